//! ZooKeeper over a failing network: the connection drops right after a
//! create reached the server (its reply lost), through the test proxy of
//! `lock_testkit::tcp_proxy`; and what is left behind once a lock is released.
//!
//! The tests share one lock name per case under a root of their own, so
//! they can read the lock's node directly with a plain client.

use std::time::Duration;

use lock_core::{DistributedLock, LockOptions, Wait};
use lock_testkit::faults::{env, unique, upstreams_of};
use lock_testkit::tcp_proxy::TcpProxy;
use lock_zk::ZkLock;
use tokio::time::Instant;
use zookeeper_client::Client;

/// The standalone server's `host:port`.
fn upstream() -> String {
    upstreams_of(&env("DISTLOCK_TEST_ZK_URL")).remove(0)
}

/// A root no other run uses, and the node of lock `job` under it.
fn fresh_root(case: &str) -> (String, String) {
    let root = format!("/{}", unique(case).replace('/', "-"));
    let dir = format!("{root}/njob");
    (root, dir)
}

async fn raw_client() -> Client {
    Client::connect(&upstream()).await.expect("plain client")
}

/// Whether a client write carries a request with one of `ops` whose
/// bytes hold `needle`: ZooKeeper frames are a 4-byte length, then (for
/// requests) xid and opcode.
fn carries(bytes: &[u8], ops: &[i32], needle: &[u8]) -> bool {
    let mut rest = bytes;
    while rest.len() >= 12 {
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let op = i32::from_be_bytes([rest[8], rest[9], rest[10], rest[11]]);
        let frame = rest.get(..4 + len).unwrap_or(rest);
        if ops.contains(&op) && frame.windows(needle.len()).any(|w| w == needle) {
            return true;
        }
        rest = rest.get(4 + len..).unwrap_or_default();
    }
    false
}

/// A create of one of our lock children (create, create2, createContainer
/// and createTTL are opcodes 1, 15, 19, 21).
fn creates_a_lock_child(bytes: &[u8]) -> bool {
    carries(bytes, &[1, 15, 19, 21], b"/lock-")
}

/// The children of `dir`; none once the server removed the empty node.
async fn children(raw: &Client, dir: &str) -> Vec<String> {
    let mut c = match raw.list_children(dir).await {
        Err(zookeeper_client::Error::NoNode) => Vec::new(),
        listed => listed.expect("list the lock's node"),
    };
    c.sort();
    c
}

/// One case's world: a root of its own, the proxy, a client connected
/// directly and one through the proxy.
struct Setup {
    dir: String,
    direct: String,
    proxy: TcpProxy,
    proxied: ZkLock,
}

async fn setup(case: &str) -> Setup {
    let (root, dir) = fresh_root(case);
    let direct = format!("{}{root}", env("DISTLOCK_TEST_ZK_URL"));
    let proxy = TcpProxy::start(&upstream()).await;
    let proxied = ZkLock::connect(&format!("zk://{}{root}", proxy.addr()))
        .await
        .expect("connect through the proxy");
    Setup {
        dir,
        direct,
        proxy,
        proxied,
    }
}

/// A client connected directly that holds lock `job`.
async fn direct_holder(direct: &str) -> (ZkLock, lock_core::LockGuard) {
    let locks = ZkLock::connect(direct).await.expect("connect");
    let held = locks
        .acquire("job", &LockOptions::new().wait(Wait::No))
        .await
        .expect("holder acquires");
    (locks, held)
}

/// `client` waits (up to 30 s) for lock `job` in a task of its own, which
/// gives back the client (to keep its session) and the outcome.
fn wait_for_job(
    client: ZkLock,
) -> tokio::task::JoinHandle<(ZkLock, Result<lock_core::LockGuard, lock_core::LockError>)> {
    tokio::spawn(async move {
        let opts = LockOptions::new().wait_timeout(Duration::from_secs(30));
        let g = client.acquire("job", &opts).await;
        (client, g)
    })
}

