//! The conformance suite against the MariaDB that `scripts/services.sh`
//! runs (`DISTLOCK_TEST_MYSQL_URL`), in row mode and in advisory mode.

use std::sync::Arc;

use lock_core::testkit::{FaultHook, Harness, taken_away};
use lock_core::{DistributedLock, LockError, async_trait};
use lock_sql::MySqlLock;

struct MySqlHook(MySqlLock);

#[async_trait]
impl FaultHook for MySqlHook {
    async fn take_away(&self, name: &str) -> Result<(), LockError> {
        taken_away(name, self.0.force_release(name).await?)
    }
}

fn url(mode: &str) -> String {
    let base = std::env::var("DISTLOCK_TEST_MYSQL_URL")
        .expect("DISTLOCK_TEST_MYSQL_URL is not set: run the tests through scripts/test.sh");
    format!("{base}?mode={mode}")
}

async fn harness_for(mode: &str) -> Harness {
    let lock = MySqlLock::connect(&url(mode))
        .await
        .expect("connect to mysql");
    let other = MySqlLock::connect(&url(mode))
        .await
        .expect("connect to mysql");
    Harness {
        hook: Arc::new(MySqlHook(lock.clone())),
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
