//! The in-memory backend: the whole contract within one process.
//!
//! Waiters queue in arrival order and each sleeps on its own [`Notify`]; a
//! release wakes exactly the head of the queue, and an expiring holder is
//! noticed by a timer set to its expiry. No polling. An election's
//! observers are signalled by every grant, release and new holder record
//! of the name, and read again when the lease they read ends. Semaphores keep a
//! slot per permit (its holder and its fencing counter) and one queue per
//! name, served the same way; so do reader-writer locks (`rw`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::capabilities::{
    Capabilities, CrashRelease, Fencing, Grade, SemaphoreCapabilities, Waiting,
};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::guard::RawGuard;
use crate::info::LockInfo;
use crate::lock::Changes;
use crate::lock_set::MAX_SET_NAMES;
use crate::loss::LossReason;
use crate::options::LockOptions;
use crate::raw::GuardHandle;
use crate::raw::HolderRecord;
use crate::raw::LeaseState;
use crate::raw::OwnerToken;
use crate::raw::Unrenewed;
use crate::raw::Watchdog;
use crate::raw::{Kind, Pace, RawLock, Request, WaitLoop};
use crate::rw_lock::{RwLockCapabilities, RwLockInfo};
use crate::semaphore::{PermitInfo, SemaphoreInfo, limit_mismatch};

mod rw;

const CAPABILITIES: Capabilities = Capabilities::new("memory", Grade::ProcessLocal)
    .with_fencing(Fencing::Safe)
    .with_fair_queue(true)
    .with_crash_release(CrashRelease::ProcessExit)
    .with_depends_on_clocks(false)
    .with_waiting(Waiting::Notified)
    .with_holder(true)
    .with_observers(Waiting::Notified)
    .with_lock_delay(true)
    .with_hold_at_least(true)
    // Every name under one mutex.
    .with_atomic_sets(MAX_SET_NAMES)
    .with_semaphore(Some(
        SemaphoreCapabilities::new(MAX_LIMIT)
            .with_fair_queue(true)
            .with_waiting(Waiting::Notified),
    ))
    .with_rw_lock(Some(
        RwLockCapabilities::new()
            .with_writer_preference(true)
            .with_fair_queue(true)
            .with_waiting(Waiting::Notified)
            .with_upgradeable(true),
    ));

/// The largest semaphore limit: each slot costs a few bytes per name.
const MAX_LIMIT: u32 = 4096;

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
    semaphores: Mutex<HashMap<String, Permits>>,
    rw: Mutex<HashMap<String, rw::RwEntry>>,
    next_waiter: AtomicU64,
}

/// What a grant's handle holds.
#[derive(Clone, Copy)]
enum Holding {
    /// A lock.
    Lock,
    /// A semaphore's permit on this slot.
    Permit(u32),
    /// A reader-writer lock, for reading or writing.
    Rw,
}

/// The queue a waiter waits in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Queue {
    Lock,
    Permits,
    Rw,
}

/// A semaphore: its slots (each a holder and a fencing counter, kept after
/// release), the limit its live holders share, and its waiters.
#[derive(Default)]
struct Permits {
    slots: Vec<Slot>,
    limit: u32,
    queue: VecDeque<(u64, Arc<Notify>)>,
}

impl Permits {
    /// How many permits are live, dropping those whose lease ran out.
    fn live(&mut self, now: Instant) -> u32 {
        let mut live = 0;
        for slot in &mut self.slots {
            if slot.live_holder(now).is_some() {
                live += 1;
            }
        }
        live
    }

    /// The earliest expiry of a live permit.
    fn next_expiry(&mut self, now: Instant) -> Option<Instant> {
        self.slots
            .iter_mut()
            .filter_map(|s| s.live_holder(now).map(|h| h.expires))
            .min()
    }

    fn wake_head(&self) {
        if let Some((_, n)) = self.queue.front() {
            n.notify_one();
        }
    }
}

#[derive(Default)]
struct Slot {
    holder: Option<Current>,
    fence: u64,
    queue: VecDeque<(u64, Arc<Notify>)>,
    /// The signal of the name's observers, once one observed it.
    observed: Option<watch::Sender<()>>,
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

    /// Tell the name's observers it changed.
    fn signal(&self) {
        if let Some(tx) = &self.observed {
            tx.send_replace(());
        }
    }
}

/// What a grant's handle did to its holder (see `MemoryHandle::with_ours`).
enum Done {
    /// Nothing an observer sees (a renewal).
    Unseen,
    /// A new holder record.
    Changed,
    /// The grant ended (the next waiter is woken).
    Ended,
}