/// The create of a waiter's node reaches the server, but its reply is lost
/// and the connection drops. The client finds its node again by its id
/// instead of creating a second one: after the hand-off exactly one node is
/// left, it is the one that holds, and its czxid is the guard's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_create_reply_leaves_no_orphan() {
    let Setup {
        dir,
        proxy,
        proxied: waiter_client,
        direct,
    } = setup("lost-create").await;
    let (_holder_client, holder) = direct_holder(&direct).await;
    proxy.lose_replies_after(creates_a_lock_child, Duration::from_millis(300));
    let waiting = wait_for_job(waiter_client);
    let raw = raw_client().await;
    // The waiter's node is created once, and survives the dropped reply.
    let start = Instant::now();
    while proxy.fired() == 0 || proxy.connections() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the proxy never cut the create (fired {}, connections {})",
            proxy.fired(),
            proxy.connections()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(children(&raw, &dir).await.len(), 2, "holder and waiter");
    assert!(holder.release().await.expect("release"));
    let (_client, g) = waiting.await.expect("waiter task");
    let g = g.expect("the waiter acquires after the lost reply");
    let left = children(&raw, &dir).await;
    assert_eq!(left.len(), 1, "no orphan: {left:?}");
    let (_, stat) = raw
        .get_data(&format!("{dir}/{}", left[0]))
        .await
        .expect("read the holder's node");
    assert_eq!(g.fencing_token(), Some(stat.czxid as u64));
    assert_eq!(proxy.fired(), 1);
    eprintln!(
        "zk network: create reply lost, connection dropped; the waiter reconnected ({} connections) and found its node; {} node left",
        proxy.connections(),
        left.len()
    );
    assert!(g.release().await.expect("release"));
}

/// An acquisition cancelled while its create's reply is lost does not leave
/// its node behind to block the lock for the rest of the session: it is
/// deleted once the client has reconnected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_cancelled_during_its_create_leaves_no_orphan() {
    let Setup {
        dir,
        proxy,
        proxied: canceller,
        direct,
    } = setup("cancel-create").await;
    let (_holder_client, holder) = direct_holder(&direct).await;
    proxy.lose_replies_after(creates_a_lock_child, Duration::from_millis(500));
    let cancelled = tokio::time::timeout(
        Duration::from_millis(200),
        canceller.acquire(
            "job",
            &LockOptions::new().wait_timeout(Duration::from_secs(30)),
        ),
    )
    .await;
    assert!(
        cancelled.is_err(),
        "the acquire was still waiting for its reply"
    );
    assert_eq!(proxy.fired(), 1);
    let raw = raw_client().await;
    assert_eq!(
        children(&raw, &dir).await.len(),
        2,
        "the cancelled create landed"
    );
    let start = Instant::now();
    loop {
        let left = children(&raw, &dir).await;
        if left.len() == 1 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the cancelled acquisition's node is still there: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let swept_after = start.elapsed();
    assert!(holder.release().await.expect("release"));
    let other = ZkLock::connect(&direct).await.expect("connect");
    let g = other
        .try_acquire("job", &LockOptions::new())
        .await
        .expect("try")
        .expect("nothing blocks the lock after its holder released it");
    eprintln!(
        "zk network: a cancelled acquisition's node was deleted {swept_after:?} after the cancel (the proxy dropped the connection 500 ms after the create, 300 ms after the cancel)"
    );
    assert!(g.release().await.expect("release"));
}

