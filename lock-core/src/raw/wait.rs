//! Waiting built from single attempts: the [`WaitLoop`] every wait is
//! written with, [`acquire_by_polling`] on it for a backend whose server
//! cannot wake its waiters, and the check that a grant answered after a
//! long wait is still of use.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;
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

/// How long a wait pauses before its next attempt (never past its
/// deadline, and cut short by a wake-up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// The request's backoff for this attempt, but no longer than the
    /// holder's remaining lease (and a millisecond), when it is known.
    Backoff {
        /// The holder's remaining lease, if the server said.
        holder_left: Option<Duration>,
    },
    /// For this long.
    For(Duration),
    /// Until this moment.
    Until(Instant),
    /// Until woken.
    Woken,
}

/// The pauses of one wait for a lock, between its attempts: the request's
/// deadline, its backoff, and a wake-up signal (a release in this process,
/// a server's notification) armed before each attempt, so that a wake-up
/// that arrives while an attempt is in flight is not lost. Every wait of
/// the library is a loop of attempts and [`pause`](Self::pause)s, or waits
/// for a server's event with [`Request::or_deadline`].
pub struct WaitLoop<'r> {
    req: Request<'r>,
    wake: Option<Arc<Notify>>,
    woken: Option<Pin<Box<OwnedNotified>>>,
    tries: u32,
}

impl<'r> WaitLoop<'r> {
    /// The wait of `req`, woken early by `wake` if given (armed now,
    /// before the first attempt).
    pub fn new(req: Request<'r>, wake: Option<Arc<Notify>>) -> Self {
        let mut wait = WaitLoop {
            req,
            wake,
            woken: None,
            tries: 0,
        };
        wait.arm();
        wait
    }

    /// The request waited for.
    pub fn request(&self) -> &Request<'r> {
        &self.req
    }

    /// How many pauses came before the current attempt.
    pub fn tries(&self) -> u32 {
        self.tries
    }

    /// Whether the wait's deadline has passed.
    pub fn expired(&self) -> bool {
        self.req.expired_at(Instant::now())
    }

    /// Pause before the next attempt, for `pace` but never past the
    /// deadline, and no longer once woken. `false`, at once, if the
    /// deadline has already passed: the wait is over.
    pub async fn pause(&mut self, pace: Pace) -> bool {
        let now = Instant::now();
        if self.req.expired_at(now) {
            return false;
        }
        let until = match pace {
            Pace::Backoff { holder_left } => {
                let pause = self.req.opts.backoff.delay(self.tries);
                let pause = holder_left.map_or(pause, |left| {
                    pause.min(left.saturating_add(Duration::from_millis(1)))
                });
                now.checked_add(pause)
            }
            Pace::For(pause) => now.checked_add(pause),
            Pace::Until(at) => Some(at),
            Pace::Woken => None,
        };
        let until = match (until, self.req.deadline) {
            (Some(u), Some(d)) => Some(u.min(d)),
            (u, d) => u.or(d),
        };
        let woken = async {
            match self.woken.as_mut() {
                Some(woken) => woken.as_mut().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = sleep_until_some(until) => {}
            () = woken => {}
        }
        self.arm();
        self.tries = self.tries.saturating_add(1);
        true
    }

    /// Listen for the next wake-up.
    fn arm(&mut self) {
        self.woken = self.wake.as_ref().map(|wake| {
            let mut woken = Box::pin(Arc::clone(wake).notified_owned());
            woken.as_mut().enable();
            woken
        });
    }
}

/// Sleep until `at`, or for ever.
pub(crate) async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
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
    let mut wait = WaitLoop::new(req, wake);
    let mut attempts: u32 = 0;
    loop {
        // The last attempt's grant came too late: what a wait that ends
        // now reports (the lock was free, so `None`, "held", would be
        // untrue). One check of the deadline, in `pause`, decides.
        let mut too_late = None;
        let pace = match attempt(attempts).await? {
            Attempt::Acquired(guard) => return Ok(Some(guard)),
            Attempt::Held { expires_in } => Pace::Backoff {
                holder_left: expires_in,
            },
            // Free, but the grant came too late: again at once while the
            // wait lasts.
            Attempt::TooLate(e) => {
                too_late = Some(e);
                Pace::For(Duration::ZERO)
            }
        };
        if !wait.pause(pace).await {
            return too_late.map_or(Ok(None), Err);
        }
        attempts = attempts.saturating_add(1);
    }
}