impl Shared {
    fn slots(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn semaphores(&self) -> MutexGuard<'_, HashMap<String, Permits>> {
        self.semaphores.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn rw(&self) -> MutexGuard<'_, HashMap<String, rw::RwEntry>> {
        self.rw.lock().unwrap_or_else(|e| e.into_inner())
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
        if !Self::may_grant(slot, waiter, now) {
            return None;
        }
        if waiter.is_some() {
            slot.queue.pop_front();
        }
        Some(self.grant(slot, name, now, opts))
    }

    /// Whether `slot` is free for `waiter`: a newcomer (`None`) only when
    /// nobody queues, a queued waiter only at the head.
    fn may_grant(slot: &mut Slot, waiter: Option<u64>, now: Instant) -> bool {
        if slot.live_holder(now).is_some() {
            return false;
        }
        match (waiter, slot.queue.front()) {
            (None, None) => true,
            (Some(id), Some((head, _))) => *head == id,
            _ => false,
        }
    }

    /// Grant `name`'s free `slot` now.
    fn grant(&self, slot: &mut Slot, name: &str, now: Instant, opts: &LockOptions) -> LockGuard {
        slot.fence += 1;
        let owner = OwnerToken::random();
        let lease = Arc::new(LeaseState::granted(now, opts));
        slot.holder = Some(Current {
            owner,
            expires: now + opts.ttl,
            lease: Arc::downgrade(&lease),
            record: opts.holder_record(),
        });
        slot.signal();
        let handle: Arc<dyn GuardHandle> = Arc::new(MemoryHandle {
            shared: Arc::clone(&self.shared),
            name: name.to_string(),
            owner,
            kind: Holding::Lock,
        });
        let guard = LockGuard::new(name, Some(slot.fence), CAPABILITIES, lease, handle);
        guard.kept_by(&self.watchdog, opts, Unrenewed::Left)
    }

    /// Grant a permit of semaphore `name` if one is free and `waiter` may
    /// take it (as [`try_grant`](Self::try_grant)); a limit other than the
    /// live holders' is refused.
    fn try_grant_permit(
        &self,
        semaphores: &mut HashMap<String, Permits>,
        name: &str,
        limit: u32,
        waiter: Option<u64>,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let now = Instant::now();
        let permits = semaphores.entry(name.to_string()).or_default();
        let live = permits.live(now);
        if live > 0 && permits.limit != limit {
            return Err(limit_mismatch(name, limit, permits.limit));
        }
        if live >= limit {
            return Ok(None);
        }
        match (waiter, permits.queue.front()) {
            (None, None) => {}
            (Some(id), Some((head, _))) if *head == id => {
                permits.queue.pop_front();
            }
            _ => return Ok(None),
        }
        let wanted = usize::try_from(limit).unwrap_or(usize::MAX);
        if permits.slots.len() < wanted {
            permits.slots.resize_with(wanted, Slot::default);
        }
        let Some(index) = permits.slots[..wanted]
            .iter()
            .position(|slot| slot.holder.is_none())
        else {
            return Ok(None);
        };
        permits.limit = limit;
        let slot = &mut permits.slots[index];
        slot.fence += 1;
        let owner = OwnerToken::random();
        let lease = Arc::new(LeaseState::granted(now, opts));
        slot.holder = Some(Current {
            owner,
            expires: now + opts.ttl,
            lease: Arc::downgrade(&lease),
            record: opts.holder_record(),
        });
        let fence = slot.fence;
        // Another permit still free: the next waiter in line may take it.
        if live + 1 < limit {
            permits.wake_head();
        }
        let slot = u32::try_from(index).ok();
        let handle: Arc<dyn GuardHandle> = Arc::new(MemoryHandle {
            shared: Arc::clone(&self.shared),
            name: name.to_string(),
            owner,
            kind: slot.map_or(Holding::Lock, Holding::Permit),
        });
        let guard = LockGuard::new(name, Some(fence), CAPABILITIES, lease, handle).with_slot(slot);
        Ok(Some(guard.kept_by(&self.watchdog, opts, Unrenewed::Left)))
    }

    /// Wait for a permit of semaphore `name`, in arrival order.
    async fn wait_for_permit(
        &self,
        req: Request<'_>,
        limit: u32,
    ) -> Result<Option<LockGuard>, LockError> {
        let (name, opts) = (req.name, req.opts);
        let notify = Arc::new(Notify::new());
        let id = self.shared.next_waiter.fetch_add(1, Ordering::Relaxed);
        {
            let mut semaphores = self.shared.semaphores();
            if let Some(guard) = self.try_grant_permit(&mut semaphores, name, limit, None, opts)? {
                return Ok(Some(guard));
            }
            let permits = semaphores.entry(name.to_string()).or_default();
            permits.queue.push_back((id, Arc::clone(&notify)));
        }
        let _queued = QueuedWaiter {
            shared: &self.shared,
            name,
            id,
            queue: Queue::Permits,
        };
        let mut wait = WaitLoop::new(req, Some(notify));
        loop {
            // Wake at the earliest holder's expiry in case nobody releases.
            let expiry = {
                let mut semaphores = self.shared.semaphores();
                if let Some(guard) =
                    self.try_grant_permit(&mut semaphores, name, limit, Some(id), opts)?
                {
                    return Ok(Some(guard));
                }
                semaphores
                    .get_mut(name)
                    .and_then(|p| p.next_expiry(Instant::now()))
            };
            if !wait.pause(expiry.map_or(Pace::Woken, Pace::Until)).await {
                return Ok(None);
            }
        }
    }
}

