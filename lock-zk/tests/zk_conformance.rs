//! The conformance suite against the ZooKeeper that `scripts/services.sh`
//! runs: the standalone server (`DISTLOCK_TEST_ZK_URL`) and the 3-node
//! ensemble (`DISTLOCK_TEST_ZK_ENSEMBLE_URL`); the lock cases over TLS
//! (`DISTLOCK_TEST_ZK_TLS_URL`) and on the application's own client.

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

    // The lock cases: TLS is the session's transport, under every
    // primitive alike.
    lock_testkit::lock_conformance_suite!(harness());
}

/// The lock cases again, on locks built from a `zookeeper_client::Client` the
/// application made itself (`ZkLock::with_client`), on the ensemble, with
/// a root of the application's choosing.
mod own_client {
    use lock_testkit::conformance::Harness;
    use lock_testkit::faults::{env, upstreams_of};
    use lock_zk::{ZkConfig, ZkLock, zookeeper_client};
    use std::time::Duration;

    async fn harness() -> Harness {
        let hosts = upstreams_of(&env("DISTLOCK_TEST_ZK_ENSEMBLE_URL")).join(",");
        Harness::of(async || {
            let client = zookeeper_client::Client::connector()
                .with_session_timeout(Duration::from_secs(10))
                .connect(&hosts)
                .await
                .expect("the application's client");
            let config = ZkConfig::default().with_root("/app/locks");
            ZkLock::with_client(client, config)
                .await
                .expect("a lock on the application's client")
        })
        .await
    }

    // The lock cases: the other primitives run the same code on the
    // lock's session, whichever client it was made from.
    lock_testkit::lock_conformance_suite!(harness());
}

/// A lock on the application's client refuses a root that is not a plain
/// absolute path, and, once the client's session is closed, answers every
/// acquisition with `Unavailable` naming the cause (it cannot open a
/// session of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_on_the_applications_client_ends_with_its_session() {
    use lock_core::{DistributedLock, LockError, LockOptions, Wait};
    use lock_zk::{ZkConfig, ZkLock, zookeeper_client};
    let hosts = lock_testkit::faults::upstreams_of(&env("DISTLOCK_TEST_ZK_URL")).join(",");
    let connect = async || {
        zookeeper_client::Client::connector()
            .connect(&hosts)
            .await
            .expect("the application's client")
    };
    for root in ["locks", "/a//b", "/a/../b", "/"] {
        let config = ZkConfig::default().with_root(root);
        let refused = ZkLock::with_client(connect().await, config).await;
        assert!(
            matches!(refused, Err(LockError::InvalidOptions { .. })),
            "root {root:?}: {refused:?}"
        );
    }
    let client = connect().await;
    let lock = ZkLock::with_client(client.clone(), ZkConfig::default())
        .await
        .expect("with_client");
    let opts = LockOptions::new().wait(Wait::No);
    let g = lock
        .acquire("own-client/closing", &opts)
        .await
        .expect("acquire");
    // Take the session over with a second client and close it: the
    // application's client finds its session gone.
    // A connection under load may take longer than the client's default
    // (2/5 of the session timeout): a longer bound, and a few tries.
    let mut tries = 0;
    let thief = loop {
        tries += 1;
        match zookeeper_client::Client::connector()
            .with_session(client.session().clone())
            .with_connection_timeout(std::time::Duration::from_secs(10))
            .connect(&hosts)
            .await
        {
            Ok(thief) => break thief,
            Err(e) if tries < 3 => eprintln!("taking the session over: {e}; again"),
            Err(e) => panic!("the session taken over: {e}"),
        }
    };
    drop(thief);
    let reason = tokio::time::timeout(std::time::Duration::from_secs(5), g.lost())
        .await
        .expect("the guard learns its session is gone");
    assert!(
        matches!(reason, lock_core::LossReason::ConnectionLost { .. }),
        "{reason:?}"
    );
    let mut states = client.state_watcher();
    tokio::time::timeout(std::time::Duration::from_secs(15), async {
        while !client.state().is_terminated() {
            states.changed().await;
        }
    })
    .await
    .expect("the application's client sees its session end");
    match lock.acquire("own-client/after", &opts).await {
        Err(LockError::Unavailable { reason, .. }) => {
            assert!(reason.contains("new client"), "{reason}")
        }
        other => panic!("after the session closed: {other:?}"),
    }
}

/// The crate's `docs.md` opens with the capability checklist this backend
/// reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_open_with_the_capability_checklist() {
    let h = harness_for("DISTLOCK_TEST_ZK_URL").await;
    lock_testkit::docs::assert_checklist(include_str!("../docs.md"), &h.lock.capabilities());
}
