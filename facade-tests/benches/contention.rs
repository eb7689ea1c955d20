//! Contention across backends: permits and reads under 8 and 32 contending
//! clients, NATS against Redis and etcd, in one run.
//!
//! ```sh
//! set -a; . <(scripts/services.sh env); set +a
//! cargo bench -p facade-tests --bench contention
//! ```
//!
//! Each client is a connection of its own (`distlock::connect` from the
//! test servers' URLs) and runs one task: take a permit of a semaphore of
//! 4, or the reader-writer lock (90 % reads, 10 % writes), hold it 1 ms,
//! give it back, wait 1 ms, again. Backends take turns within each round
//! (the machine is noisy: only ratios of one run compare); a table sums
//! the rounds, and the lines under it give each backend's acquisitions per
//! second as a ratio of Redis's and etcd's, the median over the rounds.

use std::sync::Arc;
use std::time::Duration;

use distlock::{DistributedLock, LockOptions, Wait};
use lock_testkit::bench::{Run, contend_on, print_runs, rw_mix};

/// Rounds of every backend in turn, and each one's run in a round.
const ROUNDS: usize = 3;
const RUN: Duration = Duration::from_secs(2);
const LIMIT: u32 = 4;
const HOLD: Duration = Duration::from_millis(1);

/// The backends compared, by the test servers' URL variables.
const TARGETS: [(&str, &str); 5] = [
    ("Redis", "DISTLOCK_TEST_REDIS_URL"),
    ("etcd", "DISTLOCK_TEST_ETCD_URL"),
    ("etcd x3", "DISTLOCK_TEST_ETCD_CLUSTER_URL"),
    ("NATS", "DISTLOCK_TEST_NATS_URL"),
    ("NATS x3", "DISTLOCK_TEST_NATS_CLUSTER_URL"),
];

#[derive(Clone, Copy, Debug)]
enum Workload {
    Permits,
    Reads,
}

async fn clients(var: &str, n: usize) -> Vec<Arc<dyn DistributedLock>> {
    let url = std::env::var(var).unwrap_or_else(|_| panic!("{var} is not set"));
    let mut clients: Vec<Arc<dyn DistributedLock>> = Vec::with_capacity(n);
    for _ in 0..n {
        clients.push(distlock::connect(&url).await.expect("connect"));
    }
    clients
}

async fn once(clients: &[Arc<dyn DistributedLock>], workload: Workload, round: usize) -> Run {
    let o = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Wait::UpTo(Duration::from_secs(60)));
    let name = format!("bench/contention/{workload:?}/{}/{round}", clients.len());
    match workload {
        Workload::Permits => {
            contend_on(clients.to_vec(), &name, o.permits(LIMIT), HOLD, HOLD, RUN).await
        }
        Workload::Reads => rw_mix(clients.to_vec(), &name, o, 0.9, (HOLD, HOLD), RUN).await,
    }
}

/// The rounds of one backend as one run: turns summed, the median p50
/// and the largest p99, the fewest and the most turns of a task.
fn merged(runs: &[Run]) -> Run {
    let mut p50: Vec<Duration> = runs.iter().map(|r| r.handoff_latency.0).collect();
    p50.sort();
    Run {
        acquisitions: runs.iter().map(|r| r.acquisitions).sum(),
        handoffs: runs.iter().map(|r| r.handoffs).sum(),
        handoff_latency: (
            p50[p50.len() / 2],
            runs.iter()
                .map(|r| r.handoff_latency.1)
                .max()
                .unwrap_or_default(),
        ),
        per_task: (
            runs.iter().map(|r| r.per_task.0).min().unwrap_or(0),
            runs.iter().map(|r| r.per_task.1).max().unwrap_or(0),
        ),
        cpu: runs.iter().map(|r| r.cpu).sum(),
    }
}

fn median_ratio(ours: &[Run], theirs: &[Run]) -> f64 {
    let mut r: Vec<f64> = ours
        .iter()
        .zip(theirs)
        .map(|(o, t)| o.acquisitions as f64 / t.acquisitions.max(1) as f64)
        .collect();
    r.sort_by(f64::total_cmp);
    r[r.len() / 2]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    for n in [8, 32] {
        let mut pools = Vec::new();
        for (label, var) in TARGETS {
            pools.push((label, clients(var, n).await));
        }
        for workload in [Workload::Permits, Workload::Reads] {
            let mut runs: Vec<Vec<Run>> = vec![Vec::new(); TARGETS.len()];
            for round in 0..ROUNDS {
                for (i, (_, clients)) in pools.iter().enumerate() {
                    runs[i].push(once(clients, workload, round).await);
                }
            }
            let rows: Vec<(&str, Run)> = pools
                .iter()
                .zip(&runs)
                .map(|((label, _), r)| (*label, merged(r)))
                .collect();
            let table: Vec<(&str, &Run)> = rows.iter().map(|(l, r)| (*l, r)).collect();
            let what = match workload {
                Workload::Permits => format!("permits of a semaphore of {LIMIT}"),
                Workload::Reads => "reader-writer lock, 90 % reads".to_string(),
            };
            print_runs(
                &format!("{what}: {n} clients, 1 ms inside, 1 ms outside, {ROUNDS} rounds"),
                RUN * ROUNDS as u32,
                &table,
            );
            for (i, (label, _)) in pools.iter().enumerate().skip(1) {
                println!(
                    "  {label}: {:.2}x Redis's acquisitions/s, {:.2}x etcd's (median of {ROUNDS} rounds)",
                    median_ratio(&runs[i], &runs[0]),
                    median_ratio(&runs[i], &runs[1]),
                );
            }
        }
    }
}
