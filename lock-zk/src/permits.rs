//! ZooKeeper semaphores, as Curator's `InterProcessSemaphoreV2` with slots
//! and tokens.
//!
//! Semaphore `n` lives under `ROOT/s<encoded n>` (locks are `ROOT/n…`).
//! Each acquisition joins the queue `…/q` with an `EPHEMERAL_SEQUENTIAL`
//! node whose name carries the limit it asked with (`lock-LIMIT_ID-SEQ`);
//! the first `limit` nodes by sequence hold permits, so waiters are served
//! in arrival order. A node among the first then takes a free slot by
//! creating the `EPHEMERAL` node `…/slots/SLOT`: first the slot of its place
//! in the queue, without listing; after a slot found taken, the lowest free
//! one listed; the slot node's `czxid` is the permit's fencing
//! token (global, so each slot's tokens rise). Both nodes live in the
//! holder's session; a release deletes the slot node, then the queue node.
//! An acquisition that finds, when it first lists the queue, a node ahead
//! of its own asked with another limit is refused, naming both: so the
//! nodes that pass always agree (a node ahead was there when it listed),
//! and the first of several contenders for a new name with different
//! limits passes. Waiters watch the queue's children (each change wakes
//! every waiter of the name) and look again.

use std::collections::HashSet;
use std::sync::Arc;

use lock_core::raw::{GuardHandle, Kind, OwnerToken, PendingGrant, Request, limit_mismatch};
use lock_core::{LockError, LockGuard, PermitInfo, SemaphoreInfo};
use tokio::time::Instant;
use zookeeper_client::{CreateMode, Error as ZkError};

use crate::error::{connection_dropped, zk_error};
use crate::handle::ZkHandle;
use crate::lock::{BACKEND, ZkLock};
use crate::path::semaphore_node;
use crate::queue::{await_turn, catch_up, enqueue, queue};
use crate::session::{Session, retrying_resendable};

/// The largest limit (a holder lists the slot nodes, a waiter the queue).
pub(crate) const MAX_LIMIT: u32 = 1024;

/// The two nodes of one semaphore.
pub(crate) struct PermitNodes {
    /// The queue: one sequential node per acquisition.
    queue: String,
    /// The slots: one node per held permit.
    slots: String,
}

impl PermitNodes {
    pub(crate) fn new(root: &str, name: &str) -> Self {
        let base = semaphore_node(root, name);
        PermitNodes {
            queue: format!("{base}/q"),
            slots: format!("{base}/slots"),
        }
    }

    fn slot_path(&self, slot: u32) -> String {
        format!("{}/{slot:08x}", self.slots)
    }
}

/// An attempt's id, carrying the limit it asked with.
fn attempt_id(limit: u32) -> String {
    format!("{limit:08x}_{}", &OwnerToken::random().to_hex()[..16])
}

/// The limit a queue node was created with.
fn limit_of(child: &str) -> Option<u32> {
    let hex = child.strip_prefix("lock-")?.get(..8)?;
    u32::from_str_radix(hex, 16).ok()
}

/// The slot of a slot node's name.
fn slot_of(child: &str) -> Option<u32> {
    u32::from_str_radix(child, 16).ok()
}

/// The lowest slot below `limit` without a node, once there is one
/// (the listing's watch wakes us when a slot node goes), or `None` if
/// the request's deadline passes first.
async fn free_slot(
    session: &Session,
    nodes: &PermitNodes,
    limit: u32,
    req: &Request<'_>,
) -> Result<Option<u32>, LockError> {
    let client = &session.client;
    let parents = CreateMode::Container.with_acls(session.acls);
    loop {
        let (children, watcher) =
            match retrying_resendable(|| client.list_and_watch_children(&nodes.slots)).await {
                Ok(listed) => listed,
                Err(ZkError::NoNode) => match client.mkdir(&nodes.slots, &parents).await {
                    Ok(()) | Err(ZkError::NodeExists) => continue,
                    Err(e) => return Err(zk_error("creating a semaphore's slots", e)),
                },
                Err(e) => return Err(zk_error("listing a semaphore's slots", e)),
            };
        let taken: HashSet<u32> = children.iter().filter_map(|c| slot_of(c)).collect();
        if let Some(slot) = (0..limit).find(|s| !taken.contains(s)) {
            return Ok(Some(slot));
        }
        if req.expired_at(Instant::now()) {
            return Ok(None);
        }
        let _ = req.or_deadline(watcher.changed()).await;
    }
}

