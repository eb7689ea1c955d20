//! The guard's handle on a SQLite lease: release and extend, each through
//! the client's batch of writes.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::LockError;
use lock_core::raw::GuardHandle;

use super::batch::{Extension, Held};
use super::lock::Inner;

/// One grant's handle: the lease row's name and owner token, released and
/// extended through the client's batches.
pub(crate) struct SqliteHandle {
    pub(crate) inner: Arc<Inner>,
    pub(crate) name: String,
    /// The owner token, as stored in the row.
    pub(crate) owner_hex: String,
}

#[async_trait]
impl GuardHandle for SqliteHandle {
    async fn release(&self) -> Result<bool, LockError> {
        let released = self.inner.releases.call(self.held()).await?;
        if released {
            self.inner.wakeups.wake(&self.name);
        }
        Ok(released)
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        let held = self.held();
        self.inner.extends.call(Extension { held, ttl }).await
    }
}

impl SqliteHandle {
    pub(crate) fn held(&self) -> Held {
        Held {
            name: self.name.clone(),
            owner_hex: self.owner_hex.clone(),
        }
    }
}
