//! Failovers of the project's Sentinel group (`scripts/services.sh`:
//! sredis1..3 watched by sentinel1..3): a client on `redis+sentinel://`
//! follows the new master, a held lock whose key the new master lacks fires
//! `lost()` as soon as the client finds the new master, a waiter is woken
//! through the new master, and `replicas=N` refuses a grant the replicas do
//! not acknowledge.
//!
//! These tests kill and pause the group's nodes, so they run one at a time
//! (a shared mutex in this binary, a test group under nextest).

use std::process::{Command, Stdio};
use std::time::Duration;

use lock_core::{DistributedLock, LockError, LockOptions, Wait};
use lock_redis::RedisLock;
use lock_testkit::faults::{Restore, env, one_at_a_time, services, unique};
use redis::AsyncCommands;
use tokio::sync::Mutex;
use tokio::time::Instant;

#[path = "support/acked.rs"]
mod support;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// A client on the group with short timeouts, and `extra` options.
async fn client(extra: &str) -> RedisLock {
    let url = format!(
        "{}?connect_timeout=300ms&response_timeout=500ms{extra}",
        env("DISTLOCK_TEST_REDIS_SENTINEL_URL")
    );
    RedisLock::connect(&url)
        .await
        .expect("connect through sentinel")
}

/// `scripts/services.sh ARGS`' output, required to succeed.
fn services_output(args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(env("DISTLOCK_SERVICES_SCRIPT"))
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .expect("run services.sh");
    assert!(out.status.success(), "services.sh {args:?} failed");
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_string()
}

/// The port of a node of the group (`sredis1` → 16390).
fn port_of(node: &str) -> u16 {
    let n: u16 = node
        .trim_start_matches("sredis")
        .parse()
        .expect("a node name");
    16389 + n
}

/// A plain connection to one node of the group.
async fn node(name: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{}/0", port_of(name)))
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to a node")
}

/// Puts a killed master back as a replica when dropped.
struct Rejoin(String);

impl Drop for Rejoin {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(env("DISTLOCK_SERVICES_SCRIPT"))
            .args(["rejoin", &self.0])
            .stdout(Stdio::null())
            .status();
    }
}

/// How many replicas (of 2) acknowledge, within about `within`, every write the
/// master has taken. `WAIT` counts the replicas that reached the offset of
/// the last write *on its own connection* (on a fresh connection: none, so
/// it would answer at once): a write of ours first, behind every earlier
/// write in the replication stream, makes it wait for them all.
async fn acked_replicas(within: Duration) -> i64 {
    let mut master = node(&services_output(&["master"])).await;
    let () = master
        .set("distlock-test:replicated", unique("mark"))
        .await
        .expect("SET on the master");
    support::acked(&mut master, 2, within).await
}

/// Wait (up to [`support::SETTLE`]) until both replicas have every write the
/// master has taken.
async fn replicated() {
    assert_eq!(
        acked_replicas(support::SETTLE).await,
        2,
        "both replicas have the master's writes"
    );
}

/// Kill the group's master once both replicas have its writes, and wait
/// until the Sentinels promote a replica: the old master's name, the new
/// one's and a guard that brings the old one back as a replica.
async fn kill_master() -> (String, String, Rejoin) {
    replicated().await;
    let old = services_output(&["master"]);
    let new = services_output(&["failover", "kill"]);
    assert_ne!(old, new);
    (old.clone(), new, Rejoin(old))
}

/// Wait (up to 10 s) until `locks` takes a fresh lock: it has found the
/// new master. Errors meanwhile must be transient.
async fn takes_new_locks(locks: &RedisLock) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        match locks
            .try_acquire(&unique("sentinel-probe"), &opts(Duration::from_secs(3)))
            .await
        {
            Ok(Some(g)) => {
                assert!(g.release().await.expect("release"));
                return;
            }
            Ok(None) => panic!("a fresh name is free"),
            Err(e) => assert!(e.is_transient(), "{e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the client took no lock within 10 s of the failover");
}

fn opts(ttl: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl).wait(Wait::No)
}

