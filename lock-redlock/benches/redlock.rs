//! Redlock benchmark: N = 1, 3, 5 against a single lock-redis cycle on the
//! same server and against the `rslock` crate on the same nodes, in one run.
//!
//! ```sh
//! export $(scripts/services.sh env | xargs)
//! cargo bench -p lock-redlock --bench redlock
//! ```
//!
//! Measures, in interleaved blocks (`lock_testkit::bench::cycles`): PING to
//! the first node; the raw floor on five nodes (`SET NX PX` on all, done at
//! a majority, then a compare-and-delete the same way); Redlock's own two
//! node scripts (lock-redis's, with the fencing counter and the waiters'
//! queue) sent the same way with plain redis-rs, which parts what the
//! scripts cost on five servers from the client around them; the same
//! through reconnecting connections (`ConnectionManager`, as Redlock keeps
//! one per node, so that a node that restarts is used again) with each
//! request under the node timeout (so that a slow node never delays the
//! outcome), which parts those two needs from the rest; lock-redis
//! acquire+release on the first node; Redlock acquire+release with N = 1,
//! 3, 5, and N = 5 with the guard's renewal; read and write grants of a
//! reader-writer lock against the hand-written one with the same
//! guarantees (`lock_testkit::bench::redis_rw_floor`, on every node, at a
//! majority); rslock lock+unlock with N = 5.
//! Then 8 tasks with a client each, 1 ms of work inside the lock and a 1 ms
//! pause outside: acquisitions per second, hand-offs (also in round trips)
//! and per-task min/max, distlock's Redlock (N = 5) against rslock (N = 5).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::{Either, FutureExt};
use futures_util::stream::{FuturesUnordered, StreamExt};
use lock_core::{DistributedLock, LockOptions, Wait};
use lock_redis::RedisLock;
use lock_redis::raw::{ACQUIRE, RELEASE};
use lock_redlock::{Redlock, RedlockConfig};
use lock_testkit::bench::cycles::{Cycles, RW_READ, RW_WRITE};
use lock_testkit::bench::redis_rw_floor;
use lock_testkit::bench::{
    contend, contend_on, print_handoff_round_trips, print_runs, print_rw_mix, ratios,
};
use redis::aio::{ConnectionLike, ConnectionManagerConfig};

/// Cycles per variant in a block, and rounds of blocks (after one to warm up).
const BLOCK: usize = 50;
const ROUNDS: usize = 20;
const RTT: &str = "round trip: PING, first node";
const FLOOR: &str = "raw floor N=5: SET NX PX + CAD, at a majority";
const SCRIPTS: &str = "Redlock's two node scripts, plain redis-rs, N=5, at a majority";
const MANAGED: &str =
    "the same through reconnecting connections, each request under the node timeout";
const SINGLE: &str = "lock-redis, first node, auto-renew off";
/// Redlock with N = 1, 3, 5, auto-renew off.
const SETS: [&str; 3] = [
    "Redlock N=1, auto-renew off",
    "Redlock N=3, auto-renew off",
    "Redlock N=5, auto-renew off",
];
const OURS: &str = "Redlock N=5 acquire + release";
const RW_READ_FLOOR: &str =
    "read floor N=5: hand-written reader-writer scripts, plain redis-rs, at a majority";
const RW_WRITE_FLOOR: &str =
    "write floor N=5: hand-written reader-writer scripts, plain redis-rs, at a majority";
const PEER: &str = "rslock N=5 lock + unlock";
const NAMES: [&str; 3] = ["bench:redlock-1", "bench:redlock-3", "bench:redlock-5"];
const TASKS: usize = 8;
const RUN: Duration = Duration::from_secs(4);
const WORK: Duration = Duration::from_millis(1);

fn hosts() -> Vec<String> {
    let url = std::env::var("DISTLOCK_TEST_REDLOCK_URL")
        .expect("DISTLOCK_TEST_REDLOCK_URL (see scripts/services.sh env)");
    lock_testkit::faults::upstreams_of(&url)
}

async fn redlock(hosts: &[String]) -> Redlock {
    Redlock::connect(&format!("redlock://{}", hosts.join(",")))
        .await
        .expect("redlock")
}

fn rslock(hosts: &[String]) -> rslock::LockManager {
    rslock::LockManager::new(hosts.iter().map(|h| format!("redis://{h}")).collect())
}

