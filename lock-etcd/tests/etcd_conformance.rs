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

/// The suite's lock cases again, on locks built from an `etcd_client::Client` the
/// application made itself (`EtcdLock::with_client`).
mod own_client {
    use std::time::Duration;

    use lock_etcd::etcd_client::{Client, ConnectOptions};
    use lock_etcd::{EtcdConfig, EtcdLock};
    use lock_testkit::conformance::Harness;
    use lock_testkit::faults::{env, upstreams_of};

    async fn harness() -> Harness {
        let endpoints = upstreams_of(&env("DISTLOCK_TEST_ETCD_URL"));
        Harness::of(async || {
            let options = ConnectOptions::new()
                .with_timeout(Duration::from_secs(2))
                .with_keep_alive(Duration::from_secs(5), Duration::from_secs(2));
            let client = Client::connect(&endpoints, Some(options))
                .await
                .expect("the application's client");
            EtcdLock::with_client(client, EtcdConfig::default())
                .await
                .expect("a lock on the application's client")
        })
        .await
    }

    // The lock cases: the other primitives run the same code on the
    // lock's own connections, whichever client they were made from.
    lock_testkit::lock_conformance_suite!(harness());
}

/// The crate's `docs.md` opens with the capability checklist this backend
/// reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_open_with_the_capability_checklist() {
    let h = harness_for("DISTLOCK_TEST_ETCD_URL").await;
    lock_testkit::docs::assert_checklist(include_str!("../docs.md"), &h.lock.capabilities());
}
