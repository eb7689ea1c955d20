//! Faults against the five Redis masters of `scripts/services.sh`: nodes
//! killed while a lock is held and while one is awaited, a majority lost
//! and restored, a node frozen with SIGSTOP, a majority frozen briefly and
//! for good under a waiting acquire, failed acquisitions inspected
//! on every node, fencing tokens across node restarts, and the token
//! `inspect` reports beside a node that granted late.
//!
//! These tests stop nodes, so they run one at a time (a shared mutex) in
//! this binary, apart from the conformance suite, and restart every node
//! when they end, even on failure.

use std::time::Duration;

use lock_core::raw::RawGuard;
use lock_core::{DistributedLock, LockError, LockOptions, LockSetExt, LossReason, Wait};
use lock_redlock::Redlock;
use lock_testkit::faults::{
    Restore, acquires_again, env, one_at_a_time, services, unique, upstreams_of,
};
use tokio::sync::Mutex;
use tokio::time::Instant;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// The node timeout the test clients use (the default).
const NODE_TIMEOUT: Duration = Duration::from_millis(50);

/// The node timeout of the clients in the tests about surviving node
/// failures: what they check is the quorum, not the latency, and on a
/// loaded machine a live survivor can take longer than 50 ms to answer,
/// which with two of five nodes down already costs the quorum.
const PATIENT_NODE_TIMEOUT: Duration = Duration::from_secs(1);

/// `host:port` of each of the five nodes.
fn hosts() -> Vec<String> {
    upstreams_of(&env("DISTLOCK_TEST_REDLOCK_URL"))
}

/// A client of all five nodes with the default node timeout.
async fn client() -> Redlock {
    client_with(NODE_TIMEOUT).await
}

/// A client of all five nodes that waits `node_timeout` for each node.
async fn client_with(node_timeout: Duration) -> Redlock {
    let url = format!(
        "redlock://{}?node_timeout_ms={}&connect_timeout_ms=300",
        hosts().join(","),
        node_timeout.as_millis()
    );
    Redlock::connect(&url).await.expect("connect")
}

/// A direct connection to node `i` (0-based), to inspect or plant keys.
async fn node(i: usize) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://{}", hosts()[i]))
        .expect("node url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to node")
}

fn key(name: &str) -> String {
    // The key layout of lock-redis with the default prefix; the names used
    // here contain no characters that need escaping.
    format!("distlock:{{{name}}}")
}