#[tokio::main]
async fn main() {
    let hosts = hosts();
    assert!(hosts.len() >= 5, "five nodes expected");
    let first = format!("redis://{}", hosts[0]);
    let mut conn = redis::Client::open(first.as_str())
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let single = RedisLock::connect(&first).await.expect("lock-redis");
    let sets = [
        redlock(&hosts[..1]).await,
        redlock(&hosts[..3]).await,
        redlock(&hosts[..5]).await,
    ];
    let peer = rslock(&hosts[..5]);
    let mut conns = Vec::new();
    for host in &hosts[..5] {
        conns.push(
            redis::Client::open(format!("redis://{host}"))
                .expect("client")
                .get_multiplexed_async_connection()
                .await
                .expect("connect"),
        );
    }
    // Reconnecting connections set up as Redlock sets up its own.
    let config = RedlockConfig::default();
    let mut managed = Vec::new();
    for host in &hosts[..5] {
        let settings = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.node_timeout.max(config.connect_timeout)))
            .set_number_of_retries(0);
        managed.push(
            redis::Client::open(format!("redis://{host}"))
                .expect("client")
                .get_connection_manager_with_config(settings)
                .await
                .expect("connect"),
        );
    }
    let cad = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    );
    let renewed = LockOptions::new().wait(Wait::No);
    let unrenewed = LockOptions::new().auto_renew(false).wait(Wait::No);
    let rw_scripts = (
        redis::Script::new(redis_rw_floor::ACQUIRE),
        redis::Script::new(redis_rw_floor::RELEASE),
    );
    // Loaded on every node first: a request dropped once a majority
    // answered would otherwise be dropped between its NOSCRIPT and the
    // load, leaving its grant or key behind on that node.
    for conn in &mut conns {
        for script in [&rw_scripts.0, &rw_scripts.1] {
            script.load_async(conn).await.expect("load a floor script");
        }
    }

    let mut m = Cycles::new("redlock", BLOCK);
    for round in 0..=ROUNDS {
        m.warm_up(round == 0);
        m.measure(RTT, async |_| {
            let _: String = redis::cmd("PING")
                .query_async(&mut conn)
                .await
                .expect("PING");
        })
        .await;
        m.measure(FLOOR, async |i| {
            let token = format!("{i:032x}");
            let token = &token;
            let sets = conns.iter_mut().map(|c| async move {
                redis::cmd("SET")
                    .arg("bench:raw")
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async::<Option<String>>(c)
                    .await
            });
            majority(sets).await;
            let cad = &cad;
            let deletes = conns.iter_mut().map(|c| async move {
                cad.key("bench:raw").arg(token).invoke_async::<i64>(c).await
            });
            majority(deletes).await;
        })
        .await;
        m.measure(SCRIPTS, async |i| scripts(&mut conns, i, None).await)
            .await;
        m.measure(MANAGED, async |i| {
            scripts(&mut managed, i, Some(config.node_timeout)).await;
        })
        .await;
        m.measure(SINGLE, async |_| {
            let g = single
                .acquire("bench:single", &unrenewed)
                .await
                .expect("acquire");
            assert!(g.release().await.expect("release"));
        })
        .await;
        // A name per set: the sets share nodes, and each keeps its own
        // counters in step on its own nodes.
        for ((label, set), name) in SETS.into_iter().zip(&sets).zip(NAMES) {
            m.measure_lock(label, set, name, &unrenewed).await;
        }
        m.measure_lock(OURS, &sets[2], "bench:redlock-renewed", &renewed)
            .await;
        m.measure_sets(&sets[2], "bench:set:", &unrenewed).await;
        m.measure(RW_READ_FLOOR, async |i| {
            rw_floor(&rw_scripts, &mut conns, i, false).await;
        })
        .await;
        m.measure(RW_WRITE_FLOOR, async |i| {
            rw_floor(&rw_scripts, &mut conns, i, true).await;
        })
        .await;
        m.measure_rw(&sets[2], "bench:rw", &renewed).await;
        m.measure(PEER, async |_| {
            let l = peer
                .lock("bench:rslock", Duration::from_secs(30))
                .await
                .expect("rslock");
            peer.unlock(&l).await;
        })
        .await;
    }
    m.print();
    for ours in [OURS, SETS[2]] {
        m.compare(ours, FLOOR);
        m.compare(ours, PEER);
    }
    m.compare(SCRIPTS, FLOOR);
    m.compare(OURS, SCRIPTS);
    m.compare(SETS[2], SCRIPTS);
    m.compare(MANAGED, SCRIPTS);
    m.compare(OURS, MANAGED);
    m.compare(SETS[2], MANAGED);
    m.compare(SETS[0], SINGLE);
    m.compare(SETS[2], SETS[0]);
    m.compare_sets();
    m.compare_rw(OURS);
    m.compare(RW_READ, RW_READ_FLOOR);
    m.compare(RW_WRITE, RW_WRITE_FLOOR);

    let mut clients = Vec::new();
    let mut managers = Vec::new();
    for _ in 0..TASKS {
        clients.push(Arc::new(redlock(&hosts[..5]).await) as Arc<dyn DistributedLock>);
        managers.push(rslock(&hosts[..5]));
    }
    let managers = Arc::new(managers);
    let o = LockOptions::new()
        .auto_renew(false)
        .wait_timeout(Duration::from_secs(30));
    print_rw_mix("redlock", clients.clone(), "bench:rw-mix", o.clone(), RUN).await;
    let ours = contend_on(clients, "bench/contended", o, WORK, WORK, RUN).await;
    let theirs = contend(TASKS, RUN, |t, end, log| {
        let managers = managers.clone();
        async move {
            while Instant::now() < end {
                let l = managers[t]
                    .acquire_no_guard("bench:rslock-contended", Duration::from_secs(30))
                    .await
                    .expect("rslock acquire");
                let granted = Instant::now();
                tokio::time::sleep(WORK).await;
                let released = Instant::now();
                managers[t].unlock(&l).await;
                log.lock().expect("log").push((granted, released, t));
                tokio::time::sleep(WORK).await;
            }
        }
    })
    .await;
    print_runs(
        &format!("{TASKS} tasks, a client each, N=5; 1 ms of work inside, 1 ms pause outside"),
        RUN,
        &[("distlock", &ours), ("rslock", &theirs)],
    );
    let (acquisitions, _) = ratios(&ours, &theirs);
    println!("  distlock / rslock: {acquisitions:.2}x acquisitions/s");
    if let Some(rtt) = m.figures(RTT) {
        print_handoff_round_trips(&[("distlock", &ours), ("rslock", &theirs)], rtt.wall.0);
    }
}

