//! Redis semaphores. A permit of name `n` is slot key `PREFIX{n}:permit:N`
//! (`N` below the limit), holding the owner token with the lease as its
//! TTL, as a lock key does: the server's clock ends it, renewals are the
//! locks' batched extends, and every key of the semaphore shares the
//! name's hash tag.
//!
//! An acquisition is one script: if the name's recorded limit differs from
//! the one asked and a slot below it is still held, it is refused, naming
//! both; else the lowest free slot is taken (`SET NX PX`), the name's
//! permit counter bumped (the token: it rises for every slot) and the
//! token and holder record written beside it. A release frees the slot if
//! its owner token still holds it and publishes on the name's permit
//! channel, which wakes one waiter of each listening process; waiters also
//! look again when the first live permit's lease ends. No queue: the order
//! among waiters is not promised.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::raw::{
    Attempt, DetachedRelease, GuardHandle, HolderRecord, OwnerToken, Pace, PendingGrant, RawGuard,
    RawLock, Request, WaitLoop, limit_mismatch,
};
use lock_core::{LockError, LockGuard, LockOptions, PermitInfo, SemaphoreInfo};
use redis::aio::ConnectionLike;
use tokio::time::Instant;

use crate::error::{BACKEND, map_redis, within};
use crate::extends::Extension;
use crate::keys::PermitKeys;
use crate::lock::{Inner, RedisLock};
use crate::script_call::ScriptCall;
use crate::scripts::{PERMIT_ACQUIRE, PERMIT_RELEASE, PERMIT_SET_HOLDER, PERMIT_STATE};

/// The largest limit: a full semaphore's attempt tries every slot in one
/// script run on the server's single thread.
pub(crate) const MAX_LIMIT: u32 = 1024;

/// How long a waiter pauses when no live permit has a TTL (slot keys set
/// by someone else); a release wakes it sooner.
const BACKSTOP: Duration = Duration::from_millis(500);

impl RedisLock {
    /// One attempt at a permit of `name` among `limit`. Cancel-safe: a
    /// grant whose reply is lost with the dropped future is given back in
    /// the background (looking at every slot, since its own is unknown).
    pub(crate) async fn attempt_permit(
        &self,
        name: &str,
        opts: &LockOptions,
        limit: u32,
    ) -> Result<Attempt, LockError> {
        let inner = &self.inner;
        let handle = Arc::new(PermitHandle {
            inner: Arc::clone(inner),
            keys: inner.keys.permits(name),
            limit,
            slot: OnceLock::new(),
            owner: OwnerToken::random().to_hex(),
            record: opts.holder_record(),
        });
        let keys = &handle.keys;
        let mut call = ScriptCall::new(&PERMIT_ACQUIRE, &[&keys.limit, &keys.fence, &keys.held], 5);
        call.arg(&keys.slot_base)
            .arg(&handle.owner)
            .arg(lock_core::raw::lease_millis(opts.ttl))
            .arg(limit)
            .arg(handle.record.as_bytes())
            .acknowledged(inner.config.acknowledgement());
        let pending = PendingGrant::new(Arc::clone(&handle) as Arc<dyn GuardHandle>);
        let mut conn = inner.conn.clone();
        let sent_at = Instant::now();
        let reply: Vec<i64> = call
            .invoke(&mut conn)
            .await
            .map_err(|e| map_redis("acquiring a permit", e))?;
        let unexpected = || LockError::Backend {
            backend: BACKEND,
            reason: format!("unexpected reply to a permit of {name:?}: {reply:?}"),
            source: None,
        };
        match reply[..] {
            [1, slot, token] => {
                let slot = u32::try_from(slot)
                    .ok()
                    .filter(|&s| s < limit)
                    .ok_or_else(unexpected)?;
                let token = u64::try_from(token).ok().filter(|&t| t > 0);
                // Known before the grant is checked, so that a give-back
                // looks at this slot only.
                let _ = handle.slot.set(slot);
                let (guard_handle, lease) =
                    match pending.grant_in_time(BACKEND, name, sent_at, opts).await {
                        Ok(granted) => granted,
                        Err(too_late) => return Ok(Attempt::TooLate(too_late)),
                    };
                let token = token.ok_or_else(unexpected)?;
                let guard = LockGuard::new(
                    name,
                    Some(token),
                    self.raw_capabilities(),
                    lease,
                    guard_handle,
                )
                .with_slot(Some(slot));
                Ok(Attempt::Acquired(guard.kept_by(
                    &self.watchdog,
                    opts,
                    inner.unrenewed(),
                )))
            }
            [0, earliest] => {
                drop(pending.disarm());
                let expires_in = u64::try_from(earliest).ok().map(Duration::from_millis);
                Ok(Attempt::Held { expires_in })
            }
            [-1, held] => {
                drop(pending.disarm());
                Err(limit_mismatch(
                    name,
                    limit,
                    u32::try_from(held).unwrap_or(u32::MAX),
                ))
            }
            _ => {
                drop(pending.disarm());
                Err(unexpected())
            }
        }
    }