fn opts(ttl_ms: u64) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_millis(ttl_ms))
        .wait(Wait::No)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_loss_is_survived_majority_loss_is_reported_and_recovered() {
    let _serial = one_at_a_time(&SERIAL).await;
    let _restore = Restore::servers(["redlock1", "redlock2", "redlock3", "redlock4", "redlock5"]);
    let locks = client_with(PATIENT_NODE_TIMEOUT).await;
    let other = client_with(PATIENT_NODE_TIMEOUT).await;
    assert!(
        locks.capabilities().survives_server_failure,
        "this test proves the claim `survives_server_failure`; the backend must make it"
    );
    let name = unique("minority");
    // A 3 s lease, renewed every second: the case is about a minority
    // loss, not about a renewal stalled by the loaded machine (a 1.5 s
    // lease once lapsed to a late renewal under the soak).
    let renewed = LockOptions::new().ttl(Duration::from_secs(3));
    let holder = locks.acquire(&name, &renewed).await.expect("acquire");
    let first = holder.fencing_token().expect("token");

    // A waiter queues, then two of five nodes die under the holder and the
    // waiter.
    let waiter = tokio::spawn({
        let (other, name) = (other.clone(), name.clone());
        async move {
            let opts = LockOptions::new()
                .ttl(Duration::from_millis(1500))
                .wait_timeout(Duration::from_secs(10));
            other.acquire(&name, &opts).await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The lock on every node first: a grant a bare majority made (a
    // request that did not land, the waiter's attempt there first, say) is
    // on every node again once a renewal has taken the missing one back;
    // a minority lost before that can take the grant's majority with it
    // (the docs' Renewal section). This case is the minority lost after.
    let mut conns = Vec::new();
    for i in 0..5 {
        conns.push(node(i).await);
    }
    held_on_every_node(&mut conns, &name).await;
    services(&["kill", "redlock4"]);
    services(&["kill", "redlock5"]);

    // The watchdog keeps the lock on the three survivors past its TTL.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(holder.is_lost(), None, "a minority loss cost the lock");
    assert!(!waiter.is_finished(), "the waiter got a held lock");

    // A new acquisition with two nodes down (their connections refused):
    // at most one node timeout more.
    let start = Instant::now();
    let fresh = locks
        .try_acquire(&unique("two-down"), &opts(3000))
        .await
        .expect("a majority is up")
        .expect("free");
    let two_down = start.elapsed();
    assert!(
        two_down < PATIENT_NODE_TIMEOUT + Duration::from_millis(100),
        "{two_down:?}"
    );
    assert!(fresh.release().await.expect("release"));

    // The waiter gets the lock once it is released.
    assert!(holder.release().await.expect("release"));
    let handed = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was woken")
        .expect("waiter task")
        .expect("the waiter acquired");
    assert!(handed.fencing_token().expect("token") > first);

    // A third node dies: acquisitions fail with QuorumNotReached, promptly,
    // and the held lock's lost() fires by its validity deadline.
    let watcher = tokio::spawn(async move {
        let reason = handed.lost().await;
        (reason, Instant::now(), handed)
    });
    services(&["kill", "redlock3"]);
    let start = Instant::now();
    let refused = locks.try_acquire(&unique("three-down"), &opts(3000)).await;
    let three_down = start.elapsed();
    match refused {
        Err(LockError::QuorumNotReached {
            acquired,
            needed,
            causes,
        }) => {
            assert!(acquired < needed, "{acquired} of {needed}");
            assert_eq!(needed, 3);
            assert_eq!(causes.len(), 3, "{causes:?}");
        }
        other => panic!("expected QuorumNotReached, got {other:?}"),
    }
    assert!(three_down < Duration::from_millis(500), "{three_down:?}");
    let (reason, fired, handed) = tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("lost() fired")
        .expect("watcher");
    let deadline = handed.validity_deadline().expect("deadline");
    assert_eq!(reason, LossReason::DeadlinePassed);
    let late = fired.saturating_duration_since(deadline);
    // Before the nodes' leases (a safety margin past the deadline) end,
    // so before anyone else could be granted the lock.
    let margin = handed.lease().safety_margin();
    assert!(
        late < margin,
        "lost() fired {late:?} after the deadline, after the nodes' leases ({margin:?} past it) had run out"
    );
    eprintln!(
        "redlock faults: acquire with 2 of 5 down {two_down:?}; with 3 down QuorumNotReached after {three_down:?}; lost() {late:?} after the validity deadline"
    );

    // The nodes come back: the same clients work again.
    for i in 3..=5 {
        services(&["start", &format!("redlock{i}")]);
    }
    let recovered = acquires_again(&other, &opts(3000), Duration::from_secs(10)).await;
    eprintln!(
        "redlock faults: recovered {:?} after the restart",
        recovered
    );
}

/// The nodes that answer an acquisition last still get the lock: here
/// nodes 4 and 5 have lost their script cache (as after a restart), so
/// their first acquire takes three round trips and they answer after the
/// majority of the other three has granted. Their requests run on, so the
/// lock then survives the loss of two of the nodes that answered first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nodes_that_answer_last_still_get_the_lock() {
    let _serial = one_at_a_time(&SERIAL).await;
    let _restore = Restore::servers(["redlock1", "redlock2", "redlock3", "redlock4", "redlock5"]);
    let locks = client_with(PATIENT_NODE_TIMEOUT).await;
    let mut conns = Vec::new();
    for i in 0..5 {
        conns.push(node(i).await);
    }
    flush_scripts(&mut conns[3..]).await;
    let name = unique("last");
    let holder = locks
        .acquire(&name, &LockOptions::new().ttl(Duration::from_secs(3)))
        .await
        .expect("acquire");
    held_on_every_node(&mut conns, &name).await;

    // Two of the first three go: the lock lives on nodes 3 to 5 past its
    // TTL.
    services(&["kill", "redlock1"]);
    services(&["kill", "redlock2"]);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(holder.is_lost(), None, "a minority loss cost the lock");
    assert!(holder.release().await.expect("release"));
}

/// As [`the_nodes_that_answer_last_still_get_the_lock`], for a lock set
/// taken in one request per node: once a majority granted the set, the
/// slower nodes' set scripts run on (here nodes 4 and 5 have lost their
/// script cache and stall while the set is asked for), so every node ends
/// up holding it and the loss of any minority leaves it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nodes_that_answer_last_still_get_the_set() {
    let _serial = one_at_a_time(&SERIAL).await;
    let _restore = Restore::servers(["redlock1", "redlock2", "redlock3", "redlock4", "redlock5"]);
    let locks = client_with(PATIENT_NODE_TIMEOUT).await;
    let mut conns = Vec::new();
    for i in 0..5 {
        conns.push(node(i).await);
    }
    // Every node has the set script cached, then nodes 4 and 5 lose it:
    // the first three answer in one round trip, the last two in three.
    let warm = [unique("warm-set"), unique("warm-set")];
    let warmed = locks
        .try_acquire_all(&warm, &LockOptions::new())
        .await
        .expect("try_acquire_all")
        .expect("a free set");
    assert!(warmed.release().await.expect("release"));
    flush_scripts(&mut conns[3..]).await;
    // Nodes 4 and 5 also stall while the set is asked for: their answer
    // (NOSCRIPT, then the set script loaded and called again) comes after
    // the majority of the first three has granted.
    services(&["pause", "redlock4"]);
    services(&["pause", "redlock5"]);
    let names = [unique("last-set"), unique("last-set")];
    let set = locks
        .try_acquire_all(&names, &LockOptions::new().ttl(Duration::from_secs(3)))
        .await
        .expect("try_acquire_all")
        .expect("a free set");
    services(&["resume", "redlock4"]);
    services(&["resume", "redlock5"]);
    for name in &names {
        held_on_every_node(&mut conns, name).await;
    }

    services(&["kill", "redlock1"]);
    services(&["kill", "redlock2"]);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(set.is_lost().is_none(), "a minority loss cost the set");
    assert!(set.release().await.expect("release"));
}

/// A held, renewed lock whose key vanishes from one node after another
/// (nodes restarted without their data, one at a time, a renewal apart)
/// stays held: each renewal that a majority answered takes the lock back
/// on the nodes that lost it, so the majority never shrinks below three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_lock_takes_back_the_nodes_that_lost_it() {
    let _serial = one_at_a_time(&SERIAL).await;
    let locks = client_with(PATIENT_NODE_TIMEOUT).await;
    let mut conns = Vec::new();
    for i in 0..5 {
        conns.push(node(i).await);
    }
    let name = unique("taken-back");
    let ttl = Duration::from_secs(3);
    let holder = locks
        .acquire(&name, &LockOptions::new().ttl(ttl))
        .await
        .expect("acquire");
    let owner = held_on_every_node(&mut conns, &name).await;
    for (lost_it, conn) in conns.iter_mut().take(3).enumerate() {
        let _: i64 = redis::cmd("DEL")
            .arg(key(&name))
            .query_async(conn)
            .await
            .expect("the node loses the key");
        // More than one renewal (every third of the TTL) later.
        tokio::time::sleep(ttl / 2).await;
        assert_eq!(
            holder.is_lost(),
            None,
            "lost after {} of the nodes lost the key, one at a time",
            lost_it + 1
        );
    }
    keys_settle(&mut conns, &[0, 1, 2, 3, 4], &key(&name), |_| {
        Some(owner.clone())
    })
    .await;
    assert!(holder.release().await.expect("release"));
}

/// With one node frozen, the four live ones make the quorum and no
/// acquisition waits for the frozen one: each takes less than the node
/// timeout, which an acquisition that waited for every node would take in
/// full. The timeout is the patient one, so that on a loaded machine the
/// live nodes' own answers fit in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_node_costs_at_most_the_node_timeout() {
    let _serial = one_at_a_time(&SERIAL).await;
    let _restore = Restore::servers(["redlock1", "redlock2", "redlock3", "redlock4", "redlock5"]);
    let locks = client_with(PATIENT_NODE_TIMEOUT).await;
    services(&["pause", "redlock2"]);
    let mut worst = Duration::ZERO;
    for _ in 0..20 {
        let start = Instant::now();
        let guard = locks
            .try_acquire(&unique("frozen-node"), &opts(3000))
            .await
            .expect("a majority answers")
            .expect("free");
        worst = worst.max(start.elapsed());
        assert!(guard.release().await.expect("release"));
    }
    assert!(
        worst < PATIENT_NODE_TIMEOUT,
        "acquire took {worst:?} with one node frozen: it waited for the frozen node"
    );
    eprintln!("redlock faults: slowest acquire with a node frozen {worst:?}");
}

