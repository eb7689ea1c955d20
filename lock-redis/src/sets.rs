//! Lock sets in one request: every name of a set taken by one script run,
//! all or none ([`SET_ACQUIRE`]).

use std::sync::Arc;

use lock_core::raw::{OwnerToken, PendingGrant, RawGuard, Request};
use lock_core::{LockError, LockGuard};
use tokio::time::Instant;

use crate::error::{BACKEND, map_redis};
use crate::handle::RedisHandle;
use crate::lock::RedisLock;
use crate::script_call::ScriptCall;
use crate::scripts::SET_ACQUIRE;

/// The most names one set script run takes (four keys each): a script
/// blocks the server while it runs, so a larger set is taken name by name.
pub const MAX_ATOMIC_SET: usize = 64;

/// What the set script answered for a set of `names` names: the counter
/// of each after its increment, in order; `None` when it took none (one
/// was held or reserved); an error naming what it answered when it is none
/// of these.
pub fn set_answer(answer: &[i64], names: usize) -> Result<Option<Vec<u64>>, String> {
    match answer.split_first() {
        Some((1, tokens)) if tokens.len() == names => tokens
            .iter()
            .map(|&t| u64::try_from(t).ok().filter(|&t| t > 0))
            .collect::<Option<Vec<u64>>>()
            .map(Some)
            .ok_or_else(|| format!("the set script answered counters {tokens:?}")),
        Some((0, [])) => Ok(None),
        _ => Err(format!(
            "the set script answered {answer:?} for {names} names"
        )),
    }
}

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
        let keys: Vec<&str> = handles.iter().flat_map(|h| h.keys.in_set()).collect();
        let mut call = ScriptCall::new(&SET_ACQUIRE, &keys, 3);
        call.arg(&handles[0].owner)
            .arg(lock_core::raw::lease_millis(opts.ttl))
            .arg(handles[0].record.as_bytes())
            .acknowledged(self.inner.config.acknowledgement());
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
        let tokens = set_answer(&answer, reqs.len()).map_err(|reason| LockError::Backend {
            backend: BACKEND,
            reason,
            source: None,
        })?;
        let Some(tokens) = tokens else {
            for p in pending {
                drop(p.disarm());
            }
            return Ok(None);
        };
        let mut guards = Vec::with_capacity(reqs.len());
        let mut late = None;
        for ((req, grant), token) in reqs.iter().zip(pending).zip(tokens) {
            match grant
                .grant_in_time(BACKEND, req.name, sent_at, req.opts)
                .await
            {
                Ok((handle, lease)) => {
                    let guard = LockGuard::new(
                        req.name,
                        Some(token),
                        self.inner.capabilities(),
                        lease,
                        handle,
                    );
                    guards.push(guard.kept_by(&self.watchdog, req.opts, self.inner.unrenewed()));
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

#[cfg(test)]
mod tests {
    use super::set_answer;

    #[test]
    fn the_set_scripts_answers_are_read() {
        assert_eq!(set_answer(&[1, 4, 9], 2), Ok(Some(vec![4, 9])));
        assert_eq!(set_answer(&[0], 2), Ok(None));
        assert!(set_answer(&[1, 4], 2).is_err(), "a token missing");
        assert!(set_answer(&[1, 4, 0], 2).is_err(), "a counter not positive");
        assert!(set_answer(&[], 2).is_err());
        assert!(set_answer(&[0, 3], 2).is_err());
    }
}
