//! The conformance suite against the Postgres that `scripts/services.sh`
//! runs (`DISTLOCK_TEST_POSTGRES_URL`), in row mode and in advisory mode.

use lock_sql::PgLock;
use lock_testkit::conformance::Harness;
use lock_testkit::faults::env;

/// A harness on locks from the server's URL with `query` as its options.
async fn harness_for(query: &str) -> Harness {
    let url = format!("{}?{query}", env("DISTLOCK_TEST_POSTGRES_URL"));
    Harness::of(async || PgLock::connect(&url).await.expect("connect")).await
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

/// The suite again, on locks built from a `PgPool` the application made
/// itself (`PgLock::with_pool`), in both modes.
mod own_pool {
    use lock_sql::{PgLock, SqlConfig, SqlMode};
    use lock_testkit::conformance::Harness;
    use lock_testkit::faults::env;
    use sqlx::postgres::PgPoolOptions;

    async fn harness_for(mode: SqlMode) -> Harness {
        let url = env("DISTLOCK_TEST_POSTGRES_URL");
        Harness::of(async || {
            let pool = PgPoolOptions::new()
                .max_connections(32)
                .connect(&url)
                .await
                .expect("the application's pool");
            let config = SqlConfig {
                mode,
                ..SqlConfig::default()
            };
            PgLock::with_pool(pool, config)
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
/// reports, in both modes (a column each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_open_with_the_capability_checklist() {
    for mode in ["row", "advisory"] {
        let h = harness_for(&format!("mode={mode}")).await;
        lock_testkit::docs::assert_checklist_column(
            include_str!("../docs.md"),
            &format!("postgres {mode}"),
            &h.lock.capabilities(),
        );
    }
}
