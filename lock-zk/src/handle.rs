//! A held lock's node: release and renewal check.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{GuardHandle, LockError};
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
