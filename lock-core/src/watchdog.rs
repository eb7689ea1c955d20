//! One background task per client that renews every auto-renewed lock.
//!
//! The task keeps a min-heap of due times and a single timer, and polls every
//! in-flight renewal itself (a `FuturesUnordered`), so renewals due at the
//! same moment run concurrently — pipelined on the backend's connection —
//! without spawning anything. Guards register weakly, so a dropped guard
//! simply falls out of the schedule. Thousands of locks therefore cost one
//! task, one timer and a heap entry each, not a task and a timer each.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::LockError;
use crate::guard::GuardHandle;
use crate::loss::{LeaseState, LossReason};

/// Renews leases at about a third of their TTL. Cheap to clone; one per
/// backend client. The driver task starts on the first registration, on the
/// runtime current at that moment, and stops when nothing refers to it.
#[derive(Clone, Default)]
pub struct Watchdog {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    tx: Mutex<Option<mpsc::UnboundedSender<Command>>>,
    next_id: AtomicU64,
}

enum Command {
    Add {
        id: u64,
        handle: Weak<dyn GuardHandle>,
        lease: Weak<LeaseState>,
    },
    Remove(u64),
}

/// Keeps one lock in the watchdog's schedule; dropping it takes the lock out.
pub struct Registration {
    id: u64,
    watchdog: Watchdog,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.watchdog.send(Command::Remove(self.id));
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
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        self.send(Command::Add {
            id,
            handle: Arc::downgrade(handle),
            lease: Arc::downgrade(lease),
        });
        Registration {
            id,
            watchdog: self.clone(),
        }
    }

    fn send(&self, cmd: Command) {
        let mut tx = self.inner.tx.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sender) = tx.as_ref() {
            match sender.send(cmd) {
                Ok(()) => return,
                Err(mpsc::error::SendError(c)) => {
                    // The driver's runtime went away; start a new driver below.
                    *tx = None;
                    if matches!(c, Command::Remove(_)) {
                        return;
                    }
                    return self.start(&mut tx, c);
                }
            }
        }
        if matches!(cmd, Command::Add { .. }) {
            self.start(&mut tx, cmd);
        }
    }

    fn start(&self, slot: &mut Option<mpsc::UnboundedSender<Command>>, first: Command) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "no tokio runtime: the lock is not renewed and its lost() fires at the validity deadline"
            );
            return;
        };
        let (sender, rx) = mpsc::unbounded_channel();
        // Cannot fail: the receiver is alive.
        let _ = sender.send(first);
        rt.spawn(drive(rx));
        *slot = Some(sender);
    }
}

struct Entry {
    handle: Weak<dyn GuardHandle>,
    lease: Weak<LeaseState>,
    due: Instant,
}

type Outcome = (u64, Instant, Duration, Result<bool, LockError>);

/// The shortest pause between retries of a renewal that could not reach the server.
const MIN_RETRY: Duration = Duration::from_millis(20);

async fn drive(mut rx: mpsc::UnboundedReceiver<Command>) {
    let mut entries: HashMap<u64, Entry> = HashMap::new();
    let mut heap: BinaryHeap<Reverse<(Instant, u64)>> = BinaryHeap::new();
    let mut inflight: FuturesUnordered<BoxFuture<'static, Outcome>> = FuturesUnordered::new();
    let far = || Instant::now() + Duration::from_secs(86_400);
    loop {
        let next = heap.peek().map(|Reverse((t, _))| *t).unwrap_or_else(far);
        tokio::select! {
            cmd = rx.recv() => match cmd {
                None => break,
                Some(Command::Add { id, handle, lease }) => {
                    let Some(l) = lease.upgrade() else { continue };
                    let due = Instant::now() + l.ttl() / 3;
                    heap.push(Reverse((due, id)));
                    entries.insert(id, Entry { handle, lease, due });
                }
                Some(Command::Remove(id)) => {
                    entries.remove(&id);
                }
            },
            _ = tokio::time::sleep_until(next), if !heap.is_empty() => {
                let now = Instant::now();
                while let Some(Reverse((due, id))) = heap.peek().copied() {
                    if due > now {
                        break;
                    }
                    heap.pop();
                    let Some(entry) = entries.get(&id) else { continue };
                    if entry.due != due {
                        continue; // superseded by a later schedule
                    }
                    let (Some(handle), Some(lease)) = (entry.handle.upgrade(), entry.lease.upgrade()) else {
                        entries.remove(&id);
                        continue;
                    };
                    if lease.lost_now().is_some() {
                        entries.remove(&id);
                        continue;
                    }
                    let ttl = lease.ttl();
                    inflight.push(Box::pin(async move {
                        let sent_at = Instant::now();
                        let result = handle.extend(ttl).await;
                        (id, sent_at, ttl, result)
                    }));
                }
            },
            Some((id, sent_at, ttl, result)) = inflight.next(), if !inflight.is_empty() => {
                let Some(entry) = entries.get_mut(&id) else { continue };
                let Some(lease) = entry.lease.upgrade() else {
                    entries.remove(&id);
                    continue;
                };
                let due = match result {
                    Ok(true) => {
                        lease.renewed(sent_at, ttl);
                        sent_at + ttl / 3
                    }
                    Ok(false) => {
                        tracing::warn!("renewal found the lock gone or taken over");
                        lease.mark_lost(LossReason::TakenOver);
                        entries.remove(&id);
                        continue;
                    }
                    Err(e) => {
                        let Some(deadline) = lease.deadline().filter(|_| lease.lost_now().is_none()) else {
                            tracing::warn!(error = %e, "renewal failed and the lock's validity has ended");
                            entries.remove(&id);
                            continue;
                        };
                        tracing::warn!(error = %e, "renewal failed; retrying until the validity deadline");
                        let retry = Instant::now() + (ttl / 10).max(MIN_RETRY);
                        retry.min(deadline)
                    }
                };
                entry.due = due;
                heap.push(Reverse((due, id)));
            },
        }
    }
}
