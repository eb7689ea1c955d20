//! The in-memory backend: the whole contract within one process.
//!
//! Waiters queue in arrival order and each sleeps on its own [`Notify`]; a
//! release wakes exactly the head of the queue, and an expiring holder is
//! noticed by a timer set to its expiry. No polling.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::capabilities::{Capabilities, CrashRelease, Fencing, Grade, Waiting};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::guard::RawGuard;
use crate::info::LockInfo;
use crate::loss::LossReason;
use crate::options::LockOptions;
use crate::raw::GuardHandle;
use crate::raw::HolderRecord;
use crate::raw::LeaseState;
use crate::raw::OwnerToken;
use crate::raw::Unrenewed;
use crate::raw::Watchdog;
use crate::raw::{Pace, RawLock, Request, WaitLoop};

const CAPABILITIES: Capabilities = Capabilities::new("memory", Grade::ProcessLocal)
    .with_fencing(Fencing::Safe)
    .with_fair_queue(true)
    .with_crash_release(CrashRelease::ProcessExit)
    .with_depends_on_clocks(false)
    .with_waiting(Waiting::Notified)
    .with_holder(true);

/// Locks shared by the tasks of one process.
///
/// Clones share the same locks. Fencing tokens count per name for the life
/// of the `MemoryLock` (a name's counter is kept after release so tokens
/// never repeat; that costs a few bytes per distinct name ever used).
#[derive(Clone, Default)]
pub struct MemoryLock {
    shared: Arc<Shared>,
    watchdog: Watchdog,
}

#[derive(Default)]
struct Shared {
    slots: Mutex<HashMap<String, Slot>>,
    next_waiter: AtomicU64,
}

#[derive(Default)]
struct Slot {
    holder: Option<Current>,
    fence: u64,
    queue: VecDeque<(u64, Arc<Notify>)>,
}

struct Current {
    owner: OwnerToken,
    expires: Instant,
    lease: Weak<LeaseState>,
    record: HolderRecord,
}

impl Slot {
    /// The live holder, dropping one whose lease has run out.
    fn live_holder(&mut self, now: Instant) -> Option<&mut Current> {
        if self.holder.as_ref().is_some_and(|h| h.expires <= now) {
            self.holder = None;
        }
        self.holder.as_mut()
    }

    fn wake_head(&self) {
        if let Some((_, n)) = self.queue.front() {
            n.notify_one();
        }
    }
}

impl Shared {
    fn slots(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl MemoryLock {
    /// An empty set of locks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Observation for tests: how many acquisitions of `name` are queued.
    pub fn queued(&self, name: &str) -> usize {
        self.shared
            .slots()
            .get(name)
            .map_or(0, |slot| slot.queue.len())
    }

    /// Grant `name` if it is free and `waiter` may take it: a newcomer
    /// (`None`) only when nobody queues, a queued waiter only at the head.
    fn try_grant(
        &self,
        slots: &mut HashMap<String, Slot>,
        name: &str,
        waiter: Option<u64>,
        opts: &LockOptions,
    ) -> Option<LockGuard> {
        let now = Instant::now();
        let slot = slots.entry(name.to_string()).or_default();
        if slot.live_holder(now).is_some() {
            return None;
        }
        match (waiter, slot.queue.front()) {
            (None, None) => {}
            (Some(id), Some((head, _))) if *head == id => {
                slot.queue.pop_front();
            }
            _ => return None,
        }
        slot.fence += 1;
        let owner = OwnerToken::random();
        let lease = Arc::new(LeaseState::granted(now, opts));
        slot.holder = Some(Current {
            owner,
            expires: now + opts.ttl,
            lease: Arc::downgrade(&lease),
            record: opts.holder_record(),
        });
        let handle: Arc<dyn GuardHandle> = Arc::new(MemoryHandle {
            shared: Arc::clone(&self.shared),
            name: name.to_string(),
            owner,
        });
        let guard = LockGuard::new(name, Some(slot.fence), CAPABILITIES, lease, handle);
        Some(guard.kept_by(&self.watchdog, opts, Unrenewed::Left))
    }
}

/// Removes a waiter from its queue when the waiting future ends or is
/// dropped, passing the wake-up on if it was at the head.
struct QueuedWaiter<'a> {
    shared: &'a Shared,
    name: &'a str,
    id: u64,
}

impl Drop for QueuedWaiter<'_> {
    fn drop(&mut self) {
        let mut slots = self.shared.slots();
        if let Some(slot) = slots.get_mut(self.name) {
            let was_head = slot.queue.front().is_some_and(|(id, _)| *id == self.id);
            slot.queue.retain(|(id, _)| *id != self.id);
            if was_head && slot.live_holder(Instant::now()).is_none() {
                slot.wake_head();
            }
        }
    }
}

