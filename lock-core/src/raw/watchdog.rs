//! One background task per client that renews every auto-renewed lock, and
//! ends the locks that a backend must end itself when their TTL runs out.
//!
//! The task keeps a min-heap of due times and a single timer, and polls every
//! in-flight renewal itself (a `FuturesUnordered`), so renewals due at the
//! same moment run concurrently — pipelined on the backend's connection —
//! without spawning anything. Guards register weakly, so a dropped guard
//! simply falls out of the schedule. Thousands of locks therefore cost one
//! task, one timer and a heap entry each, not a task and a timer each.
//!
//! Registering and dropping a registration touch the schedule under a mutex
//! and wake the task only when its timer must move earlier: the steady
//! acquire–release cycle of a busy client, whose new locks fall due after
//! the ones already scheduled, costs no wake-up and no context switch. Once
//! the schedule is empty the timer stays armed for a second, so that locks
//! released before the task looked at them do not wake it one by one.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::LockError;
use crate::loss::LossReason;
use crate::raw::GuardHandle;
use crate::raw::{LeaseState, RenewalOutcome};

/// Renews leases at about a third of their TTL, and ends the locks
/// registered with [`Watchdog::expire`] when their TTL runs out. Cheap to
/// clone; one per backend client. The driver task starts on the first
/// registration, on the runtime current at that moment, and stops when
/// nothing refers to the watchdog.
#[derive(Clone, Default)]
pub struct Watchdog {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    schedule: Mutex<Schedule>,
    /// Wakes the driver when its timer must move earlier (or on drop).
    wake: Arc<Notify>,
    /// How many times the driver has looked at the schedule.
    #[cfg(test)]
    turns: std::sync::atomic::AtomicU64,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Let the driver see that the watchdog is gone and stop.
        self.wake.notify_one();
    }
}

#[derive(Default)]
struct Schedule {
    entries: HashMap<u64, Entry>,
    /// Due times; entries removed or rescheduled leave stale items, skipped
    /// when they come up and dropped when the heap is rebuilt.
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    next_id: u64,
    /// The time the driver's timer is set for (`None`: no timer).
    armed: Option<Instant>,
    driver: Option<JoinHandle<()>>,
}

enum Kind {
    /// Extend the lock a third of its TTL after the last renewal.
    Renew,
    /// Release the lock `grace` after its validity deadline, unless an
    /// extension moved the deadline.
    Expire { grace: Duration },
    /// Check the lock a third of its TTL after the last check, asking the
    /// server to keep it only until its lease would have ended anyway.
    Watch,
}

struct Entry {
    handle: Weak<dyn GuardHandle>,
    lease: Weak<LeaseState>,
    due: Instant,
    kind: Kind,
}

/// Keeps one lock in the watchdog's schedule (and the watchdog running);
/// dropping it takes the lock out.
pub struct Registration {
    id: u64,
    shared: Option<Arc<Shared>>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            shared.schedule().entries.remove(&self.id);
        }
    }
}

