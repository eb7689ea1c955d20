//! Measuring helpers shared by the backends' benchmarks (feature `testkit`):
//! percentiles of interleaved samples, and a contention run that records
//! who held a lock when, for throughput, hand-off and fairness figures;
//! [`cycles`] measures uncontended cycles of a lock's variants side by side.

pub mod cycles;
pub mod redis_rw_floor;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One holder's turn: when it was granted, when it let go, and which task.
pub type Turn = (Instant, Instant, usize);

/// The shared log a contention run's tasks push their turns into.
pub type TurnLog = Arc<Mutex<Vec<Turn>>>;

/// p50 and p99 of `samples` (nearest rank). Zero for no samples.
///
/// ```
/// use std::time::Duration;
/// let ms = |n| Duration::from_millis(n);
/// let (p50, p99) = lock_testkit::bench::percentiles((1..=100).map(ms).collect());
/// assert_eq!((p50, p99), (ms(51), ms(99)));
/// ```
pub fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    if samples.is_empty() {
        return (Duration::ZERO, Duration::ZERO);
    }
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

/// Microseconds, for printing.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The outcome of one contention run.
#[derive(Debug, Clone)]
pub struct Run {
    /// Turns taken in all.
    pub acquisitions: usize,
    /// Turns that went to a different task than the one before.
    pub handoffs: usize,
    /// p50/p99 from one task's release to the next task's grant.
    pub handoff_latency: (Duration, Duration),
    /// The fewest and the most turns any one task took (fairness).
    pub per_task: (usize, usize),
    /// The process's CPU time over the run (every thread: the contenders'
    /// clients, their connections' tasks), when it was measured ([`contend`]
    /// does): divided by the turns, what one contended turn costs the
    /// client.
    pub cpu: Option<Duration>,
}

/// Run `tasks` tasks until `run` has passed: task `t` is `make(t, end, log)`
/// and pushes a [`Turn`] into `log` for every acquisition. Tasks are
/// spawned on the current runtime.
pub async fn contend<F, Fut>(tasks: usize, run: Duration, make: F) -> Run
where
    F: Fn(usize, Instant, TurnLog) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let log: TurnLog = Arc::new(Mutex::new(Vec::new()));
    let cpu_before = cycles::process_cpu_time();
    let end = Instant::now() + run;
    let handles: Vec<_> = (0..tasks)
        .map(|t| tokio::spawn(make(t, end, log.clone())))
        .collect();
    for h in handles {
        if let Err(e) = h.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    let cpu = cycles::process_cpu_time().saturating_sub(cpu_before);
    let log = std::mem::take(&mut *log.lock().unwrap_or_else(|e| e.into_inner()));
    Run {
        cpu: Some(cpu),
        ..analyse(vec![log], tasks)
    }
}

/// The figures of the turns of `tasks` contenders, recorded in one or more
/// separate runs (`slices`, for example alternated with other backends'):
/// hand-offs and their latencies are counted within each slice only.
pub fn analyse(slices: Vec<Vec<Turn>>, tasks: usize) -> Run {
    let mut counts = vec![0; tasks];
    let mut latencies = Vec::new();
    let mut handoffs = 0;
    let mut acquisitions = 0;
    for mut log in slices {
        log.sort_by_key(|(granted, _, _)| *granted);
        for w in log.windows(2) {
            let ((_, released, a), (granted, _, b)) = (w[0], w[1]);
            if a != b {
                handoffs += 1;
                latencies.push(granted.saturating_duration_since(released));
            }
        }
        for (_, _, t) in &log {
            if let Some(c) = counts.get_mut(*t) {
                *c += 1;
            }
        }
        acquisitions += log.len();
    }
    Run {
        acquisitions,
        handoffs,
        handoff_latency: percentiles(latencies),
        per_task: (
            counts.iter().copied().min().unwrap_or(0),
            counts.iter().copied().max().unwrap_or(0),
        ),
        cpu: None,
    }
}

/// Print contention runs of length `run` as a table: acquisitions and
/// hand-offs per second, hand-off p50/p99, per-task min/max and, where it
/// was measured, the client's CPU time per turn, one row per `(label, run)`.
pub fn print_runs(title: &str, run: Duration, rows: &[(&str, &Run)]) {
    let secs = run.as_secs_f64();
    println!("\n{title} ({run:?})");
    println!(
        "  {:<10} {:>10} {:>12} {:>24} {:>18} {:>14}",
        "", "acq/s", "handoffs/s", "handoff p50 / p99 (µs)", "per task min/max", "CPU/turn (µs)"
    );
    for (label, r) in rows {
        let cpu = r.cpu.map_or_else(
            || "-".to_string(),
            |cpu| format!("{:.1}", us(cpu) / r.acquisitions.max(1) as f64),
        );
        println!(
            "  {label:<10} {:>10.1} {:>12.1} {:>11.1} / {:>10.1} {:>10} / {:<6} {cpu:>8}",
            r.acquisitions as f64 / secs,
            r.handoffs as f64 / secs,
            us(r.handoff_latency.0),
            us(r.handoff_latency.1),
            r.per_task.0,
            r.per_task.1
        );
    }
}