/// A release whose delete reply is lost with the connection is sent again
/// after the reconnection: the lock is free at once, not at the end of the
/// holder's session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_delete_reply_still_frees_the_lock() {
    let Setup {
        dir,
        proxy,
        proxied: holder_client,
        direct,
    } = setup("lost-delete").await;
    let holder = holder_client
        .acquire("job", &LockOptions::new().wait(Wait::No))
        .await
        .expect("holder acquires");
    // delete is opcode 2; its path names our child.
    proxy.lose_replies_after(|b| carries(b, &[2], b"/lock-"), Duration::from_millis(300));
    assert!(holder.release().await.expect("release after a lost reply"));
    assert_eq!(proxy.fired(), 1);
    let raw = raw_client().await;
    assert!(children(&raw, &dir).await.is_empty());
    let other = ZkLock::connect(&direct).await.expect("connect");
    let g = other
        .try_acquire("job", &LockOptions::new())
        .await
        .expect("try")
        .expect("the lock is free");
    assert!(g.release().await.expect("release"));
}

/// The lock's node is a container: once its last child is gone the server
/// removes it (the test servers check every second), so lock names used
/// once do not pile up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unused_lock_node_is_removed_by_the_server() {
    let (root, dir) = fresh_root("tidy");
    let locks = ZkLock::connect(&format!("{}{root}", env("DISTLOCK_TEST_ZK_URL")))
        .await
        .expect("connect");
    let g = locks
        .acquire("job", &LockOptions::new().wait(Wait::No))
        .await
        .expect("acquire");
    let raw = raw_client().await;
    assert!(raw.check_stat(&dir).await.expect("stat").is_some());
    assert!(g.release().await.expect("release"));
    let start = Instant::now();
    while raw.check_stat(&dir).await.expect("stat").is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "the empty lock node {dir} was not removed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "zk network: the empty lock node was removed {:?} after the release",
        start.elapsed()
    );
    // The name can be used again at once.
    let again = locks
        .acquire("job", &LockOptions::new().wait(Wait::No))
        .await
        .expect("acquire after the node went");
    assert!(again.release().await.expect("release"));
}

/// With one waiter behind the holder, the hand-off is the holder's delete
/// and one notification: the waiter, whose predecessor was first when it
/// looked, takes the lock without listing the queue again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_in_line_takes_over_without_another_round_trip() {
    let Setup {
        proxy,
        proxied: waiter_client,
        direct,
        ..
    } = setup("next-in-line").await;
    let (_holder_client, holder) = direct_holder(&direct).await;
    // getChildren and getChildren2 are opcodes 8 and 12; exists is 3.
    let lists = proxy.count_requests(|b| carries(b, &[8, 12], b"/njob"));
    let watches = proxy.count_requests(|b| carries(b, &[3], b"/lock-"));
    let waiting = wait_for_job(waiter_client);
    let start = Instant::now();
    while watches.get() == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the waiter never watched"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let listed = lists.get();
    assert_eq!(
        listed, 1,
        "the waiter listed the queue once before watching"
    );
    let released_at = Instant::now();
    assert!(holder.release().await.expect("release"));
    let (_client, g) = waiting.await.expect("waiter task");
    let g = g.expect("the waiter takes over");
    let handoff = released_at.elapsed();
    assert_eq!(lists.get(), listed, "no listing after the predecessor went");
    eprintln!("zk network: two-party hand-off in {handoff:?} (delete + notification)");
    assert!(g.release().await.expect("release"));
}

/// A delete (opcode 2) of one of our lock children.
fn deletes_a_lock_child(bytes: &[u8]) -> bool {
    carries(bytes, &[2], b"/lock-")
}

/// A release whose delete gets no reply (the connection stays open,
/// silent, longer than the client waits for a reply, as after a pause of
/// the holder's process) is sent again once the client has reconnected,
/// and answers for certain: the node is deleted and the lock is free at
/// once, not left to a background retry behind a transient error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_the_client_gave_up_on_is_sent_again() {
    let Setup {
        dir,
        proxy,
        proxied: holder_client,
        ..
    } = setup("silent-delete").await;
    let held = holder_client
        .acquire("job", &LockOptions::new().wait(Wait::No))
        .await
        .expect("holder acquires");
    proxy.arm(
        lock_testkit::tcp_proxy::Loss::Request,
        deletes_a_lock_child,
        Duration::from_secs(3),
    );
    let released = held.release().await;
    assert_eq!(proxy.fired(), 1, "the delete was lost");
    assert!(
        matches!(released, Ok(true)),
        "a release the client gave up on answered {released:?}"
    );
    let raw = raw_client().await;
    assert!(
        children(&raw, &dir).await.is_empty(),
        "the lock's node outlived its release"
    );
}

