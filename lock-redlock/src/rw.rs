//! Redlock reader-writer locks: lock-redis's reader-writer script on every
//! node at once, a majority granting. A writer's token is the largest
//! write counter of its granting nodes, written back to a majority as a
//! lock's is; a reader's is the largest counter of its granting majority,
//! which shares a node with the majority every earlier write reached, so
//! it is at least the latest write's. A waiter marks itself on every node
//! that refuses it (with its arrival, the same on every node), renewing
//! the marks every [`MARK_RENEWAL`] and removing them when its wait ends,
//! so readers that come after a waiting writer wait behind it on a
//! majority, and writers that come after waiting readers behind them.
//! Waiters listen on the name's channel on every node; releases wake them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::raw::{
    Arrival, Attempt, DetachedRelease, GuardHandle, MARK_RENEWAL, OwnerToken, Pace, PendingGrant,
    RawGuard, Request, Unrenewed, WaitLoop, WaitMark, granted_too_late,
};
use lock_core::{Access, LockError, LockGuard, LockOptions, RwLockInfo};
use lock_redis::raw::RwState;
use tokio::time::Instant;

use crate::error::{BACKEND, causes, quorum_not_reached};
use crate::handle::majority_answer;
use crate::lock::{CAPABILITIES, Inner, Redlock};
use crate::node::{NodeGrant, RwRef};
use crate::quorum::{Stragglers, count, failed, gather, gather_grants};

/// How long a waiter pauses when the blocking lease is unknown; a release
/// wakes it sooner.
const BACKSTOP: Duration = Duration::from_millis(500);

/// A waiter's marks, removed from the name's waiting set
/// (`writers_waiting`, which holds the waiting readers' marks too) on
/// every node when its wait ends: given up, or granted (the granting
/// nodes' scripts took theirs; the others' go too).
fn wait_mark(
    inner: &Arc<Inner>,
    writers_waiting: &str,
    access: Access,
    arrival: Arrival,
) -> WaitMark {
    let (inner, key): (_, Arc<str>) = (Arc::clone(inner), writers_waiting.into());
    WaitMark::new(
        access,
        arrival,
        Arc::new(move |id| {
            let member: Arc<str> = format!("{}:{id}", arrival.padded()).into();
            let requests = inner
                .nodes
                .iter()
                .map(|node| Arc::clone(node).unmark(Arc::clone(&key), Arc::clone(&member)))
                .collect::<Vec<_>>();
            Box::pin(async move {
                gather(requests, Stragglers::Finish, |_| false).await;
                Ok(())
            })
        }),
    )
}

