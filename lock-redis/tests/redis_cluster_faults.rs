//! Failovers of the project's Redis Cluster (`scripts/services.sh`:
//! cluster1..6, three masters with a replica each): the master serving a
//! lock's hash slot is killed and the cluster promotes its replica. A
//! client on `redis+cluster://` goes on there: a replicated lock is kept
//! and renewed, one the promoted replica lacks fires `lost()`, a waiter is
//! woken through the new master, a release during the failover lands
//! there, and `replicas=1` refuses a grant the slot's replica does not
//! acknowledge.
//!
//! These tests kill and pause the cluster's nodes, so they run one at a
//! time (a shared mutex in this binary, a test group under nextest).

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

/// A client on the cluster with short timeouts, and `extra` options.
async fn client(extra: &str) -> RedisLock {
    let url = format!(
        "{}?connect_timeout=300ms&response_timeout=500ms{extra}",
        env("DISTLOCK_TEST_REDIS_CLUSTER_URL")
    );
    RedisLock::connect(&url)
        .await
        .expect("connect to the cluster")
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

/// A plain cluster connection, for reading and writing keys behind the
/// lock's back.
async fn cluster() -> redis::cluster_async::ClusterConnection {
    let nodes: Vec<String> = env("DISTLOCK_TEST_REDIS_CLUSTER_URL")
        .trim_start_matches("redis+cluster://")
        .split(',')
        .map(|n| format!("redis://{n}/0"))
        .collect();
    redis::cluster::ClusterClient::builder(nodes)
        .retries(8)
        .build()
        .expect("cluster client")
        .get_async_connection()
        .await
        .expect("connect to the cluster")
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

/// How many replicas (of 1) of the master serving `name`'s slot
/// acknowledge, within about `within`, every write it has taken. `WAIT` counts the
/// replicas that reached the offset of the last write on its own
/// connection (on a fresh one: none, so it would answer at once): a write
/// of ours in the slot first, behind every earlier write there, makes it
/// wait for them all. (The cluster client sends `WAIT` to every master
/// and keeps the least answer; the others have no write of ours to wait
/// for and answer at once.)
async fn acked_replicas(name: &str, within: Duration) -> i64 {
    let mut conn = cluster().await;
    let () = conn
        .set(format!("distlock-test:{{{name}}}"), unique("mark"))
        .await
        .expect("SET in the slot");
    support::acked(&mut conn, 1, within).await
}

/// Wait until the replica of the master serving `name`'s slot has every
/// write that master has taken.
async fn replicated(name: &str) {
    assert_eq!(
        acked_replicas(name, support::SETTLE).await,
        1,
        "the slot's replica has its master's writes"
    );
}

/// Another fresh name whose keys share `name`'s hash slot.
fn same_slot_as(name: &str) -> String {
    use redis::cluster_routing::Slot;
    let slot = Slot::for_key(key(name));
    loop {
        let other = unique("cluster-same-slot");
        if Slot::for_key(key(&other)) == slot {
            return other;
        }
    }
}

/// The key of lock `name` under the default prefix (names without `%`,
/// `{` or `}`, which the lock escapes).
fn key(name: &str) -> String {
    format!("distlock:{{{name}}}")
}

/// Kill the master serving `name`'s slot once the replicas have its
/// writes, and wait until the cluster promotes its replica: a guard that
/// brings the old master back as a replica.
async fn fail_over(name: &str) -> Rejoin {
    replicated(name).await;
    let named = services_output(&["cluster-failover", &key(name)]);
    let killed = named.lines().next().unwrap_or_default().to_string();
    assert!(killed.starts_with("cluster"), "{named}");
    Rejoin(killed)
}

/// Wait (up to 10 s) until `locks` reads `name`'s state: it reaches the
/// master now serving the slot. Errors meanwhile must be transient.
async fn reaches_the_slot(locks: &RedisLock, name: &str) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        match locks.inspect(name).await {
            Ok(_) => return,
            Err(e) => assert!(e.is_transient(), "{e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the client did not reach the slot within 10 s of the failover");
}

fn opts(ttl: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl).wait(Wait::No)
}

/// After the master of a lock's slot is killed and its replica promoted,
/// the client keeps the lock it held (its key was replicated): renewed on
/// the new master past its first lease, still excluding another client,
/// with the same token; new grants there go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_keeps_a_replicated_lock_on_the_promoted_replica() {
    let _serial = one_at_a_time(&SERIAL).await;
    let (locks, other) = (client("").await, client("").await);
    let name = unique("cluster-kept");
    // A lease the failover fits in with room to spare (the kill can come
    // just after a renewal; the promotion takes about 2 s here, and the
    // client's renewals go on every third of the lease): a lock is kept
    // across a failover that ends within its lease.
    let held = locks
        .acquire(&name, &opts(Duration::from_secs(6)))
        .await
        .expect("acquire");
    let token = held.fencing_token();
    let _rejoin = fail_over(&name).await;
    let moved = Instant::now();
    reaches_the_slot(&locks, &name).await;
    eprintln!(
        "cluster: the slot answered {:?} after the promotion",
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
    let next = other
        .try_acquire(&name, &opts(Duration::from_secs(3)))
        .await
        .expect("acquire on the new master")
        .expect("free after the release");
    assert!(next.fencing_token() > token, "the counter was replicated");
    assert!(next.release().await.expect("release"));
}

/// A lock whose key the promoted replica lacks (removed there before the
/// client's next renewal, as if it had not been replicated) fires `lost()`
/// at that renewal; one that is not auto-renewed fires at its next check
/// (about a third of its TTL), not at its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_the_promoted_replica_lacks_fires_lost() {
    let _serial = one_at_a_time(&SERIAL).await;
    let locks = client("").await;
    let name = unique("cluster-lost");
    let held = locks
        .acquire(&name, &opts(Duration::from_secs(6)))
        .await
        .expect("acquire");
    // The same slot as `name`: one failover takes both.
    let unrenewed_name = same_slot_as(&name);
    let unrenewed = locks
        .acquire(
            &unrenewed_name,
            &opts(Duration::from_secs(30)).auto_renew(false),
        )
        .await
        .expect("acquire");
    let _rejoin = fail_over(&name).await;
    let promoted = Instant::now();
    let mut conn = cluster().await;
    let removed: i64 = conn.del(key(&name)).await.expect("DEL on the new master");
    let removed_too: i64 = conn
        .del(key(&unrenewed_name))
        .await
        .expect("DEL on the new master");
    assert_eq!((removed, removed_too), (1, 1), "the keys were replicated");
    // The renewal is due every 2 s, the check every 10 s.
    let lost = tokio::time::timeout(Duration::from_secs(12), async {
        held.lost().await;
        unrenewed.lost().await;
    })
    .await;
    assert!(lost.is_ok(), "lost() fired for both within 12 s");
    eprintln!(
        "cluster: lost() fired {:?} after the promotion",
        promoted.elapsed()
    );
    let again = locks
        .try_acquire(&name, &opts(Duration::from_secs(3)))
        .await
        .expect("acquire on the new master")
        .expect("the new master has no holder");
    assert!(again.release().await.expect("release"));
}