/// A waiter cut off from the server for longer than its session loses the
/// session (its client gives it up 1.4 session timeouts after it last
/// heard from the server), and the fresh session it then needs cannot
/// connect while the partition lasts. It starts one again, with the
/// request's backoff, while its wait allows: once the network heals it
/// queues again and gets the lock when the holder releases, instead of
/// failing on the first connect that timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_rides_out_a_fresh_session_that_cannot_connect_at_once() {
    let session = Duration::from_secs(2);
    let (root, _dir) = fresh_root("fresh-session");
    let direct = format!("{}{root}", env("DISTLOCK_TEST_ZK_URL"));
    let proxy = TcpProxy::start(&upstream()).await;
    let waiter_client = ZkLock::connect(&format!(
        "zk://{}{root}?session_timeout_ms={}",
        proxy.addr(),
        session.as_millis()
    ))
    .await
    .expect("connect through the proxy");
    let (holder_client, holder) = direct_holder(&direct).await;
    let first = holder.fencing_token().expect("token");
    let waiting = wait_for_job(waiter_client);
    until_queued(&holder_client, &waiting, "the waiter never queued").await;
    proxy.partition();
    // The session is given up after 1.4 session timeouts, and the first
    // fresh session's connect times out one session timeout later: both
    // happen while the partition lasts.
    tokio::time::sleep(session * 3).await;
    proxy.heal();
    until_queued(
        &holder_client,
        &waiting,
        "the waiter never queued on a fresh session",
    )
    .await;
    assert!(holder.release().await.expect("release"));
    let (_client, g) = waiting.await.expect("waiter task");
    let g = g.expect("the waiter gets the lock on a fresh session");
    assert!(g.fencing_token().expect("token") > first);
    assert!(g.release().await.expect("release"));
}

/// Wait (up to 20 s, or `what` fails the case) until one acquisition of
/// lock `job` waits behind its holder, or until the waiting task ended.
async fn until_queued<T>(locks: &ZkLock, waiting: &tokio::task::JoinHandle<T>, what: &str) {
    let start = Instant::now();
    while !waiting.is_finished() && locks.queued("job").await.expect("queued") != 1 {
        assert!(start.elapsed() < Duration::from_secs(20), "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A create that gets no reply (the connection stays open and silent
/// longer than the client waits for a reply, as under a stalled network)
/// is looked up once the client has reconnected and sent again only if it
/// did not land: a lost request and a lost reply both end in exactly one
/// node, which holds the lock, instead of an acquisition failed on the
/// client's own "no response" error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_the_client_gave_up_on_is_looked_up_then_sent_again() {
    for loss in [
        lock_testkit::tcp_proxy::Loss::Replies,
        lock_testkit::tcp_proxy::Loss::Request,
    ] {
        let Setup {
            dir,
            proxy,
            proxied: client,
            ..
        } = setup("silent-create").await;
        proxy.arm(loss, creates_a_lock_child, Duration::from_secs(3));
        let g = client
            .acquire("job", &LockOptions::new().wait(Wait::No))
            .await;
        assert_eq!(proxy.fired(), 1, "{loss:?}: the create went unanswered");
        let g = g.unwrap_or_else(|e| panic!("{loss:?}: the acquisition failed: {e:?}"));
        let raw = raw_client().await;
        let left = children(&raw, &dir).await;
        assert_eq!(left.len(), 1, "{loss:?}: one node: {left:?}");
        assert!(g.release().await.expect("release"));
    }
}