/// A majority frozen for about a second (a stalled host, a slow fsync) is waited out by a waiting acquire, which then gets the lock; a
/// majority that stays frozen fails it with `QuorumNotReached` in bounded
/// time, not at the end of a long wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_briefly_unreachable_majority_is_waited_out() {
    let _serial = one_at_a_time(&SERIAL).await;
    let _restore = Restore::servers(["redlock1", "redlock2", "redlock3", "redlock4", "redlock5"]);
    let locks = client().await;
    let waiting = LockOptions::new()
        .ttl(Duration::from_millis(3000))
        .wait_timeout(Duration::from_secs(10));
    let frozen = ["redlock3", "redlock4", "redlock5"];
    let stall = Duration::from_millis(1200);

    for node in frozen {
        services(&["pause", node]);
    }
    let start = Instant::now();
    let thaw = tokio::task::spawn_blocking(move || {
        std::thread::sleep(stall);
        for node in frozen {
            services(&["resume", node]);
        }
    });
    let got = locks.acquire(&unique("stall"), &waiting).await;
    let took = start.elapsed();
    thaw.await.expect("thaw");
    let guard =
        got.unwrap_or_else(|e| panic!("a {stall:?} stall failed the wait after {took:?}: {e:?}"));
    assert!(
        took >= stall,
        "granted after {took:?}, before the majority was back"
    );
    assert!(guard.release().await.expect("release"));

    for node in frozen {
        services(&["pause", node]);
    }
    let start = Instant::now();
    let refused = locks.acquire(&unique("frozen-majority"), &waiting).await;
    let took = start.elapsed();
    for node in frozen {
        services(&["resume", node]);
    }
    assert!(
        matches!(refused, Err(LockError::QuorumNotReached { .. })),
        "{refused:?}"
    );
    assert!(
        (Duration::from_secs(2)..Duration::from_secs(4)).contains(&took),
        "QuorumNotReached after {took:?} of a 10 s wait"
    );
    eprintln!(
        "redlock faults: a {stall:?} stall of a majority waited out; a frozen majority refused after {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_acquisition_leaves_no_key_behind() {
    let _serial = one_at_a_time(&SERIAL).await;
    let _restore = Restore::servers(["redlock1", "redlock2", "redlock3", "redlock4", "redlock5"]);
    let locks = client_with(PATIENT_NODE_TIMEOUT).await;
    let name = unique("no-leftovers");
    let mut conns = Vec::new();
    for i in 0..5 {
        conns.push(node(i).await);
    }
    // Someone else holds the key on nodes 0 and 1, and node 2 is down: the
    // attempt can win nodes 3 and 4 only, which is no majority.
    for conn in &mut conns[..2] {
        let _: () = redis::cmd("SET")
            .arg(key(&name))
            .arg("someone-else")
            .arg("PX")
            .arg(10_000)
            .query_async(conn)
            .await
            .expect("plant");
    }
    services(&["kill", "redlock3"]);
    let outcome = locks.try_acquire(&name, &opts(5000)).await;
    assert!(
        matches!(outcome, Ok(None)),
        "two grants are no majority: {outcome:?}"
    );
    let someone_else = |i: usize| (i < 2).then(|| "someone-else".to_string());
    keys_settle(&mut conns, &[0, 1, 3, 4], &key(&name), someone_else).await;
    // The same with every node up: nothing of ours is left anywhere.
    services(&["start", "redlock3"]);
    let mut third = node(2).await;
    let _: () = redis::cmd("SET")
        .arg(key(&name))
        .arg("someone-else")
        .arg("PX")
        .arg(10_000)
        .query_async(&mut third)
        .await
        .expect("plant");
    let outcome = locks.try_acquire(&name, &opts(5000)).await;
    assert!(matches!(outcome, Ok(None)), "{outcome:?}");
    keys_settle(&mut conns, &[3, 4], &key(&name), |_| None).await;
}

