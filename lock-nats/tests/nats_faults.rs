//! Faults against the NATS servers of `scripts/services.sh`: a holder
//! process killed with SIGKILL and one frozen with SIGSTOP, the single
//! server killed and frozen, tokens across a killed server, and the
//! three-server cluster losing its stream leader (locks kept) and then
//! its majority (typed errors, `lost()` before the deadline).
//!
//! These tests stop servers, so they run one at a time (a shared mutex) in
//! this binary, apart from the conformance suite, and restart every server
//! they stopped when they end, even on failure.

use std::time::Duration;

use lock_core::{DistributedLock, LockOptions, Wait};
use lock_nats::{NatsLock, async_nats};
use lock_testkit::faults::{Restore, acquires_again, env, one_at_a_time, services, unique};
use tokio::sync::Mutex;
use tokio::time::Instant;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// The TTL of the test locks.
const TTL: Duration = Duration::from_secs(3);

/// In the cluster, a lease outlasts the election of a new stream leader:
/// nats-server's Raft waits 4 to 9 s without a leader's heartbeat before
/// it elects another, and renewals fail meanwhile (`docs.md`).
const CLUSTER_TTL: Duration = Duration::from_secs(15);

/// A client whose requests give up after a second.
async fn client(url: &str) -> NatsLock {
    let sep = if url.contains('?') { '&' } else { '?' };
    NatsLock::connect(&format!("{url}{sep}request_timeout=1s&connect_timeout=1s"))
        .await
        .expect("connect")
}

async fn one_server() -> NatsLock {
    client(&env("DISTLOCK_TEST_NATS_URL")).await
}

async fn cluster() -> NatsLock {
    client(&env("DISTLOCK_TEST_NATS_CLUSTER_URL")).await
}

fn opts(ttl: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl).wait(Wait::No)
}

/// The server (`nats1`…`nats3`) that leads the bucket's stream.
async fn stream_leader() -> String {
    let servers = lock_testkit::faults::upstreams_of(&env("DISTLOCK_TEST_NATS_CLUSTER_URL"));
    for _ in 0..50 {
        if let Ok(c) = async_nats::connect(servers.as_slice()).await {
            let js = async_nats::jetstream::new(c);
            if let Ok(mut stream) = js.get_stream("KV_distlock").await
                && let Ok(info) = stream.info().await
                && let Some(leader) = info.cluster.as_ref().and_then(|c| c.leader.clone())
            {
                return leader;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("no server leads the bucket's stream");
}

/// See `lock_testkit::faults::killed_holder_frees_the_lock`: the message's
/// TTL (3 s) frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_frees_the_lock_within_its_ttl() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::killed_holder_frees_the_lock(
        "a_killed_holder_frees_the_lock_within_its_ttl",
        one_server,
        opts(TTL),
        TTL,
    )
    .await;
}

/// See `lock_testkit::faults::frozen_holder_loses_its_lock_to_a_later_token`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_loses_its_lock_to_a_later_token() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::frozen_holder_loses_its_lock_to_a_later_token(
        "a_frozen_holder_loses_its_lock_to_a_later_token",
        one_server,
        opts(TTL),
        TTL,
    )
    .await;
}

/// See `lock_testkit::faults::server_failure_gives_transient_errors`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_gives_transient_errors() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::server_failure_gives_transient_errors(one_server, &["nats"], opts(TTL))
        .await;
}

/// See `lock_testkit::faults::frozen_server_bounds_waits_and_releases`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_bounds_waits_and_releases() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::frozen_server_bounds_waits_and_releases(one_server, &["nats"], opts(TTL))
        .await;
}

/// Forty grants, the single server killed with SIGKILL and started again,
/// forty grants more: the tokens rise strictly across the crash (the
/// stream's last sequence is kept in its files, deleted messages too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_across_a_killed_server() {
    let _serial = one_at_a_time(&SERIAL).await;
    let _restore = Restore::servers(["nats"]);
    let name = unique("tokens-across-kill");
    let mut tokens = Vec::new();
    let locks = one_server().await;
    for _ in 0..40 {
        let g = locks.acquire(&name, &opts(TTL)).await.expect("before");
        tokens.push(g.fencing_token().expect("token"));
        assert!(g.release().await.expect("release"));
    }
    services(&["kill", "nats"]);
    services(&["start", "nats"]);
    let locks = one_server().await;
    acquires_again(&locks, &opts(TTL), Duration::from_secs(30)).await;
    for _ in 0..40 {
        let g = locks.acquire(&name, &opts(TTL)).await.expect("after");
        tokens.push(g.fencing_token().expect("token"));
        assert!(g.release().await.expect("release"));
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens went back across the crash: {tokens:?}"
    );
}

/// The cluster loses the server leading the bucket's stream: a new leader
/// is elected, the holder's renewals go on and its lock is kept, the
/// waiter stays out, and the release hands the lock to the waiter with a
/// larger token. Then a second server dies: without a majority a grant
/// fails with a transient error, and the holder's `lost()` fires, no later
/// than its validity deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_keeps_its_locks_past_its_leader_and_reports_the_loss_of_its_majority() {
    let _serial = one_at_a_time(&SERIAL).await;
    let _restore = Restore::servers(["nats1", "nats2", "nats3"]);
    let (locks, other) = (cluster().await, cluster().await);
    assert!(
        locks.capabilities().survives_server_failure,
        "this test proves the claim `survives_server_failure`; the backend must make it"
    );
    let name = unique("leader");
    let holder = locks
        .acquire(&name, &opts(CLUSTER_TTL))
        .await
        .expect("acquire");
    let first = holder.fencing_token().expect("token");
    let waiter = tokio::spawn({
        let (other, name) = (other.clone(), name.clone());
        async move {
            let o = opts(CLUSTER_TTL).wait(Wait::UpTo(Duration::from_secs(40)));
            other.acquire(&name, &o).await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    let leader = stream_leader().await;
    services(&["kill", &leader]);
    tokio::time::sleep(CLUSTER_TTL + Duration::from_secs(1)).await;
    assert_eq!(
        holder.is_lost(),
        None,
        "losing the stream's leader cost the lock"
    );
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    assert!(holder.release().await.expect("release after the election"));
    let handed = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was woken")
        .expect("waiter task")
        .expect("the waiter acquired");
    assert!(handed.fencing_token().expect("token") > first);
    let deadline = handed.validity_deadline().expect("a deadline");

    // A second server dies: no majority is left.
    let second = ["nats1", "nats2", "nats3"]
        .into_iter()
        .find(|s| *s != leader)
        .expect("another server");
    services(&["kill", second]);
    let started = Instant::now();
    match locks.try_acquire(&unique("no-majority"), &opts(TTL)).await {
        Err(e) => assert!(e.is_transient(), "not transient without a majority: {e:?}"),
        Ok(g) => panic!(
            "granted without a majority: {:?}",
            g.map(|g| g.fencing_token())
        ),
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the refused grant took {:?}",
        started.elapsed()
    );
    let reason = tokio::time::timeout(CLUSTER_TTL + Duration::from_secs(2), handed.lost())
        .await
        .expect("lost() fired without a majority");
    assert!(Instant::now() <= deadline + Duration::from_millis(200));
    eprintln!("without a majority the holder's lost() said {reason:?}");
}
