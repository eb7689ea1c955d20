//! Lock sets in one request per node: the set script of `lock-redis` on
//! every node at once, all or none on each; the set is granted where a
//! majority granted it whole.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use lock_core::raw::{
    GuardHandle, OwnerToken, PendingGrant, RawGuard, Request, Unrenewed, granted_too_late,
};
use lock_core::{Backoff, LockError, LockGuard};
use tokio::time::Instant;

use crate::error::{BACKEND, quorum_not_reached};
use crate::handle::RedlockHandle;
use crate::lock::{CAPABILITIES, Redlock};
use crate::node::LockRef;
use crate::quorum::{failed, gather_grants, gather_in_order};

/// How many times one try of a set is sent when its votes split.
const SPLIT_TRIES: u32 = 4;

/// The pause before a split set is tried again: anywhere from none to the
/// full delay (2 ms, doubling), so that contenders that all gave their
/// shares back rarely come back together (and when they do, the order of
/// the nodes decides).
fn split_pause(tries: u32) -> Duration {
    Backoff::default()
        .with_initial(Duration::from_millis(2))
        .with_max(Duration::from_millis(20))
        .with_jitter(1.0)
        .delay(tries)
}

/// What one set attempt came to.
pub(crate) enum SetAttempt {
    /// A majority took the whole set.
    Granted(Vec<LockGuard>),
    /// Fewer than a majority granted it, some did (or may have: answers
    /// not waited for): the votes may have split between contenders, each
    /// of which gave its share back.
    Split,
    /// No node granted it.
    Refused,
}

impl Redlock {
    /// One try of the set `reqs`: [`attempt_set`](Self::attempt_set) on
    /// every node at once, and while its votes split (at most
    /// [`SPLIT_TRIES`] times in all), after a random pause, again node by
    /// node in the nodes' order ([`gather_in_order`]). Ten clients racing
    /// for one set otherwise all lose now and then, each holding a
    /// minority.
    pub(crate) async fn try_set(
        &self,
        reqs: &[Request<'_>],
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        let mut tries = 0;
        loop {
            match self.attempt_set(reqs, tries > 0).await? {
                SetAttempt::Granted(guards) => return Ok(Some(guards)),
                SetAttempt::Split if tries + 1 < SPLIT_TRIES => {
                    tracing::debug!(target: "distlock", tries, "a lock set's votes split; trying again");
                    tokio::time::sleep(split_pause(tries)).await;
                    tries += 1;
                }
                SetAttempt::Split | SetAttempt::Refused => return Ok(None),
            }
        }
    }

    /// The set script for `reqs` (checked, distinct, in order) on every
    /// node at once. Granted when a majority took the whole set: then each
    /// member's token is the largest counter its granting nodes answered,
    /// written back to a majority as for a lock ([`Redlock::fence`]), and
    /// the lease is the lock's (the drift and `min_validity` checks).
    /// Otherwise every member is given back on every node that did not
    /// refuse. A node that refuses took none of the set, so no majority
    /// ever holds part of a refused set. Cancel-safe: a [`PendingGrant`]
    /// per member releases it on every node if the future is dropped.
    /// `in_order`: node by node, stopping at the first refusal, instead of
    /// all at once.
    async fn attempt_set(
        &self,
        reqs: &[Request<'_>],
        in_order: bool,
    ) -> Result<SetAttempt, LockError> {
        let Some(first) = reqs.first() else {
            return Ok(SetAttempt::Granted(Vec::new()));
        };
        let inner = &self.inner;
        let (n, q) = (inner.nodes.len(), inner.quorum);
        let opts = first.opts;
        let owner = OwnerToken::random().to_hex();
        let record = opts.holder_record().as_bytes().to_vec();
        let handles: Vec<Arc<RedlockHandle>> = reqs
            .iter()
            .map(|req| {
                Arc::new(RedlockHandle {
                    inner: Arc::clone(inner),
                    lock: Arc::new(LockRef {
                        keys: inner.keys.all(req.name),
                        owner: owner.clone(),
                        record: record.clone(),
                    }),
                })
            })
            .collect();
        let pending: Vec<PendingGrant> = handles
            .iter()
            .map(|h| PendingGrant::new(Arc::clone(h) as Arc<dyn GuardHandle>))
            .collect();
        let locks: Arc<[Arc<LockRef>]> = handles.iter().map(|h| Arc::clone(&h.lock)).collect();
        let start = Instant::now();
        let requests = inner
            .nodes
            .iter()
            .map(|node| Arc::clone(node).acquire_set(Arc::clone(&locks), opts.ttl))
            .collect::<Vec<_>>();
        let replies = match in_order {
            true => gather_in_order(requests, Option::is_none).await,
            false => gather_grants(requests, q, Option::is_some, Option::is_none).await,
        };
        let grants: Vec<(usize, &Vec<u64>)> = replies
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Some(Ok(Some(tokens))) => Some((i, tokens)),
                _ => None,
            })
            .collect();
        let mut too_late = None;
        if grants.len() >= q {
            let tokens = join_all(handles.iter().enumerate().map(|(m, handle)| {
                let member: Vec<(usize, u64)> = grants.iter().map(|&(i, t)| (i, t[m])).collect();
                async move { self.fence(handle, &member).await }
            }))
            .await;
            let tokens: Option<Vec<u64>> = tokens.into_iter().collect();
            if let Some(tokens) = tokens {
                let leases: Vec<_> = reqs.iter().map(|r| self.lease(start, r.opts)).collect();
                // Every member's lease started at `start` with the same
                // options: all are in time, or none.
                if self.in_time(&leases[0], opts) {
                    return Ok(SetAttempt::Granted(
                        reqs.iter()
                            .zip(pending)
                            .zip(tokens)
                            .zip(leases)
                            .map(|(((req, pending), token), lease)| {
                                let handle = pending.disarm();
                                let guard = LockGuard::new(
                                    req.name,
                                    Some(token),
                                    CAPABILITIES,
                                    lease,
                                    handle,
                                );
                                guard.kept_by(&self.watchdog, req.opts, Unrenewed::Left)
                            })
                            .collect(),
                    ));
                }
                tracing::debug!(target: "distlock", elapsed = ?start.elapsed(), "lock set granted too late; giving it back");
                too_late = Some(start.elapsed());
            }
        }
        self.give_back(&locks, &replies, Option::is_some, Option::is_none, None)
            .await;
        for p in pending {
            p.disarm();
        }
        if let Some(took) = too_late {
            return Err(granted_too_late(BACKEND, first.name, took, opts.ttl));
        }
        if n - failed(&replies) < q {
            return Err(quorum_not_reached(grants.len(), q, &replies, &inner.names));
        }
        // All at once, a node whose answer was not waited for (others had
        // refused enough) may have granted it too: as split as a grant.
        let unanswered = !in_order && replies.iter().any(Option::is_none);
        Ok(match grants.len() {
            0 if !unanswered => SetAttempt::Refused,
            _ => SetAttempt::Split,
        })
    }
}