/// The owner of lock `name`, once every node holds its key for that owner
/// (see [`keys_settle`]). A majority granted it, so one of the first
/// three nodes holds it already.
async fn held_on_every_node(conns: &mut [redis::aio::MultiplexedConnection], name: &str) -> String {
    let mut owner = None;
    for conn in &mut conns[..3] {
        let value: Option<String> = redis::cmd("GET")
            .arg(key(name))
            .query_async(conn)
            .await
            .expect("inspect");
        owner = owner.or(value);
    }
    let owner = owner.expect("one of the first three nodes granted");
    keys_settle(conns, &[0, 1, 2, 3, 4], &key(name), |_| Some(owner.clone())).await;
    owner
}

/// Empty the script cache of each of `conns`' nodes, as a restart does.
async fn flush_scripts(conns: &mut [redis::aio::MultiplexedConnection]) {
    for conn in conns {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(conn)
            .await
            .expect("flush the script cache");
    }
}

/// Wait until the value of `key` on each of the `nodes` is `expected(node)`,
/// and fail if that takes 2 s. An attempt finishes the requests to the
/// nodes it did not wait for in the background (a failed one gives them
/// back), so its keys land or go a moment after it returns;
/// 2 s is well inside the attempt's 5 s TTL, so a key that merely expired
/// cannot pass for one given back.
async fn keys_settle(
    conns: &mut [redis::aio::MultiplexedConnection],
    nodes: &[usize],
    key: &str,
    expected: impl Fn(usize) -> Option<String>,
) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let mut wrong = Vec::new();
        for &i in nodes {
            let value: Option<String> = redis::cmd("GET")
                .arg(key)
                .query_async(&mut conns[i])
                .await
                .expect("inspect");
            if value != expected(i) {
                wrong.push((i, value));
            }
        }
        if wrong.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "2 s on, these nodes still hold a key that is not the expected one (node, value): {wrong:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_node_restarts() {
    let _serial = one_at_a_time(&SERIAL).await;
    let _restore = Restore::servers(["redlock1", "redlock2", "redlock3", "redlock4", "redlock5"]);
    let clients = [
        client_with(PATIENT_NODE_TIMEOUT).await,
        client_with(PATIENT_NODE_TIMEOUT).await,
    ];
    let name = unique("fencing");
    let mut last = 0;
    for round in 0..10usize {
        let holder = &clients[round % 2];
        let guard = loop {
            match holder.try_acquire(&name, &opts(5000)).await {
                Ok(Some(g)) => break g,
                // A restarted node may still be loading; retry.
                Ok(None) | Err(LockError::QuorumNotReached { .. }) => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("round {round}: {e}"),
            }
        };
        let token = guard.fencing_token().expect("token");
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        assert!(guard.release().await.expect("release"));
        // Between holders, one node dies (kill -9) and comes back.
        let victim = format!("redlock{}", round % 5 + 1);
        services(&["kill", &victim]);
        if round % 2 == 0 {
            // Sometimes the next holder runs while it is still down. On a
            // loaded machine a live node may answer past the node timeout
            // (or the last release still be on its way to one): with one
            // node down, that one refusal costs the quorum. A refused
            // attempt's grants on a minority of nodes are given back in the
            // background, and one whose give-back is lost holds its node
            // for its 5 s lease: so a refused attempt is made again, for up
            // to 6 s, past that lease.
            let next = &clients[(round + 1) % 2];
            let since = Instant::now();
            let granted = loop {
                let granted = next
                    .try_acquire(&name, &opts(5000))
                    .await
                    .expect("four of five nodes");
                if granted.is_some() || since.elapsed() > Duration::from_secs(6) {
                    break granted;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            let Some(guard) = granted else {
                let mut seen = Vec::new();
                for i in 0..5 {
                    if format!("redlock{}", i + 1) == victim {
                        continue;
                    }
                    let v: Option<String> = redis::cmd("GET")
                        .arg(key(&name))
                        .query_async(&mut node(i).await)
                        .await
                        .expect("inspect");
                    seen.push((i, v));
                }
                panic!("round {round}: refused with {victim} down; keys: {seen:?}");
            };
            let token = guard.fencing_token().expect("token");
            assert!(token > last, "with {victim} down: {token} after {last}");
            last = token;
            assert!(guard.release().await.expect("release"));
        }
        services(&["start", &victim]);
    }
}

/// A node that grants after the majority decided (its reply came too late)
/// holds the key for the holder too, with its own counter, which earlier
/// partial grants may have raised above the holder's token. `inspect` must
/// still report the holder's token, not the straggler's larger counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_reports_the_holders_token_beside_a_straggler() {
    let _serial = one_at_a_time(&SERIAL).await;
    let _restore = Restore::servers(["redlock5"]);
    // Patient with the live nodes, so that all four grant even on a loaded
    // machine; the frozen node is not waited for once a majority granted.
    let locks = client_with(PATIENT_NODE_TIMEOUT).await;
    let name = unique("straggler");
    // Every node's connection is up before node 5 stops, so the late
    // request is one already sent, not one waiting for a connection.
    let warm = locks
        .try_acquire(&unique("straggler-warm"), &opts(30_000))
        .await
        .expect("all nodes answer")
        .expect("free");
    assert!(warm.release().await.expect("release"));
    // Node 5's counter is far ahead of the others', as after many grants
    // that reached it but no majority.
    let _: u64 = redis::cmd("INCRBY")
        .arg(format!("{}:fence", key(&name)))
        .arg(100)
        .query_async(&mut node(4).await)
        .await
        .expect("raise node 5's counter");
    services(&["pause", "redlock5"]);
    let guard = locks
        .try_acquire(&name, &opts(30_000))
        .await
        .expect("four nodes answer")
        .expect("free");
    services(&["resume", "redlock5"]);
    let token = guard.fencing_token().expect("token");
    assert!(token < 100, "the majority's token {token}");
    // The acquire request waiting in node 5's socket grants there now, if
    // the client had sent it before giving up on the node; on a loaded
    // machine it may not have, and then the test makes the same grant
    // itself (what the acquire script does: the key for the owner, the
    // counter incremented).
    let mut owners = Vec::new();
    for i in 0..4 {
        let owner: Option<String> = redis::cmd("GET")
            .arg(key(&name))
            .query_async(&mut node(i).await)
            .await
            .expect("owner on a live node");
        owners.extend(owner);
    }
    assert!(owners.len() >= 3, "held on a majority: {owners:?}");
    let owner = owners[0].clone();
    let mut straggler = node(4).await;
    let state = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut pipe = redis::pipe();
        pipe.cmd("GET")
            .arg(key(&name))
            .cmd("GET")
            .arg(format!("{}:fence", key(&name)));
        let mut conn = conn.clone();
        async move {
            pipe.query_async::<(Option<String>, u64)>(&mut conn)
                .await
                .expect("node 5's state")
        }
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    let (mut held, mut counter) = state(&mut straggler).await;
    while held.is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        (held, counter) = state(&mut straggler).await;
    }
    if held.is_none() {
        eprintln!("redlock faults: the late request never reached node 5; granting there by hand");
        let set: Option<String> = redis::cmd("SET")
            .arg(key(&name))
            .arg(&owner)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut straggler)
            .await
            .expect("grant on node 5");
        if set.is_some() {
            let _: u64 = redis::cmd("INCR")
                .arg(format!("{}:fence", key(&name)))
                .query_async(&mut straggler)
                .await
                .expect("count the grant on node 5");
        }
        (held, counter) = state(&mut straggler).await;
    }
    assert_eq!(held.as_deref(), Some(owner.as_str()), "node 5's holder");
    assert!(counter > 100, "node 5 granted with counter {counter}");
    let info = locks.inspect(&name).await.expect("inspect");
    assert!(info.held);
    assert_eq!(info.fencing_token, Some(token), "the holder's token");
    assert!(guard.release().await.expect("release"));
}

