//! Redis lock benchmark: distlock against the raw round trip of the same
//! server and against the `rslock` crate, in one run.
//!
//! ```sh
//! eval "$(scripts/services.sh env | sed 's/^/export /')"
//! cargo bench -p lock-redis --bench redis
//! ```
//!
//! Reports p50/p99 of: PING; the raw floor (`SET NX PX` plus a
//! compare-and-delete script, plain redis-rs); distlock acquire+release;
//! rslock lock+unlock — interleaved sample by sample. Then, for 8 tasks with
//! a client each and 1 ms of work inside the lock, once with a 1 ms pause
//! after each release (contention) and once re-acquiring at once (barging):
//! acquisitions per second, hand-offs per second between different tasks,
//! hand-off latency, and per-task min/max acquisitions (fairness).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{DistributedLock, LockOptions, Wait};
use lock_redis::RedisLock;
use lock_testkit::bench::{contend, contend_on, percentiles, print_runs, ratios, us};

const SAMPLES: usize = 2_000;

/// The acquire and release scripts of `lock-redis` (the same files), for
/// the "scripts alone" row.
const ACQUIRE_LUA: &str = include_str!("../src/acquire.lua");
const RELEASE_LUA: &str = include_str!("../src/release.lua");
const TASKS: usize = 8;
const RUN: Duration = Duration::from_secs(4);
const WORK: Duration = Duration::from_millis(1);

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
    let opts = LockOptions::new().auto_renew(false).wait(Wait::No);
    let rs = rslock::LockManager::new(vec![url.clone()]);
    // distlock's own two scripts, sent with plain redis-rs calls: what the
    // scripts cost on the server, apart from the client library around them.
    let acquire_script = redis::Script::new(ACQUIRE_LUA);
    let release_script = redis::Script::new(RELEASE_LUA);

    // The four cycles are interleaved sample by sample, so that all of them
    // see the same machine and server conditions.
    let mut samples: [Vec<Duration>; 5] = Default::default();
    for i in 0..SAMPLES + SAMPLES / 10 {
        let keep = i >= SAMPLES / 10; // the first tenth warms up
        let t = Instant::now();
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .expect("PING");
        let ping = t.elapsed();

        let t = Instant::now();
        let token = format!("{i:032x}");
        let set: Option<String> = redis::cmd("SET")
            .arg("bench:raw")
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut conn)
            .await
            .expect("SET");
        assert!(set.is_some());
        let _: i64 = cad
            .key("bench:raw")
            .arg(&token)
            .invoke_async(&mut conn)
            .await
            .expect("CAD");
        let raw = t.elapsed();

        let t = Instant::now();
        let g = locks
            .acquire("bench:distlock", &opts)
            .await
            .expect("acquire");
        assert!(g.release().await.expect("release"));
        let ours = t.elapsed();

        let t = Instant::now();
        let (lock, fence, queue, handoff) = (
            "bench:{s}",
            "bench:{s}:fence",
            "bench:{s}:queue",
            "bench:{s}:handoff",
        );
        let (granted, _): (i64, i64) = acquire_script
            .key(lock)
            .key(fence)
            .key(queue)
            .key(handoff)
            .arg(&token)
            .arg(30_000)
            .arg("")
            .arg(30_000)
            .invoke_async(&mut conn)
            .await
            .expect("acquire script");
        assert_eq!(granted, 1);
        let _: i64 = release_script
            .key(lock)
            .key(queue)
            .key(handoff)
            .arg(&token)
            .arg("bench:{s}:released")
            .arg(1_000)
            .invoke_async(&mut conn)
            .await
            .expect("release script");
        let scripts = t.elapsed();

        let t = Instant::now();
        let l = rs
            .lock("bench:rslock", Duration::from_secs(30))
            .await
            .expect("rslock");
        rs.unlock(&l).await;
        let peer = t.elapsed();

        if keep {
            for (v, d) in samples.iter_mut().zip([ping, raw, scripts, ours, peer]) {
                v.push(d);
            }
        }
    }
    let [ping, raw, scripts, ours, peer] = samples.map(percentiles);

    println!("uncontended (p50 / p99, µs)");
    for (what, (p50, p99)) in [
        ("PING round trip", ping),
        ("raw floor: SET NX PX + compare-and-delete", raw),
        ("distlock's two scripts, plain redis-rs", scripts),
        ("distlock acquire + release", ours),
        ("rslock lock + unlock", peer),
    ] {
        println!("  {what:<45} {:>8.1} / {:>8.1}", us(p50), us(p99));
    }
    let ratio =
        |a: (Duration, Duration), b: (Duration, Duration)| a.0.as_secs_f64() / b.0.as_secs_f64();
    println!(
        "  distlock / raw floor: {:.3}x   distlock / rslock: {:.3}x   scripts alone / raw floor: {:.3}x   (p50)",
        ratio(ours, raw),
        ratio(ours, peer),
        ratio(scripts, raw)
    );

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
        print_runs(
            &format!("{TASKS} tasks, a client each; {scenario}"),
            RUN,
            &[("distlock", &ours), ("rslock", &theirs)],
        );
        let (acquisitions, handoffs) = ratios(&ours, &theirs);
        println!(
            "  distlock / rslock: {acquisitions:.2}x acquisitions/s, {handoffs:.1}x hand-offs/s"
        );
    }
}
