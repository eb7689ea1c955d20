//! Waiting built from single attempts: [`acquire_by_polling`] for a
//! backend whose server cannot wake its waiters, and the check that a
//! grant answered after a long wait is still of use.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::LockError;
use crate::guard::LockGuard;
use crate::options::LockOptions;
use crate::raw::{LeaseState, Request};

/// The outcome of one attempt by a polling backend.
#[derive(Debug)]
pub enum Attempt {
    /// The lock was granted.
    Acquired(LockGuard),
    /// Someone else holds it; `expires_in` is how long their lease has left,
    /// if the server said so (used to cap the next sleep).
    Held {
        /// The holder's remaining lease, if known.
        expires_in: Option<Duration>,
    },
    /// Granted, but the answer came so late that the lease was over (or
    /// nearly) when it arrived, and the backend gave it back. Nobody else
    /// holds the lock, so this is not [`Attempt::Held`]: a single attempt
    /// reports the transient error it carries ([`granted_too_late`]), a
    /// wait tries again.
    TooLate(LockError),
}

impl Attempt {
    /// The outcome of a single attempt (`try_acquire`): the guard, `None`
    /// when someone else holds the lock, the transient error of a grant
    /// that came too late.
    pub fn into_guard(self) -> Result<Option<LockGuard>, LockError> {
        match self {
            Attempt::Acquired(g) => Ok(Some(g)),
            Attempt::Held { .. } => Ok(None),
            Attempt::TooLate(e) => Err(e),
        }
    }
}

/// The error of a grant that arrived `took` after its request, too late to
/// be of use under a `ttl` lease, and was given back: `Unavailable`
/// (transient; the machine or the network was too slow), never "held".
pub fn granted_too_late(
    backend: &'static str,
    name: &str,
    took: Duration,
    ttl: Duration,
) -> LockError {
    LockError::Unavailable {
        backend,
        reason: format!(
            "lock {name:?} was granted {took:?} after the request, too late for its {ttl:?} lease, and given back; try again"
        ),
        source: None,
    }
}

/// The lease of a grant of `name` answered now to a request sent at
/// `sent_at` under `opts`, or, if its validity deadline (the TTL less the
/// safety margin, counted from `sent_at`) has already passed, the error of
/// a grant too late to be of use ([`granted_too_late`]). Backends reach it
/// through [`PendingGrant::grant_in_time`](crate::raw::PendingGrant::grant_in_time),
/// which also gives such a grant back.
pub(crate) fn lease_if_in_time(
    backend: &'static str,
    name: &str,
    sent_at: Instant,
    opts: &LockOptions,
) -> Result<LeaseState, LockError> {
    let lease = LeaseState::granted(sent_at, opts);
    match lease.deadline() {
        Some(deadline) if deadline <= Instant::now() => {
            Err(granted_too_late(backend, name, sent_at.elapsed(), opts.ttl))
        }
        _ => Ok(lease),
    }
}

/// Repeat `attempt` with the request's backoff (never sleeping past the
/// holder's remaining lease or the wait deadline) until it acquires
/// (`Ok(Some)`) or the deadline passes (`Ok(None)`). For backends whose
/// server cannot notify waiters. If `wake` is given, a notification on it
/// (a release elsewhere in this process, see [`Wakeups`](crate::raw::Wakeups))
/// cuts the current sleep short; a wake-up that arrives while an attempt
/// is in flight is not lost.
///
/// `attempt` receives the number of earlier attempts, so a backend can make
/// later attempts cheaper (check before taking a write lock).
pub async fn acquire_by_polling<F, Fut>(
    req: Request<'_>,
    wake: Option<Arc<Notify>>,
    mut attempt: F,
) -> Result<Option<LockGuard>, LockError>
where
    F: FnMut(u32) -> Fut + Send,
    Fut: Future<Output = Result<Attempt, LockError>> + Send,
{
    let idle = Notify::new();
    let wake = wake.as_deref().unwrap_or(&idle);
    let mut tries: u32 = 0;
    loop {
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let expires_in = match attempt(tries).await? {
            Attempt::Acquired(guard) => return Ok(Some(guard)),
            Attempt::Held { expires_in } => expires_in,
            Attempt::TooLate(e) => {
                // Free, but the grant came too late: try again at once
                // while the wait lasts.
                if req.expired_at(Instant::now()) {
                    return Err(e);
                }
                tries = tries.saturating_add(1);
                tokio::task::yield_now().await;
                continue;
            }
        };
        let now = Instant::now();
        if req.expired_at(now) {
            return Ok(None);
        }
        let mut pause = req.opts.backoff.delay(tries);
        if let Some(left) = expires_in {
            pause = pause.min(left + Duration::from_millis(1));
        }
        let mut until = now + pause;
        if let Some(d) = req.deadline {
            until = until.min(d);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(until) => {}
            _ = woken => {}
        }
        tries = tries.saturating_add(1);
    }
}
