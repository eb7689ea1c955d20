//! Redis lock benchmark: distlock against the raw round trip of the same
//! server and against the `rslock` crate, in one run.
//!
//! ```sh
//! eval "$(scripts/services.sh env | sed 's/^/export /')"
//! cargo bench -p lock-redis --bench redis
//! ```
//!
//! Measures, in interleaved blocks (`lock_testkit::bench::cycles`): PING;
//! the raw floor (`SET NX PX` plus a compare-and-delete script, plain
//! redis-rs); the floor with a fencing token (`SET NX PX` and `INCR` in
//! one script, then compare-and-delete: the cheapest hand-written lock with
//! distlock's guarantees); distlock's two scripts sent with plain redis-rs; distlock
//! acquire+release with and without the guard's renewal; a permit of a
//! semaphore of 4 against the hand-written permit (the first free slot key
//! by `SET NX PX` and `INCR` in one script, compare-and-delete); read and
//! write grants of a reader-writer lock against the hand-written one with
//! the same guarantees (`lock_testkit::bench::redis_rw_floor`); rslock
//! lock+unlock. Then, for 8 tasks with a client each and 1 ms of work
//! inside the lock, once with a 1 ms pause after each release (contention)
//! and once re-acquiring at once (barging): acquisitions per second,
//! hand-offs per second between different tasks, hand-off latency (also in
//! round trips), and per-task min/max acquisitions (fairness), against
//! rslock and against a hand-written notified lock (`SET NX PX`; a waiter
//! subscribes to a channel the release publishes on): the hand-off a
//! notification allows on this server and machine; and against a queued
//! notified lock (distlock's own scripts on plain redis-rs: the queue, the
//! hand-off to its head, a message to that waiter only), to part the cost
//! of first-come-first-served order from the client library's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use lock_core::{DistributedLock, LockOptions, Wait};
use lock_redis::RedisLock;
use lock_testkit::bench::cycles::{Cycles, RW_READ, RW_WRITE};
use lock_testkit::bench::redis_rw_floor;
use lock_testkit::bench::{
    contend, contend_on, print_handoff_round_trips, print_runs, print_rw_mix, ratios,
};

/// Cycles per variant in a block, and rounds of blocks (after one to warm up).
const BLOCK: usize = 100;
const ROUNDS: usize = 20;
const RTT: &str = "round trip: PING";
const FLOOR: &str = "raw floor: SET NX PX + compare-and-delete";
const SCRIPTS: &str = "distlock's two scripts, plain redis-rs";
const FENCED_FLOOR: &str = "floor with a token: SET NX PX + INCR script, compare-and-delete";
/// The cheapest hand-written lock with a fencing token: `SET NX PX` and, if
/// granted, `INCR` of the name's counter, in one script.
const FENCED_ACQUIRE: &str = "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
     return redis.call('INCR', KEYS[2]) end return 0";
/// The cheapest hand-written permit of a semaphore with a token per grant:
/// the first free slot key by `SET NX PX` and the name's counter by `INCR`,
/// in one script; released by compare-and-delete of the slot key.
const PERMIT_FLOOR: &str =
    "permit floor: first free slot SET NX PX + INCR script, compare-and-delete";
const PERMIT_ACQUIRE: &str = "for s = 0, tonumber(ARGV[3]) - 1 do \
     local key = ARGV[4] .. s \
     if redis.call('SET', key, ARGV[1], 'NX', 'PX', ARGV[2]) then \
     return {s, redis.call('INCR', KEYS[1])} end end return {-1, 0}";
const OURS_PERMIT: &str = "distlock permit of 4: acquire + release";
const PERMIT_SCRIPTS: &str = "distlock's two permit scripts, plain redis-rs";
/// The permit scripts of `lock-redis` (the same files).
const PERMIT_ACQUIRE_LUA: &str = include_str!("../src/permit_acquire.lua");
const PERMIT_RELEASE_LUA: &str = include_str!("../src/permit_release.lua");
/// The benchmark semaphore's limit.
const PERMITS: u32 = 4;
const OURS: &str = "distlock acquire + release";
const RW_READ_FLOOR: &str = "read floor: hand-written reader-writer scripts, plain redis-rs";
const RW_WRITE_FLOOR: &str = "write floor: hand-written reader-writer scripts, plain redis-rs";
const OURS_UNRENEWED: &str = "distlock, auto-renew off";
const PEER: &str = "rslock lock + unlock";