/// After the master is killed and a replica promoted, the same client takes
/// new locks on the new master and keeps the lock it held (its key was
/// replicated): renewed there, still excluding another client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_moves_the_client_to_the_new_master() {
    let _serial = one_at_a_time(&SERIAL).await;
    let (locks, other) = (client("").await, client("").await);
    let name = unique("sentinel-kept");
    // A lease the failover fits in with room to spare (the kill can come
    // just after a renewal; the promotion takes about 2 s here, and the
    // client's renewals go on every third of the lease): a lock is kept
    // across a failover that ends within its lease.
    let held = locks
        .acquire(&name, &opts(Duration::from_secs(6)))
        .await
        .expect("acquire");
    let token = held.fencing_token();
    let (_, _, _rejoin) = kill_master().await;
    let moved = Instant::now();
    takes_new_locks(&locks).await;
    eprintln!(
        "sentinel: new locks granted {:?} after the failover",
        moved.elapsed()
    );
    // Past the old lease's TTL: kept only by renewals on the new master.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(
        held.is_lost(),
        None,
        "the replicated lock is kept across the failover"
    );
    assert_eq!(
        other
            .try_acquire(&name, &opts(Duration::from_secs(3)))
            .await
            .expect("try_acquire")
            .map(|g| g.fencing_token()),
        None,
        "another client is still excluded"
    );
    let info = other.inspect(&name).await.expect("inspect");
    assert_eq!(info.fencing_token, token, "the new master holds our grant");
    assert!(held.release().await.expect("release on the new master"));
}

