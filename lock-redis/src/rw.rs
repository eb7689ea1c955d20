//! Redis reader-writer locks. The writer of name `n` holds key
//! `PREFIX{n}:rw:writer`, a reader key `PREFIX{n}:rw:reader:OWNER`, each
//! with its owner token and the lease as its TTL, as a lock key does: the
//! server's clock ends them, renewals are the locks' batched extends, and
//! every key shares the name's hash tag.
//!
//! An acquisition is one script. A writer is granted when no writer key
//! and no reader key is live and no reader that arrived before it is
//! waiting; its token is the name's write counter, raised. A reader is
//! granted when no writer key is live and no writer that arrived before it
//! is waiting; its token is the counter as it is (the latest write's). A
//! waiter marks itself in the name's waiting set, with its arrival and a
//! mark that lapses unless its next attempt renews it (every
//! [`MARK_RENEWAL`]), so readers that come after a waiting writer wait
//! behind it (writer preference) and readers that queued before it keep
//! their place. A waiter that gives up or is dropped removes its mark. A release publishes on the name's channel,
//! which wakes one waiter of each listening process; waiters also look
//! again when the blocking lease ends. No queue: writers among themselves,
//! and readers behind the same writer, are served in no promised order.
//!
//! An upgradeable reader is a reader the holder records name as the
//! `upgrader` (one at a time). Its upgrade is a script run that names it
//! `upgrading` while other readers' keys are live (new readers then wait,
//! as behind a writer; no writer can come in, as a reader still holds),
//! and `upgraded` once none is, with the counter raised: its reader key
//! stays its lease, now a writer's, so renewals and the release go on as
//! before.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::raw::{
    Arrival, Attempt, CleanUpOnDrop, DetachedRelease, GuardHandle, HolderRecord, MARK_RENEWAL,
    MARK_TTL, OwnerToken, Pace, PendingGrant, RawGuard, Request, WaitLoop, WaitMark,
};
use lock_core::{Access, LockError, LockGuard, LockOptions, RwHolderInfo, RwLockInfo};
use redis::aio::ConnectionLike;
use tokio::time::Instant;

use crate::error::{BACKEND, map_redis, within};
use crate::extends::Extension;
use crate::keys::RwKeys;
use crate::lock::{Inner, RedisLock};
use crate::script_call::ScriptCall;
use crate::scripts::{PERMIT_SET_HOLDER, RW_ACQUIRE, RW_RELEASE, RW_STATE, RW_UPGRADE};

/// How long a waiter pauses when the blocking holder's lease is unknown
/// (a key without a TTL, or a waiting writer); a release wakes it sooner.
const BACKSTOP: Duration = Duration::from_millis(500);

/// A waiter's mark, removed from the name's waiting set
/// (`writers_waiting`, which holds the waiting readers' marks too) when
/// its wait ends without the grant (the grant's own script removes it
/// otherwise).
fn wait_mark(
    inner: &Arc<Inner>,
    writers_waiting: &str,
    access: Access,
    arrival: Arrival,
) -> WaitMark {
    let (inner, key) = (Arc::clone(inner), writers_waiting.to_string());
    WaitMark::new(
        access,
        arrival,
        Arc::new(move |id| {
            let (inner, key) = (Arc::clone(&inner), key.clone());
            Box::pin(async move {
                let member = format!("{}:{id}", arrival.padded());
                let mut conn = inner.conn.clone();
                within(
                    &inner.config,
                    "removing a waiter's mark",
                    redis::cmd("ZREM")
                        .arg(&key)
                        .arg(&member)
                        .query_async::<i64>(&mut conn),
                )
                .await?
                .map(|_| ())
                .map_err(|e| map_redis("removing a waiter's mark", e))
            })
        }),
    )
}

/// One server's answer to [`RW_STATE`]: the write counter, the waiting
/// writers and the live holders (their access, time left and record; no
/// token, which is the caller's to give).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RwState {
    /// The write counter (the latest write's token).
    pub counter: u64,
    /// Writers whose mark has not lapsed.
    pub waiting: usize,
    /// The live holders.
    pub holders: Vec<RwHolderInfo>,
}

