//! The timing options of a lock, written once for every backend:
//!
//! - the lock delay ([`LockOptions::lock_delay`]): the server is asked for
//!   the lease's TTL plus the delay, at the grant and at every renewal,
//!   while the holder's validity deadline (and `lost()`) counts with the
//!   TTL alone ([`LeaseState::delaying`](crate::raw::LeaseState::delaying));
//!   a release deletes at once;
//! - the hold ([`LockOptions::hold_at_least`]): a release before the hold
//!   ends becomes a renewal for the time left of it, so the server ends the
//!   lock at the hold's end, without the holder.
//!
//! Both need a backend whose lease is a server-side expiry that a renewal
//! sets ([`Capabilities::lock_delay`](crate::Capabilities::lock_delay),
//! [`Capabilities::hold_at_least`](crate::Capabilities::hold_at_least));
//! [`LockOptions::validate`] refuses them elsewhere.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::error::LockError;
use crate::guard::{LockGuard, RawGuard};
use crate::options::LockOptions;
use crate::raw::{DetachedRelease, GuardHandle};

/// A hold with less than this left is released as usual.
const HOLD_LEFT_AT_LEAST: Duration = Duration::from_millis(1);

/// The options a backend is asked with: the TTL is the server's, the
/// lease's and the lock delay's together (the lease state takes the delay
/// back off for the deadline).
pub(crate) fn server_options(opts: &LockOptions) -> Cow<'_, LockOptions> {
    match opts.lock_delay {
        Some(delay) => {
            let mut server = opts.clone();
            server.ttl = opts.ttl.saturating_add(delay);
            Cow::Owned(server)
        }
        None => Cow::Borrowed(opts),
    }
}

/// The options a request was asked with, from the request's (whose TTL
/// carries the lock delay): for a backend made of other locks (a
/// migration), which asks each of them as the caller asked it.
pub fn asked_options(request: &LockOptions) -> Cow<'_, LockOptions> {
    match request.lock_delay {
        Some(delay) => {
            let mut asked = request.clone();
            asked.ttl = request.ttl.saturating_sub(delay);
            Cow::Owned(asked)
        }
        None => Cow::Borrowed(request),
    }
}

/// `guard`, granted just now, with its release held until the hold of
/// `opts` ends, if it asks for one.
pub(crate) fn with_hold(guard: LockGuard, opts: &LockOptions) -> LockGuard {
    let Some(hold) = opts.hold_at_least else {
        return guard;
    };
    // Counted from now, after the grant's answer: never earlier than the
    // server's grant plus the hold.
    let until = Instant::now() + hold;
    guard.map_handle(|inner| Arc::new(HeldAtLeast { inner, until }))
}

/// A grant's handle whose release, before `until`, leaves the lock to end
/// on the server at `until`.
struct HeldAtLeast {
    inner: Arc<dyn GuardHandle>,
    until: Instant,
}

impl HeldAtLeast {
    fn hold_left(&self) -> Option<Duration> {
        Some(self.until.saturating_duration_since(Instant::now()))
            .filter(|&left| left >= HOLD_LEFT_AT_LEAST)
    }
}

#[async_trait]
impl GuardHandle for HeldAtLeast {
    /// Within the hold: the lease set to end when the hold does (a
    /// renewal by owner token, so `Ok(false)` still means it was no longer
    /// ours); after it: the backend's release.
    async fn release(&self) -> Result<bool, LockError> {
        match self.hold_left() {
            Some(left) => {
                tracing::debug!(target: "distlock", ?left, "released within its hold: the lock ends when the hold does");
                self.inner.extend(left).await
            }
            None => self.inner.release().await,
        }
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        self.inner.extend(ttl).await
    }

    async fn set_value(&self, value: &[u8]) -> Result<bool, LockError> {
        self.inner.set_value(value).await
    }

    async fn upgrade(&self, deadline: Option<Instant>) -> Result<Option<u64>, LockError> {
        self.inner.upgrade(deadline).await
    }

    /// After the hold, the backend's; within it, none: the lock then ends
    /// with its lease (the hold's end, or the lease's if that comes first).
    fn detached_release(&self) -> Option<DetachedRelease> {
        match self.hold_left() {
            Some(_) => None,
            None => self.inner.detached_release(),
        }
    }
}
