//! The conformance suite against the five Redis masters that
//! `scripts/services.sh` runs (`DISTLOCK_TEST_REDLOCK_URL`): once with all
//! five, and once with three nodes of which one is down for the whole run.

use std::sync::Arc;

use lock_core::testkit::{FaultHook, Harness, taken_away};
use lock_core::{DistributedLock, LockError, async_trait};
use lock_redlock::Redlock;

struct RedlockHook(Redlock);

#[async_trait]
impl FaultHook for RedlockHook {
    async fn take_away(&self, name: &str) -> Result<(), LockError> {
        taken_away(name, self.0.force_release(name).await?)
    }

    async fn queued(&self, name: &str) -> Result<Option<usize>, LockError> {
        self.0.queued(name).await.map(Some)
    }
}

/// The five masters, as `redlock://h1:p1,…,h5:p5`.
fn five() -> String {
    std::env::var("DISTLOCK_TEST_REDLOCK_URL")
        .expect("DISTLOCK_TEST_REDLOCK_URL is not set: run the tests through scripts/test.sh")
}

/// The first two masters plus an address where nothing listens (port 1 on
/// loopback refuses connections): a three-node set with one node down.
///
/// This set has no margin: a single attempt needs both live nodes to
/// answer within the node timeout. The suite runs its cases in parallel on
/// a small machine, where the client's own threads can be busy for longer
/// than the default 50 ms, so this set is given 250 ms; what it checks is
/// the contract with a node down, not latency (the fault tests check the
/// node timeout itself).
fn three_with_one_down() -> String {
    let url = five();
    let rest = url.strip_prefix("redlock://").expect("a redlock:// URL");
    let (hosts, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let two: Vec<&str> = hosts.split(',').take(2).collect();
    let sep = if tail.contains('?') { '&' } else { '?' };
    format!(
        "redlock://{},127.0.0.1:1{tail}{sep}node_timeout_ms=250",
        two.join(",")
    )
}

async fn harness_for(url: &str) -> Harness {
    let lock = Redlock::connect(url)
        .await
        .expect("connect to the redlock nodes");
    let other = Redlock::connect(url)
        .await
        .expect("connect to the redlock nodes");
    Harness {
        hook: Arc::new(RedlockHook(lock.clone())),
        lock: Arc::new(lock),
        other: Arc::new(other),
    }
}

mod five_nodes {
    use super::*;

    async fn harness() -> Harness {
        harness_for(&five()).await
    }

    lock_core::conformance_suite!(harness());
}

mod three_nodes_one_down {
    use super::*;

    async fn harness() -> Harness {
        let url = three_with_one_down();
        let probe = Redlock::connect(&url).await.expect("a majority is up");
        assert_eq!(probe.quorum(), (3, 2));
        assert!(format!("{probe:?}").contains("127.0.0.1:1/"), "{probe:?}");
        harness_for(&url).await
    }

    lock_core::conformance_suite!(harness());
}