    /// Wait for a permit: listening on the name's permit channel (a
    /// release anywhere wakes one waiter per listening process), else
    /// until the first live permit's lease ends. An uncontended wait is one
    /// round trip: it listens only once its first attempt found the
    /// semaphore full.
    pub(crate) async fn wait_for_permit(
        &self,
        req: Request<'_>,
        limit: u32,
    ) -> Result<Option<LockGuard>, LockError> {
        let (name, opts) = (req.name, req.opts);
        let keys = self.inner.keys.permits(name);
        let wake = self.inner.wakeups.subscribe(&keys.wake);
        let mut listening = self
            .inner
            .subscriber
            .get()
            .and_then(|s| s.join_subscribed(&keys.channel));
        let mut wait = WaitLoop::new(req, Some(wake));
        loop {
            let mut too_late = None;
            let pause = match self.attempt_permit(name, opts, limit).await? {
                Attempt::Acquired(guard) => return Ok(Some(guard)),
                Attempt::Held { expires_in } => {
                    expires_in.map_or(BACKSTOP, |left| left + Duration::from_millis(1))
                }
                Attempt::TooLate(e) => {
                    too_late = Some(e);
                    Duration::ZERO
                }
            };
            if wait.expired() {
                return too_late.map_or(Ok(None), Err);
            }
            if listening.is_none() {
                // Listen, then attempt again at once: a release published
                // before we listened is not missed.
                listening = Some(self.subscriber().await?.subscribe(&keys.channel).await?);
                continue;
            }
            if !wait.pause(Pace::For(pause)).await {
                return too_late.map_or(Ok(None), Err);
            }
        }
    }

    /// The live permits of `name`, read in one script run.
    pub(crate) async fn inspect_permits(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        let keys = self.inner.keys.permits(name);
        let mut call = ScriptCall::new(&PERMIT_STATE, &[&keys.limit, &keys.held], 1);
        call.arg(&keys.slot_base);
        let mut conn = self.inner.conn.clone();
        let reply: Vec<Vec<u8>> = within(
            &self.inner.config,
            "reading a semaphore",
            call.invoke(&mut conn),
        )
        .await?
        .map_err(|e| map_redis("reading a semaphore", e))?;
        let bad = |what: &str| LockError::Backend {
            backend: BACKEND,
            reason: format!("semaphore {name:?}: unreadable {what} in the server's reply"),
            source: None,
        };
        let number = |bytes: &[u8], what: &str| -> Result<i64, LockError> {
            std::str::from_utf8(bytes)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad(what))
        };
        let Some((limit, rest)) = reply.split_first() else {
            return Ok(SemaphoreInfo::free());
        };
        let limit = u32::try_from(number(limit, "limit")?).map_err(|_| bad("limit"))?;
        let mut permits = Vec::with_capacity(rest.len() / 4);
        for permit in rest.chunks(4) {
            let [slot, left, token, record] = permit else {
                return Err(bad("permit"));
            };
            let slot = u32::try_from(number(slot, "slot")?).map_err(|_| bad("slot"))?;
            let left = u64::try_from(number(left, "lease")?)
                .ok()
                .map(Duration::from_millis);
            let token = u64::try_from(number(token, "token")?)
                .ok()
                .filter(|&t| t > 0);
            let holder = (!record.is_empty())
                .then(|| HolderRecord::decode_for(BACKEND, name, record))
                .transpose()?;
            permits.push(
                PermitInfo::new(slot)
                    .with_fencing_token(token)
                    .with_expires_in(left)
                    .with_holder(holder),
            );
        }
        Ok(SemaphoreInfo::held(limit, permits))
    }
}