/// Print each run's hand-off latency (p50) in round trips of the same
/// server (`round_trip`, a p50 measured in the same run), the unit of the
/// hand-off goal: a notified hand-off needs the release, the notification
/// and the grant.
pub fn print_handoff_round_trips(rows: &[(&str, &Run)], round_trip: Duration) {
    for (label, r) in rows {
        println!(
            "  {label}: hand-off p50 = {:.1} round trips ({:.1} µs each)",
            r.handoff_latency.0.as_secs_f64() / round_trip.as_secs_f64(),
            us(round_trip)
        );
    }
}

/// A mixed reader-writer workload on distlock clients: task `t` uses
/// `clients[t]` and loops until `run` has passed: takes `name`'s
/// reader-writer lock for reading with probability `read_share` (else for
/// writing) with `opts`, holds it for `work`, releases, then waits `pause`.
/// With `read_share` 0 every acquisition writes: the same workload with
/// exclusive grants only, what readers' parallelism is measured against.
/// The run's hand-offs count grants to another task than the last.
pub async fn rw_mix(
    clients: Vec<Arc<dyn lock_core::DistributedLock>>,
    name: &str,
    opts: lock_core::LockOptions,
    read_share: f64,
    (work, pause): (Duration, Duration),
    run: Duration,
) -> Run {
    let clients = Arc::new(clients);
    let name: Arc<str> = name.into();
    contend(clients.len(), run, |t, end, log| {
        let (clients, name, opts) = (clients.clone(), name.clone(), opts.clone());
        async move {
            while Instant::now() < end {
                let access = if rand::random_bool(read_share) {
                    lock_core::Access::Read
                } else {
                    lock_core::Access::Write
                };
                let opts = opts.clone().access(access);
                let guard = clients[t].acquire(&name, &opts).await.expect("acquire");
                let granted = Instant::now();
                tokio::time::sleep(work).await;
                let released = Instant::now();
                guard.release().await.expect("release");
                log.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((granted, released, t));
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
        }
    })
    .await
}

/// Run [`rw_mix`] with 90 % reads and with writes only, one after the
/// other on the same clients, and print both and their ratio of
/// acquisitions: what readers sharing the lock buys.
pub async fn print_rw_mix(
    title: &str,
    clients: Vec<Arc<dyn lock_core::DistributedLock>>,
    name: &str,
    opts: lock_core::LockOptions,
    run: Duration,
) {
    let timing = (Duration::from_millis(1), Duration::from_millis(1));
    let mixed = rw_mix(clients.clone(), name, opts.clone(), 0.9, timing, run).await;
    let exclusive = rw_mix(clients.clone(), name, opts, 0.0, timing, run).await;
    print_runs(
        &format!(
            "{title}: {} tasks, a client each; 1 ms inside, 1 ms outside",
            clients.len()
        ),
        run,
        &[("90 % reads", &mixed), ("writes only", &exclusive)],
    );
    let (acquisitions, _) = ratios(&mixed, &exclusive);
    println!(
        "  {title}: 90 % reads ÷ writes only: {acquisitions:.2}x acquisitions/s (readers' parallelism)"
    );
}

/// `ours / theirs` acquisitions and hand-offs, for the line under a table.
pub fn ratios(ours: &Run, theirs: &Run) -> (f64, f64) {
    (
        ours.acquisitions as f64 / theirs.acquisitions.max(1) as f64,
        ours.handoffs as f64 / theirs.handoffs.max(1) as f64,
    )
}

/// A contention run on distlock clients: task `t` uses `clients[t]`, and
/// loops until `run` has passed: acquire `name` with `opts`, hold it for
/// `work`, release, then wait `pause` (zero: re-acquire at once).
pub async fn contend_on(
    clients: Vec<Arc<dyn lock_core::DistributedLock>>,
    name: &str,
    opts: lock_core::LockOptions,
    work: Duration,
    pause: Duration,
    run: Duration,
) -> Run {
    let clients = Arc::new(clients);
    let name: Arc<str> = name.into();
    contend(clients.len(), run, |t, end, log| {
        let (clients, name, opts) = (clients.clone(), name.clone(), opts.clone());
        async move {
            while Instant::now() < end {
                let guard = clients[t].acquire(&name, &opts).await.expect("acquire");
                let granted = Instant::now();
                tokio::time::sleep(work).await;
                let released = Instant::now();
                guard.release().await.expect("release");
                log.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((granted, released, t));
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
        }
    })
    .await
}