impl Shared {
    fn schedule(&self) -> MutexGuard<'_, Schedule> {
        self.schedule.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Watchdog {
    /// A watchdog with no locks; its task starts on first use.
    pub fn new() -> Self {
        Self::default()
    }

    /// Renew `handle` for as long as the returned registration lives.
    /// Successful renewals move `lease`'s validity deadline; a renewal that
    /// finds the lock gone marks it lost; failed renewals are retried until
    /// the deadline, after which `lost()` fires by itself.
    pub fn register(&self, handle: &Arc<dyn GuardHandle>, lease: &Arc<LeaseState>) -> Registration {
        let due = lease.first_renewal(Instant::now());
        self.insert(handle, lease, due, Kind::Renew)
    }

    /// Check `handle` about every third of the lease's TTL without
    /// prolonging it (each check asks the server to keep the lock only until
    /// the lease would end anyway: its deadline plus the safety margin), and
    /// mark `lease` lost when a check finds the lock gone; checks stop at the
    /// validity deadline. For locks held by a connection that a server crash
    /// can end early: without auto-renewal, the holder still learns of it
    /// within a third of the TTL instead of at its deadline.
    pub fn watch(&self, handle: &Arc<dyn GuardHandle>, lease: &Arc<LeaseState>) -> Registration {
        let due = lease.first_renewal(Instant::now());
        self.insert(handle, lease, due, Kind::Watch)
    }

    /// Release `handle` once `lease`'s validity deadline (as extensions move
    /// it) is `grace` behind, for backends whose server would otherwise keep
    /// a lock without auto-renewal past its TTL. The registration does not
    /// keep the handle alive; keep it with the guard.
    pub fn expire(
        &self,
        handle: &Arc<dyn GuardHandle>,
        lease: &Arc<LeaseState>,
        grace: Duration,
    ) -> Registration {
        let Some(deadline) = lease.deadline() else {
            return Registration {
                id: u64::MAX,
                shared: None,
            };
        };
        self.insert(handle, lease, deadline + grace, Kind::Expire { grace })
    }

    /// Renew every auto-renewed lock and check every watched one now,
    /// instead of at its next due time: for a backend that learns its
    /// server changed under the locks (a failover to a replica), so that
    /// those the new server lacks fire `lost()` at once. Expiries keep
    /// their time.
    pub fn check_now(&self) {
        let mut s = self.shared.schedule();
        let now = Instant::now();
        let due: Vec<u64> = s
            .entries
            .iter_mut()
            .filter(|(_, e)| matches!(e.kind, Kind::Renew | Kind::Watch))
            .map(|(&id, e)| {
                e.due = now;
                id
            })
            .collect();
        if due.is_empty() {
            return;
        }
        s.heap.extend(due.into_iter().map(|id| Reverse((now, id))));
        s.compact();
        self.shared.wake.notify_one();
    }

    fn insert(
        &self,
        handle: &Arc<dyn GuardHandle>,
        lease: &Arc<LeaseState>,
        due: Instant,
        kind: Kind,
    ) -> Registration {
        let mut s = self.shared.schedule();
        let id = s.next_id;
        s.next_id += 1;
        s.entries.insert(
            id,
            Entry {
                handle: Arc::downgrade(handle),
                lease: Arc::downgrade(lease),
                due,
                kind,
            },
        );
        s.heap.push(Reverse((due, id)));
        s.compact();
        if s.driver.as_ref().is_none_or(JoinHandle::is_finished) {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    s.armed = None;
                    let driver = drive(Arc::downgrade(&self.shared), self.shared.wake.clone());
                    s.driver = Some(rt.spawn(driver));
                }
                Err(_) => tracing::warn!(target: "distlock",
                    "no tokio runtime: the lock is not renewed and its lost() fires at the validity deadline"
                ),
            }
        } else if s.armed.is_none_or(|armed| due < armed) {
            self.shared.wake.notify_one();
        }
        Registration {
            id,
            shared: Some(Arc::clone(&self.shared)),
        }
    }
}

impl Schedule {
    /// Rebuild the heap from the live entries once stale items outnumber
    /// them, so short-lived locks cannot grow it without bound.
    fn compact(&mut self) {
        if self.heap.len() > 2 * self.entries.len() + 64 {
            self.heap = self
                .entries
                .iter()
                .map(|(id, e)| Reverse((e.due, *id)))
                .collect();
        }
    }

    /// The earliest live due time, dropping stale heap items on the way.
    fn next_due(&mut self) -> Option<Instant> {
        while let Some(Reverse((due, id))) = self.heap.peek().copied() {
            match self.entries.get(&id) {
                Some(e) if e.due == due => return Some(due),
                _ => {
                    self.heap.pop();
                }
            }
        }
        None
    }