impl RwState {
    /// Read [`RW_STATE`]'s `reply` about lock `name`; a reply that is not
    /// one is [`LockError::Backend`] of `backend`.
    pub fn read(backend: &'static str, name: &str, reply: &[Vec<u8>]) -> Result<Self, LockError> {
        let bad = |what: &str| LockError::Backend {
            backend,
            reason: format!("reader-writer lock {name:?}: unreadable {what} in the server's reply"),
            source: None,
        };
        let number = |bytes: &[u8], what: &str| -> Result<i64, LockError> {
            std::str::from_utf8(bytes)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad(what))
        };
        let [counter, waiting, rest @ ..] = reply else {
            return Err(bad("state"));
        };
        let counter = u64::try_from(number(counter, "counter")?).map_err(|_| bad("counter"))?;
        let waiting = usize::try_from(number(waiting, "waiting writers")?)
            .map_err(|_| bad("waiting writers"))?;
        let mut holders = Vec::with_capacity(rest.len() / 3);
        for holder in rest.chunks(3) {
            let [access, left, record] = holder else {
                return Err(bad("holder"));
            };
            let access = match &access[..] {
                b"w" => Access::Write,
                b"r" => Access::Read,
                b"u" => Access::Upgradeable,
                _ => return Err(bad("access")),
            };
            let left = u64::try_from(number(left, "lease")?)
                .ok()
                .map(Duration::from_millis);
            let record = (!record.is_empty())
                .then(|| HolderRecord::decode_for(backend, name, record))
                .transpose()?;
            holders.push(
                RwHolderInfo::new(access)
                    .with_expires_in(left)
                    .with_holder(record),
            );
        }
        Ok(RwState {
            counter,
            waiting,
            holders,
        })
    }
}

impl RedisLock {
    /// One attempt at `access` to `name`, as a newcomer arriving now or as
    /// the waiter `mark`. Cancel-safe: a grant whose reply is lost
    /// with the dropped future is given back in the background.
    async fn attempt_rw(
        &self,
        name: &str,
        opts: &LockOptions,
        access: Access,
        arrival: Arrival,
        mark: Option<&WaitMark>,
    ) -> Result<Attempt, LockError> {
        let inner = &self.inner;
        let keys = inner.keys.rw(name);
        let owner = OwnerToken::random().to_hex();
        let handle = Arc::new(RwHandle {
            inner: Arc::clone(inner),
            key: match access {
                Access::Write => keys.writer.clone(),
                _ => keys.reader(&owner),
            },
            field: match access {
                Access::Write => "writer".to_string(),
                _ => owner.clone(),
            },
            keys,
            owner,
            record: opts.holder_record(),
            access,
            name: name.to_string(),
        });
        let keys = &handle.keys;
        let mut call = ScriptCall::new(
            &RW_ACQUIRE,
            &[
                &keys.writer,
                &keys.readers,
                &keys.fence,
                &keys.held,
                &keys.writers_waiting,
            ],
            8,
        );
        call.arg(&keys.reader_base)
            .arg(&handle.owner)
            .arg(lock_core::raw::lease_millis(opts.ttl))
            .arg(match access {
                Access::Write => "w",
                Access::Upgradeable => "u",
                _ => "r",
            })
            .arg(handle.record.as_bytes())
            .arg(mark.map_or(arrival, |m| m.arrival()).padded())
            .arg(mark.map_or("", |m| m.id()))
            .arg(MARK_TTL.as_millis() as u64)
            .acknowledged(inner.config.acknowledgement());
        let pending = PendingGrant::new(Arc::clone(&handle) as Arc<dyn GuardHandle>);
        let mut conn = inner.conn.clone();
        let sent_at = Instant::now();
        if let Some(m) = mark {
            // Refused, the script puts or renews the mark.
            m.placing();
        }
        let reply: Vec<i64> = call
            .invoke(&mut conn)
            .await
            .map_err(|e| map_redis("acquiring a reader-writer lock", e))?;
        match reply[..] {
            [1, token] => {
                // Granted, the script removed the mark.
                if let Some(m) = mark {
                    m.removed();
                }
                let (guard_handle, lease) =
                    match pending.grant_in_time(BACKEND, name, sent_at, opts).await {
                        Ok(granted) => granted,
                        Err(too_late) => return Ok(Attempt::TooLate(too_late)),
                    };
                let token = u64::try_from(token).map_err(|_| LockError::Backend {
                    backend: BACKEND,
                    reason: format!("a negative token for {access} lock {name:?}: {token}"),
                    source: None,
                })?;
                let guard =
                    LockGuard::new(name, Some(token), inner.capabilities(), lease, guard_handle)
                        .with_access(Some(access));
                Ok(Attempt::Acquired(guard.kept_by(
                    &self.watchdog,
                    opts,
                    inner.unrenewed(),
                )))
            }
            [0, left] => {
                drop(pending.disarm());
                let expires_in = u64::try_from(left).ok().map(Duration::from_millis);
                Ok(Attempt::Held { expires_in })
            }
            _ => {
                drop(pending.disarm());
                Err(LockError::Backend {
                    backend: BACKEND,
                    reason: format!("unexpected reply to {access} lock {name:?}: {reply:?}"),
                    source: None,
                })
            }
        }
    }