/// A client that waited before the failover is woken through the new
/// master: its subscriber's channel moved with the slot, so a release there
/// reaches a waiter at once (without it the waiter would wait out the
/// holder's 20 s lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_through_the_new_master() {
    let _serial = one_at_a_time(&SERIAL).await;
    let (holder, waiter) = (client("").await, client("").await);
    let name = unique("cluster-wait");
    let held = holder
        .acquire(&name, &opts(Duration::from_secs(20)))
        .await
        .expect("acquire");
    // The waiter's subscriber, subscribed to the lock's channel on the
    // slot's old master.
    let early = waiter
        .acquire(
            &name,
            &LockOptions::new().wait_timeout(Duration::from_millis(200)),
        )
        .await;
    assert!(matches!(early, Err(LockError::Timeout { .. })), "{early:?}");
    let _rejoin = fail_over(&name).await;
    reaches_the_slot(&holder, &name).await;
    reaches_the_slot(&waiter, &name).await;
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
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        held.release().await.expect("release on the new master"),
        "the holder's key was replicated"
    );
    let released = Instant::now();
    let (got, at, _waiter) = waiting.await.expect("waiter");
    let guard = got.expect("the waiter is granted the lock");
    let after = at.saturating_duration_since(released);
    eprintln!("cluster: waiter granted {after:?} after the release");
    assert!(
        after < Duration::from_millis(500),
        "the waiter was woken {after:?} after the release"
    );
    assert!(guard.release().await.expect("release"));
}