    /// Start the work due by `now`: renewals and expiries to poll.
    fn start_due(
        &mut self,
        now: Instant,
        inflight: &mut FuturesUnordered<BoxFuture<'static, Outcome>>,
    ) {
        while let Some(due) = self.next_due() {
            if due > now {
                break;
            }
            let Some(Reverse((_, id))) = self.heap.pop() else {
                break;
            };
            let Some(entry) = self.entries.get_mut(&id) else {
                continue;
            };
            let (Some(handle), Some(lease)) = (entry.handle.upgrade(), entry.lease.upgrade())
            else {
                self.entries.remove(&id);
                continue;
            };
            match entry.kind {
                Kind::Renew if lease.lost_now().is_some() => {
                    self.entries.remove(&id);
                }
                Kind::Renew => {
                    let ttl = lease.ttl();
                    let server_ttl = lease.server_ttl(ttl);
                    inflight.push(Box::pin(async move {
                        let sent_at = Instant::now();
                        let result = handle.extend(server_ttl).await;
                        Outcome::Renewed {
                            id,
                            sent_at,
                            ttl,
                            result,
                        }
                    }));
                }
                Kind::Watch => {
                    let Some(deadline) = lease.deadline().filter(|&d| d > now) else {
                        // Past its deadline the lease reports itself lost.
                        self.entries.remove(&id);
                        continue;
                    };
                    if lease.lost_now().is_some() {
                        self.entries.remove(&id);
                        continue;
                    }
                    let left = lease.server_ttl(
                        (deadline + lease.safety_margin()).saturating_duration_since(now),
                    );
                    inflight.push(Box::pin(async move {
                        let result = handle.extend(left).await;
                        Outcome::Checked { id, result }
                    }));
                }
                // A lease past its deadline reports itself lost: that is
                // when an expiry runs.
                Kind::Expire { grace } => {
                    if let Some(later) = lease.deadline().map(|d| d + grace).filter(|&d| d > now) {
                        // Extended since it was scheduled.
                        entry.due = later;
                        self.heap.push(Reverse((later, id)));
                        continue;
                    }
                    self.entries.remove(&id);
                    inflight.push(Box::pin(async move {
                        let result = handle.release().await;
                        Outcome::Expired { result }
                    }));
                }
            }
        }
    }

    /// Record a check's outcome and schedule the next one.
    fn checked(&mut self, id: u64, result: Result<bool, LockError>) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        let Some(lease) = entry.lease.upgrade() else {
            self.entries.remove(&id);
            return;
        };
        let now = Instant::now();
        let next = match result {
            Ok(true) => now + lease.renewal_period(),
            Ok(false) => {
                tracing::warn!(target: "distlock", "a check found the lock gone (its connection ended)");
                lease.mark_lost(LossReason::TakenOver);
                self.entries.remove(&id);
                return;
            }
            Err(e) => {
                tracing::debug!(target: "distlock", error = %e.report(), "checking a lock failed; trying again");
                now + (lease.renewal_period() / 10).max(MIN_RETRY)
            }
        };
        match lease.deadline().filter(|&d| d > now) {
            Some(deadline) => {
                let due = next.min(deadline);
                entry.due = due;
                self.heap.push(Reverse((due, id)));
            }
            None => {
                self.entries.remove(&id);
            }
        }
    }

    /// Record a renewal's outcome and schedule the next one.
    fn renewed(
        &mut self,
        id: u64,
        sent_at: Instant,
        ttl: Duration,
        result: Result<bool, LockError>,
    ) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        let Some(lease) = entry.lease.upgrade() else {
            self.entries.remove(&id);
            return;
        };
        lease.note_renewal(match &result {
            Ok(true) => RenewalOutcome::Renewed,
            Ok(false) => RenewalOutcome::NotHeld,
            Err(_) => RenewalOutcome::Failed,
        });
        let due = match result {
            Ok(true) => {
                lease.renewed(sent_at, ttl);
                sent_at + lease.renewal_period()
            }
            Ok(false) => {
                tracing::warn!(target: "distlock", "renewal found the lock gone or taken over");
                lease.mark_lost(LossReason::TakenOver);
                self.entries.remove(&id);
                return;
            }
            Err(e) => {
                let Some(deadline) = lease.deadline().filter(|_| lease.lost_now().is_none()) else {
                    tracing::warn!(target: "distlock", error = %e.report(), "renewal failed and the lock's validity has ended");
                    self.entries.remove(&id);
                    return;
                };
                tracing::warn!(target: "distlock", error = %e.report(), "renewal failed; retrying until the validity deadline");
                let retry = Instant::now() + (ttl / 10).max(MIN_RETRY);
                retry.min(deadline)
            }
        };
        entry.due = due;
        self.heap.push(Reverse((due, id)));
    }
}

enum Outcome {
    Renewed {
        id: u64,
        sent_at: Instant,
        ttl: Duration,
        result: Result<bool, LockError>,
    },
    Expired {
        result: Result<bool, LockError>,
    },
    Checked {
        id: u64,
        result: Result<bool, LockError>,
    },
}

