//! The conformance suite against the five Redis masters that
//! `scripts/services.sh` runs (`DISTLOCK_TEST_REDLOCK_URL`): once with all
//! five, and once with three nodes of which one is down for the whole run.
//!
//! Every set here waits [`NODE_TIMEOUT`] for a node's answer, not the
//! default 50 ms. A single attempt (`try_acquire`, or a competitor's try in
//! a race) fails with `QuorumNotReached` when a majority does not answer in
//! time, and the suite runs its cases in parallel on a small machine, often
//! beside a build, where the client's own threads and the servers can be
//! held up for longer than 50 ms. (A soak with three suites and a build
//! side by side once saw every master silent for over a second: their
//! fsyncs waited on the disk the build kept busy. `scripts/services.sh`
//! now keeps their files in memory.) The suite checks the contract; the
//! fault tests check the node timeout itself, at its default.

use std::time::Duration;

use lock_redlock::Redlock;
use lock_testkit::conformance::Harness;
use lock_testkit::faults::{env, upstreams_of, with_upstreams};

/// How long the suite's clients wait for a node's answer.
const NODE_TIMEOUT: Duration = Duration::from_secs(1);

/// `url` with the suite's node timeout.
fn with_node_timeout(url: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}node_timeout={}ms", NODE_TIMEOUT.as_millis())
}

/// The five masters, as `redlock://h1:p1,…,h5:p5`.
fn five() -> String {
    env("DISTLOCK_TEST_REDLOCK_URL")
}

/// The first two masters plus an address where nothing listens (port 1 on
/// loopback refuses connections): a three-node set with one node down.
/// This set has no margin: a single attempt needs both live nodes to
/// answer within the node timeout.
fn three_with_one_down() -> String {
    let url = five();
    let mut hosts = upstreams_of(&url);
    hosts.truncate(2);
    hosts.push("127.0.0.1:1".to_string());
    with_upstreams(&url, &hosts)
}

async fn harness_for(url: &str) -> Harness {
    let url = with_node_timeout(url);
    Harness::of(async || {
        Redlock::connect(&url)
            .await
            .expect("connect to the redlock nodes")
    })
    .await
}

mod five_nodes {
    use super::*;

    async fn harness() -> Harness {
        harness_for(&five()).await
    }

    lock_testkit::conformance_suite!(harness());
}

mod three_nodes_one_down {
    use super::*;

    async fn harness() -> Harness {
        let url = three_with_one_down();
        let probe = Redlock::connect(&with_node_timeout(&url))
            .await
            .expect("a majority is up");
        assert_eq!(probe.quorum(), (3, 2));
        assert!(format!("{probe:?}").contains("127.0.0.1:1/"), "{probe:?}");
        harness_for(&url).await
    }

    lock_testkit::conformance_suite!(harness());
}

/// The suite's lock cases again, on a Redlock built from five `redis::Client`s the
/// application made itself (`Redlock::with_clients`).
mod own_clients {
    use lock_redlock::{Redlock, RedlockConfig, redis};
    use lock_testkit::conformance::Harness;
    use lock_testkit::faults::upstreams_of;

    /// One client per master, as applications make them: RESP2, redis-rs's
    /// default.
    fn clients() -> Vec<redis::Client> {
        upstreams_of(&super::five())
            .iter()
            .map(|host| {
                redis::Client::open(format!("redis://{host}/").as_str())
                    .expect("the application's client")
            })
            .collect()
    }

    async fn harness() -> Harness {
        Harness::of(async || {
            let config = RedlockConfig::default().with_node_timeout(super::NODE_TIMEOUT);
            // The lock's own connections speak RESP3.
            Redlock::with_clients(clients(), config)
                .await
                .expect("a Redlock on the application's clients")
        })
        .await
    }

    // The lock cases: the other primitives run the same code on the
    // lock's own connections, whichever client they were made from.
    lock_testkit::lock_conformance_suite!(harness());

    /// No client: refused, typed.
    #[tokio::test]
    async fn no_client_is_refused() {
        match Redlock::with_clients(Vec::new(), RedlockConfig::default()).await {
            Err(lock_core::LockError::InvalidOptions { .. }) => {}
            Err(e) => panic!("no client gave {e:?}"),
            Ok(_) => panic!("no client was accepted"),
        }
    }
}

/// The crate's `docs.md` opens with the capability checklist this backend
/// reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_open_with_the_capability_checklist() {
    let h = harness_for(&five()).await;
    lock_testkit::docs::assert_checklist(include_str!("../docs.md"), &h.lock.capabilities());
}
