//! A held lock's node: release and renewal check.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::raw::{DetachedRelease, GuardHandle, HolderRecord, Retry};
use lock_core::{Backoff, LockError};
use zookeeper_client::Error as ZkError;

use crate::config::ZkUrl;
use crate::error::zk_error;
use crate::session::{Session, retrying_resendable};

/// Our node in a lock's queue.
pub(crate) struct ZkHandle {
    /// The session our node lives in.
    pub session: Arc<Session>,
    pub path: String,
    /// Where a session of its own comes from, for a release at shutdown:
    /// the URL, or nowhere (the application's client).
    pub url: Option<Arc<ZkUrl>>,
    /// The holder record the node was created with (identity and time
    /// stay; `set_value` replaces the value).
    pub record: HolderRecord,
}

/// The background delete's pauses: the first before its first attempt,
/// doubling up to two seconds.
fn background_retry() -> Backoff {
    Backoff::default()
        .with_initial(Duration::from_millis(100))
        .with_max(Duration::from_secs(2))
        .with_jitter(0.0)
}

impl ZkHandle {
    /// Keep deleting until the node is gone or the session has ended.
    async fn delete_in_background(self) {
        let backoff = background_retry();
        tokio::time::sleep(backoff.initial).await;
        let still_cut = |e: &LockError| e.is_transient() && !self.session.is_terminated();
        let outcome = Retry::with_backoff(backoff)
            .run("releasing a lock in the background", still_cut, |_| {
                self.delete()
            })
            .await;
        match outcome {
            Ok(_) => {
                tracing::info!(target: "distlock", path = %self.path, "a release cut by a connection failure completed");
            }
            Err(e) if e.is_transient() => {
                tracing::debug!(target: "distlock", path = %self.path, error = %e, "session ended; the node went with it");
            }
            Err(e) => {
                tracing::warn!(target: "distlock", path = %self.path, error = %e, "release failed; the node goes with its session");
            }
        }
    }

    /// Delete our node. A delete whose reply was lost with the connection
    /// (or that the client gave up on, as after a process pause) is sent
    /// again once the client has reconnected; finding the node gone then
    /// means the first one landed, and a session that ended meanwhile
    /// answers that the node went with it. Without this, a node whose
    /// delete was lost would hold the lock for the rest of the session.
    async fn delete(&self) -> Result<bool, LockError> {
        let mut sent_before = false;
        let outcome = retrying_resendable(|| {
            let again = std::mem::replace(&mut sent_before, true);
            let delete = self.session.client.delete(&self.path, None);
            async move {
                match delete.await {
                    Err(ZkError::NoNode) if again => Ok(true),
                    other => other.map(|()| true),
                }
            }
        })
        .await;
        match outcome {
            Ok(deleted) => Ok(deleted),
            // Gone, or gone with its session.
            Err(ZkError::NoNode | ZkError::SessionExpired | ZkError::ClientClosed) => Ok(false),
            Err(e) => Err(zk_error("releasing a lock", e)),
        }
    }
}

#[async_trait]
impl GuardHandle for ZkHandle {
    /// Delete our node. If the delete cannot be confirmed (the connection
    /// failed past the retries, say under a server crash), the caller gets
    /// a transient error and the delete goes on in the background until
    /// the node is gone or its session has ended: a released lock is never
    /// left held by a live client.
    async fn release(&self) -> Result<bool, LockError> {
        match self.delete().await {
            Err(e) if e.is_transient() => {
                let again = ZkHandle {
                    session: Arc::clone(&self.session),
                    path: self.path.clone(),
                    url: self.url.clone(),
                    record: self.record.clone(),
                };
                match tokio::runtime::Handle::try_current() {
                    Ok(rt) => {
                        rt.spawn(async move { again.delete_in_background().await });
                    }
                    Err(_) => tracing::warn!(target: "distlock",
                        path = %self.path,
                        "release failed outside a runtime; the node goes with its session"
                    ),
                }
                Err(e)
            }
            done => done,
        }
    }

    /// The delete, in a session of its own started from the URL (with the
    /// same credentials, so a creator-only node can be deleted). A lock on
    /// the application's own client has none: its node goes with its
    /// session.
    fn detached_release(&self) -> Option<DetachedRelease> {
        let url = Arc::clone(self.url.as_ref()?);
        let path = self.path.clone();
        Some(Box::pin(async move {
            let session = Session::connect(&url).await?;
            match session.client.delete(&path, None).await {
                Ok(()) => Ok(true),
                Err(ZkError::NoNode) => Ok(false),
                Err(e) => Err(zk_error("releasing a lock at shutdown", e)),
            }
        }))
    }

    async fn extend(&self, _ttl: Duration) -> Result<bool, LockError> {
        match retrying_resendable(|| self.session.client.check_stat(&self.path)).await {
            Ok(stat) => Ok(stat.is_some()),
            Err(e @ (ZkError::SessionExpired | ZkError::ClientClosed)) => {
                // Gone with the session: its reason, not a take-over.
                self.session.ended(&e);
                Ok(false)
            }
            Err(e) => Err(zk_error("checking a lock node", e)),
        }
    }

    /// Set our node's data to the new record: the node is this
    /// acquisition's own, so it is ours while it exists.
    async fn set_value(&self, value: &[u8]) -> Result<bool, LockError> {
        let record = self.record.with_value(value);
        match retrying_resendable(|| {
            self.session
                .client
                .set_data(&self.path, record.as_bytes(), None)
        })
        .await
        {
            Ok(_) => Ok(true),
            Err(ZkError::NoNode | ZkError::SessionExpired | ZkError::ClientClosed) => Ok(false),
            Err(e) => Err(zk_error("replacing a holder's value", e)),
        }
    }
}
