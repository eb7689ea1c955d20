//! The conformance suite against SQLite, with two independent clients
//! (separate connection pools) on one database file.

use std::sync::OnceLock;

use lock_sql::{SqliteConfig, SqliteLock};
use lock_testkit::conformance::Harness;

/// One database file for the whole test binary, so cases run concurrently
/// against the same file (as separate processes would).
fn db_dir() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temporary directory"))
}

async fn harness() -> Harness {
    let path = db_dir().path().join("conformance.db");
    Harness::of(async || {
        SqliteLock::open(&path, SqliteConfig::default())
            .await
            .expect("open sqlite")
    })
    .await
}

lock_testkit::conformance_suite!(harness());

/// The crate's `docs.md` opens with the capability checklist this backend
/// reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_open_with_the_capability_checklist() {
    let h = harness().await;
    lock_testkit::docs::assert_checklist(include_str!("../docs.md"), &h.lock.capabilities());
}

/// The lock cases again, on locks built from a `SqlitePool` the application
/// made itself (`SqliteLock::with_pool`), on a file of its own.
mod own_pool {
    use std::time::Duration;

    use lock_sql::sqlx::sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
    };
    use lock_sql::{Identifier, SqliteLock};
    use lock_testkit::conformance::Harness;

    pub(super) fn options(
        journal: SqliteJournalMode,
        sync: SqliteSynchronous,
    ) -> SqliteConnectOptions {
        SqliteConnectOptions::new()
            .filename(super::db_dir().path().join("own-pool.db"))
            .create_if_missing(true)
            .journal_mode(journal)
            .synchronous(sync)
            .busy_timeout(Duration::from_secs(5))
    }

    async fn harness() -> Harness {
        Harness::of(async || {
            let pool = SqlitePoolOptions::new()
                .max_connections(4)
                .connect_with(options(SqliteJournalMode::Wal, SqliteSynchronous::Full))
                .await
                .expect("the application's pool");
            SqliteLock::with_pool(pool, Identifier::new("app_leases").expect("table"))
                .await
                .expect("a lock on the application's pool")
        })
        .await
    }

    // The lock cases: the other primitives run the same code on the
    // lock's connections, whichever pool they were taken from.
    lock_testkit::lock_conformance_suite!(harness());

    /// A pool whose settings would break a guarantee is refused, typed,
    /// naming the setting: not WAL, or a file that a machine crash could
    /// corrupt (`synchronous` OFF). `NORMAL` is enough on Linux, where the
    /// boot id tells a crash of the machine (the fencing epoch advances).
    #[tokio::test]
    async fn a_pool_that_breaks_a_guarantee_is_refused() {
        #[cfg(target_os = "linux")]
        {
            let dir = tempfile::tempdir().expect("temporary directory");
            let normal = options(SqliteJournalMode::Wal, SqliteSynchronous::Normal)
                .filename(dir.path().join("x.db"));
            let pool = SqlitePoolOptions::new()
                .connect_with(normal)
                .await
                .expect("pool");
            SqliteLock::with_pool(pool, Identifier::default_table())
                .await
                .expect("synchronous NORMAL is accepted where the boot is known");
        }
        for (journal, sync, setting) in [
            (
                SqliteJournalMode::Wal,
                SqliteSynchronous::Off,
                "synchronous",
            ),
            (
                SqliteJournalMode::Delete,
                SqliteSynchronous::Full,
                "journal_mode",
            ),
        ] {
            let dir = tempfile::tempdir().expect("temporary directory");
            let pool = SqlitePoolOptions::new()
                .connect_with(options(journal, sync).filename(dir.path().join("x.db")))
                .await
                .expect("pool");
            match SqliteLock::with_pool(pool, Identifier::default_table()).await {
                Err(lock_core::LockError::InvalidOptions { reason }) => {
                    assert!(reason.contains(setting), "{reason}")
                }
                Err(e) => panic!("{setting}: {e:?}"),
                Ok(_) => panic!("{setting}: accepted"),
            }
        }
    }
}

/// The suite again with `fencing=false`: guards, `inspect` and
/// `capabilities()` carry no token, and everything else holds.
mod without_fencing {
    use lock_sql::{SqliteConfig, SqliteLock};
    use lock_testkit::conformance::Harness;

    async fn harness() -> Harness {
        let path = super::db_dir().path().join("conformance.db");
        Harness::of(async || {
            let config = SqliteConfig::default().with_fencing(false);
            SqliteLock::open(&path, config).await.expect("open sqlite")
        })
        .await
    }

    lock_testkit::conformance_suite!(harness());
}

/// A lease table made before the holder record existed (no `holder`
/// column) gains the column when opened, keeps its rows and tokens, and
/// records holders from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_table_without_the_holder_column_gains_it() {
    use lock_core::{DistributedLock, LockOptions};
    use lock_sql::sqlx::{self, Connection};

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("older.db");
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("connect");
    sqlx::raw_sql(
        "CREATE TABLE distlock_leases (name TEXT PRIMARY KEY NOT NULL, owner TEXT, \
         fence INTEGER NOT NULL DEFAULT 0, expires_at_ms INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID; \
         INSERT INTO distlock_leases (name, fence) VALUES ('jobs', 41);",
    )
    .execute(&mut conn)
    .await
    .expect("an older table");
    conn.close().await.expect("close");

    let locks = SqliteLock::open(&path, SqliteConfig::default())
        .await
        .expect("open an older table");
    let opts = LockOptions::new().identity("api-2").value("10.0.0.7");
    let guard = locks.acquire("jobs", &opts).await.expect("acquire");
    let token = guard.fencing_token().expect("a token");
    assert!(token > 41, "the row's token rises: {token}");
    let holder = locks.inspect("jobs").await.expect("inspect").holder;
    let holder = holder.expect("a holder record");
    assert_eq!(
        (holder.identity.as_str(), holder.value.as_slice()),
        ("api-2", b"10.0.0.7".as_slice())
    );
    // A second opener finds the column there.
    let again = SqliteLock::open(&path, SqliteConfig::default())
        .await
        .expect("open again");
    guard.set_value(b"10.0.0.8").await.expect("set_value");
    let holder = again.inspect("jobs").await.expect("inspect").holder;
    assert_eq!(holder.map(|h| h.value), Some(b"10.0.0.8".to_vec()));
    assert!(guard.release().await.expect("release"));
}
