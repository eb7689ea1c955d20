//! The `DistributedLock` trait users call, the [`RawLock`] trait backends
//! implement, and the one request path between them: `DistributedLock` is
//! implemented once, for every `RawLock`, and holds the checks, the wait
//! deadline, `Wait::No` and the `Timeout` error, so that no backend
//! repeats them.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::capabilities::Capabilities;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::info::LockInfo;
use crate::loss::LeaseState;
use crate::name::validate_name;
use crate::options::{LockOptions, Wait};

/// A lock service, used as `Arc<dyn DistributedLock>` so the backend is
/// picked at run time.
///
/// Backends do not implement this trait: they implement [`RawLock`], and
/// get this one from it. Wrappers that decorate another lock (layers, a
/// migration between backends) implement it directly.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// use std::sync::Arc;
/// use lock_core::{DistributedLock, LockOptions, MemoryLock};
/// let locks: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
/// let guard = locks.try_acquire("nightly-report", &LockOptions::new()).await?;
/// assert!(guard.is_some());
/// # Ok(()) }
/// ```
#[async_trait]
pub trait DistributedLock: Send + Sync {
    /// One attempt: `Ok(None)` when someone else holds the lock.
    async fn try_acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError>;

    /// Wait until the lock is granted or `opts.wait` passes
    /// ([`LockError::Timeout`]). Cancel-safe: dropping the future leaves
    /// nothing held and no waiter registered. A bounded wait returns by
    /// its end plus [`WAIT_OVERRUN`] even when the server stops answering.
    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError>;

    /// What this backend guarantees.
    fn capabilities(&self) -> Capabilities;

    /// What the server says about `name` now, without taking it: whether it
    /// is held and, where the backend can read them, the holder's fencing
    /// token, its lease's time left and the number of waiters. A snapshot
    /// for operators (`distlock status`); it may change at once. Every
    /// backend of this project implements it; the default answers
    /// [`LockError::Unsupported`].
    async fn inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        let _ = name;
        Err(LockError::Unsupported {
            backend: self.capabilities().backend,
            operation: "inspect",
        })
    }

    /// The operator's way out for a lock whose holder is gone but whose
    /// lease is long: free `name` on the server whoever holds it, without
    /// the holder's consent. The holder's `lost()` fires when its client
    /// next hears from the server. Returns whether there was a holder.
    ///
    /// Where a lock lives as long as a session or connection (Postgres and
    /// MySQL, etcd's shared session lease), that session is ended, and the
    /// other locks it carried are lost with it; each backend's
    /// documentation says what it removes. Never part of normal locking:
    /// a holder that is alive loses its lock while it may still be working.
    async fn force_release(&self, name: &str) -> Result<bool, LockError> {
        let _ = name;
        Err(LockError::Unsupported {
            backend: self.capabilities().backend,
            operation: "force_release",
        })
    }
}

/// How long after its wait ends an [`acquire`](DistributedLock::acquire)
/// may still run: a backend that finishes a wait in line (taking its
/// queue entry back) does so within it; a request the server does not
/// answer (a crashed or frozen server, a client reconnecting) is cut off
/// then, the acquisition is a [`LockError::Timeout`], and whatever it may
/// have left on the server is given back in the background.
pub const WAIT_OVERRUN: Duration = Duration::from_secs(2);

/// An acquisition that passed the checks every backend makes: the name is
/// acceptable, the options fit the backend, and the wait has a deadline.
/// What [`RawLock`] is handed.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The lock's name, validated.
    pub name: &'a str,
    /// The options, validated against the backend's capabilities.
    pub opts: &'a LockOptions,
    /// When the acquisition began.
    pub start: Instant,
    /// When the wait ends: `start` for [`Wait::No`], `None` for
    /// [`Wait::Forever`] (or a wait too long to represent).
    pub deadline: Option<Instant>,
}

impl<'a> Request<'a> {
    /// Check `name` and `opts` against `caps` ([`check_request`]) and start
    /// the clock.
    pub fn checked(
        name: &'a str,
        opts: &'a LockOptions,
        caps: &Capabilities,
    ) -> Result<Self, LockError> {
        check_request(name, opts, caps)?;
        let start = Instant::now();
        Ok(Request {
            name,
            opts,
            start,
            deadline: wait_deadline(start, opts.wait),
        })
    }

    /// Whether the wait is over at `now`.
    pub fn expired_at(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }

    /// The [`LockError::Timeout`] of this acquisition, as of now.
    pub fn timeout(&self) -> LockError {
        LockError::Timeout {
            name: self.name.to_string(),
            waited: self.start.elapsed(),
        }
    }
}

/// What a backend implements; [`DistributedLock`] follows from it.
///
/// A backend answers two questions about a checked [`Request`]: one
/// attempt without waiting ([`attempt_once`](RawLock::attempt_once)), and
/// a wait until the request's deadline ([`wait`](RawLock::wait)), which by
/// default polls `attempt_once` with the request's backoff. The request
/// path around them (validation, the deadline, [`Wait::No`] as a single
/// attempt, the [`LockError::Timeout`] when nothing was granted) is the
/// same for every backend and lives in the one implementation of
/// `DistributedLock` for `T: RawLock`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// use lock_core::raw::{RawLock, Request, async_trait};
/// use lock_core::{Capabilities, DistributedLock, LockError, LockGuard, LockOptions, MemoryLock};
///
/// /// A backend that forwards to the in-process one.
/// struct Forward(MemoryLock);
///
/// #[async_trait]
/// impl RawLock for Forward {
///     fn raw_capabilities(&self) -> Capabilities {
///         self.0.capabilities()
///     }
///     async fn attempt_once(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
///         self.0.try_acquire(req.name, req.opts).await
///     }
/// }
///
/// let locks = Forward(MemoryLock::new());
/// let held = locks.acquire("job", &LockOptions::new()).await?;
/// assert!(locks.try_acquire("job", &LockOptions::new()).await?.is_none());
/// held.release().await?;
/// # Ok(()) }
/// ```
#[async_trait]
pub trait RawLock: Send + Sync {
    /// What this backend guarantees ([`DistributedLock::capabilities`]);
    /// requests are checked against it.
    fn raw_capabilities(&self) -> Capabilities;

    /// One attempt, without waiting: `Ok(None)` when someone else holds
    /// the lock. Must be cancel-safe (a dropped future leaves nothing held
    /// and nothing queued).
    async fn attempt_once(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError>;

    /// Wait until the lock is granted (`Ok(Some)`) or `req.deadline`
    /// passes (`Ok(None)`); never called for [`Wait::No`]. Must be
    /// cancel-safe. The default polls [`attempt_once`](RawLock::attempt_once)
    /// with `req.opts.backoff` ([`acquire_by_polling`]).
    async fn wait(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        acquire_by_polling(req, None, |_| async move {
            Ok(match self.attempt_once(req).await? {
                Some(guard) => Attempt::Acquired(guard),
                None => Attempt::Held { expires_in: None },
            })
        })
        .await
    }

    /// See [`DistributedLock::inspect`]; `name` is not yet validated. The
    /// default answers [`LockError::Unsupported`].
    async fn raw_inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        let _ = name;
        Err(LockError::Unsupported {
            backend: self.raw_capabilities().backend,
            operation: "inspect",
        })
    }

    /// See [`DistributedLock::force_release`]; `name` is not yet
    /// validated. The default answers [`LockError::Unsupported`].
    async fn raw_force_release(&self, name: &str) -> Result<bool, LockError> {
        let _ = name;
        Err(LockError::Unsupported {
            backend: self.raw_capabilities().backend,
            operation: "force_release",
        })
    }
}

/// The one request path: every backend's `DistributedLock`.
#[async_trait]
impl<T: RawLock + ?Sized> DistributedLock for T {
    async fn try_acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let req = Request::checked(name, opts, &self.raw_capabilities())?;
        self.attempt_once(req).await
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        let req = Request::checked(name, opts, &self.raw_capabilities())?;
        let granted = match (opts.wait, req.deadline) {
            (Wait::No, _) => self.attempt_once(req).await?,
            (_, Some(deadline)) => {
                match tokio::time::timeout_at(deadline + WAIT_OVERRUN, self.wait(req)).await {
                    Ok(granted) => granted?,
                    Err(_) => {
                        tracing::warn!(
                            name,
                            overrun = ?WAIT_OVERRUN,
                            "the wait's requests were still unanswered past its end; cut off"
                        );
                        None
                    }
                }
            }
            (_, None) => self.wait(req).await?,
        };
        granted.ok_or_else(|| req.timeout())
    }

    fn capabilities(&self) -> Capabilities {
        self.raw_capabilities()
    }

    async fn inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        self.raw_inspect(name).await
    }

    async fn force_release(&self, name: &str) -> Result<bool, LockError> {
        self.raw_force_release(name).await
    }
}

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