impl ZkLock {
    /// Join `name`'s queue in `session` and wait (until the request's
    /// deadline) to be among the first `limit`, then take a slot.
    pub(crate) async fn attempt_permit(
        &self,
        session: &Arc<Session>,
        req: Request<'_>,
        limit: u32,
    ) -> Result<Option<LockGuard>, LockError> {
        let (name, opts) = (req.name, req.opts);
        let nodes = PermitNodes::new(self.root(), name);
        let id = attempt_id(limit);
        let sent_at = Instant::now();
        let client = &session.client;
        let record = opts.holder_record();
        let ours = enqueue(session, &nodes.queue, &id, record.as_bytes()).await?;
        let handle = Arc::new(ZkHandle::new(
            Arc::clone(session),
            ours.path,
            self.url(),
            record,
        ));
        // Leaving without a permit deletes our nodes.
        let pending = PendingGrant::new(Arc::clone(&handle) as Arc<dyn GuardHandle>);
        let child = handle.path.rsplit('/').next().unwrap_or_default();
        let kind = Kind::Permit(limit);
        let mut first_look = true;
        let waited = await_turn(client, &nodes.queue, child, &req, true, |ahead| {
            // Only the nodes ahead count: each node is checked against
            // those before it, so the nodes that pass agree, and the first
            // of a new name's contenders always passes.
            let kinds: Vec<Kind> = ahead
                .iter()
                .map(|c| limit_of(c).map_or(Kind::Lock, Kind::Permit))
                .collect();
            if std::mem::take(&mut first_look)
                && let Some(held) = ahead
                    .iter()
                    .filter_map(|c| limit_of(c))
                    .find(|&l| l != limit)
            {
                return Err(limit_mismatch(name, limit, held));
            }
            Ok(kind.turn(&kinds))
        })
        .await;
        let at = match waited {
            Ok(Some(at)) => at as u32,
            Ok(None) => {
                let _ = pending.give_back().await;
                return Ok(None);
            }
            Err(e) => {
                let _ = pending.give_back().await;
                return Err(e);
            }
        };
        let Some((slot, czxid)) = self
            .claim_slot(session, &nodes, (at, limit), &handle, &req)
            .await?
        else {
            let _ = pending.give_back().await;
            return Ok(None);
        };
        self.guard(name, session, pending, czxid, sent_at, opts)
            .await
            .map(|guard| Some(lock_core::raw::RawGuard::with_slot(guard, Some(slot))))
    }