/// A writer granted by a majority takes its waiting marks there and removes
/// the rest in the background after it returns, so for a moment a minority
/// of nodes still marks it. `inspect_rw` counts the waiting writers a
/// majority marks: marks planted on two of five nodes are not a waiting
/// writer, on three they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_counts_only_the_waiting_writers_a_majority_marks() {
    let _serial = one_at_a_time(&SERIAL).await;
    let locks = client_with(PATIENT_NODE_TIMEOUT).await;
    let name = unique("marks");
    let waiting = format!("{}:rw:waiting", key(&name));
    // A mark as a waiting writer leaves it (`ARRIVAL:ID`, scored with the
    // server time its mark lapses), here one that never lapses.
    let plant = async |i: usize| {
        let _: i64 = redis::cmd("ZADD")
            .arg(&waiting)
            .arg("+inf")
            .arg("00000000000001:planted")
            .query_async(&mut node(i).await)
            .await
            .expect("plant a mark");
    };
    for i in 0..2 {
        plant(i).await;
    }
    let info = locks.inspect_rw(&name).await.expect("inspect");
    assert_eq!(
        info.waiting_writers,
        Some(0),
        "a minority's marks: {info:?}"
    );
    plant(2).await;
    let info = locks.inspect_rw(&name).await.expect("inspect");
    assert_eq!(
        info.waiting_writers,
        Some(1),
        "a majority's marks: {info:?}"
    );
    for i in 0..5 {
        let _: i64 = redis::cmd("DEL")
            .arg(&waiting)
            .query_async(&mut node(i).await)
            .await
            .expect("remove the marks");
    }
}