/// One cycle of Redlock's two node scripts on `conns` (five nodes), each
/// done at a majority; each request under `bound` if given.
async fn scripts<C: ConnectionLike + Send>(conns: &mut [C], i: usize, bound: Option<Duration>) {
    let token = format!("{i:032x}");
    let token = &token;
    let acquires = conns.iter_mut().map(|c| async move {
        let mut call = ACQUIRE.prepare_invoke();
        call.key("bench:{s}")
            .key("bench:{s}:fence")
            .key("bench:{s}:queue")
            .key("bench:{s}:handoff")
            .arg(token)
            .arg(30_000)
            .arg("")
            .arg(30_000)
            .arg("");
        bounded(bound, call.invoke_async::<(i64, i64)>(c)).await
    });
    majority(acquires).await;
    let releases = conns.iter_mut().map(|c| async move {
        let mut call = RELEASE.prepare_invoke();
        call.key("bench:{s}")
            .key("bench:{s}:queue")
            .key("bench:{s}:handoff")
            .arg(token)
            .arg("bench:{s}:released")
            .arg(1_000);
        bounded(bound, call.invoke_async::<i64>(c)).await
    });
    majority(releases).await;
}

/// One cycle of the hand-written reader-writer lock
/// ([`redis_rw_floor`]) on every node, done at a majority: acquire for
/// reading or writing, release.
async fn rw_floor<C: ConnectionLike + Send>(
    scripts: &(redis::Script, redis::Script),
    conns: &mut [C],
    i: usize,
    write: bool,
) {
    let keys = &redis_rw_floor::Keys::of("bench:rw-floor");
    let owner = &format!("{i:032x}");
    let arrival = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let access = if write { "w" } else { "r" };
    let acquires = conns.iter_mut().map(|c| async move {
        let mut call = scripts.0.prepare_invoke();
        call.key(&keys.writer)
            .key(&keys.readers)
            .key(&keys.counter)
            .key(&keys.marks)
            .arg(owner)
            .arg(30_000)
            .arg(access)
            .arg(&keys.reader_prefix)
            .arg(arrival);
        call.invoke_async::<Vec<i64>>(c).await
    });
    majority(acquires).await;
    let releases = conns.iter_mut().map(|c| async move {
        let mut call = scripts.1.prepare_invoke();
        call.key(keys.grant(owner, write))
            .key(&keys.readers)
            .arg(owner)
            .arg(&keys.channel);
        call.invoke_async::<i64>(c).await
    });
    majority(releases).await;
}

/// `request` under `bound` if given, a timeout being a failed reply. A
/// combinator, not an `async fn`, so that the request's future is held
/// once (as Redlock's own node requests are).
fn bounded<T>(
    bound: Option<Duration>,
    request: impl Future<Output = redis::RedisResult<T>>,
) -> impl Future<Output = redis::RedisResult<T>> {
    match bound {
        Some(limit) => Either::Left(tokio::time::timeout(limit, request).map(|reply| {
            reply.unwrap_or_else(|_| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no answer within the node timeout",
                )
                .into())
            })
        })),
        None => Either::Right(request),
    }
}

/// Wait for a majority of `replies` (each must succeed); the others are
/// dropped, as a Redlock client that is done at a majority would.
async fn majority<T, E: std::fmt::Debug>(
    replies: impl Iterator<Item = impl Future<Output = Result<T, E>>>,
) {
    let mut pending: FuturesUnordered<_> = replies.collect();
    let quorum = pending.len() / 2 + 1;
    for _ in 0..quorum {
        pending
            .next()
            .await
            .expect("a reply")
            .expect("the node answered");
    }
}