#[async_trait]
impl RawLock for MemoryLock {
    async fn attempt_once(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        let mut slots = self.shared.slots();
        Ok(self.try_grant(&mut slots, req.name, None, req.opts))
    }

    async fn wait(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        let (name, opts) = (req.name, req.opts);
        let notify = Arc::new(Notify::new());
        let id = self.shared.next_waiter.fetch_add(1, Ordering::Relaxed);
        {
            let mut slots = self.shared.slots();
            if let Some(guard) = self.try_grant(&mut slots, name, None, opts) {
                return Ok(Some(guard));
            }
            let slot = slots.entry(name.to_string()).or_default();
            slot.queue.push_back((id, Arc::clone(&notify)));
        }
        let _queued = QueuedWaiter {
            shared: &self.shared,
            name,
            id,
        };
        let mut wait = WaitLoop::new(req, Some(notify));
        loop {
            // Wake at the holder's expiry in case nobody releases.
            let expiry = {
                let mut slots = self.shared.slots();
                if let Some(guard) = self.try_grant(&mut slots, name, Some(id), opts) {
                    return Ok(Some(guard));
                }
                slots
                    .get_mut(name)
                    .and_then(|s| s.live_holder(Instant::now()).map(|h| h.expires))
            };
            if !wait.pause(expiry.map_or(Pace::Woken, Pace::Until)).await {
                return Ok(None);
            }
        }
    }

    fn raw_capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    async fn raw_inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        crate::name::validate_name(name)?;
        let now = Instant::now();
        let mut slots = self.shared.slots();
        let Some(slot) = slots.get_mut(name) else {
            return Ok(LockInfo::free().with_waiters(Some(0)));
        };
        let waiters = Some(slot.queue.len());
        let fence = slot.fence;
        Ok(match slot.live_holder(now) {
            Some(holder) => LockInfo::held()
                .with_fencing_token(Some(fence))
                .with_expires_in(Some(holder.expires - now))
                .with_holder(Some(HolderRecord::decode_for(
                    "memory",
                    name,
                    holder.record.as_bytes(),
                )?)),
            None => LockInfo::free(),
        }
        .with_waiters(waiters))
    }

    /// Make the current holder of `name` lose the lock at once, as if a
    /// server had expired it: its `lost()` fires (taken over) and the next
    /// waiter is woken.
    async fn raw_force_release(&self, name: &str) -> Result<bool, LockError> {
        crate::name::validate_name(name)?;
        let mut slots = self.shared.slots();
        let Some(slot) = slots.get_mut(name) else {
            return Ok(false);
        };
        let Some(holder) = slot.holder.take() else {
            return Ok(false);
        };
        if let Some(lease) = holder.lease.upgrade() {
            lease.mark_lost(LossReason::TakenOver);
        }
        slot.wake_head();
        Ok(true)
    }
}

struct MemoryHandle {
    shared: Arc<Shared>,
    name: String,
    owner: OwnerToken,
}

impl MemoryHandle {
    /// Free the lock if it is still ours; `true` if it was.
    fn release_now(&self) -> bool {
        let mut slots = self.shared.slots();
        let Some(slot) = slots.get_mut(&self.name) else {
            return false;
        };
        let ours = slot
            .live_holder(Instant::now())
            .is_some_and(|h| h.owner == self.owner);
        if ours {
            slot.holder = None;
            slot.wake_head();
        }
        ours
    }
}

#[async_trait]
impl GuardHandle for MemoryHandle {
    async fn release(&self) -> Result<bool, LockError> {
        Ok(self.release_now())
    }

    /// The lock lives in this process: the release needs no runtime.
    fn detached_release(&self) -> Option<crate::raw::DetachedRelease> {
        let handle = MemoryHandle {
            shared: Arc::clone(&self.shared),
            name: self.name.clone(),
            owner: self.owner,
        };
        Some(Box::pin(async move { Ok(handle.release_now()) }))
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        let mut slots = self.shared.slots();
        let now = Instant::now();
        match slots.get_mut(&self.name).and_then(|s| s.live_holder(now)) {
            Some(h) if h.owner == self.owner => {
                h.expires = now + ttl;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn set_value(&self, value: &[u8]) -> Result<bool, LockError> {
        let mut slots = self.shared.slots();
        match slots
            .get_mut(&self.name)
            .and_then(|s| s.live_holder(Instant::now()))
        {
            Some(h) if h.owner == self.owner => {
                h.record = h.record.with_value(value);
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}