/// A lock whose key the new master lacks (it was not replicated: here it
/// is removed from both replicas before the master is killed, so whichever
/// is promoted lacks it) fires `lost()` as soon as the client finds the new
/// master, long before its next renewal would have been due; so does one
/// that is not auto-renewed, whose lease would have run for 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_the_new_master_lacks_fires_lost_at_the_switch() {
    let _serial = one_at_a_time(&SERIAL).await;
    let locks = client("").await;
    let name = unique("sentinel-lost");
    // Renewed every 10 s: a loss seen sooner is the switch's doing.
    let held = locks
        .acquire(&name, &opts(Duration::from_secs(30)))
        .await
        .expect("acquire");
    let unrenewed_name = unique("sentinel-lost-unrenewed");
    let unrenewed = locks
        .acquire(
            &unrenewed_name,
            &opts(Duration::from_secs(30)).auto_renew(false),
        )
        .await
        .expect("acquire");
    replicated().await;
    let old = services_output(&["master"]);
    let keys = [
        format!("distlock:{{{name}}}"),
        format!("distlock:{{{unrenewed_name}}}"),
    ];
    // The replicas lose the keys (a replica takes a write of its own only
    // while it is not read-only), as if they had never reached them.
    for replica in ["sredis1", "sredis2", "sredis3"]
        .into_iter()
        .filter(|n| *n != old)
    {
        let mut conn = node(replica).await;
        let writable = |yes: &str| {
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("replica-read-only")
                .arg(yes)
                .clone()
        };
        let () = writable("no")
            .query_async(&mut conn)
            .await
            .expect("CONFIG SET");
        let removed: i64 = conn.del(&keys).await.expect("DEL on a replica");
        let () = writable("yes")
            .query_async(&mut conn)
            .await
            .expect("CONFIG SET");
        assert_eq!(removed, 2, "{replica} had both keys");
    }
    services(&["kill", &old]);
    let _rejoin = Rejoin(old.clone());
    let killed = Instant::now();
    loop {
        if services_output(&["master"]) != old {
            break;
        }
        assert!(killed.elapsed() < Duration::from_secs(30), "no failover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let promoted = Instant::now();
    // The renewal and the check are due 10 s after the grants.
    let lost = tokio::time::timeout(Duration::from_secs(4), async {
        held.lost().await;
        unrenewed.lost().await;
    })
    .await;
    assert!(
        lost.is_ok(),
        "lost() fired within 4 s of the promotion, {:?} after the kill",
        killed.elapsed()
    );
    eprintln!(
        "sentinel: lost() fired {:?} after the promotion, {:?} after the kill",
        promoted.elapsed(),
        killed.elapsed()
    );
    let again = locks
        .try_acquire(&name, &opts(Duration::from_secs(3)))
        .await
        .expect("acquire on the new master")
        .expect("the new master has no holder");
    assert!(again.release().await.expect("release"));
}

/// A client that waited before the failover is woken through the new
/// master: its subscriber moved there with the channels it had, so a
/// release on the new master reaches a waiter at once (without the move it
/// would wait out the holder's 20 s lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_through_the_new_master() {
    let _serial = one_at_a_time(&SERIAL).await;
    let (holder, waiter) = (client("").await, client("").await);
    let name = unique("sentinel-wait");
    let held = holder
        .acquire(&name, &opts(Duration::from_secs(20)))
        .await
        .expect("acquire");
    // The waiter's subscriber, subscribed to the lock's channel, on the
    // old master.
    let early = waiter
        .acquire(
            &name,
            &LockOptions::new().wait_timeout(Duration::from_millis(200)),
        )
        .await;
    assert!(matches!(early, Err(LockError::Timeout { .. })), "{early:?}");
    let (_, _, _rejoin) = kill_master().await;
    takes_new_locks(&holder).await;
    takes_new_locks(&waiter).await;
    // The move runs beside the client's commands.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let waiting = {
        let name = name.clone();
        tokio::spawn(async move {
            let got = waiter
                .acquire(
                    &name,
                    &LockOptions::new()
                        .ttl(Duration::from_secs(5))
                        .wait_timeout(Duration::from_secs(30)),
                )
                .await;
            (got, Instant::now(), waiter)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        held.release().await.expect("release on the new master"),
        "the holder's key was replicated"
    );
    let released = Instant::now();
    let (got, at, _waiter) = waiting.await.expect("waiter");
    let guard = got.expect("the waiter is granted the lock");
    let after = at.saturating_duration_since(released);
    eprintln!("sentinel: waiter granted {after:?} after the release");
    assert!(
        after < Duration::from_millis(500),
        "the waiter was woken {after:?} after the release"
    );
    assert!(guard.release().await.expect("release"));
}

/// With `replicas=2` a grant counts only once both replicas acknowledge it:
/// with one replica frozen the grant is given back and the attempt fails as
/// transient; `replicas=1` still grants; once the replica answers again,
/// `replicas=2` grants again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_that_do_not_acknowledge_refuse_the_grant() {
    let _serial = one_at_a_time(&SERIAL).await;
    let two = client("&replicas=2&replicas_timeout=200ms").await;
    let one = client("&replicas=1&replicas_timeout=200ms").await;
    let plain = client("").await;
    let name = unique("sentinel-replicas");
    let g = two
        .try_acquire(&name, &opts(Duration::from_secs(5)))
        .await
        .expect("both replicas acknowledge")
        .expect("free");
    assert!(g.release().await.expect("release"));

    let master = services_output(&["master"]);
    let replica = ["sredis1", "sredis2", "sredis3"]
        .into_iter()
        .find(|n| *n != master)
        .expect("a replica");
    let _resume = Restore::servers([replica]);
    services(&["pause", replica]);
    let refused = two.try_acquire(&name, &opts(Duration::from_secs(5))).await;
    assert!(
        matches!(refused, Err(LockError::Unavailable { .. })),
        "a grant one replica did not acknowledge is refused as transient: {refused:?}"
    );
    // The tests' own replication check waits for the paused replica too.
    assert_eq!(
        acked_replicas(Duration::from_secs(2)).await,
        1,
        "a write the paused replica has not taken is acknowledged by one"
    );
    // Given back: another client finds the lock free.
    let mut free = false;
    for _ in 0..20 {
        if !plain.inspect(&name).await.expect("inspect").held {
            free = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(free, "the refused grant was given back");
    let g = one
        .try_acquire(&name, &opts(Duration::from_secs(5)))
        .await
        .expect("one replica acknowledges")
        .expect("free");
    assert!(g.release().await.expect("release"));
    services(&["resume", replica]);
    let mut granted = None;
    for _ in 0..40 {
        if let Ok(Some(g)) = two.try_acquire(&name, &opts(Duration::from_secs(5))).await {
            granted = Some(g);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let g = granted.expect("both replicas acknowledge again after the resume");
    assert!(g.release().await.expect("release"));
}

/// A release while the group has no master (the master just killed) fails
/// as transient and goes on in the background: once the Sentinels promote a
/// replica the lock is released there, long before its 30 s lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_during_the_failover_lands_on_the_new_master() {
    let _serial = one_at_a_time(&SERIAL).await;
    let (holder, other) = (client("").await, client("").await);
    let name = unique("sentinel-release");
    let held = holder
        .acquire(&name, &opts(Duration::from_secs(30)))
        .await
        .expect("acquire");
    replicated().await;
    let old = services_output(&["master"]);
    services(&["kill", &old]);
    let _rejoin = Rejoin(old);
    let killed = Instant::now();
    let released = held.release().await;
    assert!(
        matches!(released, Err(LockError::Unavailable { .. })),
        "no master to release on: {released:?}"
    );
    let said = released.expect_err("unavailable").to_string();
    assert!(
        said.contains("goes on in the background"),
        "the error says the release goes on: {said}"
    );
    let mut free_at = None;
    while killed.elapsed() < Duration::from_secs(20) {
        if let Ok(Some(g)) = other
            .try_acquire(&name, &opts(Duration::from_secs(3)))
            .await
        {
            free_at = Some(killed.elapsed());
            assert!(g.release().await.expect("release"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let free_at = free_at.expect("the lock is free within 20 s of the kill (its lease: 30 s)");
    eprintln!("sentinel: the released lock was free {free_at:?} after the kill");
}

/// A Sentinel paused through a failover, and the old master restarted:
/// the old master answers as a master, with its old data, until the
/// Sentinels make it a replica. A client that starts then, with the paused
/// Sentinel first in its URL, must still take its locks on the promoted
/// replica, not on the old master beside it. (The paused Sentinel, back,
/// holds the old master down until it hears from it again, so the client
/// asks the next one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_that_missed_the_failover_does_not_send_a_client_to_the_old_master() {
    let _serial = one_at_a_time(&SERIAL).await;
    replicated().await;
    let old = services_output(&["master"]);
    let _resume = Restore::servers(["sentinel1"]);
    services(&["pause", "sentinel1"]);
    services(&["kill", &old]);
    let _rejoin = Rejoin(old.clone());
    // Sentinels 2 and 3 (a quorum of two) promote a replica.
    let mut second = redis::Client::open("redis://127.0.0.1:16396/")
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to sentinel2");
    let killed = Instant::now();
    let new_port = loop {
        let named: Vec<String> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg("distlock")
            .query_async(&mut second)
            .await
            .expect("sentinel2 answers");
        let port: u16 = named[1].parse().expect("a port");
        if port != port_of(&old) {
            break port;
        }
        assert!(killed.elapsed() < Duration::from_secs(30), "no failover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The old master back with its data, as a master, before the
    // Sentinels reconfigure it; then the lagging Sentinel back.
    services(&["start", &old]);
    services(&["resume", "sentinel1"]);
    let stale_first = "redis+sentinel://127.0.0.1:16395,127.0.0.1:16396,127.0.0.1:16397/distlock?connect_timeout=300ms&response_timeout=500ms";
    let name = unique("sentinel-stale");
    let mut old_node = node(&old).await;
    let role: Vec<redis::Value> = redis::cmd("ROLE")
        .query_async(&mut old_node)
        .await
        .expect("ROLE");
    let stale_window = matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master");
    // Connected and granted within a few seconds (errors meanwhile must be
    // transient): then the key must be on the promoted replica.
    let started = Instant::now();
    let granted = loop {
        let attempt = match RedisLock::connect(stale_first).await {
            Ok(locks) => locks
                .try_acquire(&name, &opts(Duration::from_secs(5)))
                .await
                .map(|g| g.map(|g| (g, locks))),
            Err(e) => Err(e),
        };
        match attempt {
            Ok(Some(granted)) => break granted,
            Ok(None) => panic!("a fresh name is free"),
            Err(e) => assert!(e.is_transient(), "{e:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no grant within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let key = format!("distlock:{{{name}}}");
    let on_old: Option<String> = old_node.get(&key).await.unwrap_or(None);
    let mut new_node = redis::Client::open(format!("redis://127.0.0.1:{new_port}/0"))
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the new master");
    let on_new: Option<String> = new_node.get(&key).await.expect("GET");
    assert!(
        on_old.is_none(),
        "the lock was granted on the old master (it answered as a master at the start: {stale_window})"
    );
    assert!(on_new.is_some(), "the lock is on the promoted replica");
    drop(granted);
    eprintln!("sentinel: stale window at the client's start: {stale_window}");
}