/// One permit's handle: its semaphore's keys, its slot once known and its
/// owner token; released by an owner-checked script, extended through the
/// client's batch as a lock is.
struct PermitHandle {
    inner: Arc<Inner>,
    keys: PermitKeys,
    limit: u32,
    /// Set from the grant's reply; unset only while it is in flight.
    slot: OnceLock<u32>,
    owner: String,
    record: HolderRecord,
}

/// Free the slot `owner` holds among `keys`' (only `slot` if known, else
/// any below `limit`), on `conn`: `true` if it was ours.
async fn release_on(
    conn: &mut impl ConnectionLike,
    keys: &PermitKeys,
    owner: &str,
    slot: Option<u32>,
    limit: u32,
) -> Result<bool, LockError> {
    let (first, last) = slot.map_or((0, limit.saturating_sub(1)), |s| (s, s));
    let first_key = keys.slot(first);
    let mut call = ScriptCall::new(&PERMIT_RELEASE, &[&first_key], 6);
    call.arg(owner)
        .arg(&keys.channel)
        .arg(&keys.wake)
        .arg(&keys.slot_base)
        .arg(first)
        .arg(last);
    let released: i64 = call
        .invoke(conn)
        .await
        .map_err(|e| map_redis("releasing a permit", e))?;
    Ok(released == 1)
}

#[async_trait]
impl GuardHandle for PermitHandle {
    async fn release(&self) -> Result<bool, LockError> {
        let mut conn = self.inner.conn.clone();
        let slot = self.slot.get().copied();
        release_on(&mut conn, &self.keys, &self.owner, slot, self.limit).await
    }

    /// The same script, on a connection of its own made from the client.
    fn detached_release(&self) -> Option<DetachedRelease> {
        let connector = self.inner.connector();
        let config = self.inner.config.clone();
        let (keys, owner) = (self.keys.clone(), self.owner.clone());
        let (slot, limit) = (self.slot.get().copied(), self.limit);
        Some(Box::pin(async move {
            let mut conn = connector.connect(&config).await?;
            release_on(&mut conn, &keys, &owner, slot, limit).await
        }))
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        let Some(&slot) = self.slot.get() else {
            return Ok(false);
        };
        let extension = Extension {
            key: self.keys.slot(slot),
            owner: self.owner.clone(),
            ttl,
        };
        self.inner.extends.call(extension).await
    }

    async fn set_value(&self, value: &[u8]) -> Result<bool, LockError> {
        let Some(&slot) = self.slot.get() else {
            return Ok(false);
        };
        let record = self.record.with_value(value);
        let slot_key = self.keys.slot(slot);
        let mut call = ScriptCall::new(&PERMIT_SET_HOLDER, &[&slot_key, &self.keys.held], 3);
        call.arg(&self.owner)
            .arg(format!("{slot}:holder"))
            .arg(record.as_bytes());
        let mut conn = self.inner.conn.clone();
        let done: i64 = call
            .invoke(&mut conn)
            .await
            .map_err(|e| map_redis("replacing a permit holder's value", e))?;
        Ok(done == 1)
    }
}
