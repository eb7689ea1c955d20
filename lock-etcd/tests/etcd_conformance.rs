//! The conformance suite against the etcd that `scripts/services.sh` runs:
//! the single member (`DISTLOCK_TEST_ETCD_URL`) and the 3-member cluster
//! (`DISTLOCK_TEST_ETCD_CLUSTER_URL`), two independent clients each.

use lock_etcd::EtcdLock;
use lock_testkit::conformance::Harness;
use lock_testkit::faults::env;

async fn harness_for(var: &str) -> Harness {
    let url = env(var);
    Harness::of(async || EtcdLock::connect(&url).await.expect("connect to etcd")).await
}

mod single_member {
    use super::*;

    async fn harness() -> Harness {
        harness_for("DISTLOCK_TEST_ETCD_URL").await
    }

    lock_testkit::conformance_suite!(harness());
}

mod three_members {
    use super::*;

    async fn harness() -> Harness {
        harness_for("DISTLOCK_TEST_ETCD_CLUSTER_URL").await
    }

    lock_testkit::conformance_suite!(harness());
}

/// The crate's `docs.md` opens with the capability checklist this backend
/// reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_open_with_the_capability_checklist() {
    let h = harness_for("DISTLOCK_TEST_ETCD_URL").await;
    lock_testkit::docs::assert_checklist(include_str!("../docs.md"), &h.lock.capabilities());
}
