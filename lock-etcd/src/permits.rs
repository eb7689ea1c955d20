//! etcd semaphores, on the locks' leases and sessions.
//!
//! Semaphore `n` lives under `PREFIX/%permits/e(n)/` (no lock's directory
//! can be that: an escaped name holds `%` only as `%25` or `%2F`). Each
//! acquisition puts a queue key `…/q/LIMIT-LEASE-OWNER` (the limit it
//! asked with, in hex) on its lease; the queue is ordered by create
//! revision, and the first `limit` keys hold permits, so waiters are served
//! in arrival order. A key that is among the first then claims a free
//! slot key `…/s/SLOT` (each claimer starting at one of its own) on the
//! same lease, by a transaction that checks
//! its queue key is still there and the slot key absent; the slot key's
//! create revision is the permit's fencing token (global, so each slot's
//! tokens rise). A release deletes both keys in one transaction, as the
//! lease's end does. The first transaction also reads every queue key: one
//! asked with another limit refuses the request, naming both. Waiters
//! watch the queue's deletions (every waiter of the name is woken by each)
//! and read their place again.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchFilterType, WatchOptions,
};
use lock_core::raw::{
    GuardHandle, HolderRecord, OwnerToken, PendingGrant, RawGuard, Unrenewed, limit_mismatch,
};
use lock_core::{LockError, LockGuard, LockOptions, PermitInfo, SemaphoreInfo};
use tokio::time::Instant;

use crate::error::BACKEND;
use crate::handle::{EtcdHandle, Lease, SlotKey};
use crate::keys;
use crate::lock::{EtcdLock, ride_out};
use crate::queue::{self, Turn, get_result};
use crate::requests;

/// The largest limit (a waiter reads the keys ahead of its own, a holder
/// the slot keys).
pub(crate) const MAX_LIMIT: u32 = 1024;

/// The two directories of one semaphore.
pub(crate) struct PermitDirs {
    /// Queue keys, one per acquisition, ordered by create revision.
    queue: String,
    /// Slot keys, one per held permit.
    slots: String,
}

impl PermitDirs {
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let base = keys::dir(&format!("{prefix}/%permits"), name);
        PermitDirs {
            queue: format!("{base}q/"),
            slots: format!("{base}s/"),
        }
    }

    fn queue_key(&self, limit: u32, lease: i64, owner: &str) -> String {
        format!("{}{limit:08x}-{lease:016x}-{owner}", self.queue)
    }

    fn slot_key(&self, slot: u32) -> String {
        format!("{}{slot:08x}", self.slots)
    }

    /// The limit a queue key was put with.
    fn limit_of(&self, key: &[u8]) -> Option<u32> {
        let hex = key.strip_prefix(self.queue.as_bytes())?.get(..8)?;
        u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
    }

    /// The slot of a slot key.
    fn slot_of(&self, key: &[u8]) -> Option<u32> {
        let hex = key.strip_prefix(self.slots.as_bytes())?;
        u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
    }

    /// Every key of a directory (`dir` is one of ours).
    fn all(dir: &str) -> GetOptions {
        GetOptions::new().with_range(keys::range_end(dir))
    }
}

/// What one claim of a slot came to.
enum Claim {
    /// The slot (and its key's create revision, the token).
    Granted(u32, i64),
    /// Another holder took the slot first: the slot keys as they are now.
    Taken(Vec<Vec<u8>>),
    /// Our queue key is gone (its lease ended).
    OursGone,
}

