//! Batched extends: the extends waiting for one server (the watchdog's
//! renewals of many locks) go out as one script run, so a client holding
//! thousands of renewed locks sends a few requests per renewal round
//! instead of one per lock.

use std::sync::Arc;
use std::time::Duration;

use lock_core::LockError;
use lock_core::raw::{BatchFn, Batcher};
use redis::aio::ConnectionLike;

use crate::error::map_error;
use crate::script_call::{Acknowledge, ScriptCall};
use crate::scripts::EXTEND;

/// The most leases one script run touches: a few hundred microseconds of
/// the server's single thread.
const MAX_BATCH: usize = 512;

/// One extend: a lock key, its owner token and the new lease.
pub struct Extension {
    /// The lock's key (`LockKeys::lock`).
    pub key: String,
    /// The owner token the key must still hold.
    pub owner: String,
    /// The new lease.
    pub ttl: Duration,
}

/// A batcher of extends on `conn`, each batch acknowledged by `ack`'s
/// replicas (if any) and bounded by `limit` (then `Unavailable`); errors
/// name `backend` and `server` (shown, so without credentials).
pub fn extend_batcher<C>(
    backend: &'static str,
    server: &str,
    conn: C,
    ack: Option<Acknowledge>,
    limit: Duration,
) -> Batcher<Extension, bool>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let doing: Arc<str> = format!("extending locks on {server}").into();
    let run: BatchFn<Extension, bool> = Arc::new(move |items: Vec<Extension>| {
        let mut conn = conn.clone();
        let doing = Arc::clone(&doing);
        Box::pin(async move {
            let keys: Vec<&str> = items.iter().map(|x| x.key.as_str()).collect();
            let mut call = ScriptCall::new(&EXTEND, &keys, 2 * items.len());
            for x in &items {
                call.arg(&x.owner).arg(lock_core::raw::lease_millis(x.ttl));
            }
            call.acknowledged(ack);
            let replies: Vec<i64> = match tokio::time::timeout(limit, call.invoke(&mut conn)).await
            {
                Ok(reply) => reply.map_err(|e| map_error(backend, &doing, e))?,
                Err(_) => {
                    return Err(LockError::Unavailable {
                        backend,
                        reason: format!("{doing}: no answer within {limit:?}"),
                        source: None,
                    });
                }
            };
            Ok(replies.into_iter().map(|r| r == 1).collect())
        })
    });
    Batcher::new(backend, MAX_BATCH, run)
}