/// A release while the slot has no master (its master just killed) fails
/// as transient and goes on in the background: once the cluster promotes
/// the replica the lock is released there, long before its 30 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_during_the_failover_lands_on_the_new_master() {
    let _serial = one_at_a_time(&SERIAL).await;
    let (holder, other) = (client("").await, client("").await);
    let name = unique("cluster-release");
    let held = holder
        .acquire(&name, &opts(Duration::from_secs(30)))
        .await
        .expect("acquire");
    replicated(&name).await;
    let old = master_of(&name).await;
    services(&["kill", &old]);
    let _rejoin = Rejoin(old);
    let killed = Instant::now();
    let released = held.release().await;
    assert!(
        matches!(released, Err(LockError::Unavailable { .. })),
        "no master to release on: {released:?}"
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
    eprintln!("cluster: the released lock was free {free_at:?} after the kill");
}

/// The server name (`clusterN`) of the master serving the slot of lock
/// `name`'s keys.
async fn master_of(name: &str) -> String {
    let mut conn = cluster().await;
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key(name))
        .query_async(&mut conn)
        .await
        .expect("CLUSTER KEYSLOT");
    let shards: redis::Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut conn)
        .await
        .expect("CLUSTER SLOTS");
    let redis::Value::Array(ranges) = shards else {
        panic!("CLUSTER SLOTS answered {shards:?}");
    };
    for range in ranges {
        let redis::Value::Array(fields) = range else {
            continue;
        };
        let (Some(redis::Value::Int(lo)), Some(redis::Value::Int(hi))) =
            (fields.first(), fields.get(1))
        else {
            continue;
        };
        if (*lo..=*hi).contains(&i64::from(slot))
            && let Some(redis::Value::Array(master)) = fields.get(2)
            && let Some(redis::Value::Int(port)) = master.get(1)
        {
            return format!("cluster{}", port - 16399);
        }
    }
    panic!("no master serves slot {slot}");
}

/// With `replicas=1` a grant counts only once the slot's replica
/// acknowledges it: with that replica frozen the grant is given back and
/// the attempt fails as transient; once it answers again, grants go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_does_not_acknowledge_refuses_the_grant() {
    let _serial = one_at_a_time(&SERIAL).await;
    let one = client("&replicas=1&replicas_timeout=200ms").await;
    let plain = client("").await;
    let name = unique("cluster-replicas");
    let g = one
        .try_acquire(&name, &opts(Duration::from_secs(5)))
        .await
        .expect("the replica acknowledges")
        .expect("free");
    assert!(g.release().await.expect("release"));
    let master = master_of(&name).await;
    let replica = replica_of(&master);
    // Paused for less than the cluster's node timeout would matter: the
    // master stays master, only the acknowledgement is missing.
    let _resume = Restore::servers([replica.as_str()]);
    services(&["pause", &replica]);
    let refused = one.try_acquire(&name, &opts(Duration::from_secs(5))).await;
    // The tests' own replication check waits for the paused replica too.
    let acked = acked_replicas(&name, Duration::from_secs(2)).await;
    services(&["resume", &replica]);
    assert_eq!(
        acked, 0,
        "a write the paused replica has not taken is not acknowledged"
    );
    assert!(
        matches!(refused, Err(LockError::Unavailable { .. })),
        "a grant the replica did not acknowledge is refused as transient: {refused:?}"
    );
    let mut free = false;
    for _ in 0..20 {
        if !plain.inspect(&name).await.expect("inspect").held {
            free = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(free, "the refused grant was given back");
    let mut granted = None;
    for _ in 0..40 {
        if let Ok(Some(g)) = one.try_acquire(&name, &opts(Duration::from_secs(5))).await {
            granted = Some(g);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let g = granted.expect("the replica acknowledges again after the resume");
    assert!(g.release().await.expect("release"));
}

/// The name of the replica of cluster master `master`, from the node's own
/// `ROLE` (the first replica it lists).
fn replica_of(master: &str) -> String {
    let port: u16 = master
        .trim_start_matches("cluster")
        .parse::<u16>()
        .expect("a node name")
        + 16399;
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "role"])
        .output()
        .expect("redis-cli");
    let role = String::from_utf8(out.stdout).expect("utf-8");
    // master, offset, then each replica's host, port and offset.
    let replica_port: u16 = role
        .lines()
        .nth(3)
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("{master} has no replica: {role}"));
    format!("cluster{}", replica_port - 16399)
}