/// Removes a waiter from its queue when the waiting future ends or is
/// dropped, passing the wake-up on if it was at the head.
struct QueuedWaiter<'a> {
    shared: &'a Shared,
    name: &'a str,
    id: u64,
    /// Whose queue it waits in.
    queue: Queue,
}

impl Drop for QueuedWaiter<'_> {
    fn drop(&mut self) {
        if self.queue == Queue::Rw {
            let mut rw = self.shared.rw();
            if let Some(entry) = rw.get_mut(self.name) {
                entry.leave_queue(self.id);
            }
            return;
        }
        if self.queue == Queue::Permits {
            let mut semaphores = self.shared.semaphores();
            if let Some(permits) = semaphores.get_mut(self.name) {
                let was_head = permits.queue.front().is_some_and(|(id, _)| *id == self.id);
                permits.queue.retain(|(id, _)| *id != self.id);
                let limit = permits.limit.max(1);
                if was_head && permits.live(Instant::now()) < limit {
                    permits.wake_head();
                }
            }
            return;
        }
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
        match req.kind() {
            Kind::Rw(access) => {
                let mut rw = self.shared.rw();
                Ok(self.try_grant_rw(&mut rw, req.name, access, None, req.opts))
            }
            Kind::Permit(limit) => {
                let mut semaphores = self.shared.semaphores();
                self.try_grant_permit(&mut semaphores, req.name, limit, None, req.opts)
            }
            Kind::Lock => {
                let mut slots = self.shared.slots();
                Ok(self.try_grant(&mut slots, req.name, None, req.opts))
            }
        }
    }

    /// Under the one mutex of every name: all free (as for a newcomer),
    /// then all granted.
    async fn attempt_set_once(
        &self,
        reqs: &[Request<'_>],
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        let now = Instant::now();
        let mut slots = self.shared.slots();
        for req in reqs {
            let slot = slots.entry(req.name.to_string()).or_default();
            if !Self::may_grant(slot, None, now) {
                return Ok(None);
            }
        }
        Ok(Some(
            reqs.iter()
                .map(|req| {
                    let slot = slots.entry(req.name.to_string()).or_default();
                    self.grant(slot, req.name, now, req.opts)
                })
                .collect(),
        ))
    }

    async fn wait(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        match req.kind() {
            Kind::Rw(access) => return self.wait_for_rw(req, access).await,
            Kind::Permit(limit) => return self.wait_for_permit(req, limit).await,
            Kind::Lock => {}
        }
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
            queue: Queue::Lock,
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

    async fn raw_inspect_rw(&self, name: &str) -> Result<RwLockInfo, LockError> {
        let mut rw = self.shared.rw();
        Ok(match rw.get_mut(name) {
            Some(entry) => entry.info(name, Instant::now())?,
            None => RwLockInfo::free().with_waiting(Some(0), Some(0)),
        })
    }

    async fn raw_inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        let now = Instant::now();
        let mut semaphores = self.shared.semaphores();
        let Some(permits) = semaphores.get_mut(name) else {
            return Ok(SemaphoreInfo::free().with_waiters(Some(0)));
        };
        let waiters = Some(permits.queue.len());
        if permits.live(now) == 0 {
            return Ok(SemaphoreInfo::free().with_waiters(waiters));
        }
        let mut held = Vec::new();
        for (index, slot) in permits.slots.iter().enumerate() {
            let Some(holder) = &slot.holder else {
                continue;
            };
            let record = HolderRecord::decode_for("memory", name, holder.record.as_bytes())?;
            held.push(
                PermitInfo::new(u32::try_from(index).unwrap_or(u32::MAX))
                    .with_fencing_token(Some(slot.fence))
                    .with_expires_in(Some(holder.expires - now))
                    .with_holder(Some(record)),
            );
        }
        Ok(SemaphoreInfo::held(permits.limit, held).with_waiters(waiters))
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
        slot.signal();
        Ok(true)
    }

    /// The name's signal: every grant, release, forced release and new
    /// holder record of `name` marks it changed.
    async fn raw_changes(&self, name: &str) -> Result<Option<Changes>, LockError> {
        crate::name::validate_name(name)?;
        let rx = {
            let mut slots = self.shared.slots();
            let slot = slots.entry(name.to_string()).or_default();
            slot.observed
                .get_or_insert_with(|| watch::channel(()).0)
                .subscribe()
        };
        Ok(Some(Box::pin(futures_util::stream::unfold(
            rx,
            |mut rx| async move {
                rx.changed().await.ok()?;
                Some((Ok(()), rx))
            },
        ))))
    }
}

