//! The guard's handle on a Redlock: release and extend on every node at
//! once, answered by the majority.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::LockError;
use lock_core::raw::{DetachedRelease, GuardHandle, HolderRecord};
use tokio::sync::watch;

use crate::error::quorum_not_reached;
use crate::lock::Inner;
use crate::node::{LockRef, Node};
use crate::quorum::{Stragglers, count, failed, gather};

/// One grant's handle: the lock's keys and owner on every node, released
/// and extended on all of them at once.
pub(crate) struct RedlockHandle {
    pub(crate) inner: Arc<Inner>,
    pub(crate) lock: Arc<LockRef>,
}

impl RedlockHandle {
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

/// Once the renewal that `node` answered "not ours" is decided: if a
/// majority renewed it, take the lock back on `node` for the same owner
/// if nobody holds it there (`SET NX`). That node was restarted without
/// its data, or its key expired early or was evicted; otherwise it would
/// stay lost to the grant, and a rolling restart of the nodes would shrink
/// the grant's majority until a renewal failed. A node taken back never
/// counts toward the renewal it follows, so a grant that no majority holds
/// any longer is still reported lost. Nothing is done when the renewal
/// failed or was abandoned.
async fn take_back_once_renewed(
    node: Arc<Node>,
    lock: Arc<LockRef>,
    ttl: Duration,
    mut decision: watch::Receiver<Option<bool>>,
) {
    let renewed = match decision.wait_for(Option::is_some).await {
        Ok(decided) => *decided == Some(true),
        Err(_) => false,
    };
    if !renewed {
        return;
    }
    let at = node.display.clone();
    match node.take_back(lock, ttl).await {
        Ok(true) => {
            tracing::info!(target: "distlock", node = %at, "a renewed lock was taken back on a node that had lost it");
        }
        Ok(false) => {}
        Err(e) => {
            tracing::debug!(target: "distlock", node = %at, error = %e.report(), "taking a renewed lock back failed");
        }
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
    /// nodes that answered it was not ours ([`take_back_once_renewed`]).
    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        let inner = &self.inner;
        let (n, q) = (inner.nodes.len(), inner.quorum);
        let (decided, decision) = watch::channel(None);
        let replies = gather(
            inner.nodes.iter().map(|node| {
                let (node, lock) = (Arc::clone(node), Arc::clone(&self.lock));
                let decision = decision.clone();
                async move {
                    let ours = Arc::clone(&node).extend(Arc::clone(&lock), ttl).await?;
                    if !ours && let Ok(rt) = tokio::runtime::Handle::try_current() {
                        rt.spawn(take_back_once_renewed(node, lock, ttl, decision));
                    }
                    Ok(ours)
                }
            }),
            Stragglers::Finish,
            |r| count(r, |&ok| ok) >= q || n - count(r, |&ok| !ok) < q,
        )
        .await;
        let extended = count(&replies, |&ok| ok);
        // Told to the take-backs of the nodes that said no, whether they
        // answered before the decision or after it.
        let _ = decided.send(Some(extended >= q));
        if extended >= q {
            Ok(true)
        } else if n - count(&replies, |&ok| !ok) < q {
            Ok(false)
        } else {
            Err(quorum_not_reached(extended, q, &replies, &inner.names))
        }
    }
}
