//! The conformance suite against the etcd that `scripts/services.sh` runs:
//! the single member (`DISTLOCK_TEST_ETCD_URL`) and the 3-member cluster
//! (`DISTLOCK_TEST_ETCD_CLUSTER_URL`), two independent clients each.

use std::sync::Arc;

use lock_core::testkit::{FaultHook, Harness, taken_away};
use lock_core::{DistributedLock, LockError, async_trait};
use lock_etcd::EtcdLock;

struct EtcdHook(EtcdLock);

#[async_trait]
impl FaultHook for EtcdHook {
    async fn take_away(&self, name: &str) -> Result<(), LockError> {
        taken_away(name, self.0.force_release(name).await?)
    }

    async fn queued(&self, name: &str) -> Result<Option<usize>, LockError> {
        self.0.queued(name).await.map(Some)
    }
}

fn url(var: &str) -> String {
    std::env::var(var)
        .unwrap_or_else(|_| panic!("{var} is not set: run the tests through scripts/test.sh"))
}

async fn harness_for(var: &str) -> Harness {
    let lock = EtcdLock::connect(&url(var)).await.expect("connect to etcd");
    let other = EtcdLock::connect(&url(var)).await.expect("connect to etcd");
    Harness {
        hook: Arc::new(EtcdHook(lock.clone())),
        lock: Arc::new(lock),
        other: Arc::new(other),
    }
}

mod single_member {
    use super::*;

    async fn harness() -> Harness {
        harness_for("DISTLOCK_TEST_ETCD_URL").await
    }

    lock_core::conformance_suite!(harness());
}

mod three_members {
    use super::*;

    async fn harness() -> Harness {
        harness_for("DISTLOCK_TEST_ETCD_CLUSTER_URL").await
    }

    lock_core::conformance_suite!(harness());
}
