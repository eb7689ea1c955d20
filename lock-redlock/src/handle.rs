//! The guard's handle on a Redlock: release and extend on every node at
//! once, answered by the majority.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::LockError;
use lock_core::raw::{DetachedRelease, GuardHandle, HolderRecord};

use crate::error::quorum_not_reached;
use crate::lock::Inner;
use crate::node::LockRef;
use crate::quorum::{Replies, Stragglers, count, failed, gather};

/// One grant's handle: the lock's keys and owner on every node, released
/// and extended on all of them at once.
pub(crate) struct RedlockHandle {
    pub(crate) inner: Arc<Inner>,
    pub(crate) lock: Arc<LockRef>,
}

impl RedlockHandle {
    /// After a renewal that a majority answered, take the lock back (in
    /// the background, only where its key is free) on each node that
    /// answered it was not ours: a node restarted without its data, or
    /// one whose key expired early or was evicted. Otherwise each such
    /// node would stay lost to the grant, and a rolling restart of the
    /// nodes would shrink its majority until a renewal failed. A node
    /// taken back never counts toward the renewal it follows, so a grant
    /// a majority no longer holds is still reported lost.
    fn take_back(&self, replies: &Replies<bool>, ttl: Duration) {
        let gone: Vec<usize> = replies
            .iter()
            .enumerate()
            .filter_map(|(i, r)| matches!(r, Some(Ok(false))).then_some(i))
            .collect();
        if gone.is_empty() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for i in gone {
            let (node, lock) = (Arc::clone(&self.inner.nodes[i]), Arc::clone(&self.lock));
            rt.spawn(async move {
                let at = node.display.clone();
                match node.take_back(lock, ttl).await {
                    Ok(true) => tracing::info!(target: "distlock", node = %at, "a renewed lock was taken back on a node that had lost it"),
                    Ok(false) => {}
                    Err(e) => tracing::debug!(target: "distlock", node = %at, error = %e, "taking a renewed lock back failed"),
                }
            });
        }
    }

    /// [`majority_answer`] on this handle's nodes.
    async fn on_majority<Fut>(
        &self,
        requests: impl IntoIterator<Item = Fut>,
    ) -> Result<bool, LockError>
    where
        Fut: std::future::Future<Output = Result<bool, LockError>> + Send + 'static,
    {
        majority_answer(&self.inner, requests).await
    }
}

/// One owner-checked request per node, at once: `true` once a majority
/// answered that the grant is ours, `false` once too many say it is not,
/// and `QuorumNotReached` when the unreachable nodes could have made it a
/// majority. Done as soon as the answer is settled; slow nodes finish in
/// the background.
pub(crate) async fn majority_answer<Fut>(
    inner: &Inner,
    requests: impl IntoIterator<Item = Fut>,
) -> Result<bool, LockError>
where
    Fut: std::future::Future<Output = Result<bool, LockError>> + Send + 'static,
{
    let q = inner.quorum;
    let replies = gather(requests, Stragglers::Finish, |r| {
        let ours = count(r, |&ours| ours);
        let open = r.iter().filter(|r| r.is_none()).count();
        ours >= q || ours + failed(r) + open < q
    })
    .await;
    let ours = count(&replies, |&ours| ours);
    if ours >= q {
        return Ok(true);
    }
    if ours + failed(&replies) >= q {
        // The unreachable nodes could have made it a majority.
        return Err(quorum_not_reached(ours, q, &replies, &inner.names));
    }
    Ok(false)
}

#[async_trait]
impl GuardHandle for RedlockHandle {
    /// Release on every node at once; `true` if a majority still held it.
    /// Done as soon as the answer is settled; slow nodes finish in the
    /// background. Each node gets the longer release bound (see
    /// `Node::release`) rather than a retry: a release that ran but whose
    /// answer was lost would find the key gone when asked again, and could
    /// not tell that from a lock that was no longer ours.
    async fn release(&self) -> Result<bool, LockError> {
        self.on_majority(
            self.inner
                .nodes
                .iter()
                .map(|node| Arc::clone(node).release(Arc::clone(&self.lock), None)),
        )
        .await
    }

    /// Write the new record on every node that the lock is ours on;
    /// `true` once a majority did, `false` if too many say it is not ours.
    async fn set_value(&self, value: &[u8]) -> Result<bool, LockError> {
        let inner = &self.inner;
        let record: Arc<[u8]> = match HolderRecord::from_stored(&self.lock.record) {
            Some(ours) => ours.with_value(value),
            None => HolderRecord::new(lock_core::default_identity(), value),
        }
        .as_bytes()
        .into();
        self.on_majority(
            inner.nodes.iter().map(|node| {
                Arc::clone(node).set_holder(Arc::clone(&self.lock), Arc::clone(&record))
            }),
        )
        .await
    }

    /// The release on every node, each on a connection of its own;
    /// `true` if a majority still held it.
    fn detached_release(&self) -> Option<DetachedRelease> {
        let quorum = self.inner.quorum;
        let releases: Vec<_> = self
            .inner
            .nodes
            .iter()
            .map(|node| node.release_detached(Arc::clone(&self.lock)))
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

    /// Extend on every node at once; `true` once a majority extended,
    /// `false` if too many nodes say it is no longer ours. Once a
    /// majority extended, the lock is taken back (if free there) on the
    /// nodes that answered it was not ours: see [`RedlockHandle::take_back`].
    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        let inner = &self.inner;
        let (n, q) = (inner.nodes.len(), inner.quorum);
        let replies = gather(
            inner
                .nodes
                .iter()
                .map(|node| Arc::clone(node).extend(Arc::clone(&self.lock), ttl)),
            Stragglers::Finish,
            |r| count(r, |&ok| ok) >= q || n - count(r, |&ok| !ok) < q,
        )
        .await;
        let extended = count(&replies, |&ok| ok);
        if extended >= q {
            self.take_back(&replies, ttl);
            Ok(true)
        } else if n - count(&replies, |&ok| !ok) < q {
            Ok(false)
        } else {
            Err(quorum_not_reached(extended, q, &replies, &inner.names))
        }
    }
}
