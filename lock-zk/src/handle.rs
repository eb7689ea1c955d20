//! A held lock's node: release, renewal check, and the end of a lock
//! acquired without auto-renewal.

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{GuardHandle, LeaseState, LockError};
use tokio::time::Instant;
use zookeeper_client::Error as ZkError;

use crate::session::{Session, retrying, zk_error};

/// Our node in a lock's queue.
pub(crate) struct ZkHandle {
    /// The session our node lives in.
    pub session: Arc<Session>,
    pub path: String,
}

impl ZkHandle {
    /// Delete our node. A delete whose reply was lost with the connection
    /// is sent again once the client has reconnected; finding the node gone
    /// then means the first one landed. Without this, a node whose delete
    /// was lost would hold the lock for the rest of the session.
    async fn delete(&self) -> Result<bool, LockError> {
        let mut sent_before = false;
        let outcome = retrying(|| {
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
    async fn release(&self) -> Result<bool, LockError> {
        self.delete().await
    }

    async fn extend(&self, _ttl: Duration) -> Result<bool, LockError> {
        match retrying(|| self.session.client.check_stat(&self.path)).await {
            Ok(stat) => Ok(stat.is_some()),
            Err(ZkError::SessionExpired | ZkError::ClientClosed) => Ok(false),
            Err(e) => Err(zk_error("checking a lock node", e)),
        }
    }
}

/// A lock without auto-renewal ends `grace` after its validity deadline
/// (unless an `extend` moved it): delete its node then, as a lease would
/// expire.
pub(crate) fn expire_at_deadline(handle: Weak<ZkHandle>, lease: Arc<LeaseState>, grace: Duration) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        loop {
            let Some(deadline) = lease.deadline() else {
                return;
            };
            tokio::time::sleep_until(deadline + grace).await;
            if lease.deadline().is_some_and(|d| d + grace > Instant::now()) {
                continue; // extended
            }
            if let Some(handle) = handle.upgrade() {
                let _ = handle.delete().await;
            }
            return;
        }
    });
}
