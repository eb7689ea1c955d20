//! SQLite fencing tokens without a flush of the log per grant.
//!
//! A token is `(epoch << 32) | n`, kept whole in the lease row's `fence`
//! column. Commits run with `synchronous = NORMAL` in WAL mode: a committed
//! grant survives a crash of any process (the log is in the kernel's page
//! cache), but a crash of the machine may roll back the latest commits,
//! and with them the counters. The **epoch** (table `{t}_epoch`) is what
//! survives that: it records the machine's boot (the kernel's boot id) in
//! a commit flushed to disk, and the first process to open the file after
//! the machine started again advances it. Every grant then counts from
//! `epoch << 32` at least, above every token handed out before the crash,
//! whatever the crash rolled back. A process reads the epoch once, when it
//! opens the file: the boot cannot change while it runs.
//!
//! Where the kernel tells no boot id (any system but Linux), a machine
//! crash cannot be told from a restart: the connections keep
//! `synchronous = FULL` (a flush per commit), so the counters themselves
//! survive, and the epoch stays as it is.
//!
//! The epoch has 16 bits, so tokens stay below 2^48 and a fencing epoch
//! (`fencing_epoch`, shifted by 48) still orders above them. A name whose
//! counter reaches 2^32 grants within one epoch moves into the next
//! epoch's range; the durable epoch is raised to it (flushed) before such a
//! token is handed out, so a crash after it still advances beyond.

use std::sync::atomic::{AtomicI64, Ordering};

use lock_core::LockError;
use sqlx::sqlite::SqlitePool;
use sqlx::{AssertSqlSafe, Connection, SqliteConnection};

use super::lock::BACKEND;
use crate::error::map_sqlx;
use crate::ident::Identifier;

// Every token, `(MAX_EPOCH << 32) | 0xFFFF_FFFF` at most, below 2^48.
const _: () = assert!(MAX_EPOCH < 1 << 16);

/// The largest epoch: tokens stay below 2^48.
const MAX_EPOCH: i64 = 0xFFFF;

/// Where Linux tells the current boot's id.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The current boot of this machine, where the kernel tells it.
pub(crate) fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string(BOOT_ID).ok()?;
    let id = id.trim();
    (!id.is_empty()).then(|| id.to_string())
}

/// The epoch this process's grants count in (read when the file was
/// opened, raised when a counter moves past it).
pub(crate) struct Epoch {
    current: AtomicI64,
    raise: String,
}

impl Epoch {
    /// The epoch of lease table `table`, advanced first if the file was
    /// last opened in another boot of the machine (`boot`; `None`: the
    /// boot is unknown and the epoch is kept).
    pub(crate) async fn open(
        pool: &SqlitePool,
        table: &Identifier,
        boot: Option<&str>,
    ) -> Result<Self, LockError> {
        let t = table.as_str();
        let failed = |e| map_sqlx(BACKEND, "reading the fencing epoch", e);
        let create = format!(
            "CREATE TABLE IF NOT EXISTS \"{t}_epoch\" (\
             id INTEGER PRIMARY KEY CHECK (id = 1), epoch INTEGER NOT NULL, boot TEXT NOT NULL)"
        );
        sqlx::query(AssertSqlSafe(create))
            .execute(pool)
            .await
            .map_err(|e| map_sqlx(BACKEND, "creating the epoch table", e))?;
        let read = format!("SELECT epoch, boot FROM \"{t}_epoch\" WHERE id = 1");
        let stored: Option<(i64, String)> = sqlx::query_as(AssertSqlSafe(read.as_str()))
            .fetch_optional(pool)
            .await
            .map_err(failed)?;
        let epoch = match stored {
            Some((epoch, seen)) if boot.is_none_or(|b| b == seen) => epoch,
            _ => {
                // The first open in this boot (or of this file): the
                // counters may have lost commits that a crash of the
                // machine rolled back. Advance, flushed, before any grant.
                let advance = format!(
                    "INSERT INTO \"{t}_epoch\" (id, epoch, boot) VALUES (1, 1, ?1) \
                     ON CONFLICT(id) DO UPDATE SET epoch = epoch + 1, boot = excluded.boot \
                     WHERE boot <> excluded.boot AND epoch < {MAX_EPOCH}"
                );
                let boot = boot.unwrap_or("").to_string();
                let binding = boot.clone();
                let mut conn = pool.acquire().await.map_err(failed)?;
                let advanced = flushed(&mut conn, |conn| {
                    Box::pin(async move {
                        sqlx::query(AssertSqlSafe(advance.as_str()))
                            .bind(binding.as_str())
                            .execute(&mut *conn)
                            .await?;
                        sqlx::query_as::<_, (i64, String)>(AssertSqlSafe(read.as_str()))
                            .fetch_one(&mut *conn)
                            .await
                    })
                })
                .await
                .map_err(|e| map_sqlx(BACKEND, "advancing the fencing epoch", e))?;
                if advanced.1 != boot {
                    return Err(exhausted(advanced.0));
                }
                tracing::info!(target: "distlock", table = t, epoch = advanced.0,
                    "sqlite fencing epoch advanced for this boot of the machine");
                advanced.0
            }
        };
        Ok(Epoch {
            current: AtomicI64::new(epoch),
            raise: format!("UPDATE \"{t}_epoch\" SET epoch = MAX(epoch, ?1) WHERE id = 1"),
        })
    }

