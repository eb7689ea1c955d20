//! [`SqliteLock`]: the client on one database file, its lease table and
//! statements, and the `RawLock` implementation (one upsert to acquire,
//! waiters in ticket order).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use lock_core::raw::{
    Attempt, Batcher, HolderRecord, Kind, OwnerToken, PendingGrant, RawGuard, RawLock, Request,
    Retry, Unrenewed, Wakeups, Watchdog, acquire_by_polling, validate_name,
};
use lock_core::{
    Backoff, Capabilities, Fencing, Grade, LockError, LockGuard, LockInfo, LockOptions,
    RwLockCapabilities, RwLockInfo, SemaphoreCapabilities, SemaphoreInfo,
};
use sqlx::AssertSqlSafe;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use tokio::time::Instant;

use super::batch::{self, Extension, Held, Writes};
use super::config::{MAX_BUSY_TIMEOUT_MS, SqliteConfig, parse_url};
use super::gate::{WriteGate, gate_for};
use super::handle::SqliteHandle;
use super::permits::{MAX_LIMIT, PermitStatements};
use super::rw::RwStatements;
use super::ticket::{Ticket, drop_ticket};
use super::tokens::{Epoch, boot_id};
use crate::error::{is_busy, map_sqlx};
use crate::ident::Identifier;

/// The backend's name in errors and capabilities.
pub(crate) const BACKEND: &str = "sqlite";

const CAPABILITIES: Capabilities = Capabilities::new(BACKEND, Grade::Correctness)
    .with_fencing(Fencing::Safe)
    // Waiters are granted in ticket order.
    .with_fair_queue(true)
    // The lease row's `holder` column, written with the grant.
    .with_holder(true)
    // The lease row's expiry carries the delay; a renewal sets it to now
    // plus the TTL asked, so it sets a hold's end too.
    .with_lock_delay(true)
    .with_hold_at_least(true)
    // One transaction: the acquire statement of each name.
    .with_atomic_sets(MAX_ATOMIC_SET)
    // Permits are rows of `TABLE_permits`; their waiters poll, unordered.
    .with_semaphore(Some(SemaphoreCapabilities::new(MAX_LIMIT)))
    // Rows of `TABLE_rw`; a waiting writer's mark holds later readers
    // back; waiters poll, unordered.
    .with_rw_lock(Some(
        RwLockCapabilities::new()
            .with_writer_preference(true)
            .with_upgradeable(true),
    ));

/// The most names one transaction takes: it holds SQLite's write lock
/// (every other writer of the file waits) for a statement per name; a
/// larger set is taken name by name.
const MAX_ATOMIC_SET: usize = 64;

/// How often the first waiter in line looks whether the lock is free; the
/// n-th looks n times as seldom.
const LINE_POLL: Duration = Duration::from_millis(4);

/// Locks in a SQLite database file, shared by every process that opens the
/// same file on this machine.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{DistributedLock, LockOptions};
/// use lock_sql::SqliteLock;
/// let locks = SqliteLock::open("/var/lib/myapp/locks.db", Default::default()).await?;
/// let guard = locks.acquire("daily-export", &LockOptions::new()).await?;
/// println!("token {:?}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqliteLock {
    pub(crate) inner: Arc<Inner>,
    pub(crate) watchdog: Watchdog,
}

pub(crate) struct Inner {
    pub(crate) pool: SqlitePool,
    pub(crate) path: PathBuf,
    pub(crate) sql: Statements,
    pub(crate) wakeups: Wakeups,
    /// Extends and releases of held leases, batched into shared
    /// transactions.
    pub(crate) extends: Batcher<Extension, bool>,
    pub(crate) releases: Batcher<Held, bool>,
    /// This process's turns to write to the file.
    pub(crate) gate: Arc<WriteGate>,
    /// Whether guards carry fencing tokens.
    pub(crate) fencing: bool,
    /// The epoch the fencing counters count in.
    pub(crate) epoch: Epoch,
    /// The semaphores' statements.
    pub(crate) permits: PermitStatements,
    /// The reader-writer locks' statements.
    pub(crate) rw: RwStatements,
}

/// The wake-up signals of every lease table this process has open, so that
/// all `SqliteLock`s on one file (not just clones) wake each other.
fn wakeups_for(path: &Path, table: &Identifier) -> Wakeups {
    static TABLES: OnceLock<Mutex<HashMap<(PathBuf, String), Wakeups>>> = OnceLock::new();
    let key = (
        std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
        table.as_str().to_string(),
    );
    let mut tables = TABLES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    tables.entry(key).or_default().clone()
}

