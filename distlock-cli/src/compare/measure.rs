//! The workloads of `distlock compare`, run in slices that alternate
//! between the services.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{DistributedLock, LockError, LockOptions, Wait};
use tokio::time::Instant;

use super::Target;
use super::stats::{Contention, Turn, p50_p99};

/// How long one service has the machine before the next takes a turn.
const UNCONTENDED_SLICE: Duration = Duration::from_millis(250);
const CONTENDED_SLICE: Duration = Duration::from_secs(1);

/// The uncontended acquire + release cycle on one service.
pub(crate) struct Uncontended {
    /// Every cycle's duration, sorted.
    pub samples: Vec<Duration>,
    /// p50 and p99.
    pub percentiles: (Duration, Duration),
}

/// One contended run on one service.
pub(crate) struct Contended {
    /// Acquisitions, hand-offs, hand-off gap and fairness.
    pub run: Contention,
    /// How long the tasks contended in all.
    pub ran: Duration,
}

/// A name no other run uses.
fn fresh_name(what: &str) -> String {
    format!("distlock-compare/{what}/{:016x}", rand::random::<u64>())
}

/// Order the services differently in each round, so that none always runs
/// right after the same neighbour.
fn round_order(n: usize, round: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |i| {
        if round.is_multiple_of(2) {
            i
        } else {
            n - 1 - i
        }
    })
}

/// The uncontended workload on every target, alternating slices until each
/// has had `duration`. A service that fails stops being measured.
pub(super) async fn uncontended(
    targets: &[Target],
    opts: &LockOptions,
    duration: Duration,
) -> Vec<Result<Uncontended, LockError>> {
    let names: Vec<String> = targets.iter().map(|_| fresh_name("uncontended")).collect();
    let mut samples: Vec<Result<Vec<Duration>, LockError>> =
        targets.iter().map(|_| Ok(Vec::new())).collect();
    let rounds = duration.as_millis().div_ceil(UNCONTENDED_SLICE.as_millis()) as usize;
    for round in 0..rounds {
        for i in round_order(targets.len(), round) {
            let Ok(mine) = &mut samples[i] else { continue };
            let lock = &targets[i].clients[0];
            if let Err(e) = cycles(&**lock, &names[i], opts, UNCONTENDED_SLICE, mine).await {
                samples[i] = Err(e);
            }
        }
    }
    samples
        .into_iter()
        .map(|s| {
            s.map(|mut samples| {
                samples.sort_unstable();
                let percentiles = p50_p99(&samples);
                Uncontended {
                    samples,
                    percentiles,
                }
            })
        })
        .collect()
}

/// Acquire and release `name` until `slice` has passed, pushing each
/// cycle's duration.
async fn cycles(
    lock: &dyn DistributedLock,
    name: &str,
    opts: &LockOptions,
    slice: Duration,
    samples: &mut Vec<Duration>,
) -> Result<(), LockError> {
    let end = Instant::now() + slice;
    while Instant::now() < end {
        let start = Instant::now();
        let guard = lock.acquire(name, opts).await?;
        guard.release().await?;
        samples.push(start.elapsed());
    }
    Ok(())
}

/// The contended workload with `tasks` tasks on every target, alternating
/// slices until each has had `duration`.
pub(super) async fn contended(
    targets: &[Target],
    tasks: usize,
    opts: &LockOptions,
    duration: Duration,
) -> Vec<Result<Contended, LockError>> {
    let names: Vec<String> = targets.iter().map(|_| fresh_name("contended")).collect();
    let mut slices: Vec<Result<Vec<Vec<Turn>>, LockError>> =
        targets.iter().map(|_| Ok(Vec::new())).collect();
    let rounds = duration.as_millis().div_ceil(CONTENDED_SLICE.as_millis()) as usize;
    for round in 0..rounds {
        for i in round_order(targets.len(), round) {
            if slices[i].is_err() {
                continue;
            }
            let clients = &targets[i].clients[..tasks];
            match contend(clients, &names[i], opts, CONTENDED_SLICE).await {
                Ok(turns) => {
                    if let Ok(mine) = &mut slices[i] {
                        mine.push(turns);
                    }
                }
                Err(e) => slices[i] = Err(e),
            }
        }
    }
    slices
        .into_iter()
        .map(|s| {
            s.map(|slices| {
                let ran = CONTENDED_SLICE * slices.len() as u32;
                Contended {
                    run: Contention::of(slices, tasks),
                    ran,
                }
            })
        })
        .collect()
}

/// One slice: each client in a task of its own acquires `name` (waiting at
/// most until the slice ends) and releases it at once, until `slice` has
/// passed. The turns, or the first error.
async fn contend(
    clients: &[Arc<dyn DistributedLock>],
    name: &str,
    opts: &LockOptions,
    slice: Duration,
) -> Result<Vec<Turn>, LockError> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let end = Instant::now() + slice;
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(t, lock)| {
            let (lock, name, opts, log) = (
                Arc::clone(lock),
                name.to_string(),
                opts.clone(),
                Arc::clone(&log),
            );
            tokio::spawn(async move {
                loop {
                    let left = end.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(());
                    }
                    let opts = opts
                        .clone()
                        .wait(Wait::UpTo(left.max(Duration::from_millis(1))));
                    let guard = match lock.acquire(&name, &opts).await {
                        Ok(guard) => guard,
                        Err(LockError::Timeout { .. }) => return Ok(()),
                        Err(e) => return Err(e),
                    };
                    let granted = std::time::Instant::now();
                    let released = std::time::Instant::now();
                    guard.release().await?;
                    log.lock().unwrap_or_else(|e| e.into_inner()).push(Turn {
                        granted,
                        released,
                        task: t,
                    });
                }
            })
        })
        .collect();
    let mut first_error = None;
    for task in tasks {
        let outcome = task.await.unwrap_or_else(|e| {
            Err(LockError::Backend {
                backend: "compare",
                reason: format!("a contending task failed: {e}"),
                source: None,
            })
        });
        if let Err(e) = outcome {
            first_error.get_or_insert(e);
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let turns = std::mem::take(&mut *log.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(turns)
}
