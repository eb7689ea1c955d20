//! The guard's handle on a Redis lock: release by an owner-checked
//! script, extend through the client's renewal batch.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::LockError;
use lock_core::raw::GuardHandle;

use crate::error::map_redis;
use crate::extends::Extension;
use crate::keys::LockKeys;
use crate::lock::Inner;
use crate::script_call::ScriptCall;
use crate::scripts::RELEASE;

/// One grant's handle: its keys and owner token, released by an
/// owner-checked script and extended through the client's batch.
pub(crate) struct RedisHandle {
    pub(crate) inner: Arc<Inner>,
    pub(crate) keys: LockKeys,
    /// The owner token, as stored in the lock key.
    pub(crate) owner: String,
}

#[async_trait]
impl GuardHandle for RedisHandle {
    async fn release(&self) -> Result<bool, LockError> {
        let mut conn = self.inner.conn.clone();
        let keys = &self.keys;
        let mut call = ScriptCall::new(&RELEASE, &[&keys.lock, &keys.queue, &keys.handoff], 3);
        call.arg(&self.owner)
            .arg(&self.keys.channel)
            .arg(self.inner.config.handoff_window.as_millis() as u64);
        let released: i64 = call
            .invoke(&mut conn)
            .await
            .map_err(|e| map_redis("releasing a lock", e))?;
        Ok(released == 1)
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        let extension = Extension {
            key: self.keys.lock.clone(),
            owner: self.owner.clone(),
            ttl,
        };
        self.inner.extends.call(extension).await
    }
}
