//! Lock sets in one request: every name of a set taken by one script run,
//! all or none ([`SET_ACQUIRE`]).

use std::sync::Arc;

use lock_core::raw::{OwnerToken, PendingGrant, RawGuard, Request, Unrenewed};
use lock_core::{LockError, LockGuard};
use tokio::time::Instant;

use crate::error::{BACKEND, map_redis};
use crate::handle::RedisHandle;
use crate::lock::{CAPABILITIES, RedisLock};
use crate::script_call::ScriptCall;
use crate::scripts::SET_ACQUIRE;

/// The most names one script run takes (four keys each): a script blocks
/// the server while it runs, so a larger set is taken name by name.
pub(crate) const MAX_ATOMIC_SET: usize = 64;

impl RedisLock {
    /// One run of the set script for `reqs` (checked, distinct, in order).
    /// Cancel-safe: until the answer is read, a [`PendingGrant`] per member
    /// releases it by owner token if the future is dropped.
    pub(crate) async fn attempt_set(
        &self,
        reqs: &[Request<'_>],
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        let Some(first) = reqs.first() else {
            return Ok(Some(Vec::new()));
        };
        let opts = first.opts;
        let owner = OwnerToken::random();
        let handles: Vec<Arc<RedisHandle>> = reqs
            .iter()
            .map(|req| Arc::new(self.handle(req.name, owner, req.opts)))
            .collect();
        let keys: Vec<&str> = handles
            .iter()
            .flat_map(|h| {
                [
                    h.keys.lock.as_str(),
                    h.keys.fence.as_str(),
                    h.keys.handoff.as_str(),
                    h.keys.holder.as_str(),
                ]
            })
            .collect();
        let mut call = ScriptCall::new(&SET_ACQUIRE, &keys, 3);
        call.arg(&handles[0].owner)
            .arg(lock_core::raw::lease_millis(opts.ttl))
            .arg(handles[0].record.as_bytes());
        let pending: Vec<PendingGrant> = handles
            .iter()
            .map(|h| PendingGrant::new(Arc::clone(h) as _))
            .collect();
        let mut conn = self.inner.conn.clone();
        let sent_at = Instant::now();
        let answer: Vec<i64> = call
            .invoke(&mut conn)
            .await
            .map_err(|e| map_redis("acquiring a lock set", e))?;
        if answer.first() != Some(&1) {
            for p in pending {
                drop(p.disarm());
            }
            return Ok(None);
        }
        if answer.len() != reqs.len() + 1 {
            return Err(LockError::Backend {
                backend: BACKEND,
                reason: format!(
                    "the set script answered {} values for {} names",
                    answer.len(),
                    reqs.len()
                ),
                source: None,
            });
        }
        let mut guards = Vec::with_capacity(reqs.len());
        let mut late = None;
        for ((req, grant), value) in reqs.iter().zip(pending).zip(&answer[1..]) {
            match grant
                .grant_in_time(BACKEND, req.name, sent_at, req.opts)
                .await
            {
                Ok((handle, lease)) => {
                    let token = u64::try_from(*value).map_err(|_| LockError::Backend {
                        backend: BACKEND,
                        reason: format!(
                            "fencing counter of {:?} is not positive ({value})",
                            req.name
                        ),
                        source: None,
                    })?;
                    let guard = LockGuard::new(req.name, Some(token), CAPABILITIES, lease, handle);
                    guards.push(guard.kept_by(&self.watchdog, req.opts, Unrenewed::Left));
                }
                // The whole set was answered at once: every member is as
                // late, and each was given back.
                Err(too_late) => {
                    late.get_or_insert(too_late);
                }
            }
        }
        match late {
            Some(too_late) => Err(too_late),
            None => Ok(Some(guards)),
        }
    }
}
