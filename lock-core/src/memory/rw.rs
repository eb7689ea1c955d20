//! The in-memory backend's reader-writer locks: one writer or many readers
//! per name, one queue in arrival order, and one fencing counter per name.
//!
//! A newcomer is granted only when nobody queues, so once a writer waits,
//! later readers queue behind it (writer preference) while readers already
//! holding keep their grants. A queued waiter is granted at the head of the
//! queue; a reader granted there wakes the next waiter if it reads too, so
//! a run of queued readers is let in together.
//!
//! An upgradeable reader is a reader marked as the name's one upgrader: a
//! writer waits for it as for any reader, another upgradeable reader waits
//! for the mark to go. Its upgrade raises a flag that keeps new readers
//! out (queued waiters stay queued), waits on a notification of its own
//! until it is the only reader, then moves it to the writer's place with a
//! new token.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{CAPABILITIES, Current, Done, Holding, MemoryHandle, MemoryLock, Queue, QueuedWaiter};
use crate::error::LockError;
use crate::guard::{LockGuard, RawGuard};
use crate::options::LockOptions;
use crate::raw::{
    GuardHandle, HolderRecord, LeaseState, OwnerToken, Pace, Request, Unrenewed, WaitLoop,
};
use crate::rw_lock::{Access, RwHolderInfo, RwLockInfo};

/// One name's reader-writer lock.
#[derive(Default)]
pub(super) struct RwEntry {
    writer: Option<Current>,
    readers: Vec<Current>,
    /// The latest write grant's token (kept after release, so tokens never
    /// repeat).
    fence: u64,
    queue: VecDeque<(u64, Access, Arc<Notify>)>,
    /// The upgradeable reader among `readers`, if any.
    upgrader: Option<OwnerToken>,
    /// Told of each reader's end while the upgrader waits to upgrade
    /// (which keeps new readers out).
    upgrading: Option<Arc<Notify>>,
}

impl RwEntry {
    /// Drop the holders whose lease ran out (an upgrader's mark with it).
    fn prune(&mut self, now: Instant) {
        if self.writer.as_ref().is_some_and(|w| w.expires <= now) {
            self.writer = None;
        }
        self.readers.retain(|r| r.expires > now);
        self.forget_gone_upgrader();
    }

    /// Drop the upgrader's mark (and its upgrade's flag) once it no longer
    /// reads, telling a waiting upgrade.
    fn forget_gone_upgrader(&mut self) {
        let gone = self
            .upgrader
            .is_some_and(|u| !self.readers.iter().any(|r| r.owner == u));
        if gone {
            self.upgrader = None;
            if let Some(n) = self.upgrading.take() {
                n.notify_one();
            }
        }
    }

    /// Whether `access` may be granted to `waiter` now: free for it, and
    /// a newcomer (`None`) only when nobody queues, a queued waiter only
    /// at the head.
    fn may_grant(&mut self, access: Access, waiter: Option<u64>, now: Instant) -> bool {
        self.prune(now);
        let free = match access {
            Access::Write => self.writer.is_none() && self.readers.is_empty(),
            Access::Upgradeable => self.writer.is_none() && self.upgrader.is_none(),
            _ => self.writer.is_none() && self.upgrading.is_none(),
        };
        free && match (waiter, self.queue.front()) {
            (None, None) => true,
            (Some(id), Some((head, _, _))) => *head == id,
            _ => false,
        }
    }

    /// Wake the waiter at the head of the queue: it checks for itself.
    fn wake_head(&self) {
        if let Some((_, _, n)) = self.queue.front() {
            n.notify_one();
        }
    }

    /// The earliest end of a holder's lease.
    fn next_expiry(&mut self, now: Instant) -> Option<Instant> {
        self.prune(now);
        self.writer
            .iter()
            .chain(&self.readers)
            .map(|h| h.expires)
            .min()
    }

    /// Leave the queue (a waiter that gave up or was dropped); the new
    /// head may be free to go.
    pub(super) fn leave_queue(&mut self, id: u64) {
        self.queue.retain(|(queued, _, _)| *queued != id);
        self.wake_head();
    }

    /// Run `f` on `owner`'s live grant (`None` if it has none); an ending
    /// grant is removed and the head of the queue woken.
    pub(super) fn with_ours<R>(
        &mut self,
        owner: OwnerToken,
        now: Instant,
        f: impl FnOnce(&mut Current) -> (R, Done),
    ) -> Option<R> {
        self.prune(now);
        let holder = match &mut self.writer {
            Some(w) if w.owner == owner => w,
            _ => self.readers.iter_mut().find(|r| r.owner == owner)?,
        };
        let (out, done) = f(holder);
        if let Done::Ended = done {
            if self.writer.as_ref().is_some_and(|w| w.owner == owner) {
                self.writer = None;
            }
            self.readers.retain(|r| r.owner != owner);
            self.forget_gone_upgrader();
            // A waiting upgrade looks again whether it reads alone.
            if let Some(n) = &self.upgrading {
                n.notify_one();
            }
            self.wake_head();
        }
        Some(out)
    }