    /// The epoch grants count in now.
    pub(crate) fn current(&self) -> i64 {
        self.current.load(Ordering::Acquire)
    }

    /// Make `token`, just committed as a name's counter, safe to hand out:
    /// if it lies beyond the epoch known to be durable (its counter went
    /// past 2^32 grants), raise the durable epoch to it first.
    pub(crate) async fn cover(&self, pool: &SqlitePool, token: i64) -> Result<(), LockError> {
        let epoch = token >> 32;
        if epoch <= self.current() {
            return Ok(());
        }
        if epoch > MAX_EPOCH {
            return Err(exhausted(epoch));
        }
        let failed = |e| map_sqlx(BACKEND, "raising the fencing epoch", e);
        let mut conn = pool.acquire().await.map_err(failed)?;
        let raise = self.raise.clone();
        flushed(&mut conn, |conn| {
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(raise.as_str()))
                    .bind(epoch)
                    .execute(&mut *conn)
                    .await
                    .map(drop)
            })
        })
        .await
        .map_err(failed)?;
        self.current.fetch_max(epoch, Ordering::AcqRel);
        Ok(())
    }
}

/// The epochs are used up: no token above the last can be made.
fn exhausted(epoch: i64) -> LockError {
    LockError::Backend {
        backend: BACKEND,
        reason: format!(
            "the fencing epoch cannot advance past {epoch} (at most {MAX_EPOCH}): \
             remove the lease table's `_epoch` row only with every token user reset"
        ),
        source: None,
    }
}

type Work<'c, T> = std::pin::Pin<Box<dyn Future<Output = Result<T, sqlx::Error>> + Send + 'c>>;

