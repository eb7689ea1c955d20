//! Lock sets in one request: one transaction puts a key in every name's
//! directory if every directory is empty (no holder, no waiter), all or
//! none.

use std::sync::Arc;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use futures_util::future::join_all;
use lock_core::raw::{GuardHandle, OwnerToken, PendingGrant, Request};
use lock_core::{LockError, LockGuard};

use crate::handle::EtcdHandle;
use crate::keys;
use crate::lock::{EtcdLock, place_gone};
use crate::requests;

/// The most names one transaction takes: a compare and a put each, well
/// within the server's default limit of 128 operations per transaction
/// (`--max-txn-ops`); a larger set is taken name by name.
pub(crate) const MAX_ATOMIC_SET: usize = 64;

impl EtcdLock {
    /// One transaction for `reqs` (checked, distinct, in order): every
    /// directory compared empty (a range compare of create revision 0),
    /// then a key put in each, on the session's lease or, for options
    /// the session does not match, on a lease of each member's own
    /// (granted first, side by side). The members' tokens are the
    /// transaction's revision. Cancel-safe: until the answer is read, a
    /// [`PendingGrant`] per member deletes its key and revokes its own
    /// lease if the future is dropped.
    pub(crate) async fn attempt_set(
        &self,
        reqs: &[Request<'_>],
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        let leased = join_all(reqs.iter().map(|req| self.lease_for(req.opts))).await;
        let mut handles = Vec::with_capacity(reqs.len());
        let mut failed = None;
        for (req, leased) in reqs.iter().zip(leased) {
            match leased {
                Ok(leased) => {
                    let dir = keys::dir(&self.inner.config.prefix, req.name);
                    let key = keys::key(&dir, leased.0.id(), &OwnerToken::random().to_hex());
                    handles.push(Arc::new(EtcdHandle::new(
                        Arc::clone(&self.inner),
                        req.name,
                        dir,
                        key,
                        req.opts.holder_record(),
                        leased,
                    )));
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        let pending: Vec<PendingGrant> = handles
            .iter()
            .map(|h| PendingGrant::new(Arc::clone(h) as Arc<dyn GuardHandle>))
            .collect();
        if let Some(e) = failed {
            give_back(pending).await;
            return Err(e);
        }
        let txn = Txn::new()
            .when(
                handles
                    .iter()
                    .map(|h| {
                        Compare::create_revision(h.dir.as_str(), CompareOp::Equal, 0)
                            .with_range(keys::range_end(&h.dir))
                    })
                    .collect::<Vec<_>>(),
            )
            .and_then(
                handles
                    .iter()
                    .map(|h| {
                        TxnOp::put(
                            h.key.as_str(),
                            h.record().as_bytes(),
                            Some(PutOptions::new().with_lease(h.lease_id())),
                        )
                    })
                    .collect::<Vec<_>>(),
            );
        let resp = match requests::txn(&self.inner.client, txn, "acquiring a lock set").await {
            Ok(resp) => resp,
            Err(e) => {
                let e = handles[0].put_failed(e);
                give_back(pending).await;
                return Err(e);
            }
        };
        if !resp.succeeded() {
            give_back(pending).await;
            return Ok(None);
        }
        let rev = resp.header().map_or(0, |h| h.revision());
        // The answer came after a lease's validity deadline: no guard is
        // handed out past it.
        if let Some(late) = handles.iter().find(|h| h.state.lost_now().is_some()) {
            let name = late.name.clone();
            give_back(pending).await;
            return Err(place_gone(&name));
        }
        Ok(Some(
            reqs.iter()
                .zip(handles)
                .zip(pending)
                .map(|((req, handle), pending)| {
                    *handle.rev.lock().unwrap_or_else(|e| e.into_inner()) = rev;
                    pending.disarm();
                    self.guard(req.name, handle, rev, req.opts)
                })
                .collect(),
        ))
    }
}

/// Every member's key deleted and its own lease revoked, in line.
async fn give_back(pending: Vec<PendingGrant>) {
    join_all(pending.into_iter().map(|p| async move {
        let _ = p.give_back().await;
    }))
    .await;
}