    /// One attempt without waiting.
    pub(crate) async fn try_rw(
        &self,
        req: Request<'_>,
        access: Access,
    ) -> Result<Option<LockGuard>, LockError> {
        self.attempt_rw(req.name, req.opts, access, Arrival::now(), None)
            .await?
            .into_guard()
    }

    /// Wait for `access`: listening on the name's channel (a release
    /// anywhere wakes one waiter per listening process), else until the
    /// blocking lease ends; the waiter also renews its mark every
    /// [`MARK_RENEWAL`]. An uncontended wait is one round trip.
    pub(crate) async fn wait_for_rw(
        &self,
        req: Request<'_>,
        access: Access,
    ) -> Result<Option<LockGuard>, LockError> {
        let (name, opts) = (req.name, req.opts);
        let keys = self.inner.keys.rw(name);
        let arrival = Arrival::now();
        let mark = wait_mark(&self.inner, &keys.writers_waiting, access, arrival);
        let wake = self.inner.wakeups.subscribe(&keys.wake);
        let mut listening = self
            .inner
            .subscriber
            .get()
            .and_then(|s| s.join_subscribed(&keys.channel));
        let mut wait = WaitLoop::new(req, Some(wake));
        loop {
            let mut too_late = None;
            let attempt = self
                .attempt_rw(name, opts, access, arrival, Some(&mark))
                .await?;
            let pause = match attempt {
                Attempt::Acquired(guard) => return Ok(Some(guard)),
                Attempt::Held { expires_in } => {
                    // Back before the mark lapses.
                    expires_in
                        .map_or(BACKSTOP, |left| left + Duration::from_millis(1))
                        .min(MARK_RENEWAL)
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

    /// The holders of `name`, the write counter and the waiting writers,
    /// read in one script run.
    pub(crate) async fn inspect_rw_lock(&self, name: &str) -> Result<RwLockInfo, LockError> {
        let keys = self.inner.keys.rw(name);
        let mut call = ScriptCall::new(
            &RW_STATE,
            &[
                &keys.writer,
                &keys.readers,
                &keys.fence,
                &keys.held,
                &keys.writers_waiting,
            ],
            1,
        );
        call.arg(&keys.reader_base);
        let mut conn = self.inner.conn.clone();
        let reply: Vec<Vec<u8>> = within(
            &self.inner.config,
            "reading a reader-writer lock",
            call.invoke(&mut conn),
        )
        .await?
        .map_err(|e| map_redis("reading a reader-writer lock", e))?;
        let state = RwState::read(BACKEND, name, &reply)?;
        let fence = state.counter;
        let holders = state
            .holders
            .into_iter()
            .map(|h| h.with_fencing_token(Some(fence)))
            .collect();
        Ok(RwLockInfo::held(holders)
            .with_fencing_token(Some(fence))
            .with_waiting(Some(state.waiting), None))
    }
}

/// One reader-writer grant's handle: its key (the writer's or its own
/// reader key), its field among the holder records, and its owner token;
/// released by an owner-checked script, extended through the client's
/// batch as a lock is.
struct RwHandle {
    inner: Arc<Inner>,
    keys: RwKeys,
    key: String,
    field: String,
    owner: String,
    record: HolderRecord,
    access: Access,
    /// The lock's name, for errors.
    name: String,
}

impl RwHandle {
    /// The same grant's handle, for a clean-up that outlives this one.
    fn clone_for_background(&self) -> RwHandle {
        RwHandle {
            inner: Arc::clone(&self.inner),
            keys: self.keys.clone(),
            key: self.key.clone(),
            field: self.field.clone(),
            owner: self.owner.clone(),
            record: self.record.clone(),
            access: self.access,
            name: self.name.clone(),
        }
    }

    /// One run of [`RW_UPGRADE`] in `mode`.
    async fn upgrade_once(&self, mode: &str) -> Result<Vec<i64>, LockError> {
        let keys = &self.keys;
        let mut call = ScriptCall::new(
            &RW_UPGRADE,
            &[&keys.writer, &keys.readers, &keys.fence, &keys.held],
            5,
        );
        call.arg(&keys.reader_base)
            .arg(&self.owner)
            .arg(mode)
            .arg(&keys.channel)
            .arg(&keys.wake)
            .acknowledged(self.inner.config.acknowledgement());
        let mut conn = self.inner.conn.clone();
        call.invoke(&mut conn)
            .await
            .map_err(|e| map_redis("upgrading a reader-writer lock", e))
    }
}

/// Free the grant `owner` holds at `key`, on `conn`: `true` if it was ours.
async fn release_on(
    conn: &mut impl ConnectionLike,
    keys: &RwKeys,
    key: &str,
    field: &str,
    owner: &str,
) -> Result<bool, LockError> {
    let mut call = ScriptCall::new(&RW_RELEASE, &[key, &keys.readers, &keys.held], 4);
    call.arg(owner)
        .arg(field)
        .arg(&keys.channel)
        .arg(&keys.wake);
    let released: i64 = call
        .invoke(conn)
        .await
        .map_err(|e| map_redis("releasing a reader-writer lock", e))?;
    Ok(released == 1)
}

#[async_trait]
impl GuardHandle for RwHandle {
    async fn release(&self) -> Result<bool, LockError> {
        let mut conn = self.inner.conn.clone();
        release_on(&mut conn, &self.keys, &self.key, &self.field, &self.owner).await
    }

    /// The same script, on a connection of its own made from the client.
    fn detached_release(&self) -> Option<DetachedRelease> {
        let connector = self.inner.connector();
        let config = self.inner.config.clone();
        let (keys, key, field, owner) = (
            self.keys.clone(),
            self.key.clone(),
            self.field.clone(),
            self.owner.clone(),
        );
        Some(Box::pin(async move {
            let mut conn = connector.connect(&config).await?;
            release_on(&mut conn, &keys, &key, &field, &owner).await
        }))
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        let extension = Extension {
            key: self.key.clone(),
            owner: self.owner.clone(),
            ttl,
        };
        self.inner.extends.call(extension).await
    }

    /// Runs of [`RW_UPGRADE`], listening on the name's channel between
    /// them (a reader's release wakes it), else until the first other
    /// reader's lease ends.
    async fn upgrade(&self, deadline: Option<Instant>) -> Result<Option<u64>, LockError> {
        if self.access != Access::Upgradeable {
            return Err(LockError::invalid_options(
                "only an upgradeable read can be upgraded",
            ));
        }
        let name = self.name.clone();
        let wake = self.inner.wakeups.subscribe(&self.keys.wake);
        let mut listening = self
            .inner
            .subscriber
            .get()
            .and_then(|s| s.join_subscribed(&self.keys.channel));
        let opts = LockOptions::new();
        let start = Instant::now();
        let req = Request {
            name: &name,
            opts: &opts,
            start,
            deadline,
        };
        let mut wait = WaitLoop::new(req, Some(wake));
        // Leaving without upgrading (the deadline, a cancellation, an
        // error) lets readers in again: a `give up` run, a no-op on the
        // server once upgraded.
        let mut give_up = CleanUpOnDrop::new({
            let handle = self.clone_for_background();
            async move {
                if let Err(e) = handle.upgrade_once("give up").await {
                    tracing::debug!(target: "distlock", error = %e.report(), "an upgrade that gave up could not let readers in again; they come in once its lease or its release ends it");
                }
            }
        });
        loop {
            let reply = self.upgrade_once("up").await?;
            let pause = match reply[..] {
                [1, token] => {
                    give_up.disarm();
                    return u64::try_from(token)
                        .map(Some)
                        .map_err(|_| LockError::Backend {
                            backend: BACKEND,
                            reason: format!("a negative token for upgraded lock {name:?}: {token}"),
                            source: None,
                        });
                }
                [-1] => {
                    give_up.disarm();
                    return Err(LockError::NotHeld { name });
                }
                [0, left] => u64::try_from(left)
                    .map_or(BACKSTOP, |l| Duration::from_millis(l + 1))
                    .min(BACKSTOP),
                _ => {
                    return Err(LockError::Backend {
                        backend: BACKEND,
                        reason: format!("unexpected reply to the upgrade of {name:?}: {reply:?}"),
                        source: None,
                    });
                }
            };
            if wait.expired() {
                return Err(wait.request().timeout());
            }
            if listening.is_none() {
                // Listen, then look again at once: a release published
                // before we listened is not missed.
                let subscriber = self.inner.connected_subscriber().await?;
                listening = Some(subscriber.subscribe(&self.keys.channel).await?);
                continue;
            }
            if !wait.pause(Pace::For(pause)).await {
                return Err(wait.request().timeout());
            }
        }
    }

    async fn set_value(&self, value: &[u8]) -> Result<bool, LockError> {
        let record = self.record.with_value(value);
        let mut call = ScriptCall::new(&PERMIT_SET_HOLDER, &[&self.key, &self.keys.held], 3);
        call.arg(&self.owner)
            .arg(&self.field)
            .arg(record.as_bytes());
        let mut conn = self.inner.conn.clone();
        let done: i64 = call
            .invoke(&mut conn)
            .await
            .map_err(|e| map_redis("replacing a holder's value", e))?;
        Ok(done == 1)
    }
}