impl Redlock {
    /// One attempt at `access` to `name` on every node at once, as a
    /// newcomer arriving at `arrival` or as the waiter `mark`.
    /// Cancel-safe: a grant whose replies are lost with the dropped future
    /// is released on every node in the background.
    async fn attempt_rw(
        &self,
        name: &str,
        opts: &LockOptions,
        access: Access,
        arrival: &Arc<str>,
        mark: Option<&WaitMark>,
    ) -> Result<Attempt, LockError> {
        let inner = &self.inner;
        let (n, q) = (inner.nodes.len(), inner.quorum);
        let keys = inner.keys.rw(name);
        let owner = OwnerToken::random().to_hex();
        let (key, field) = match access {
            Access::Write => (keys.writer.clone(), "writer".to_string()),
            _ => (keys.reader(&owner), owner.clone()),
        };
        let handle = Arc::new(RwHandle {
            inner: Arc::clone(inner),
            rw: Arc::new(RwRef {
                keys,
                owner,
                access,
                key,
                field,
                record: opts.holder_record().as_bytes().to_vec(),
            }),
        });
        let pending = PendingGrant::new(Arc::clone(&handle) as Arc<dyn GuardHandle>);
        let start = Instant::now();
        let granted = |g: &NodeGrant| matches!(g, NodeGrant::Granted(_));
        let held = |g: &NodeGrant| matches!(g, NodeGrant::Held(_));
        // Whether an earlier attempt of this wait may have marked it; a
        // node that refuses this one marks it.
        let marked_before = mark.is_some_and(WaitMark::may_be_placed);
        if let Some(m) = mark {
            m.placing();
        }
        // As for a lock ([`gather_grants`]).
        let replies = gather_grants(
            inner.nodes.iter().map(|node| {
                Arc::clone(node).acquire_rw(
                    Arc::clone(&handle.rw),
                    opts.ttl,
                    Arc::clone(arrival),
                    mark.map(|m| Arc::from(m.id())),
                )
            }),
            q,
            granted,
            held,
        )
        .await;
        let grants: Vec<(usize, u64)> = replies
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Some(Ok(NodeGrant::Granted(t))) => Some((i, *t)),
                _ => None,
            })
            .collect();
        let mut too_late = None;
        if grants.len() >= q {
            let token = match access {
                Access::Write => self.fence_write(&handle.rw, &grants).await,
                _ => grants.iter().map(|&(_, t)| t).max(),
            };
            if let Some(token) = token {
                let lease = self.lease(start, opts);
                if self.in_time(&lease, opts) {
                    // Granted at its first attempt with no node refusing:
                    // no mark was put (a node still answering that refuses
                    // puts one that lapses by itself).
                    let refused = replies
                        .iter()
                        .any(|r| matches!(r, Some(Ok(NodeGrant::Held(_)))));
                    if let Some(m) = mark
                        && !marked_before
                        && !refused
                    {
                        m.removed();
                    }
                    let handle = pending.disarm();
                    let guard = LockGuard::new(name, Some(token), CAPABILITIES, lease, handle)
                        .with_access(Some(access));
                    return Ok(Attempt::Acquired(guard.kept_by(
                        &self.watchdog,
                        opts,
                        Unrenewed::Left,
                    )));
                }
                too_late = Some(start.elapsed());
            }
        }
        // Given back on every node that did not refuse (including those
        // that failed or were not waited for).
        let back = inner
            .nodes
            .iter()
            .zip(&replies)
            .filter(|(_, r)| !matches!(r, Some(Ok(NodeGrant::Held(_)))))
            .map(|(node, _)| Arc::clone(node).release_rw(Arc::clone(&handle.rw)));
        gather(back, Stragglers::Finish, |_| false).await;
        pending.disarm();
        if let Some(took) = too_late {
            return Ok(Attempt::TooLate(granted_too_late(
                BACKEND, name, took, opts.ttl,
            )));
        }
        if n - failed(&replies) < q {
            return Err(quorum_not_reached(grants.len(), q, &replies, &inner.names));
        }
        // The earliest end of a blocking lease on a majority is not known
        // node by node; the waiter listens for releases meanwhile.
        let left = replies
            .iter()
            .filter_map(|r| match r {
                Some(Ok(NodeGrant::Held(left))) => *left,
                _ => None,
            })
            .max();
        Ok(Attempt::Held { expires_in: left })
    }

    /// A write grant's token: the largest counter of its granting nodes,
    /// once a majority carries it (written back where it is behind).
    async fn fence_write(&self, rw: &Arc<RwRef>, grants: &[(usize, u64)]) -> Option<u64> {
        let q = self.inner.quorum;
        let token = grants.iter().map(|&(_, t)| t).max()?;
        let carried = grants.iter().filter(|&&(_, t)| t == token).count();
        if carried >= q {
            return Some(token);
        }
        let behind = grants.iter().filter(|&&(_, t)| t < token);
        let replies = gather(
            behind.map(|&(i, _)| Arc::clone(&self.inner.nodes[i]).fence_rw(Arc::clone(rw), token)),
            Stragglers::Finish,
            |r| carried + count(r, |&ok| ok) >= q,
        )
        .await;
        (carried + count(&replies, |&ok| ok) >= q).then_some(token)
    }

    /// One attempt without waiting.
    pub(crate) async fn try_rw(
        &self,
        req: Request<'_>,
        access: Access,
    ) -> Result<Option<LockGuard>, LockError> {
        self.attempt_rw(
            req.name,
            req.opts,
            access,
            &Arrival::now().padded().into(),
            None,
        )
        .await?
        .into_guard()
    }

    /// Wait for `access`: listening on the name's channel on every node,
    /// else until the blocking lease ends; the waiter renews its marks
    /// every [`MARK_RENEWAL`]. An uncontended wait is one attempt.
    pub(crate) async fn wait_for_rw(
        &self,
        req: Request<'_>,
        access: Access,
    ) -> Result<Option<LockGuard>, LockError> {
        let (name, opts) = (req.name, req.opts);
        let keys = self.inner.keys.rw(name);
        let arrival = Arrival::now();
        let mark = wait_mark(&self.inner, &keys.writers_waiting, access, arrival);
        let arrival: Arc<str> = arrival.padded().into();
        let wake = self.inner.wakeups.subscribe(&keys.wake);
        let mut listening = None;
        let mut wait = WaitLoop::new(req, Some(wake));
        loop {
            let mut too_late = None;
            let pause = match self
                .attempt_rw(name, opts, access, &arrival, Some(&mark))
                .await?
            {
                // The grant took our marks on the granting nodes; the
                // mark's drop removes the rest in the background.
                Attempt::Acquired(guard) => return Ok(Some(guard)),
                Attempt::Held { expires_in } => {
                    // Back before the marks lapse.
                    expires_in
                        .map_or(BACKSTOP, |l| l + Duration::from_millis(1))
                        .min(MARK_RENEWAL)
                }
                Attempt::TooLate(e) => {
                    too_late = Some(e);
                    Duration::ZERO
                }
            };
            if wait.expired() {
                return too_late.map_or(Ok(None), Err);
            }
            if listening.is_none() {
                // Listen, then attempt again at once.
                listening = Some(self.subscribe_all(&keys.channel).await);
                continue;
            }
            if !wait.pause(Pace::For(pause)).await {
                return too_late.map_or(Ok(None), Err);
            }
        }
    }

    /// Every node's view of `name`, failing unless a majority answers: the
    /// mode a majority shows, its holders as the first such node lists
    /// them, the counter a majority carries (else the largest) and the
    /// waiting writers a majority marks. A minority's marks are not
    /// counted: a writer granted by a majority takes its marks there, and
    /// removes the rest in the background after it returns.
    pub(crate) async fn inspect_rw_lock(&self, name: &str) -> Result<RwLockInfo, LockError> {
        let inner = &self.inner;
        let keys = Arc::new(inner.keys.rw(name));
        let replies = gather(
            inner
                .nodes
                .iter()
                .map(|n| Arc::clone(n).rw_state(Arc::clone(&keys))),
            Stragglers::Finish,
            |_| false,
        )
        .await;
        let answered = count(&replies, |_| true);
        if answered < inner.quorum {
            return Err(LockError::QuorumNotReached {
                acquired: answered,
                needed: inner.quorum,
                causes: causes(&replies, &inner.names),
            });
        }
        let views = replies
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|reply| RwState::read(BACKEND, name, &reply))
            .collect::<Result<Vec<_>, _>>()?;
        let on_majority = |access: Access| {
            views
                .iter()
                .filter(|v| v.holders.iter().any(|h| h.access == access))
                .count()
                >= inner.quorum
        };
        let mode = if on_majority(Access::Write) {
            Some(Access::Write)
        } else if on_majority(Access::Read) {
            Some(Access::Read)
        } else {
            None
        };
        let mut counters: Vec<u64> = views.iter().map(|v| v.counter).collect();
        counters.sort_unstable();
        let token = counters
            .chunk_by(|a, b| a == b)
            .find(|same| same.len() >= inner.quorum)
            .map(|same| same[0])
            .or(counters.last().copied());
        let holders = match mode {
            Some(access) => views
                .iter()
                .find(|v| v.holders.iter().any(|h| h.access == access))
                .map(|v| {
                    v.holders
                        .iter()
                        .filter(|h| h.access == access)
                        .cloned()
                        .map(|h| h.with_fencing_token(token))
                        .collect()
                })
                .unwrap_or_default(),
            None => Vec::new(),
        };
        let waiting = on_a_majority(views.iter().map(|v| v.waiting), inner.quorum);
        Ok(RwLockInfo::held(holders)
            .with_fencing_token(token)
            .with_waiting(waiting, None))
    }
}