    /// One look of `owner`'s upgrade: `Ok(Some(token))` once it has moved
    /// to the writer's place (it read alone), `Ok(None)` while other
    /// readers hold (the flag that keeps new readers out raised, its
    /// notification and the earliest lease's end to wait on answered in
    /// `wait`), `Err(())` if `owner` is not the upgrader any more.
    pub(super) fn try_upgrade(
        &mut self,
        owner: OwnerToken,
        now: Instant,
        wait: &mut Option<(Arc<Notify>, Option<Instant>)>,
    ) -> Result<Option<u64>, ()> {
        self.prune(now);
        if self.upgrader != Some(owner) {
            return Err(());
        }
        if self.readers.len() == 1 {
            let Some(at) = self.readers.iter().position(|r| r.owner == owner) else {
                return Err(());
            };
            self.writer = Some(self.readers.remove(at));
            self.upgrader = None;
            self.upgrading = None;
            self.fence += 1;
            return Ok(Some(self.fence));
        }
        let notify = Arc::clone(
            self.upgrading
                .get_or_insert_with(|| Arc::new(Notify::new())),
        );
        *wait = Some((notify, self.next_expiry(now)));
        Ok(None)
    }

    /// `owner`'s upgrade gave up: let the readers in again.
    pub(super) fn abandon_upgrade(&mut self, owner: OwnerToken) {
        if self.upgrader == Some(owner) && self.upgrading.take().is_some() {
            self.wake_head();
        }
    }

    /// The snapshot `inspect_rw` reports.
    pub(super) fn info(&mut self, name: &str, now: Instant) -> Result<RwLockInfo, LockError> {
        self.prune(now);
        let fence = self.fence;
        let mut holders = Vec::new();
        let upgrader = self.upgrader;
        let held = self
            .writer
            .iter()
            .map(|w| (Access::Write, w))
            .chain(self.readers.iter().map(|r| {
                let access = if Some(r.owner) == upgrader {
                    Access::Upgradeable
                } else {
                    Access::Read
                };
                (access, r)
            }));
        for (access, h) in held {
            let record = HolderRecord::decode_for("memory", name, h.record.as_bytes())?;
            holders.push(
                RwHolderInfo::new(access)
                    .with_fencing_token(Some(fence))
                    .with_expires_in(Some(h.expires - now))
                    .with_holder(Some(record)),
            );
        }
        let queued_writers = self
            .queue
            .iter()
            .filter(|(_, a, _)| *a == Access::Write)
            .count();
        // An upgrade under way waits to write.
        let writers = queued_writers + usize::from(self.upgrading.is_some());
        Ok(RwLockInfo::held(holders)
            .with_fencing_token(Some(fence))
            .with_waiting(Some(writers), Some(self.queue.len() - queued_writers)))
    }
}

impl MemoryLock {
    /// Grant `access` to `name` if [`RwEntry::may_grant`] says so.
    pub(super) fn try_grant_rw(
        &self,
        entries: &mut HashMap<String, RwEntry>,
        name: &str,
        access: Access,
        waiter: Option<u64>,
        opts: &LockOptions,
    ) -> Option<LockGuard> {
        let now = Instant::now();
        let entry = entries.entry(name.to_string()).or_default();
        if !entry.may_grant(access, waiter, now) {
            return None;
        }
        if waiter.is_some() {
            entry.queue.pop_front();
            // A run of queued readers goes in together (an upgradeable
            // reader among them, where no other holds).
            if access.is_shared()
                && entry
                    .queue
                    .front()
                    .is_some_and(|(_, next, _)| next.is_shared())
            {
                entry.wake_head();
            }
        }
        if access == Access::Write {
            entry.fence += 1;
        }
        let owner = OwnerToken::random();
        let lease = Arc::new(LeaseState::granted(now, opts));
        let current = Current {
            owner,
            expires: now + opts.ttl,
            lease: Arc::downgrade(&lease),
            record: opts.holder_record(),
        };
        match access {
            Access::Write => entry.writer = Some(current),
            _ => {
                if access == Access::Upgradeable {
                    entry.upgrader = Some(owner);
                }
                entry.readers.push(current);
            }
        }
        let handle: Arc<dyn GuardHandle> = Arc::new(MemoryHandle {
            shared: Arc::clone(&self.shared),
            name: name.to_string(),
            owner,
            kind: Holding::Rw,
        });
        let guard = LockGuard::new(name, Some(entry.fence), CAPABILITIES, lease, handle)
            .with_access(Some(access));
        Some(guard.kept_by(&self.watchdog, opts, Unrenewed::Left))
    }

    /// Wait for `access` to `name`, in arrival order.
    pub(super) async fn wait_for_rw(
        &self,
        req: Request<'_>,
        access: Access,
    ) -> Result<Option<LockGuard>, LockError> {
        let (name, opts) = (req.name, req.opts);
        let notify = Arc::new(Notify::new());
        let id = self.shared.next_waiter.fetch_add(1, Ordering::Relaxed);
        {
            let mut rw = self.shared.rw();
            if let Some(guard) = self.try_grant_rw(&mut rw, name, access, None, opts) {
                return Ok(Some(guard));
            }
            let entry = rw.entry(name.to_string()).or_default();
            entry.queue.push_back((id, access, Arc::clone(&notify)));
        }
        let _queued = QueuedWaiter {
            shared: &self.shared,
            name,
            id,
            queue: Queue::Rw,
        };
        let mut wait = WaitLoop::new(req, Some(notify));
        loop {
            // Wake at the earliest holder's expiry in case nobody releases.
            let expiry = {
                let mut rw = self.shared.rw();
                if let Some(guard) = self.try_grant_rw(&mut rw, name, access, Some(id), opts) {
                    return Ok(Some(guard));
                }
                rw.get_mut(name).and_then(|e| e.next_expiry(Instant::now()))
            };
            if !wait.pause(expiry.map_or(Pace::Woken, Pace::Until)).await {
                return Ok(None);
            }
        }
    }
}
