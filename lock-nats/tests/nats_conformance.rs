//! The conformance suite against the NATS servers that `scripts/services.sh`
//! runs: one server (`DISTLOCK_TEST_NATS_URL`) and a three-server cluster
//! whose bucket has three replicas (`DISTLOCK_TEST_NATS_CLUSTER_URL`), two
//! independent clients each.

use lock_nats::NatsLock;
use lock_testkit::conformance::Harness;
use lock_testkit::faults::env;

async fn harness_for(var: &str) -> Harness {
    let url = env(var);
    Harness::of(async || NatsLock::connect(&url).await.expect("connect to NATS")).await
}

mod one_server {
    use super::*;

    async fn harness() -> Harness {
        harness_for("DISTLOCK_TEST_NATS_URL").await
    }

    lock_testkit::conformance_suite!(harness());
}

mod three_replicas {
    use super::*;

    async fn harness() -> Harness {
        harness_for("DISTLOCK_TEST_NATS_CLUSTER_URL").await
    }

    lock_testkit::conformance_suite!(harness());
}

/// The suite's lock cases again, on locks built from an `async_nats::Client`
/// the application made itself (`NatsLock::with_client`).
mod own_client {
    use std::time::Duration;

    use lock_nats::{NatsConfig, NatsLock, async_nats};
    use lock_testkit::conformance::Harness;
    use lock_testkit::faults::{env, upstreams_of};

    async fn harness() -> Harness {
        let servers = upstreams_of(&env("DISTLOCK_TEST_NATS_URL"));
        Harness::of(async || {
            let client = async_nats::ConnectOptions::new()
                .request_timeout(Some(Duration::from_secs(2)))
                .connect(servers.as_slice())
                .await
                .expect("the application's client");
            NatsLock::with_client(client, NatsConfig::default())
                .await
                .expect("a lock on the application's client")
        })
        .await
    }

    // The lock cases: the other primitives run the same code on the
    // lock's own client, whichever way it was made.
    lock_testkit::lock_conformance_suite!(harness());
}

/// The crate's `docs.md` opens with the capability checklist this backend
/// reports, one column per kind of stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_open_with_the_capability_checklist() {
    let docs = include_str!("../docs.md");
    for (var, column) in [
        ("DISTLOCK_TEST_NATS_URL", "one server"),
        ("DISTLOCK_TEST_NATS_CLUSTER_URL", "3+ replicas"),
    ] {
        let h = harness_for(var).await;
        lock_testkit::docs::assert_checklist_column(docs, column, &h.lock.capabilities());
    }
}
