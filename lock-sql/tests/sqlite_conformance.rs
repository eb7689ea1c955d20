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

/// The suite again, on locks built from a `SqlitePool` the application
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

    lock_testkit::conformance_suite!(harness());

    /// A pool whose settings would break a guarantee is refused, typed,
    /// naming the setting: not WAL, or tokens that a machine crash could
    /// take back (`synchronous` NORMAL).
    #[tokio::test]
    async fn a_pool_that_breaks_a_guarantee_is_refused() {
        for (journal, sync, setting) in [
            (
                SqliteJournalMode::Wal,
                SqliteSynchronous::Normal,
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