/// The largest count at least `quorum` of the answering nodes show (each
/// node counting its waiting writers, say): the `quorum`-th largest, `None`
/// when fewer than `quorum` nodes answered.
fn on_a_majority(counts: impl Iterator<Item = usize>, quorum: usize) -> Option<usize> {
    let mut counts: Vec<usize> = counts.collect();
    counts.sort_unstable_by(|a, b| b.cmp(a));
    quorum.checked_sub(1).and_then(|i| counts.get(i).copied())
}

/// One reader-writer grant's handle: released and extended on every node
/// at once, answered by the majority.
pub(crate) struct RwHandle {
    inner: Arc<Inner>,
    rw: Arc<RwRef>,
}

#[async_trait]
impl GuardHandle for RwHandle {
    async fn release(&self) -> Result<bool, LockError> {
        majority_answer(
            &self.inner,
            self.inner
                .nodes
                .iter()
                .map(|node| Arc::clone(node).release_rw(Arc::clone(&self.rw))),
        )
        .await
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        majority_answer(
            &self.inner,
            self.inner
                .nodes
                .iter()
                .map(|node| Arc::clone(node).extend_rw(Arc::clone(&self.rw), ttl)),
        )
        .await
    }

    /// The release on every node, each on a connection of its own.
    fn detached_release(&self) -> Option<DetachedRelease> {
        let quorum = self.inner.quorum;
        let releases: Vec<_> = self
            .inner
            .nodes
            .iter()
            .map(|node| node.release_rw_detached(Arc::clone(&self.rw)))
            .collect();
        Some(Box::pin(async move {
            let replies = futures_util::future::join_all(releases).await;
            let ours = replies.iter().filter(|r| matches!(r, Ok(true))).count();
            match replies.into_iter().find_map(Result::err) {
                Some(e) if ours < quorum => Err(e),
                _ => Ok(ours >= quorum),
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::on_a_majority;

    #[test]
    fn a_count_counts_when_a_majority_shows_it() {
        assert_eq!(on_a_majority([1, 1, 0, 0, 0].into_iter(), 3), Some(0));
        assert_eq!(on_a_majority([0, 1, 1, 1, 0].into_iter(), 3), Some(1));
        assert_eq!(on_a_majority([2, 1, 3, 0, 0].into_iter(), 3), Some(1));
        assert_eq!(on_a_majority([1, 1].into_iter(), 3), None);
        assert_eq!(on_a_majority([4].into_iter(), 0), None);
    }
}
