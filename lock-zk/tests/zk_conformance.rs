//! The conformance suite against the ZooKeeper that `scripts/services.sh`
//! runs: the standalone server (`DISTLOCK_TEST_ZK_URL`), the same server
//! over TLS (`DISTLOCK_TEST_ZK_TLS_URL`) and the 3-node ensemble
//! (`DISTLOCK_TEST_ZK_ENSEMBLE_URL`).

use lock_testkit::conformance::Harness;
use lock_testkit::faults::env;
use lock_zk::ZkLock;

async fn harness_for(var: &str) -> Harness {
    let url = env(var);
    Harness::of(async || ZkLock::connect(&url).await.expect("connect to zookeeper")).await
}

mod standalone {
    use super::*;

    async fn harness() -> Harness {
        harness_for("DISTLOCK_TEST_ZK_URL").await
    }

    lock_testkit::conformance_suite!(harness());
}

mod ensemble {
    use super::*;

    async fn harness() -> Harness {
        harness_for("DISTLOCK_TEST_ZK_ENSEMBLE_URL").await
    }

    lock_testkit::conformance_suite!(harness());
}

mod tls {
    use super::*;

    async fn harness() -> Harness {
        harness_for("DISTLOCK_TEST_ZK_TLS_URL").await
    }

    lock_testkit::conformance_suite!(harness());
}

/// The crate's `docs.md` opens with the capability checklist this backend
/// reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_open_with_the_capability_checklist() {
    let h = harness_for("DISTLOCK_TEST_ZK_URL").await;
    lock_testkit::docs::assert_checklist(include_str!("../docs.md"), &h.lock.capabilities());
}
