//! Redlock benchmark: N = 1, 3, 5 against a single lock-redis cycle on the
//! same server and against the `rslock` crate on the same nodes, in one run.
//!
//! ```sh
//! export $(scripts/services.sh env | xargs)
//! cargo bench -p lock-redlock --bench redlock
//! ```
//!
//! Reports p50/p99 of PING to the first node; lock-redis acquire+release on
//! the first node; Redlock acquire+release with N = 1, 3, 5; rslock
//! lock+unlock with N = 5 — interleaved sample by sample. Then 8 tasks with
//! a client each, 1 ms of work inside the lock and a 1 ms pause outside:
//! acquisitions per second, hand-offs and per-task min/max, distlock's
//! Redlock (N = 5) against rslock (N = 5).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{DistributedLock, LockOptions, Wait};
use lock_redis::RedisLock;
use lock_redlock::Redlock;
use lock_testkit::bench::{contend, contend_on, percentiles, print_runs, ratios, us};

const SAMPLES: usize = 1_000;
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
    let opts = LockOptions::new().auto_renew(false).wait(Wait::No);

    let mut samples: [Vec<Duration>; 6] = Default::default();
    for i in 0..SAMPLES + SAMPLES / 10 {
        let keep = i >= SAMPLES / 10; // the first tenth warms up
        let mut row = [Duration::ZERO; 6];
        let t = Instant::now();
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .expect("PING");
        row[0] = t.elapsed();

        let t = Instant::now();
        let g = single
            .acquire("bench:single", &opts)
            .await
            .expect("acquire");
        assert!(g.release().await.expect("release"));
        row[1] = t.elapsed();

        // A name per set: the sets share nodes, and each keeps its own
        // counters in step on its own nodes.
        for ((slot, set), name) in row[2..5].iter_mut().zip(&sets).zip(NAMES) {
            let t = Instant::now();
            let g = set.acquire(name, &opts).await.expect("acquire");
            assert!(g.release().await.expect("release"));
            *slot = t.elapsed();
        }

        let t = Instant::now();
        let l = peer
            .lock("bench:rslock", Duration::from_secs(30))
            .await
            .expect("rslock");
        peer.unlock(&l).await;
        row[5] = t.elapsed();

        if keep {
            for (v, d) in samples.iter_mut().zip(row) {
                v.push(d);
            }
        }
    }
    let [ping, single, n1, n3, n5, theirs] = samples.map(percentiles);
    println!("uncontended cycle (p50 / p99, µs)");
    for (what, (p50, p99)) in [
        ("PING, first node", ping),
        ("lock-redis acquire + release, first node", single),
        ("Redlock N=1 acquire + release", n1),
        ("Redlock N=3 acquire + release", n3),
        ("Redlock N=5 acquire + release", n5),
        ("rslock N=5 lock + unlock", theirs),
    ] {
        println!("  {what:<42} {:>8.1} / {:>8.1}", us(p50), us(p99));
    }
    let ratio =
        |a: (Duration, Duration), b: (Duration, Duration)| a.0.as_secs_f64() / b.0.as_secs_f64();
    println!(
        "  N=5 / N=1: {:.2}x   N=1 / lock-redis: {:.2}x   N=5 / rslock N=5: {:.2}x   (p50)",
        ratio(n5, n1),
        ratio(n1, single),
        ratio(n5, theirs)
    );

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
}
