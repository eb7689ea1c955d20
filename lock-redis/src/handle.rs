//! The guard's handle on a Redis lock: release by an owner-checked
//! script, extend through the client's renewal batch.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::LockError;
use lock_core::raw::{DetachedRelease, GuardHandle, HolderRecord};
use redis::aio::ConnectionLike;

use crate::error::map_redis;
use crate::extends::Extension;
use crate::keys::LockKeys;
use crate::lock::Inner;
use crate::script_call::ScriptCall;
use crate::scripts::{RELEASE, SET_HOLDER};

/// One grant's handle: its keys and owner token, released by an
/// owner-checked script and extended through the client's batch.
pub(crate) struct RedisHandle {
    pub(crate) inner: Arc<Inner>,
    pub(crate) keys: LockKeys,
    /// The owner token, as stored in the lock key.
    pub(crate) owner: String,
    /// The holder record written with the grant.
    pub(crate) record: HolderRecord,
}

/// Release the lock of `keys` if `owner` holds it, on `conn`: `true` if
/// it was ours.
async fn release_on(
    conn: &mut impl ConnectionLike,
    keys: &LockKeys,
    owner: &str,
    handoff_window: Duration,
) -> Result<bool, LockError> {
    let mut call = ScriptCall::new(&RELEASE, &[&keys.lock, &keys.queue, &keys.handoff], 3);
    call.arg(owner)
        .arg(&keys.channel)
        .arg(handoff_window.as_millis() as u64);
    let released: i64 = call
        .invoke(conn)
        .await
        .map_err(|e| map_redis("releasing a lock", e))?;
    Ok(released == 1)
}

#[async_trait]
impl GuardHandle for RedisHandle {
    async fn release(&self) -> Result<bool, LockError> {
        let mut conn = self.inner.conn.clone();
        let window = self.inner.config.handoff_window;
        release_on(&mut conn, &self.keys, &self.owner, window).await
    }

    /// The same script, on a connection of its own made from the client
    /// (its address, credentials and TLS set-up).
    fn detached_release(&self) -> Option<DetachedRelease> {
        let connector = self.inner.connector();
        let config = self.inner.config.clone();
        let (keys, owner) = (self.keys.clone(), self.owner.clone());
        Some(Box::pin(async move {
            let mut conn = connector.connect(&config).await?;
            release_on(&mut conn, &keys, &owner, config.handoff_window).await
        }))
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        let extension = Extension {
            key: self.keys.lock.clone(),
            owner: self.owner.clone(),
            ttl,
        };
        self.inner.extends.call(extension).await
    }

    async fn set_value(&self, value: &[u8]) -> Result<bool, LockError> {
        let record = self.record.with_value(value);
        let mut call = ScriptCall::new(&SET_HOLDER, &[&self.keys.lock, &self.keys.holder], 2);
        call.arg(&self.owner).arg(record.as_bytes());
        let mut conn = self.inner.conn.clone();
        let done: i64 = call
            .invoke(&mut conn)
            .await
            .map_err(|e| map_redis("replacing a holder's value", e))?;
        Ok(done == 1)
    }
}