/// The shortest pause between retries of a renewal that could not reach the server.
const MIN_RETRY: Duration = Duration::from_millis(20);

/// How long the task keeps its timer armed once its schedule is empty.
const LINGER: Duration = Duration::from_secs(1);

async fn drive(shared: Weak<Shared>, wake: Arc<Notify>) {
    let mut inflight: FuturesUnordered<BoxFuture<'static, Outcome>> = FuturesUnordered::new();
    // Until when the timer stays armed over an empty schedule.
    let mut linger: Option<Instant> = None;
    // One timer, moved when the next due time moves: a timer made anew on
    // every turn costs a timer-wheel entry per renewal outcome.
    let timer = tokio::time::sleep_until(Instant::now());
    tokio::pin!(timer);
    loop {
        let next = {
            let Some(shared) = shared.upgrade() else {
                break;
            };
            let mut s = shared.schedule();
            let now = Instant::now();
            s.start_due(now, &mut inflight);
            let next = match s.next_due() {
                Some(due) => {
                    linger = None;
                    Some(due)
                }
                // Nothing scheduled: the timer stays armed for LINGER, so
                // that the locks of a client acquiring and releasing in a
                // loop, registered and gone again before this task looks,
                // find it armed and do not wake it one by one.
                None => match linger {
                    Some(until) if until > now => Some(until),
                    Some(_) => {
                        linger = None;
                        None
                    }
                    None => {
                        linger = Some(now + LINGER);
                        linger
                    }
                },
            };
            s.armed = next;
            #[cfg(test)]
            shared
                .turns
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            next
        };
        if let Some(next) = next
            && timer.deadline() != next
        {
            timer.as_mut().reset(next);
        }
        tokio::select! {
            _ = wake.notified() => {}
            _ = &mut timer, if next.is_some() => {}
            Some(outcome) = inflight.next(), if !inflight.is_empty() => {
                let Some(shared) = shared.upgrade() else {
                    break;
                };
                // Every outcome already in, under one look at the schedule:
                // thousands of renewals answered together (a batch) take
                // one turn of this task, not one each.
                let mut s = shared.schedule();
                s.record(outcome);
                while let Some(Some(outcome)) = inflight.next().now_or_never() {
                    s.record(outcome);
                }
            }
        }
    }
    // Let in-flight releases of expired locks finish; renewals no longer matter.
    while inflight.next().await.is_some() {}
}

impl Schedule {
    /// Take in what a renewal, a check or an expiry came to.
    fn record(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Renewed {
                id,
                sent_at,
                ttl,
                result,
            } => self.renewed(id, sent_at, ttl, result),
            Outcome::Checked { id, result } => self.checked(id, result),
            Outcome::Expired { result } => match result {
                Ok(true) => {
                    tracing::debug!(target: "distlock", "a lock without auto-renewal reached its TTL and was released")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(target: "distlock", error = %e.report(), "releasing a lock at the end of its TTL failed")
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use async_trait::async_trait;

    use super::*;

    /// A lock that is always still ours.
    struct Held;

    #[async_trait]
    impl GuardHandle for Held {
        async fn release(&self) -> Result<bool, LockError> {
            Ok(true)
        }

        async fn extend(&self, _ttl: Duration) -> Result<bool, LockError> {
            Ok(true)
        }
    }

    /// Locks registered and dropped again before the task looks at them (a
    /// client acquiring and releasing in a loop) wake the task once, not
    /// once per lock: its timer stays armed over the empty schedule.
    #[tokio::test(flavor = "current_thread")]
    async fn locks_gone_before_the_task_looks_wake_it_once() {
        let watchdog = Watchdog::new();
        let handle: Arc<dyn GuardHandle> = Arc::new(Held);
        for _ in 0..100 {
            let lease = Arc::new(LeaseState::lease(Instant::now(), Duration::from_secs(30)));
            drop(watchdog.watch(&handle, &lease));
            // The task runs now, and finds nothing scheduled.
            tokio::task::yield_now().await;
        }
        let turns = watchdog.shared.turns.load(Ordering::Relaxed);
        assert!(turns <= 2, "the task looked {turns} times for 100 locks");
    }
}
