//! A held lock's node: release and renewal check.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::raw::{DetachedRelease, GuardHandle, HolderRecord, Retry};
use lock_core::{Backoff, LockError};
use zookeeper_client::{Client, Error as ZkError};

use crate::config::ZkUrl;
use crate::error::zk_error;
use crate::session::{Session, retrying_resendable};

/// Our node in a lock's queue (or a semaphore's, with its slot node).
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
    /// A permit's slot node, from just before its create (never for a
    /// lock): released first, and only if it is this session's node.
    slot: Mutex<Option<String>>,
}

impl ZkHandle {
    /// The handle of our node `path` in `session`.
    pub(crate) fn new(
        session: Arc<Session>,
        path: String,
        url: Option<Arc<ZkUrl>>,
        record: HolderRecord,
    ) -> Self {
        ZkHandle {
            session,
            path,
            url,
            record,
            slot: Mutex::new(None),
        }
    }

    /// Set (or forget) the permit's slot node.
    pub(crate) fn set_slot(&self, slot: Option<String>) {
        *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = slot;
    }

    fn slot(&self) -> Option<String> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Delete the slot node `path` if it is a node of `client`'s session (a
/// slot node's name is taken again by later holders): `true` if it was.
async fn delete_slot(client: &Client, path: &str) -> Result<bool, ZkError> {
    let Some(stat) = retrying_resendable(|| client.check_stat(path)).await? else {
        return Ok(false);
    };
    if stat.ephemeral_owner != client.session_id().0 {
        return Ok(false);
    }
    match retrying_resendable(|| client.delete(path, Some(stat.version))).await {
        Ok(()) => Ok(true),
        Err(ZkError::NoNode | ZkError::BadVersion) => Ok(false),
        Err(e) => Err(e),
    }
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
                tracing::debug!(target: "distlock", path = %self.path, error = %e.report(), "session ended; the node went with it");
            }
            Err(e) => {
                tracing::warn!(target: "distlock", path = %self.path, error = %e.report(), "release failed; the node goes with its session");
            }
        }
    }

    /// Delete our node. A delete whose reply was lost with the connection
    /// (or that the client gave up on, as after a process pause) is sent
    /// again once the client has reconnected; finding the node gone then
    /// means the first one landed, and a session that ended meanwhile
    /// answers that the node went with it. Without this, a node whose
    /// delete was lost would hold the lock for the rest of the session.
    ///
    /// A permit's slot node goes first, so that the waiter our queue
    /// node's deletion lets in finds a slot free; the answer is then
    /// whether the slot node was still ours.
    async fn delete(&self) -> Result<bool, LockError> {
        let slot = match self.slot() {
            Some(path) => match delete_slot(&self.session.client, &path).await {
                Ok(ours) => Some(ours),
                Err(ZkError::SessionExpired | ZkError::ClientClosed) => return Ok(false),
                Err(e) => return Err(zk_error("releasing a permit's slot", e)),
            },
            None => None,
        };
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
            Ok(deleted) => Ok(slot.unwrap_or(deleted)),
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
                let again = ZkHandle::new(
                    Arc::clone(&self.session),
                    self.path.clone(),
                    self.url.clone(),
                    self.record.clone(),
                );
                again.set_slot(self.slot());
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
        let (path, slot) = (self.path.clone(), self.slot());
        // A slot node of the ending session can only be deleted from
        // another by name; it is ours while our queue node exists.
        Some(Box::pin(async move {
            let session = Session::connect(&url).await?;
            if let Some(slot) = slot
                && matches!(session.client.check_stat(&path).await, Ok(Some(_)))
            {
                let _ = session.client.delete(&slot, None).await;
            }
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
    /// A permit's slot node gets the record too (`inspect_semaphore`
    /// reads it there).
    async fn set_value(&self, value: &[u8]) -> Result<bool, LockError> {
        let record = self.record.with_value(value);
        if let Some(slot) = self.slot() {
            match retrying_resendable(|| {
                self.session.client.set_data(&slot, record.as_bytes(), None)
            })
            .await
            {
                Ok(_) => {}
                Err(ZkError::NoNode | ZkError::SessionExpired | ZkError::ClientClosed) => {
                    return Ok(false);
                }
                Err(e) => return Err(zk_error("replacing a permit holder's value", e)),
            }
        }
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
