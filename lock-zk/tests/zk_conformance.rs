//! The conformance suite against the ZooKeeper that `scripts/services.sh`
//! runs: the standalone server (`DISTLOCK_TEST_ZK_URL`), the same server
//! over TLS (`DISTLOCK_TEST_ZK_TLS_URL`) and the 3-node ensemble
//! (`DISTLOCK_TEST_ZK_ENSEMBLE_URL`).

use std::sync::Arc;

use lock_core::testkit::{FaultHook, Harness, taken_away};
use lock_core::{DistributedLock, LockError, async_trait};
use lock_zk::ZkLock;

struct ZkHook(ZkLock);

#[async_trait]
impl FaultHook for ZkHook {
    async fn take_away(&self, name: &str) -> Result<(), LockError> {
        taken_away(name, self.0.force_release(name).await?)
    }

    async fn queued(&self, name: &str) -> Result<Option<usize>, LockError> {
        self.0.queued(name).await.map(Some)
    }
}

async fn harness_for(var: &str) -> Harness {
    let url = lock_core::faultkit::env(var);
    let lock = ZkLock::connect(&url).await.expect("connect to zookeeper");
    let other = ZkLock::connect(&url).await.expect("connect to zookeeper");
    Harness {
        hook: Arc::new(ZkHook(lock.clone())),
        lock: Arc::new(lock),
        other: Arc::new(other),
    }
}

mod standalone {
    use super::*;

    async fn harness() -> Harness {
        harness_for("DISTLOCK_TEST_ZK_URL").await
    }

    lock_core::conformance_suite!(harness());
}

mod ensemble {
    use super::*;

    async fn harness() -> Harness {
        harness_for("DISTLOCK_TEST_ZK_ENSEMBLE_URL").await
    }

    lock_core::conformance_suite!(harness());
}

mod tls {
    use super::*;

    async fn harness() -> Harness {
        harness_for("DISTLOCK_TEST_ZK_TLS_URL").await
    }

    lock_core::conformance_suite!(harness());
}