/// The statements, with the validated table name filled in once.
pub(crate) struct Statements {
    /// Take the lease if it is free and no live waiter is ahead of ticket
    /// `?7`; answers the token.
    pub(crate) acquire: String,
    pub(crate) count_ahead: String,
    pub(crate) take_ticket: String,
    pub(crate) refresh_ticket: String,
    pub(crate) drop_ticket: String,
    pub(crate) holder_expiry: String,
    pub(crate) holder: String,
    /// Replace the holder record of a lease we own.
    pub(crate) set_holder: String,
    pub(crate) take_away: String,
    /// One lease freed by its owner, outside the batches: a release at
    /// shutdown.
    pub(crate) release_one: String,
}

impl Statements {
    fn new(table: &Identifier) -> Self {
        let t = table.as_str();
        Statements {
            count_ahead: format!(
                "SELECT COUNT(*) FROM \"{t}_waiters\" WHERE name = ?1 AND alive_until_ms > ?2 AND ticket < ?3"
            ),
            take_ticket: format!(
                "INSERT INTO \"{t}_waiters\" (name, alive_until_ms) VALUES (?1, ?2) RETURNING ticket"
            ),
            refresh_ticket: format!(
                "UPDATE \"{t}_waiters\" SET alive_until_ms = ?2 WHERE ticket = ?1"
            ),
            drop_ticket: format!(
                "DELETE FROM \"{t}_waiters\" WHERE ticket = ?1 OR alive_until_ms < ?2"
            ),
            acquire: format!(
                "INSERT INTO \"{t}\" (name, owner, fence, expires_at_ms, holder) \
                 SELECT ?1, ?2, (?6 << 32) + 1, ?3, ?5 WHERE NOT EXISTS (\
                 SELECT 1 FROM \"{t}_waiters\" WHERE name = ?1 AND alive_until_ms > ?4 AND ticket < ?7) \
                 ON CONFLICT(name) DO UPDATE SET owner = excluded.owner, \
                 fence = MAX(fence, ?6 << 32) + 1, \
                 expires_at_ms = excluded.expires_at_ms, holder = excluded.holder \
                 WHERE owner IS NULL OR expires_at_ms <= ?4 RETURNING fence"
            ),
            holder_expiry: format!(
                "SELECT expires_at_ms FROM \"{t}\" \
                 WHERE name = ?1 AND owner IS NOT NULL AND expires_at_ms > ?2"
            ),
            holder: format!(
                "SELECT fence, expires_at_ms, holder FROM \"{t}\" \
                 WHERE name = ?1 AND owner IS NOT NULL AND expires_at_ms > ?2"
            ),
            set_holder: format!(
                "UPDATE \"{t}\" SET holder = ?3 \
                 WHERE name = ?1 AND owner = ?2 AND expires_at_ms > ?4"
            ),
            take_away: format!(
                "UPDATE \"{t}\" SET owner = NULL, expires_at_ms = 0 \
                 WHERE name = ?1 AND owner IS NOT NULL AND expires_at_ms > ?2"
            ),
            release_one: format!(
                "UPDATE \"{t}\" SET owner = NULL, expires_at_ms = 0 \
                 WHERE name = ?1 AND owner = ?2 AND expires_at_ms > ?3"
            ),
        }
    }
}

/// Wall-clock Unix milliseconds (shared by all processes on the machine).
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The time left before `expires_at_ms` (Unix ms) at `now_ms`, zero once
/// it has passed.
pub(crate) fn time_left(expires_at_ms: i64, now_ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(expires_at_ms.saturating_sub(now_ms)).unwrap_or(0))
}

/// A lease in whole milliseconds, rounded up
/// ([`lease_millis`](lock_core::raw::lease_millis)).
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(lock_core::raw::lease_millis(d)).unwrap_or(i64::MAX)
}

impl SqliteLock {
    /// Open (creating if needed) the database file at `path` and its lease table.
    pub async fn open(path: impl AsRef<Path>, config: SqliteConfig) -> Result<Self, LockError> {
        let path = path.as_ref().to_path_buf();
        if config.busy_timeout.is_zero() || config.max_connections == 0 {
            return Err(LockError::invalid_options(
                "sqlite busy_timeout and max_connections must be greater than zero",
            ));
        }
        if config.busy_timeout > Duration::from_millis(MAX_BUSY_TIMEOUT_MS) {
            return Err(LockError::invalid_options(format!(
                "sqlite busy_timeout is at most {MAX_BUSY_TIMEOUT_MS} ms, got {:?}",
                config.busy_timeout
            )));
        }
        let boot = boot_id();
        // With the boot known, a crash of the machine advances the epoch,
        // so commits need not be flushed one by one (see `tokens`).
        let synchronous = if boot.is_some() {
            SqliteSynchronous::Normal
        } else {
            SqliteSynchronous::Full
        };
        let connect = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(synchronous)
            .busy_timeout(config.busy_timeout);
        // Switching a new file to WAL takes an exclusive lock that SQLite's
        // busy timeout does not wait for, so two processes opening a new
        // file at once can see SQLITE_BUSY here: retry within busy_timeout.
        let pool = Retry::with_backoff(Backoff::default())
            .patience(config.busy_timeout)
            .run("opening a SQLite file", is_busy, |_| {
                SqlitePoolOptions::new()
                    .max_connections(config.max_connections)
                    .acquire_timeout(config.busy_timeout * 2)
                    .connect_with(connect.clone())
            })
            .await
            .map_err(|e| map_sqlx(BACKEND, &format!("opening {}", path.display()), e))?;
        Self::from_pool(pool, path, config.table, config.fencing, boot).await
    }