struct MemoryHandle {
    shared: Arc<Shared>,
    name: String,
    owner: OwnerToken,
    /// A lock's, a permit's (its slot) or a reader-writer lock's grant.
    kind: Holding,
}

impl MemoryHandle {
    /// Run `f` on this grant's live holder if it is still ours (`None`
    /// otherwise); `f` answers the result and what it did: a grant that
    /// ends wakes the next waiter, and a lock's observers hear of an end
    /// and of a new record.
    fn with_ours<R>(&self, f: impl FnOnce(&mut Current) -> (R, Done)) -> Option<R> {
        let now = Instant::now();
        match self.kind {
            Holding::Rw => {
                let mut rw = self.shared.rw();
                let entry = rw.get_mut(&self.name)?;
                entry.with_ours(self.owner, now, f)
            }
            Holding::Lock => {
                let mut slots = self.shared.slots();
                let slot = slots.get_mut(&self.name)?;
                let holder = slot.live_holder(now).filter(|h| h.owner == self.owner)?;
                let (out, done) = f(holder);
                match done {
                    Done::Unseen => {}
                    Done::Changed => slot.signal(),
                    Done::Ended => {
                        slot.holder = None;
                        slot.wake_head();
                        slot.signal();
                    }
                }
                Some(out)
            }
            Holding::Permit(index) => {
                let mut semaphores = self.shared.semaphores();
                let permits = semaphores.get_mut(&self.name)?;
                let slot = permits.slots.get_mut(usize::try_from(index).ok()?)?;
                let holder = slot.live_holder(now).filter(|h| h.owner == self.owner)?;
                let (out, done) = f(holder);
                if let Done::Ended = done {
                    slot.holder = None;
                    permits.wake_head();
                }
                Some(out)
            }
        }
    }

    /// Free the grant if it is still ours; `true` if it was.
    fn release_now(&self) -> bool {
        self.with_ours(|_| ((), Done::Ended)).is_some()
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
            kind: self.kind,
        };
        Some(Box::pin(async move { Ok(handle.release_now()) }))
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        let now = Instant::now();
        Ok(self
            .with_ours(|h| {
                h.expires = now + ttl;
                ((), Done::Unseen)
            })
            .is_some())
    }

    async fn set_value(&self, value: &[u8]) -> Result<bool, LockError> {
        Ok(self
            .with_ours(|h| {
                h.record = h.record.with_value(value);
                ((), Done::Changed)
            })
            .is_some())
    }

    /// Look, and wait for a reader's end (or the earliest lease's, or the
    /// deadline) between looks; leaving in any way (the deadline, a
    /// cancellation) lets the readers in again.
    async fn upgrade(&self, deadline: Option<Instant>) -> Result<Option<u64>, LockError> {
        if !matches!(self.kind, Holding::Rw) {
            return Err(LockError::invalid_options(
                "only an upgradeable read can be upgraded",
            ));
        }
        let started = Instant::now();
        let _leaving = LeftUpgrade(self);
        loop {
            let mut wait = None;
            let look = {
                let mut rw = self.shared.rw();
                match rw.get_mut(&self.name) {
                    Some(entry) => entry.try_upgrade(self.owner, Instant::now(), &mut wait),
                    None => Err(()),
                }
            };
            match look {
                Ok(Some(token)) => return Ok(Some(token)),
                Err(()) => {
                    return Err(LockError::NotHeld {
                        name: self.name.clone(),
                    });
                }
                Ok(None) => {}
            }
            let Some((notify, expiry)) = wait else {
                continue;
            };
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(LockError::Timeout {
                    name: self.name.clone(),
                    waited: started.elapsed(),
                });
            }
            let until = match (expiry, deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            match until {
                Some(at) => {
                    let _ = tokio::time::timeout_at(at, notify.notified()).await;
                }
                None => notify.notified().await,
            }
        }
    }
}

/// Lets the readers in again when an upgrade leaves without upgrading (a
/// no-op once it upgraded).
struct LeftUpgrade<'a>(&'a MemoryHandle);

impl Drop for LeftUpgrade<'_> {
    fn drop(&mut self) {
        let h = self.0;
        if let Some(entry) = h.shared.rw().get_mut(&h.name) {
            entry.abandon_upgrade(h.owner);
        }
    }
}