    /// Take a free slot for `handle`'s node, `at` in the queue of a
    /// semaphore of `limit`: its slot and the slot node's `czxid`, or
    /// `None` if the request's deadline passed while every slot was taken
    /// (a holder between deleting its slot and its queue node, or a node
    /// being given back).
    ///
    /// The first try, without listing, is slot `at`: the holders ahead of
    /// ours took the slots below it when the semaphore fills in order, so
    /// an uncontended permit costs one create. After a slot that was
    /// taken, the slots are listed and the lowest free one is tried.
    async fn claim_slot(
        &self,
        session: &Arc<Session>,
        nodes: &PermitNodes,
        (at, limit): (u32, u32),
        handle: &ZkHandle,
        req: &Request<'_>,
    ) -> Result<Option<(u32, i64)>, LockError> {
        let client = &session.client;
        let parents = CreateMode::Container.with_acls(session.acls);
        let mode = CreateMode::Ephemeral.with_acls(session.acls);
        let mut guess = Some(at.min(limit - 1));
        loop {
            let slot = match guess.take() {
                Some(slot) => slot,
                None => match free_slot(session, nodes, limit, req).await? {
                    Some(slot) => slot,
                    None => return Ok(None),
                },
            };
            let path = nodes.slot_path(slot);
            // Known before the create, so that a give-back looks for it
            // (and deletes it only if it is this session's).
            handle.set_slot(Some(path.clone()));
            match client.create(&path, handle.record.as_bytes(), &mode).await {
                Ok((stat, _)) => return Ok(Some((slot, stat.czxid))),
                Err(ZkError::NodeExists) => handle.set_slot(None),
                Err(ZkError::NoNode) => {
                    handle.set_slot(None);
                    match client.mkdir(&nodes.slots, &parents).await {
                        Ok(()) | Err(ZkError::NodeExists) => {}
                        Err(e) => return Err(zk_error("creating a semaphore's slots", e)),
                    }
                }
                Err(e) if connection_dropped(&e) => {
                    // The create may have landed: ours if the node is this
                    // session's.
                    let stat = retrying_resendable(|| client.check_stat(&path))
                        .await
                        .map_err(|e| zk_error("reading a slot node", e))?;
                    match stat {
                        Some(stat) if stat.ephemeral_owner == client.session_id().0 => {
                            return Ok(Some((slot, stat.czxid)));
                        }
                        _ => handle.set_slot(None),
                    }
                }
                Err(e) => return Err(zk_error("taking a slot", e)),
            }
        }
    }

    /// The slot nodes of `name` (slot, token, holder record) and the
    /// queue's length, read once this client's member has caught up with
    /// the leader.
    pub(crate) async fn inspect_permits(
        &self,
        session: &Session,
        name: &str,
    ) -> Result<SemaphoreInfo, LockError> {
        let nodes = PermitNodes::new(self.root(), name);
        let client = &session.client;
        catch_up(client, &nodes.queue).await?;
        let queued = queue(client, &nodes.queue).await?;
        let Some(limit) = queued.iter().find_map(|c| limit_of(c)) else {
            return Ok(SemaphoreInfo::free().with_waiters(Some(0)));
        };
        let mut slots = match retrying_resendable(|| client.list_children(&nodes.slots)).await {
            Ok(children) => children,
            Err(ZkError::NoNode) => Vec::new(),
            Err(e) => return Err(zk_error("listing a semaphore's slots", e)),
        };
        slots.sort();
        let mut permits = Vec::with_capacity(slots.len());
        for child in slots {
            let Some(slot) = slot_of(&child) else {
                continue;
            };
            let path = nodes.slot_path(slot);
            let (data, stat) = match retrying_resendable(|| client.get_data(&path)).await {
                Ok(read) => read,
                Err(ZkError::NoNode) => continue,
                Err(e) => return Err(zk_error("reading a slot node", e)),
            };
            let holder = match data.as_slice() {
                [] => None,
                bytes => Some(lock_core::raw::HolderRecord::decode_for(
                    BACKEND, name, bytes,
                )?),
            };
            permits.push(
                PermitInfo::new(slot)
                    .with_fencing_token(u64::try_from(stat.czxid).ok())
                    .with_holder(holder),
            );
        }
        let waiters = queued.len().saturating_sub(permits.len());
        if permits.is_empty() {
            return Ok(SemaphoreInfo::free().with_waiters(Some(waiters)));
        }
        Ok(SemaphoreInfo::held(limit, permits).with_waiters(Some(waiters)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::path::sequence;

    #[test]
    fn queue_nodes_carry_their_limit() {
        let id = attempt_id(3);
        let child = format!("lock-{id}-0000000007");
        assert_eq!(limit_of(&child), Some(3));
        assert_eq!(sequence(&child), Some(7));
        assert!(crate::path::is_attempt(&child, &id));
        assert_eq!(slot_of("0000000a"), Some(10));
        let nodes = PermitNodes::new("/r", "a/b");
        assert_eq!(nodes.queue, "/r/sa%2Fb/q");
        assert_eq!(nodes.slot_path(2), "/r/sa%2Fb/slots/00000002");
    }
}