    /// A lock on a pool the application already has, in lease table
    /// `table` (created if missing; [`Identifier::default_table`] is the
    /// default `distlock_leases`).
    ///
    /// The pool must be on a file (every process that opens the same file
    /// shares its locks), in WAL mode with `synchronous` NORMAL or above
    /// (FULL or above where the kernel tells no boot id, that is, beyond
    /// Linux: fencing tokens must survive a crash of the machine, see the
    /// module's documentation) and a busy timeout above zero (so processes
    /// take turns instead of failing): `SqliteConnectOptions::new()
    /// .filename(path).journal_mode(Wal).synchronous(Normal)
    /// .busy_timeout(…)`. A pool that is not is refused with
    /// [`LockError::InvalidOptions`] naming the setting.
    pub async fn with_pool(pool: SqlitePool, table: Identifier) -> Result<Self, LockError> {
        let path = pool.connect_options().get_filename().to_path_buf();
        if path.as_os_str().is_empty() || path.as_os_str() == ":memory:" {
            return Err(LockError::invalid_options(
                "the sqlite pool must be on a file shared by the processes that lock",
            ));
        }
        let failed = |e| map_sqlx(BACKEND, "reading the pool's settings", e);
        let mut conn = pool.acquire().await.map_err(failed)?;
        let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&mut *conn)
            .await
            .map_err(failed)?;
        let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&mut *conn)
            .await
            .map_err(failed)?;
        let busy_timeout: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
            .fetch_one(&mut *conn)
            .await
            .map_err(failed)?;
        drop(conn);
        if !journal.eq_ignore_ascii_case("wal") {
            return Err(LockError::invalid_options(format!(
                "the sqlite pool must use journal_mode WAL, not {journal}"
            )));
        }
        // 1 = NORMAL, 2 = FULL, 3 = EXTRA.
        let boot = boot_id();
        if boot.is_none() && synchronous < 2 {
            return Err(LockError::invalid_options(
                "the sqlite pool must use synchronous FULL or EXTRA where the kernel tells no boot id: \
                 fencing tokens must survive a crash of the machine",
            ));
        }
        if synchronous < 1 {
            return Err(LockError::invalid_options(
                "the sqlite pool must use synchronous NORMAL, FULL or EXTRA: \
                 with OFF a crash of the machine can corrupt the file",
            ));
        }
        if busy_timeout <= 0 {
            return Err(LockError::invalid_options(
                "the sqlite pool must have a busy timeout above zero",
            ));
        }
        Self::from_pool(pool, path, table, true, boot).await
    }

    /// The lock on `pool`'s file, in the machine's boot `boot` (see
    /// `tokens`).
    pub(crate) async fn from_pool(
        pool: SqlitePool,
        path: PathBuf,
        table: Identifier,
        fencing: bool,
        boot: Option<String>,
    ) -> Result<Self, LockError> {
        let t = table.as_str();
        let create = format!(
            "CREATE TABLE IF NOT EXISTS \"{t}\" (\
             name TEXT PRIMARY KEY NOT NULL, owner TEXT, \
             fence INTEGER NOT NULL DEFAULT 0, expires_at_ms INTEGER NOT NULL DEFAULT 0, \
             holder BLOB) WITHOUT ROWID"
        );
        sqlx::query(AssertSqlSafe(create))
            .execute(&pool)
            .await
            .map_err(|e| map_sqlx(BACKEND, "creating the lease table", e))?;
        add_holder_column(&pool, &table).await?;
        let waiters = format!(
            "CREATE TABLE IF NOT EXISTS \"{t}_waiters\" (\
             ticket INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, \
             alive_until_ms INTEGER NOT NULL)"
        );
        let by_name = format!(
            "CREATE INDEX IF NOT EXISTS \"{t}_waiters_name\" ON \"{t}_waiters\" (name, ticket)"
        );
        for ddl in [waiters, by_name] {
            sqlx::query(AssertSqlSafe(ddl))
                .execute(&pool)
                .await
                .map_err(|e| map_sqlx(BACKEND, "creating the waiters table", e))?;
        }
        let epoch = Epoch::open(&pool, &table, boot.as_deref()).await?;
        let permits = PermitStatements::new(&table);
        sqlx::query(AssertSqlSafe(permits.create.as_str()))
            .execute(&pool)
            .await
            .map_err(|e| map_sqlx(BACKEND, "creating the permits table", e))?;
        let rw = RwStatements::new(&table);
        for ddl in &rw.create {
            sqlx::query(AssertSqlSafe(ddl.as_str()))
                .execute(&pool)
                .await
                .map_err(|e| map_sqlx(BACKEND, "creating the reader-writer tables", e))?;
        }
        tracing::debug!(target: "distlock", path = %path.display(), table = t, "sqlite lock store open");
        let sql = Statements::new(&table);
        let gate = gate_for(&path);
        let batches = Writes {
            backend: BACKEND,
            pool: pool.clone(),
            gate: Arc::clone(&gate),
        };
        Ok(SqliteLock {
            inner: Arc::new(Inner {
                extends: batch::extends(batches.clone(), &table),
                releases: batch::releases(batches, &table),
                gate,
                pool,
                sql,
                wakeups: wakeups_for(&path, &table),
                path,
                fencing,
                epoch,
                permits,
                rw,
            }),
            watchdog: Watchdog::new(),
        })
    }

    /// Open from a URL: `sqlite://PATH[?table=NAME&busy_timeout_ms=N&max_connections=N]`.
    /// `sqlite:///var/lib/x.db` is an absolute path, `sqlite://x.db` relative.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let (path, config) = parse_url(url)?;
        Self::open(path, config).await
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Observation for tests and operators: how many live waiters hold a
    /// ticket for `name`.
    pub async fn queued(&self, name: &str) -> Result<u32, LockError> {
        self.waiters_ahead(name, i64::MAX).await
    }

    /// One attempt. With `look_first`, read the row before taking the write
    /// lock. Cancel-safe: a transaction dropped before its commit rolls back,
    /// and a [`PendingGrant`] releases by owner token if the future is
    /// dropped while the commit is in flight.
    async fn attempt(
        &self,
        name: &str,
        opts: &LockOptions,
        look_first: bool,
        ticket: Option<&Ticket>,
    ) -> Result<Attempt, LockError> {
        if look_first {
            // Reads only, unless this attempt can win: the lock looks free
            // and no live waiter is ahead. A waiter looks again after a
            // pause that grows with its place in line, so that the first
            // takes up a release in another process (which cannot notify
            // it) within a few milliseconds, the next notices soon after
            // that it is first, and those behind never compete for SQLite's
            // write lock with the one whose turn it is.
            let holder = self.holder_expires_in(name).await?;
            let mut ahead = 0;
            if let Some(ticket) = ticket {
                ticket.keep(name).await?;
                if let Some(n) = ticket.number() {
                    ahead = self.waiters_ahead(name, n).await?;
                }
            }
            let pause = LINE_POLL.saturating_mul(ahead.saturating_add(1));
            if holder.is_some() || ahead > 0 {
                return Ok(Attempt::Held {
                    expires_in: Some(holder.map_or(pause, |left| left.min(pause))),
                });
            }
        }
        let owner = OwnerToken::random();
        let handle = Arc::new(self.handle(name, owner, opts.holder_record()));
        let pending = PendingGrant::new(Arc::clone(&handle) as _);
        let sent_at = Instant::now();
        let now = now_ms();
        let failed = |e| map_sqlx(BACKEND, "acquiring a lock", e);
        // This process's writers take turns before taking a connection
        // (renewals first); the turn ends with the transaction. One
        // statement takes the lease if it is free and no live waiter is
        // ahead of us (any, for an attempt without a ticket); a waiter's
        // ticket goes in the same transaction. The transaction holds
        // SQLite's write lock from its `BEGIN IMMEDIATE`: if this future
        // is dropped with the statement in flight, the release that
        // `pending` sends waits for that lock, so it cannot overtake the
        // grant (a statement on its own, in autocommit, could be overtaken
        // and leave the lock held until its lease ends).
        let turn = self.inner.gate.acquisition().await;
        let mine = ticket.and_then(Ticket::number);
        let mut tx = self
            .inner
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(failed)?;
        let fence = self
            .take_lease(&mut tx, &handle, opts, now, mine)
            .await
            .map_err(failed)?;
        if fence.is_some() {
            if let Some(mine) = mine {
                drop_ticket(&self.inner, &mut *tx, mine)
                    .await
                    .map_err(failed)?;
            }
            tx.commit().await.map_err(failed)?;
        } else {
            tx.rollback().await.map_err(failed)?;
        }
        drop(turn);
        let Some(fence) = fence else {
            drop(pending.disarm());
            if let Some(ticket) = ticket {
                ticket.keep(name).await?;
            }
            // Held, or free with a waiter ahead (`None`).
            let expires_in = self.holder_expires_in(name).await?;
            return Ok(Attempt::Held { expires_in });
        };
        if let Some(ticket) = ticket {
            ticket.served();
        }
        self.granted(name, opts, pending, sent_at, fence).await
    }

    /// The acquire statement for `handle`'s grant at `now`, in `tx`: the
    /// token if it took the lease (free, and no live waiter ahead of
    /// `ticket`: none at all for `None`).
    async fn take_lease(
        &self,
        tx: &mut sqlx::SqliteConnection,
        handle: &SqliteHandle,
        opts: &LockOptions,
        now: i64,
        ticket: Option<i64>,
    ) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query_scalar::<_, i64>(AssertSqlSafe(self.inner.sql.acquire.as_str()))
            .bind(&handle.name)
            .bind(&handle.owner_hex)
            .bind(now.saturating_add(ms(opts.ttl)))
            .bind(now)
            .bind(handle.record.as_bytes())
            .bind(self.inner.epoch.current())
            .bind(ticket.unwrap_or(i64::MAX))
            .fetch_optional(tx)
            .await
    }

    /// The guard of a grant of `name` whose statement (sent at `sent_at`)
    /// answered `fence`, `pending` still armed.
    async fn granted(
        &self,
        name: &str,
        opts: &LockOptions,
        pending: PendingGrant,
        sent_at: Instant,
        fence: i64,
    ) -> Result<Attempt, LockError> {
        // A counter past the durable epoch (2^32 grants of one name in one
        // epoch) is covered before its token is handed out; if that
        // fails, dropping `pending` gives the lock back.
        self.inner.epoch.cover(&self.inner.pool, fence).await?;
        let (handle, lease) = match pending.grant_in_time(BACKEND, name, sent_at, opts).await {
            Ok(granted) => granted,
            // Granted too late to be of use: given back rather than held on
            // a lease that may already be expired.
            Err(too_late) => return Ok(Attempt::TooLate(too_late)),
        };
        let fence = match u64::try_from(fence) {
            Ok(f) => f,
            Err(_) => {
                let _ = handle.release().await;
                return Err(LockError::Backend {
                    backend: BACKEND,
                    reason: format!("fencing counter for {name:?} is negative ({fence})"),
                    source: None,
                });
            }
        };
        let token = Some(fence).filter(|_| self.inner.fencing);
        let guard = LockGuard::new(name, token, self.raw_capabilities(), lease, handle);
        Ok(Attempt::Acquired(guard.kept_by(
            &self.watchdog,
            opts,
            Unrenewed::Left,
        )))
    }

    /// A lock set in one transaction: the acquire statement of each name
    /// in turn (as a newcomer: any live waiter refuses it), committed only
    /// if every one took its lease. Cancel-safe as a single attempt is
    /// (the transaction holds SQLite's write lock from its `BEGIN
    /// IMMEDIATE`, and a [`PendingGrant`] per member releases it if the
    /// future is dropped).
    async fn attempt_set(&self, reqs: &[Request<'_>]) -> Result<Option<Vec<LockGuard>>, LockError> {
        let failed = |e| map_sqlx(BACKEND, "acquiring a lock set", e);
        let handles: Vec<Arc<SqliteHandle>> = reqs
            .iter()
            .map(|req| {
                Arc::new(self.handle(req.name, OwnerToken::random(), req.opts.holder_record()))
            })
            .collect();
        let pending: Vec<PendingGrant> = handles
            .iter()
            .map(|h| PendingGrant::new(Arc::clone(h) as _))
            .collect();
        let sent_at = Instant::now();
        let now = now_ms();
        let turn = self.inner.gate.acquisition().await;
        let mut tx = self
            .inner
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(failed)?;
        let mut fences = Vec::with_capacity(reqs.len());
        for (req, handle) in reqs.iter().zip(&handles) {
            let fence = self
                .take_lease(&mut tx, handle, req.opts, now, None)
                .await
                .map_err(failed)?;
            match fence {
                Some(fence) => fences.push(fence),
                None => break,
            }
        }
        let all = fences.len() == reqs.len();
        if all {
            tx.commit().await.map_err(failed)?;
        } else {
            tx.rollback().await.map_err(failed)?;
        }
        drop(turn);
        if !all {
            for p in pending {
                drop(p.disarm());
            }
            return Ok(None);
        }
        let mut guards = Vec::with_capacity(reqs.len());
        let mut late = None;
        for ((req, p), fence) in reqs.iter().zip(pending).zip(fences) {
            match self.granted(req.name, req.opts, p, sent_at, fence).await? {
                Attempt::Acquired(guard) => guards.push(guard),
                // Answered at once for the whole set: every member is as
                // late, and each is given back.
                other => {
                    late.get_or_insert(other);
                }
            }
        }
        match late {
            Some(late) => late.into_guard().map(|_| None),
            None => Ok(Some(guards)),
        }
    }

    /// How many live waiters hold a ticket below `ticket` for `name`. A
    /// plain read.
    async fn waiters_ahead(&self, name: &str, ticket: i64) -> Result<u32, LockError> {
        let ahead: i64 = sqlx::query_scalar(AssertSqlSafe(self.inner.sql.count_ahead.as_str()))
            .bind(name)
            .bind(now_ms())
            .bind(ticket)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| map_sqlx(BACKEND, "reading the waiters", e))?;
        Ok(u32::try_from(ahead).unwrap_or(u32::MAX))
    }

    /// How long the current holder's lease has left; `None` if nobody holds
    /// the lock. A plain read: it never waits for SQLite's write lock.
    async fn holder_expires_in(&self, name: &str) -> Result<Option<Duration>, LockError> {
        let now = now_ms();
        let expires: Option<i64> =
            sqlx::query_scalar(AssertSqlSafe(self.inner.sql.holder_expiry.as_str()))
                .bind(name)
                .bind(now)
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(|e| map_sqlx(BACKEND, "reading a lock", e))?;
        Ok(expires.map(|e| time_left(e, now)))
    }

    pub(crate) fn handle(
        &self,
        name: &str,
        owner: OwnerToken,
        record: HolderRecord,
    ) -> SqliteHandle {
        SqliteHandle {
            inner: Arc::clone(&self.inner),
            name: name.to_string(),
            owner_hex: owner.to_hex(),
            record,
            slot: None,
            rw: false,
            upgradeable: false,
        }
    }
}

