//! The conformance suite against the Postgres that `scripts/services.sh`
//! runs (`DISTLOCK_TEST_POSTGRES_URL`), in row mode and in advisory mode.

use std::sync::Arc;

use lock_core::testkit::{FaultHook, Harness, taken_away};
use lock_core::{DistributedLock, LockError, async_trait};
use lock_sql::PgLock;

struct PgHook(PgLock);

#[async_trait]
impl FaultHook for PgHook {
    async fn take_away(&self, name: &str) -> Result<(), LockError> {
        taken_away(name, self.0.force_release(name).await?)
    }

    async fn queued(&self, name: &str) -> Result<Option<usize>, LockError> {
        self.0.queued(name).await.map(Some)
    }
}

fn url(mode: &str) -> String {
    let base = std::env::var("DISTLOCK_TEST_POSTGRES_URL")
        .expect("DISTLOCK_TEST_POSTGRES_URL is not set: run the tests through scripts/test.sh");
    format!("{base}?mode={mode}")
}

async fn harness_for(mode: &str) -> Harness {
    let lock = PgLock::connect(&url(mode))
        .await
        .expect("connect to postgres");
    let other = PgLock::connect(&url(mode))
        .await
        .expect("connect to postgres");
    Harness {
        hook: Arc::new(PgHook(lock.clone())),
        lock: Arc::new(lock),
        other: Arc::new(other),
    }
}

mod row {
    use super::*;

    async fn harness() -> Harness {
        harness_for("row").await
    }

    lock_core::conformance_suite!(harness());
}

mod advisory {
    use super::*;

    async fn harness() -> Harness {
        harness_for("advisory").await
    }

    lock_core::conformance_suite!(harness());
}