/// The checks every backend makes before touching its server: the name is
/// acceptable ([`validate_name`]) and the options fit the backend
/// ([`LockOptions::validate`]).
pub fn check_request(name: &str, opts: &LockOptions, caps: &Capabilities) -> Result<(), LockError> {
    validate_name(name)?;
    opts.validate(caps)
}

/// When `opts.wait` ends, measured from `start`; `None` for [`Wait::Forever`]
/// and for a wait too long to represent as an instant (`Duration::MAX`).
pub fn wait_deadline(start: Instant, wait: Wait) -> Option<Instant> {
    match wait {
        Wait::No => Some(start),
        Wait::Up(d) => start.checked_add(d),
        Wait::Forever => None,
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::memory::MemoryLock;

    /// A grant is in time until its validity deadline (the TTL less the
    /// safety margin), not until its TTL: inside the margin it is too late.
    #[test]
    fn a_grant_is_in_time_until_its_validity_deadline() {
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(10))
            .safety_margin(Duration::from_secs(2));
        let now = Instant::now();
        let sent = |ago: Duration| now.checked_sub(ago).expect("a monotonic clock this old");
        let in_time = |ago| lease_if_in_time("test", "n", sent(ago), &opts);
        let lease = in_time(Duration::from_secs(7)).expect("in time");
        assert!(lease.deadline().is_some_and(|d| d > now));
        let late = in_time(Duration::from_secs(9)).expect_err("inside the margin: too late");
        assert!(
            matches!(
                late,
                LockError::Unavailable {
                    backend: "test",
                    ..
                }
            ),
            "{late:?}"
        );
        assert!(in_time(Duration::from_secs(11)).is_err());
    }

    /// A backend over the in-process one that counts what the request
    /// path asks of it, and keeps the default polling `wait`.
    struct Counted {
        locks: MemoryLock,
        attempts: AtomicU32,
    }

    impl Counted {
        fn new() -> Self {
            Counted {
                locks: MemoryLock::new(),
                attempts: AtomicU32::new(0),
            }
        }

        fn attempts(&self) -> u32 {
            self.attempts.load(Ordering::SeqCst)
        }
    }

    #[async_trait]
    impl RawLock for Counted {
        fn raw_capabilities(&self) -> Capabilities {
            self.locks.raw_capabilities()
        }

        async fn attempt_once(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
            self.attempts.fetch_add(1, Ordering::SeqCst);
            self.locks.attempt_once(req).await
        }
    }

    fn options(wait: Wait) -> LockOptions {
        LockOptions::new()
            .wait(wait)
            .backoff(crate::options::Backoff {
                initial: Duration::from_millis(20),
                max: Duration::from_millis(20),
                jitter: 0.0,
                ..crate::options::Backoff::default()
            })
    }

    /// A bad name or TTL is refused, typed, before the backend is asked.
    #[tokio::test]
    async fn bad_requests_never_reach_the_backend() {
        let locks = Counted::new();
        let bad_name = locks.acquire("", &options(Wait::Forever)).await;
        assert!(
            matches!(bad_name, Err(LockError::InvalidName { .. })),
            "{bad_name:?}"
        );
        let short = options(Wait::No).ttl(Duration::from_millis(1));
        let bad_ttl = locks.try_acquire("job", &short).await;
        assert!(
            matches!(bad_ttl, Err(LockError::InvalidOptions { .. })),
            "{bad_ttl:?}"
        );
        assert_eq!(locks.attempts(), 0);
    }

    /// `Wait::No` is one attempt and, when the lock is held, a `Timeout`;
    /// the backend's wait is not entered (it would poll again).
    #[tokio::test]
    async fn wait_no_is_a_single_attempt() {
        let locks = Counted::new();
        let held = locks
            .acquire("job", &options(Wait::No))
            .await
            .expect("free");
        assert_eq!(locks.attempts(), 1);
        let refused = locks.acquire("job", &options(Wait::No)).await;
        assert!(
            matches!(refused, Err(LockError::Timeout { .. })),
            "{refused:?}"
        );
        assert_eq!(locks.attempts(), 2);
        held.release().await.expect("release");
    }

    /// A wait that ends without a grant is a `Timeout` naming the lock and
    /// the whole time waited; the default wait polled in between.
    #[tokio::test(start_paused = true)]
    async fn a_wait_without_a_grant_is_a_timeout_with_the_time_waited() {
        let locks = Counted::new();
        let _held = locks
            .acquire("job", &options(Wait::No))
            .await
            .expect("free");
        let wait = Duration::from_millis(200);
        match locks.acquire("job", &options(Wait::Up(wait))).await {
            Err(LockError::Timeout { name, waited }) => {
                assert_eq!(name, "job");
                assert!(waited >= wait, "{waited:?}");
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(
            locks.attempts() > 5,
            "{} attempts: the first and the polls",
            locks.attempts()
        );
    }

    /// A grant that came too late is not "held": a single attempt reports
    /// its transient error, a wait tries again at once and takes the next
    /// grant, and a wait that ends on one reports the error, not `Timeout`.
    #[tokio::test]
    async fn a_grant_too_late_is_retried_by_a_wait_and_reported_by_an_attempt() {
        let locks = MemoryLock::new();
        let too_late = || {
            granted_too_late(
                "memory",
                "job",
                Duration::from_millis(700),
                Duration::from_millis(500),
            )
        };
        assert!(matches!(
            Attempt::TooLate(too_late()).into_guard(),
            Err(LockError::Unavailable { .. })
        ));

        let opts = options(Wait::Up(Duration::from_secs(5)));
        let req = Request::checked("job", &opts, &locks.raw_capabilities()).expect("request");
        let calls = AtomicU32::new(0);
        let guard = acquire_by_polling(req, None, |_| {
            let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
            let (locks, opts) = (locks.clone(), opts.clone());
            async move {
                if first {
                    return Ok(Attempt::TooLate(too_late()));
                }
                let guard = locks.try_acquire("job", &opts).await?.expect("free");
                Ok(Attempt::Acquired(guard))
            }
        })
        .await
        .expect("granted")
        .expect("a guard");
        assert_eq!(calls.load(Ordering::SeqCst), 2, "one retry");
        assert!(guard.release().await.expect("release"));

        let short = options(Wait::Up(Duration::from_millis(50)));
        let req = Request::checked("job", &short, &locks.raw_capabilities()).expect("request");
        let ended =
            acquire_by_polling(req, None, |_| async { Ok(Attempt::TooLate(too_late())) }).await;
        assert!(
            matches!(ended, Err(LockError::Unavailable { .. })),
            "{ended:?}"
        );
    }

    /// A backend whose wait hangs (its server stopped answering) past the
    /// request's deadline.
    struct Hanging(MemoryLock);

    #[async_trait]
    impl RawLock for Hanging {
        fn raw_capabilities(&self) -> Capabilities {
            self.0.raw_capabilities()
        }

        async fn attempt_once(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
            self.0.attempt_once(req).await
        }

        async fn wait(&self, _req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
            std::future::pending().await
        }
    }

    /// A wait whose backend never answers ends by its deadline plus
    /// `WAIT_OVERRUN`, as a `Timeout`, not when the server comes back.
    #[tokio::test(start_paused = true)]
    async fn a_hanging_wait_is_cut_off_after_its_end() {
        let locks = Hanging(MemoryLock::new());
        let wait = Duration::from_secs(5);
        let start = Instant::now();
        let outcome = tokio::time::timeout(
            Duration::from_secs(3600),
            locks.acquire("job", &options(Wait::Up(wait))),
        )
        .await
        .expect("the wait ends by itself");
        let took = start.elapsed();
        assert!(
            matches!(outcome, Err(LockError::Timeout { .. })),
            "{outcome:?}"
        );
        assert!(
            took >= wait && took <= wait + WAIT_OVERRUN,
            "returned after {took:?} of a {wait:?} wait"
        );
    }

    /// The default wait takes the lock once it is released.
    #[tokio::test(start_paused = true)]
    async fn the_default_wait_takes_the_lock_when_it_is_free() {
        let locks = Arc::new(Counted::new());
        let held = locks
            .acquire("job", &options(Wait::No))
            .await
            .expect("free");
        let waiter = {
            let locks = Arc::clone(&locks);
            tokio::spawn(async move { locks.acquire("job", &options(Wait::Forever)).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished(), "granted while held");
        held.release().await.expect("release");
        let guard = waiter
            .await
            .expect("task")
            .expect("granted after the release");
        assert!(guard.is_lost().is_none());
    }
}