#[async_trait]
impl RawLock for SqliteLock {
    /// A single attempt does not queue.
    async fn attempt_once(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        match req.kind() {
            Kind::Rw(access) => self.try_rw(req, access).await,
            Kind::Permit(limit) => self
                .attempt_permit(req.name, req.opts, limit)
                .await?
                .into_guard(),
            Kind::Lock => self
                .attempt(req.name, req.opts, false, None)
                .await?
                .into_guard(),
        }
    }

    /// One transaction for the whole set.
    async fn attempt_set_once(
        &self,
        reqs: &[Request<'_>],
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        self.attempt_set(reqs).await
    }

    async fn wait(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        match req.kind() {
            Kind::Rw(access) => return self.wait_for_rw(req, access).await,
            Kind::Permit(limit) => return self.wait_for_permit(req, limit).await,
            Kind::Lock => {}
        }
        let (name, opts) = (req.name, req.opts);
        let wake = self.inner.wakeups.subscribe(name);
        let ticket = Ticket::new(&self.inner);
        let outcome = acquire_by_polling(req, Some(wake), |tries| {
            self.attempt(name, opts, tries > 0, Some(&ticket))
        })
        .await;
        // Leaving without the lock: out of the line at once, so that the
        // next attempt (ours or anyone's) is not held up by our ticket.
        ticket.leave().await;
        outcome
    }

    fn raw_capabilities(&self) -> Capabilities {
        CAPABILITIES.with_fencing(if self.inner.fencing {
            CAPABILITIES.fencing
        } else {
            Fencing::None
        })
    }

    /// The lease row (holder's token and expiry) and the live waiters'
    /// tickets.
    async fn raw_inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        validate_name(name)?;
        let now = now_ms();
        let holder: Option<(i64, i64, Option<Vec<u8>>)> =
            sqlx::query_as(AssertSqlSafe(self.inner.sql.holder.as_str()))
                .bind(name)
                .bind(now)
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(|e| map_sqlx(BACKEND, "reading a lock's holder", e))?;
        let waiters = Some(self.queued(name).await? as usize);
        Ok(match holder {
            None => LockInfo::free().with_waiters(waiters),
            Some((fence, expires_at, record)) => LockInfo::held()
                .with_fencing_token(u64::try_from(fence).ok().filter(|_| self.inner.fencing))
                .with_expires_in(Some(time_left(expires_at, now)))
                .with_waiters(waiters)
                .with_holder(
                    record
                        .filter(|r| !r.is_empty())
                        .map(|r| HolderRecord::decode_for(BACKEND, name, &r))
                        .transpose()?,
                ),
        })
    }