/// The acquire and release scripts of `lock-redis` (the same files), for
/// the "scripts alone" row.
const ACQUIRE_LUA: &str = include_str!("../src/acquire.lua");
const RELEASE_LUA: &str = include_str!("../src/release.lua");
const TASKS: usize = 8;
const RUN: Duration = Duration::from_secs(4);
const WORK: Duration = Duration::from_millis(1);

/// The hand-written notified lock's release: compare-and-delete, then a
/// message to the waiters.
const NOTIFYING_RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     redis.call('DEL', KEYS[1]) redis.call('PUBLISH', KEYS[2], '') return 1 end return 0";

/// `SET key token NX PX 30000`: whether it was set.
async fn set_nx(conn: &mut redis::aio::MultiplexedConnection, key: &str, token: &str) -> bool {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(conn)
        .await
        .expect("SET");
    set.is_some()
}

/// One task of the hand-written notified lock: `SET NX PX`; if refused,
/// wait for a release message (or 10 ms) and try again; hold for `WORK`,
/// release with [`NOTIFYING_RELEASE`], pause for `pause`; until `end`.
async fn notified_task(
    client: redis::Client,
    t: usize,
    end: Instant,
    pause: Duration,
    log: lock_testkit::bench::TurnLog,
) {
    let (key, channel) = ("bench:notified", "bench:notified:released");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut pubsub = client.get_async_pubsub().await.expect("pubsub");
    pubsub.subscribe(channel).await.expect("subscribe");
    let mut released = pubsub.on_message();
    let release = redis::Script::new(NOTIFYING_RELEASE);
    let mut n = 0u64;
    while Instant::now() < end {
        n += 1;
        let token = format!("{t}:{n}");
        loop {
            if set_nx(&mut conn, key, &token).await {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(10), released.next()).await;
        }
        let granted = Instant::now();
        tokio::time::sleep(WORK).await;
        let let_go = Instant::now();
        let ours: i64 = release
            .key(key)
            .key(channel)
            .arg(&token)
            .invoke_async(&mut conn)
            .await
            .expect("release");
        assert_eq!(ours, 1);
        log.lock().expect("log").push((granted, let_go, t));
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
}

/// The keys (and release channel) of one lock under distlock's scripts.
struct ScriptKeys {
    lock: &'static str,
    fence: &'static str,
    queue: &'static str,
    handoff: &'static str,
    channel: &'static str,
}

/// The uncontended "scripts alone" lock's keys.
const SCRIPTS_KEYS: ScriptKeys = ScriptKeys {
    lock: "bench:{s}",
    fence: "bench:{s}:fence",
    queue: "bench:{s}:queue",
    handoff: "bench:{s}:handoff",
    channel: "bench:{s}:released",
};

/// The queued notified lock's keys.
const QUEUED_KEYS: ScriptKeys = ScriptKeys {
    lock: "bench:{f}",
    fence: "bench:{f}:fence",
    queue: "bench:{f}:queue",
    handoff: "bench:{f}:handoff",
    channel: "bench:{f}:released",
};

/// distlock's acquire script for `owner` (a `waiter` id, or `""`, queues
/// if refused): whether it was granted.
async fn script_acquire(
    script: &redis::Script,
    conn: &mut redis::aio::MultiplexedConnection,
    keys: &ScriptKeys,
    owner: &str,
    waiter: &str,
) -> bool {
    let (granted, _): (i64, i64) = script
        .key(keys.lock)
        .key(keys.fence)
        .key(keys.queue)
        .key(keys.handoff)
        .arg(owner)
        .arg(30_000)
        .arg(waiter)
        .arg(30_000)
        .invoke_async(conn)
        .await
        .expect("acquire script");
    granted == 1
}

/// distlock's release script for `owner`: whether it was still theirs.
async fn script_release(
    script: &redis::Script,
    conn: &mut redis::aio::MultiplexedConnection,
    keys: &ScriptKeys,
    owner: &str,
) -> bool {
    let released: i64 = script
        .key(keys.lock)
        .key(keys.queue)
        .key(keys.handoff)
        .arg(owner)
        .arg(keys.channel)
        .arg(1_000)
        .invoke_async(conn)
        .await
        .expect("release script");
    released == 1
}

/// The floors' release: delete `key` if it still holds `token`.
async fn compare_and_delete(
    cad: &redis::Script,
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    token: &str,
) {
    let _: i64 = cad
        .key(key)
        .arg(token)
        .invoke_async(conn)
        .await
        .expect("CAD");
}

/// One task of the hand-written queued notified lock: distlock's own acquire
/// and release scripts on plain redis-rs. A refused acquisition joins the
/// queue under the task's waiter id; a release hands the lock to the head
/// of the queue and publishes its id, and only that waiter tries again (or
/// after 10 ms). The same protocol as distlock's, without the library.
async fn queued_task(
    client: redis::Client,
    t: usize,
    end: Instant,
    pause: Duration,
    log: lock_testkit::bench::TurnLog,
) {
    let waiter = format!("waiter-{t}");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut pubsub = client.get_async_pubsub().await.expect("pubsub");
    pubsub
        .subscribe(QUEUED_KEYS.channel)
        .await
        .expect("subscribe");
    let mut released = pubsub.on_message();
    let (acquire, release) = (
        redis::Script::new(ACQUIRE_LUA),
        redis::Script::new(RELEASE_LUA),
    );
    let mut n = 0u64;
    while Instant::now() < end {
        n += 1;
        let owner = format!("{t}:{n}");
        loop {
            if script_acquire(&acquire, &mut conn, &QUEUED_KEYS, &owner, &waiter).await {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(10), async {
                while let Some(message) = released.next().await {
                    if message.get_payload::<String>().ok().as_deref() == Some(waiter.as_str()) {
                        break;
                    }
                }
            })
            .await;
        }
        let granted = Instant::now();
        tokio::time::sleep(WORK).await;
        let let_go = Instant::now();
        assert!(script_release(&release, &mut conn, &QUEUED_KEYS, &owner).await);
        log.lock().expect("log").push((granted, let_go, t));
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
}

/// One cycle of the hand-written reader-writer lock
/// ([`redis_rw_floor`]): acquire for reading or writing, release.
async fn rw_floor_cycle(
    scripts: &(redis::Script, redis::Script),
    conn: &mut redis::aio::MultiplexedConnection,
    keys: &redis_rw_floor::Keys,
    i: usize,
    write: bool,
) {
    let owner = format!("{i:032x}");
    let arrival = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let granted: Vec<i64> = scripts
        .0
        .key(&keys.writer)
        .key(&keys.readers)
        .key(&keys.counter)
        .key(&keys.marks)
        .arg(&owner)
        .arg(30_000)
        .arg(if write { "w" } else { "r" })
        .arg(&keys.reader_prefix)
        .arg(arrival)
        .invoke_async(conn)
        .await
        .expect("floor acquire");
    assert_eq!(granted.first(), Some(&1), "{granted:?}");
    let released: i64 = scripts
        .1
        .key(keys.grant(&owner, write))
        .key(&keys.readers)
        .arg(&owner)
        .arg(&keys.channel)
        .invoke_async(conn)
        .await
        .expect("floor release");
    assert_eq!(released, 1);
}

fn url() -> String {
    std::env::var("DISTLOCK_TEST_REDIS_URL")
        .expect("DISTLOCK_TEST_REDIS_URL (see scripts/services.sh env)")
}

#[tokio::main]
async fn main() {
    let url = url();
    let client = redis::Client::open(url.as_str()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");

    let cad = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    );
    let locks = RedisLock::connect(&url).await.expect("distlock");
    let renewed = LockOptions::new().wait(Wait::No);
    let unrenewed = LockOptions::new().auto_renew(false).wait(Wait::No);
    let rs = rslock::LockManager::new(vec![url.clone()]);
    // distlock's own two scripts, sent with plain redis-rs calls: what the
    // scripts cost on the server, apart from the client library around them.
    let acquire_script = redis::Script::new(ACQUIRE_LUA);
    let fenced_acquire = redis::Script::new(FENCED_ACQUIRE);
    let release_script = redis::Script::new(RELEASE_LUA);
    let permit_acquire = redis::Script::new(PERMIT_ACQUIRE);
    let our_permit_acquire = redis::Script::new(PERMIT_ACQUIRE_LUA);
    let our_permit_release = redis::Script::new(PERMIT_RELEASE_LUA);
    let record = LockOptions::new().holder_record().as_bytes().to_vec();
    let permit = renewed.clone().permits(PERMITS);
    let rw_floor = (
        redis::Script::new(redis_rw_floor::ACQUIRE),
        redis::Script::new(redis_rw_floor::RELEASE),
    );
    let rw_keys = redis_rw_floor::Keys::of("bench:rw-floor");

    let mut m = Cycles::new("redis", BLOCK);
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
            assert!(set_nx(&mut conn, "bench:raw", &token).await);
            compare_and_delete(&cad, &mut conn, "bench:raw", &token).await;
        })
        .await;
        m.measure(FENCED_FLOOR, async |i| {
            let token = format!("{i:032x}");
            let fence: i64 = fenced_acquire
                .key("bench:fenced")
                .key("bench:fenced:fence")
                .arg(&token)
                .arg(30_000)
                .invoke_async(&mut conn)
                .await
                .expect("acquire with a token");
            assert!(fence > 0);
            compare_and_delete(&cad, &mut conn, "bench:fenced", &token).await;
        })
        .await;
        m.measure(SCRIPTS, async |i| {
            let token = format!("{i:032x}");
            assert!(script_acquire(&acquire_script, &mut conn, &SCRIPTS_KEYS, &token, "").await);
            script_release(&release_script, &mut conn, &SCRIPTS_KEYS, &token).await;
        })
        .await;
        for (label, opts) in [(OURS, &renewed), (OURS_UNRENEWED, &unrenewed)] {
            m.measure_lock(label, &locks, "bench:distlock", opts).await;
        }
        m.measure(PERMIT_FLOOR, async |i| {
            let token = format!("{i:032x}");
            let (slot, fence): (i64, i64) = permit_acquire
                .key("bench:{permit-floor}:fence")
                .arg(&token)
                .arg(30_000)
                .arg(PERMITS)
                .arg("bench:{permit-floor}:slot:")
                .invoke_async(&mut conn)
                .await
                .expect("a permit");
            assert!(slot >= 0 && fence > 0);
            let key = format!("bench:{{permit-floor}}:slot:{slot}");
            compare_and_delete(&cad, &mut conn, &key, &token).await;
        })
        .await;
        m.measure(PERMIT_SCRIPTS, async |i| {
            let token = format!("{i:032x}");
            let base = "bench:{permit-scripts}:permit:";
            let granted: Vec<i64> = our_permit_acquire
                .key("bench:{permit-scripts}:permits:limit")
                .key("bench:{permit-scripts}:permits:fence")
                .key("bench:{permit-scripts}:permits")
                .arg(base)
                .arg(&token)
                .arg(30_000)
                .arg(PERMITS)
                .arg(&record)
                .invoke_async(&mut conn)
                .await
                .expect("permit script");
            assert_eq!(granted.first(), Some(&1), "{granted:?}");
            let slot = granted[1];
            let released: i64 = our_permit_release
                .key(format!("{base}{slot}"))
                .arg(&token)
                .arg("bench:{permit-scripts}:permits:released")
                .arg("permits:bench")
                .arg(base)
                .arg(slot)
                .arg(slot)
                .invoke_async(&mut conn)
                .await
                .expect("permit release script");
            assert_eq!(released, 1);
        })
        .await;
        m.measure_lock(OURS_PERMIT, &locks, "bench:permit", &permit)
            .await;
        m.measure_sets(&locks, "bench:set:", &unrenewed).await;
        m.measure(RW_READ_FLOOR, async |i| {
            rw_floor_cycle(&rw_floor, &mut conn, &rw_keys, i, false).await;
        })
        .await;
        m.measure(RW_WRITE_FLOOR, async |i| {
            rw_floor_cycle(&rw_floor, &mut conn, &rw_keys, i, true).await;
        })
        .await;
        m.measure_rw(&locks, "bench:rw", &renewed).await;
        m.measure(PEER, async |_| {
            let l = rs
                .lock("bench:rslock", Duration::from_secs(30))
                .await
                .expect("rslock");
            rs.unlock(&l).await;
        })
        .await;
    }
    m.print();
    for ours in [OURS, OURS_UNRENEWED] {
        m.compare(ours, FLOOR);
        m.compare(ours, FENCED_FLOOR);
        // The hand-written lock with the same guarantees: a fencing token,
        // waiters served in arrival order, a release waking the next one.
        m.compare(ours, SCRIPTS);
        m.compare(ours, PEER);
    }
    m.compare(SCRIPTS, FLOOR);
    m.compare(SCRIPTS, FENCED_FLOOR);
    // A permit against the hand-written permit with the same guarantees
    // (a slot, a token per grant, compare-and-delete), and against a lock.
    m.compare(OURS_PERMIT, PERMIT_FLOOR);
    // The library around the scripts, and the scripts' own cost (the limit
    // check, the holder record) over the floor's.
    m.compare(OURS_PERMIT, PERMIT_SCRIPTS);
    m.compare(PERMIT_SCRIPTS, PERMIT_FLOOR);
    m.compare(OURS_PERMIT, OURS);
    m.compare_sets();
    m.compare_rw(OURS);
    m.compare(RW_READ, RW_READ_FLOOR);
    m.compare(RW_WRITE, RW_WRITE_FLOOR);

    let mut clients = Vec::new();
    let mut managers = Vec::new();
    for _ in 0..TASKS {
        clients.push(
            Arc::new(RedisLock::connect(&url).await.expect("distlock client"))
                as Arc<dyn DistributedLock>,
        );
        managers.push(rslock::LockManager::new(vec![url.clone()]));
    }
    let managers = Arc::new(managers);
    let mix = LockOptions::new()
        .auto_renew(false)
        .wait_timeout(Duration::from_secs(30));
    print_rw_mix("redis", clients.clone(), "bench:rw-mix", mix, RUN).await;
    for (scenario, pause) in [
        ("contention: 1 ms of work inside, 1 ms pause outside", WORK),
        (
            "barging: 1 ms of work inside, re-acquire at once",
            Duration::ZERO,
        ),
    ] {
        let o = LockOptions::new()
            .auto_renew(false)
            .wait_timeout(Duration::from_secs(30));
        let ours = contend_on(clients.clone(), "bench:contended", o, WORK, pause, RUN).await;
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
                    if !pause.is_zero() {
                        tokio::time::sleep(pause).await;
                    }
                }
            }
        })
        .await;
        let notified = contend(TASKS, RUN, |t, end, log| {
            notified_task(client.clone(), t, end, pause, log)
        })
        .await;
        let queued = contend(TASKS, RUN, |t, end, log| {
            queued_task(client.clone(), t, end, pause, log)
        })
        .await;
        print_runs(
            &format!("{TASKS} tasks, a client each; {scenario}"),
            RUN,
            &[
                ("distlock", &ours),
                ("rslock", &theirs),
                ("notified", &notified),
                ("queued", &queued),
            ],
        );
        let (acquisitions, handoffs) = ratios(&ours, &theirs);
        println!(
            "  distlock / rslock: {acquisitions:.2}x acquisitions/s, {handoffs:.1}x hand-offs/s"
        );
        if let Some(rtt) = m.figures(RTT) {
            print_handoff_round_trips(
                &[
                    ("distlock", &ours),
                    ("rslock", &theirs),
                    ("notified", &notified),
                    ("queued", &queued),
                ],
                rtt.wall.0,
            );
        }
    }
}