/// See `lock_testkit::faults::server_failure_gives_transient_errors`: a majority of
/// the masters killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_failure_gives_transient_errors() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::server_failure_gives_transient_errors(
        client,
        &["redlock1", "redlock2", "redlock3"],
        LockOptions::new().ttl(Duration::from_secs(5)),
    )
    .await;
}

/// See `lock_testkit::faults::frozen_server_bounds_waits_and_releases`: a
/// majority of the masters frozen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_server_bounds_waits_and_releases() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::frozen_server_bounds_waits_and_releases(
        client,
        &["redlock1", "redlock2", "redlock3"],
        LockOptions::new().ttl(Duration::from_secs(5)),
    )
    .await;
}

/// See `lock_testkit::faults::killed_holder_frees_the_lock` (the TTL frees it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_frees_the_lock() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::killed_holder_frees_the_lock(
        "a_killed_holder_frees_the_lock",
        client,
        LockOptions::new().ttl(Duration::from_secs(2)),
        Duration::ZERO,
    )
    .await;
}

/// See `lock_testkit::faults::frozen_holder_loses_its_lock_to_a_later_token`: the
/// lease's TTL (1 s) frees it on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_loses_its_lock_to_a_later_token() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::frozen_holder_loses_its_lock_to_a_later_token(
        "a_frozen_holder_loses_its_lock_to_a_later_token",
        client,
        LockOptions::new().ttl(Duration::from_secs(1)),
        Duration::from_secs(1),
    )
    .await;
}

/// See `lock_testkit::faults::a_grant_answered_past_its_deadline_is_not_handed_out`:
/// a majority of the masters frozen for 1.3 s under a 1 s lease, each
/// node waited for up to 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_answered_past_its_deadline_is_not_handed_out() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::a_grant_answered_past_its_deadline_is_not_handed_out(
        async || client_with(Duration::from_secs(5)).await,
        &["redlock1", "redlock2", "redlock3"],
        LockOptions::new().ttl(Duration::from_secs(1)),
        Duration::from_millis(1300),
    )
    .await;
}