/// Run `work` in one `BEGIN IMMEDIATE` transaction whose commit is flushed
/// to disk (`synchronous = FULL` on this connection for the transaction,
/// then its own setting again; a call dropped midway may leave the
/// connection flushing every commit, which costs time only). The flush of
/// the log makes every earlier commit durable too.
async fn flushed<T>(
    conn: &mut SqliteConnection,
    work: impl for<'c> FnOnce(&'c mut SqliteConnection) -> Work<'c, T>,
) -> Result<T, sqlx::Error> {
    let setting: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await?;
    sqlx::query("PRAGMA synchronous = FULL")
        .execute(&mut *conn)
        .await?;
    let outcome = async {
        // Rolled back if dropped before the commit.
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let out = work(&mut tx).await?;
        tx.commit().await?;
        Ok::<T, sqlx::Error>(out)
    }
    .await;
    let restore = format!("PRAGMA synchronous = {}", setting.clamp(0, 3));
    let restored = sqlx::query(AssertSqlSafe(restore))
        .execute(&mut *conn)
        .await;
    let out = outcome?;
    restored?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use lock_core::{DistributedLock, LockOptions};
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};

    use super::*;
    use crate::sqlite::SqliteLock;

    async fn pool(path: &Path) -> SqlitePool {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(std::time::Duration::from_secs(5));
        SqlitePool::connect_with(options).await.expect("pool")
    }

    /// The lock on `path` as opened in boot `boot` of the machine.
    async fn open_in(path: &Path, boot: &str) -> SqliteLock {
        SqliteLock::from_pool(
            pool(path).await,
            path.to_path_buf(),
            Identifier::default_table(),
            true,
            Some(boot.to_string()),
        )
        .await
        .expect("open")
    }

    async fn grant(lock: &SqliteLock) -> u64 {
        let g = lock
            .acquire("job", &LockOptions::new())
            .await
            .expect("acquire");
        let token = g.fencing_token().expect("a token");
        assert!(g.release().await.expect("release"));
        token
    }

    /// A crash of the machine that rolls back the latest grants (their
    /// commits were not flushed) does not take tokens back: the first
    /// open in the next boot advances the epoch, and the next token is
    /// above every token handed out before. Within one boot the epoch
    /// stays (no flush per open).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crash_of_the_machine_does_not_take_tokens_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("l.db");
        let before = open_in(&path, "boot-a").await;
        let mut tokens = Vec::new();
        for _ in 0..5 {
            tokens.push(grant(&before).await);
        }
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
        assert!(tokens[0] > 1 << 32, "tokens count in epoch 1 at least");
        let again = open_in(&path, "boot-a").await;
        assert_eq!(again.inner.epoch.current(), before.inner.epoch.current());
        // What the disk holds after the crash: the counter as it was two
        // grants in, the later commits lost with the page cache.
        let table = Identifier::default_table();
        let rollback = format!("UPDATE \"{}\" SET fence = ?1", table.as_str());
        sqlx::query(AssertSqlSafe(rollback))
            .bind(i64::try_from(tokens[1]).expect("token"))
            .execute(&pool(&path).await)
            .await
            .expect("roll back");
        let after = open_in(&path, "boot-b").await;
        assert_eq!(
            after.inner.epoch.current(),
            before.inner.epoch.current() + 1
        );
        let next = grant(&after).await;
        assert!(
            next > tokens[4],
            "token {next} after the crash, {} before",
            tokens[4]
        );
    }

    /// A counter that reaches the end of its epoch's range goes on into
    /// the next one, and the durable epoch is raised to it before that
    /// token is handed out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_counter_past_its_epoch_raises_the_durable_epoch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("l.db");
        let lock = open_in(&path, "boot-a").await;
        let first = grant(&lock).await;
        let table = Identifier::default_table();
        let last_of_epoch = ((first >> 32) << 32) | 0xFFFF_FFFF;
        let jump = format!("UPDATE \"{}\" SET fence = ?1", table.as_str());
        sqlx::query(AssertSqlSafe(jump))
            .bind(i64::try_from(last_of_epoch).expect("token"))
            .execute(&pool(&path).await)
            .await
            .expect("jump");
        let next = grant(&lock).await;
        assert_eq!(next, last_of_epoch + 1);
        let read = format!("SELECT epoch FROM \"{}_epoch\"", table.as_str());
        let durable: i64 = sqlx::query_scalar(AssertSqlSafe(read))
            .fetch_one(&pool(&path).await)
            .await
            .expect("epoch");
        assert_eq!(u64::try_from(durable).expect("epoch"), next >> 32);
        assert_eq!(lock.inner.epoch.current(), durable);
    }

    /// The connections of `open` flush only the epoch's commits: they run
    /// with `synchronous = NORMAL` where the boot is known, and the
    /// setting is back after the epoch's flushed commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commits_are_not_flushed_one_by_one_where_the_boot_is_known() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("l.db");
        let lock = SqliteLock::open(&path, Default::default())
            .await
            .expect("open");
        let expected = if boot_id().is_some() { 1 } else { 2 };
        for _ in 0..3 {
            let mut conn = lock.inner.pool.acquire().await.expect("connection");
            let setting: i64 = sqlx::query_scalar("PRAGMA synchronous")
                .fetch_one(&mut *conn)
                .await
                .expect("pragma");
            assert_eq!(setting, expected);
        }
    }
}