    /// The live rows of `name`'s reader-writer lock and its counter.
    async fn raw_inspect_rw(&self, name: &str) -> Result<RwLockInfo, LockError> {
        self.inspect_rw_lock(name).await
    }

    /// The live rows of `name`'s permits.
    async fn raw_inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        self.inspect_permits(name).await
    }

    /// Clear the holder of `name`'s lease row. Waiters in this process are
    /// woken at once, those in other processes at their next look; the
    /// holder's next renewal fails and its `lost()` fires.
    async fn raw_force_release(&self, name: &str) -> Result<bool, LockError> {
        validate_name(name)?;
        let done = sqlx::query(AssertSqlSafe(self.inner.sql.take_away.as_str()))
            .bind(name)
            .bind(now_ms())
            .execute(&self.inner.pool)
            .await
            .map_err(|e| map_sqlx(BACKEND, "force-releasing a lock", e))?;
        self.inner.wakeups.wake(name);
        Ok(done.rows_affected() == 1)
    }
}

impl fmt::Debug for SqliteLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteLock")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

/// Add the `holder` column to a lease table made before it existed (an
/// older version of this crate); concurrent openers may race to add it.
async fn add_holder_column(pool: &SqlitePool, table: &Identifier) -> Result<(), LockError> {
    let failed = |e| map_sqlx(BACKEND, "adding the holder column to the lease table", e);
    let has = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM pragma_table_info(?1) WHERE name = 'holder'",
        )
        .bind(table.as_str())
        .fetch_one(pool)
        .await
    };
    if has().await.map_err(failed)? > 0 {
        return Ok(());
    }
    let alter = format!("ALTER TABLE \"{}\" ADD COLUMN holder BLOB", table.as_str());
    match sqlx::query(AssertSqlSafe(alter)).execute(pool).await {
        Ok(_) => Ok(()),
        // Another process added it first.
        Err(_) if has().await.map_err(failed)? > 0 => Ok(()),
        Err(e) => Err(failed(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::{DistributedLock, Wait};

    /// With a 5 s polling delay, only the in-process wake-up can hand the
    /// lock over quickly, across two separately opened clients of one file.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn release_wakes_waiters_of_the_same_file_in_this_process() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("l.db");
        let a = SqliteLock::open(&path, SqliteConfig::default())
            .await
            .expect("open");
        let b = SqliteLock::open(&path, SqliteConfig::default())
            .await
            .expect("open");
        let slow = lock_core::Backoff::default()
            .with_initial(Duration::from_secs(5))
            .with_max(Duration::from_secs(5))
            .with_jitter(0.0);
        let opts = LockOptions::new()
            .backoff(slow)
            .wait(Wait::UpTo(Duration::from_secs(20)));
        let held = a.acquire("x", &opts).await.expect("acquire");
        let waiter =
            tokio::spawn(async move { b.acquire("x", &opts).await.map(|g| (Instant::now(), g)) });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let released = Instant::now();
        assert!(held.release().await.expect("release"));
        let (granted, g) = waiter.await.expect("task").expect("acquire");
        assert!(
            granted - released < Duration::from_secs(2),
            "no wake-up: {:?}",
            granted - released
        );
        assert!(g.release().await.expect("release"));
    }

    /// A waiter dropped while the statement taking its ticket waits for
    /// SQLite's write lock leaves no ticket behind once that statement
    /// goes through, not even for a moment: a ticket seen by a newcomer
    /// would hold the line for nobody (it used to block it until it went
    /// stale, then until the background task deleted it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_dropped_while_taking_its_ticket_leaves_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("l.db");
        let locks = SqliteLock::open(&path, SqliteConfig::default())
            .await
            .expect("open");
        // Every ticket row ever committed, even one deleted at once.
        let waiters = format!("{}_waiters", Identifier::default_table().as_str());
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE seen_tickets (ticket INTEGER); \
             CREATE TRIGGER seen AFTER INSERT ON \"{waiters}\" \
             BEGIN INSERT INTO seen_tickets VALUES (NEW.ticket); END"
        )))
        .execute(&locks.inner.pool)
        .await
        .expect("trigger");
        // Another connection holds the write lock: the ticket's INSERT
        // waits in SQLite's busy handler.
        let mut blocking = holding_the_write_lock(&path).await;
        let ticket = Ticket::new(&locks.inner);
        let taking_place = ticket.place_in_use();
        let taking = tokio::time::timeout(Duration::from_millis(500), ticket.keep("x")).await;
        assert!(
            taking.is_err(),
            "the ticket was taken despite the write lock"
        );
        drop(ticket);
        release_the_write_lock(&mut blocking).await;
        // The task taking the ticket goes on; it is done when it lets go
        // of the waiter's place.
        let start = Instant::now();
        while taking_place() {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "taking the ticket never ended"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let seen: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM seen_tickets")
            .fetch_one(&locks.inner.pool)
            .await
            .expect("seen tickets");
        assert_eq!(seen, 0, "the dropped waiter's ticket was in line");
        assert_eq!(locks.queued("x").await.expect("queued"), 0);
    }

    /// Another connection to the database at `path`, holding its write
    /// lock (`BEGIN IMMEDIATE`) until [`release_the_write_lock`].
    async fn holding_the_write_lock(path: &std::path::Path) -> sqlx::sqlite::SqliteConnection {
        use sqlx::Connection;
        let mut writer = sqlx::sqlite::SqliteConnection::connect_with(
            &SqliteConnectOptions::new().filename(path),
        )
        .await
        .expect("second connection");
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut writer)
            .await
            .expect("write lock");
        writer
    }

    async fn release_the_write_lock(writer: &mut sqlx::sqlite::SqliteConnection) {
        sqlx::query("ROLLBACK")
            .execute(writer)
            .await
            .expect("rollback");
    }

    /// A single attempt under `opts` on a new database, made while another
    /// connection holds the database's write lock for `hold`. Checks that
    /// its answer is the transient error, not a guard (a grant that came
    /// too late is given back: the name is free at once), and returns how
    /// long after its request the answer came.
    async fn a_grant_held_up_for(opts: LockOptions, hold: Duration) -> Duration {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("l.db");
        let locks = SqliteLock::open(&path, SqliteConfig::default())
            .await
            .expect("open");
        let mut blocking = holding_the_write_lock(&path).await;
        let attempt = {
            let (locks, opts) = (locks.clone(), opts.clone());
            tokio::spawn(async move {
                let sent_at = Instant::now();
                (locks.try_acquire("late", &opts).await, sent_at.elapsed())
            })
        };
        tokio::time::sleep(hold).await;
        release_the_write_lock(&mut blocking).await;
        let (answer, took) = attempt.await.expect("attempt task");
        match answer {
            Err(LockError::Unavailable { backend, .. }) => assert_eq!(backend, BACKEND),
            Ok(Some(g)) => panic!(
                "a guard answered {took:?} after its request was handed out (lost: {:?})",
                g.is_lost()
            ),
            other => panic!("expected Unavailable, got {other:?}"),
        }
        let next = locks
            .try_acquire("late", &opts)
            .await
            .expect("try")
            .expect("the late grant was given back");
        assert!(next.release().await.expect("release"));
        took
    }

    /// A single attempt whose grant comes back after its TTL (the database
    /// was locked by another writer meanwhile) gives the lock back and
    /// says so with a transient error, not "held": nobody holds it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_grant_too_late_for_its_ttl_is_unavailable_not_held() {
        let opts = LockOptions::new()
            .ttl(Duration::from_millis(300))
            .wait(Wait::No)
            .auto_renew(false);
        a_grant_held_up_for(opts, Duration::from_millis(500)).await;
    }

    /// A grant that comes back inside its safety margin (after the
    /// lease's validity deadline, before its TTL) is too late as well: a
    /// guard already past its deadline is never handed out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_grant_past_its_validity_deadline_is_unavailable_not_held() {
        // Valid for 1 s less a margin of 400 ms: 600 ms.
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(1))
            .safety_margin(Duration::from_millis(400))
            .wait(Wait::No)
            .auto_renew(false);
        // Only a grant inside the margin says anything; on a loaded machine
        // one may come back past the TTL instead (still refused), so up to
        // three tries.
        let mut tries = Vec::new();
        for _ in 0..3 {
            let took = a_grant_held_up_for(opts.clone(), Duration::from_millis(850)).await;
            if took > Duration::from_millis(750) && took < Duration::from_secs(1) {
                return;
            }
            tries.push(took);
        }
        panic!("no grant came back inside the margin: {tries:?} after the request");
    }

    #[tokio::test]
    async fn wait_no_fails_fast_on_a_held_lock() {
        let dir = tempfile::tempdir().expect("tempdir");
        let locks = SqliteLock::open(dir.path().join("l.db"), SqliteConfig::default())
            .await
            .expect("open");
        let opts = LockOptions::new().wait(Wait::No);
        let g = locks.acquire("x", &opts).await.expect("acquire");
        let start = Instant::now();
        assert!(matches!(
            locks.acquire("x", &opts).await,
            Err(LockError::Timeout { .. })
        ));
        assert!(start.elapsed() < Duration::from_secs(1));
        assert!(g.release().await.expect("release"));
    }
}
