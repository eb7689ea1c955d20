//! The conformance suite against the MariaDB that `scripts/services.sh`
//! runs (`DISTLOCK_TEST_MYSQL_URL`), in row mode and in advisory mode.

use lock_sql::MySqlLock;
use lock_testkit::conformance::Harness;
use lock_testkit::faults::env;

/// A harness on locks from the server's URL with `query` as its options.
async fn harness_for(query: &str) -> Harness {
    let url = format!("{}?{query}", env("DISTLOCK_TEST_MYSQL_URL"));
    Harness::of(async || MySqlLock::connect(&url).await.expect("connect")).await
}

mod row {
    use super::*;

    async fn harness() -> Harness {
        harness_for("mode=row").await
    }

    lock_testkit::conformance_suite!(harness());
}

mod advisory {
    use super::*;

    async fn harness() -> Harness {
        harness_for("mode=advisory").await
    }

    lock_testkit::conformance_suite!(harness());
}

/// The suite again, on locks built from a `MySqlPool` the application
/// made itself (`MySqlLock::with_pool`), in both modes.
mod own_pool {
    use lock_sql::sqlx::mysql::MySqlPoolOptions;
    use lock_sql::{MySqlLock, SqlConfig, SqlMode};
    use lock_testkit::conformance::Harness;
    use lock_testkit::faults::env;

    async fn harness_for(mode: SqlMode) -> Harness {
        let url = env("DISTLOCK_TEST_MYSQL_URL");
        Harness::of(async || {
            let pool = MySqlPoolOptions::new()
                .max_connections(32)
                .connect(&url)
                .await
                .expect("the application's pool");
            let config = SqlConfig {
                mode,
                ..SqlConfig::default()
            };
            MySqlLock::with_pool(pool, config)
                .await
                .expect("a lock on the application's pool")
        })
        .await
    }

    mod row {
        use super::*;

        async fn harness() -> Harness {
            harness_for(SqlMode::Row).await
        }

        lock_testkit::conformance_suite!(harness());
    }

    mod advisory {
        use super::*;

        async fn harness() -> Harness {
            harness_for(SqlMode::Advisory).await
        }

        lock_testkit::conformance_suite!(harness());
    }
}

/// A connection the lock used goes back to the application's pool with
/// the session variables the lock set (the lock wait, the idle bound) back
/// at the server's defaults, in both modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_connections_come_back_unchanged() {
    use lock_core::{DistributedLock, LockOptions, Wait};
    use lock_sql::sqlx::mysql::MySqlPoolOptions;
    use lock_sql::{SqlConfig, SqlMode};
    use std::time::Duration;

    for mode in [SqlMode::Row, SqlMode::Advisory] {
        // One connection: the one the lock used is the one we look at.
        let pool = MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&env("DISTLOCK_TEST_MYSQL_URL"))
            .await
            .expect("the application's pool");
        let config = SqlConfig {
            mode,
            sessions: 0,
            ..SqlConfig::default()
        };
        let lock = MySqlLock::with_pool(pool.clone(), config)
            .await
            .expect("with_pool");
        let name = format!("own-pool/{mode:?}/{}", std::process::id());
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(7))
            .wait(Wait::Up(Duration::from_secs(3)));
        let g = lock.acquire(&name, &opts).await.expect("acquire");
        assert!(g.release().await.expect("release"));
        // Hands the lock's cached connections back to the pool.
        lock.inspect(&name).await.expect("inspect");
        let changed: Vec<(String, i64, i64)> = lock_sql::sqlx::query_as(
            "SELECT v.name, v.here, v.server FROM ( \
             SELECT 'innodb_lock_wait_timeout' AS name, \
                    CAST(@@SESSION.innodb_lock_wait_timeout AS SIGNED) AS here, \
                    CAST(@@GLOBAL.innodb_lock_wait_timeout AS SIGNED) AS server \
             UNION ALL SELECT 'wait_timeout', CAST(@@SESSION.wait_timeout AS SIGNED), \
                    CAST(@@GLOBAL.wait_timeout AS SIGNED) \
             UNION ALL SELECT 'idle_transaction_timeout', \
                    CAST(@@SESSION.idle_transaction_timeout AS SIGNED), \
                    CAST(@@GLOBAL.idle_transaction_timeout AS SIGNED)) v \
             WHERE v.here <> v.server",
        )
        .fetch_all(&pool)
        .await
        .expect("read the session's variables");
        assert!(changed.is_empty(), "{mode:?}: left changed: {changed:?}");
    }
}

/// The suite again with `fencing=false`, in both modes: guards, `inspect`
/// and `capabilities()` carry no token, and everything else holds.
mod without_fencing {
    mod row {
        use lock_testkit::conformance::Harness;

        async fn harness() -> Harness {
            crate::harness_for("mode=row&fencing=false").await
        }

        lock_testkit::conformance_suite!(harness());
    }

    mod advisory {
        use lock_testkit::conformance::Harness;

        async fn harness() -> Harness {
            crate::harness_for("mode=advisory&fencing=false").await
        }

        lock_testkit::conformance_suite!(harness());
    }
}

/// The crate's `docs.md` opens with the capability checklist this backend
/// reports, in both modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_open_with_the_capability_checklist() {
    for mode in ["row", "advisory"] {
        let h = harness_for(&format!("mode={mode}")).await;
        lock_testkit::docs::assert_checklist(include_str!("../docs.md"), &h.lock.capabilities());
    }
}