impl EtcdLock {
    /// Acquire a permit of `name` among `limit`; `wait == false` gives up
    /// (removing our queue key) if not among the first `limit`.
    pub(crate) async fn acquire_permit(
        &self,
        name: &str,
        opts: &LockOptions,
        limit: u32,
        deadline: Option<Instant>,
        wait: bool,
    ) -> Result<Option<LockGuard>, LockError> {
        let leased = self.lease_for(opts).await?;
        let dirs = PermitDirs::new(&self.inner.config.prefix, name);
        let key = dirs.queue_key(limit, leased.0.id(), &OwnerToken::random().to_hex());
        let handle = Arc::new(EtcdHandle::new(
            Arc::clone(&self.inner),
            name,
            dirs.queue.clone(),
            key,
            opts.holder_record(),
            leased,
        ));
        // Until a guard owns the keys, leaving deletes them and gives back
        // a lease of our own.
        let pending = PendingGrant::new(Arc::clone(&handle) as Arc<dyn GuardHandle>);
        let client = &self.inner.client;
        let txn = Txn::new()
            .when([Compare::create_revision(
                handle.key.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([
                TxnOp::put(
                    handle.key.as_str(),
                    handle.record().as_bytes(),
                    Some(PutOptions::new().with_lease(handle.lease_id())),
                ),
                // Every key (their limits), ours the newest.
                TxnOp::get(
                    dirs.queue.as_str(),
                    Some(PermitDirs::all(&dirs.queue).with_keys_only()),
                ),
                TxnOp::get(
                    dirs.slots.as_str(),
                    Some(PermitDirs::all(&dirs.slots).with_keys_only()),
                ),
            ]);
        let resp = requests::txn(client, txn, "acquiring a permit")
            .await
            .map_err(|e| handle.put_failed(e))?;
        if !resp.succeeded() {
            return Err(LockError::Backend {
                backend: BACKEND,
                reason: format!("permit key {:?} exists already", handle.key),
                source: None,
            });
        }
        let rev = resp.header().map_or(0, |h| h.revision());
        *handle.rev.lock().unwrap_or_else(|e| e.into_inner()) = rev;
        // Checked against every key there, so the keys that pass always
        // agree (one checked against the oldest alone could pass beside a
        // key of another limit that was itself being refused).
        let (queued, _) = get_result(&resp, 1);
        if let Some(held) = queued
            .iter()
            .filter_map(|k| dirs.limit_of(k))
            .find(|&held| held != limit)
        {
            let _ = pending.give_back().await;
            return Err(limit_mismatch(name, limit, held));
        }
        let mut ahead = queued.len().saturating_sub(1) as u64;
        let mut slots = get_result(&resp, 2).0;
        let mut read_at = rev;
        loop {
            if handle.state.lost_now().is_some() {
                let _ = pending.give_back().await;
                return Err(queue::place_lost(name));
            }
            let step = if ahead < u64::from(limit) {
                match self.claim_slot(&handle, &dirs, limit, rev, &slots).await {
                    Ok(Claim::Granted(slot, token)) => {
                        pending.disarm();
                        return Ok(Some(self.permit(name, handle, slot, token, opts)));
                    }
                    Ok(Claim::Taken(now)) => {
                        slots = now;
                        continue;
                    }
                    Ok(Claim::OursGone) => return Err(queue::place_lost(name)),
                    Err(e) => Err(e),
                }
            } else if !wait {
                let _ = pending.give_back().await;
                return Ok(None);
            } else {
                self.await_deletion(&handle, &dirs, read_at + 1, deadline)
                    .await
            };
            match step {
                Ok(Turn::OursGone) => return Err(queue::place_lost(name)),
                Ok(_) => {}
                // A leader election or a member going away while we wait:
                // keep our place and look again, until the deadline.
                Err(e) if e.is_transient() => ride_out(name, e, deadline).await?,
                // The wait ran out: our key goes before the caller hears.
                Err(e @ LockError::Timeout { .. }) => {
                    let _ = pending.give_back().await;
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
            // A deletion ahead, a watch that ended, a claim that failed
            // for a moment: our place now.
            match self.place(&handle, &dirs, rev).await {
                Ok(Some((now_ahead, now_slots, at))) => {
                    ahead = now_ahead;
                    slots = now_slots;
                    read_at = at;
                }
                Ok(None) => return Err(queue::place_lost(name)),
                Err(e) if e.is_transient() => ride_out(name, e, deadline).await?,
                Err(e) => return Err(e),
            }
        }
    }

    /// Take a slot not in `slots`, if our queue key (created at `rev`) is
    /// still there. Losing the slot to another claimer is `Taken`: the
    /// caller claims again, as long as it takes (each loss is another's
    /// grant).
    async fn claim_slot(
        &self,
        handle: &EtcdHandle,
        dirs: &PermitDirs,
        limit: u32,
        rev: i64,
        slots: &[Vec<u8>],
    ) -> Result<Claim, LockError> {
        let taken: HashSet<u32> = slots.iter().filter_map(|k| dirs.slot_of(k)).collect();
        let free: Vec<u32> = (0..limit).filter(|s| !taken.contains(s)).collect();
        // Each claimer starts at a free slot of its own (by its queue key's
        // revision), so the first `limit` claimers mostly do not collide:
        // a collision costs the loser a round trip, never its place.
        let slot =
            (!free.is_empty()).then(|| free[(rev.unsigned_abs() % free.len() as u64) as usize]);
        let Some(slot) = slot else {
            return Err(LockError::Backend {
                backend: BACKEND,
                reason: format!(
                    "semaphore {:?}: every slot below {limit} has a key although fewer permits are held",
                    handle.name
                ),
                source: None,
            });
        };
        let key = dirs.slot_key(slot);
        let txn = Txn::new()
            .when([
                Compare::create_revision(handle.key.as_str(), CompareOp::Equal, rev),
                Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
            ])
            .and_then([TxnOp::put(
                key.as_str(),
                handle.record().as_bytes(),
                Some(PutOptions::new().with_lease(handle.lease_id())),
            )])
            .or_else([
                TxnOp::get(
                    handle.key.as_str(),
                    Some(GetOptions::new().with_keys_only()),
                ),
                TxnOp::get(
                    dirs.slots.as_str(),
                    Some(PermitDirs::all(&dirs.slots).with_keys_only()),
                ),
            ]);
        let resp = requests::txn(&self.inner.client, txn, "claiming a permit's slot").await?;
        if resp.succeeded() {
            let token = resp.header().map_or(0, |h| h.revision());
            *handle.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(SlotKey { key, token });
            return Ok(Claim::Granted(slot, token));
        }
        if get_result(&resp, 0).0.is_empty() {
            return Ok(Claim::OursGone);
        }
        Ok(Claim::Taken(get_result(&resp, 1).0))
    }

    /// How many queue keys stand ahead of ours (created at `rev`), the slot
    /// keys, and the revision read at; `None` if our key is gone.
    async fn place(
        &self,
        handle: &EtcdHandle,
        dirs: &PermitDirs,
        rev: i64,
    ) -> Result<Option<(u64, Vec<Vec<u8>>, i64)>, LockError> {
        // Counted from the keys themselves: etcd counts a range before
        // its revision filters.
        let ahead = PermitDirs::all(&dirs.queue)
            .with_max_create_revision(rev - 1)
            .with_keys_only();
        let txn = Txn::new()
            .when([Compare::create_revision(
                handle.key.as_str(),
                CompareOp::Equal,
                rev,
            )])
            .and_then([
                TxnOp::get(dirs.queue.as_str(), Some(ahead)),
                TxnOp::get(
                    dirs.slots.as_str(),
                    Some(PermitDirs::all(&dirs.slots).with_keys_only()),
                ),
            ]);
        let resp = requests::txn(&self.inner.client, txn, "reading a permit's place").await?;
        if !resp.succeeded() {
            return Ok(None);
        }
        let at = resp.header().map_or(0, |h| h.revision());
        let ahead = get_result(&resp, 0).0.len() as u64;
        Ok(Some((ahead, get_result(&resp, 1).0, at)))
    }

    /// Wait for a deletion in the queue from revision `from`: of our own key
    /// (`OursGone`) or of another (`PredecessorGone`, then we read our
    /// place again).
    async fn await_deletion(
        &self,
        handle: &EtcdHandle,
        dirs: &PermitDirs,
        from: i64,
        deadline: Option<Instant>,
    ) -> Result<Turn, LockError> {
        let options = WatchOptions::new()
            .with_range(keys::range_end(&dirs.queue))
            .with_start_revision(from)
            .with_filters([WatchFilterType::NoPut]);
        let watch = requests::watch(
            &self.inner.client,
            dirs.queue.as_bytes(),
            options,
            "watching a semaphore's queue",
        )
        .await?;
        let ours = handle.key.as_bytes();
        self.watch_until(handle, watch, deadline, |message| {
            let resp = match message {
                Ok(Some(resp)) if !resp.canceled() => resp,
                _ => return Some(Turn::Ended),
            };
            let mut turn = None;
            for event in resp.events() {
                let Some(kv) = event.kv() else { continue };
                if event.event_type() != EventType::Delete {
                    continue;
                }
                if kv.key() == ours {
                    return Some(Turn::OursGone);
                }
                turn = Some(Turn::PredecessorGone(kv.mod_revision()));
            }
            turn
        })
        .await
    }

    /// The guard of a permit on `slot` with `token`.
    fn permit(
        &self,
        name: &str,
        handle: Arc<EtcdHandle>,
        slot: u32,
        token: i64,
        opts: &LockOptions,
    ) -> LockGuard {
        let state = Arc::clone(&handle.state);
        let own = matches!(handle.current_lease(), Lease::Own { .. });
        let guard = LockGuard::new(
            name,
            u64::try_from(token).ok(),
            self.inner.caps,
            state,
            handle,
        )
        .with_slot(Some(slot));
        // Session permits are renewed by the session's keep-alive.
        if own {
            guard.kept_by(&self.watchdog, opts, Unrenewed::Left)
        } else {
            guard
        }
    }

    /// The slot keys of `name` (slot, token, lease, record) and its queue's
    /// length, in one transaction; each lease's time left in one request.
    pub(crate) async fn inspect_permits(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        let dirs = PermitDirs::new(&self.inner.config.prefix, name);
        let txn = Txn::new().and_then([
            TxnOp::get(dirs.slots.as_str(), Some(PermitDirs::all(&dirs.slots))),
            TxnOp::get(
                dirs.queue.as_str(),
                Some(queue::first_by_creation(&dirs.queue)),
            ),
        ]);
        let resp = requests::txn(&self.inner.client, txn, "reading a semaphore").await?;
        let slot_keys = match resp.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(get)) => get.kvs().to_vec(),
            _ => Vec::new(),
        };
        let (oldest, queued) = get_result(&resp, 1);
        let Some(limit) = oldest.first().and_then(|k| dirs.limit_of(k)) else {
            return Ok(SemaphoreInfo::free().with_waiters(Some(0)));
        };
        let mut permits = Vec::with_capacity(slot_keys.len());
        for kv in slot_keys {
            let Some(slot) = dirs.slot_of(kv.key()) else {
                continue;
            };
            let left = if kv.lease() == 0 {
                None
            } else {
                requests::time_left(&self.inner.client, kv.lease(), "reading a permit's lease")
                    .await?
                    .map(Duration::from_secs)
            };
            let holder = match kv.value() {
                [] => None,
                bytes => Some(HolderRecord::decode_for(BACKEND, name, bytes)?),
            };
            permits.push(
                PermitInfo::new(slot)
                    .with_fencing_token(u64::try_from(kv.create_revision()).ok())
                    .with_expires_in(left)
                    .with_holder(holder),
            );
        }
        let waiters = usize::try_from(queued)
            .unwrap_or(0)
            .saturating_sub(permits.len());
        if permits.is_empty() {
            return Ok(SemaphoreInfo::free().with_waiters(Some(waiters)));
        }
        Ok(SemaphoreInfo::held(limit, permits).with_waiters(Some(waiters)))
    }
}
