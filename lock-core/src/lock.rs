//! The `DistributedLock` trait users call. Backends implement
//! [`RawLock`](crate::raw::RawLock) instead, from which this one follows
//! (`raw/backend.rs`).

use std::time::Duration;

use async_trait::async_trait;

use crate::capabilities::Capabilities;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::info::LockInfo;
use crate::options::LockOptions;
use crate::rw_lock::RwLockInfo;
use crate::semaphore::SemaphoreInfo;

/// Server notifications that a lock may have changed
/// ([`DistributedLock::changes`]): one `Ok(())` per notification, an error
/// when the channel broke (the stream ends after it).
pub type Changes =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<(), LockError>> + Send + 'static>>;

/// A lock service, used as `Arc<dyn DistributedLock>` so the backend is
/// picked at run time.
///
/// Backends do not implement this trait: they implement
/// [`RawLock`](crate::raw::RawLock), and get this one from it. Wrappers
/// that decorate another lock (layers, a migration between backends)
/// implement it directly.
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

    /// What the server says about semaphore `name` now: its limit and the
    /// permits held (slot, fencing token, lease left, holder), where the
    /// backend offers semaphores ([`Capabilities::semaphore`]); else
    /// [`LockError::Unsupported`] (the default). A snapshot, as
    /// [`inspect`](Self::inspect) is.
    async fn inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        let _ = name;
        Err(LockError::Unsupported {
            backend: self.capabilities().backend,
            operation: "semaphores",
        })
    }

    /// What the server says about reader-writer lock `name` now: its mode,
    /// its holders (access, fencing token, lease left, holder) and the
    /// waiting writers, where the backend offers reader-writer locks
    /// ([`Capabilities::rw_lock`]); else [`LockError::Unsupported`] (the
    /// default). A snapshot, as [`inspect`](Self::inspect) is.
    async fn inspect_rw(&self, name: &str) -> Result<RwLockInfo, LockError> {
        let _ = name;
        Err(LockError::Unsupported {
            backend: self.capabilities().backend,
            operation: "reader-writer locks",
        })
    }

    /// A stream that yields each time the server says lock `name` may have
    /// changed (granted, released, its holder record rewritten), where the
    /// backend is notified by its server
    /// ([`Capabilities::observers`] is [`Waiting::Notified`](crate::Waiting::Notified));
    /// `Ok(None)` where it is not (the default). A notification carries no
    /// state: read it with [`inspect`](Self::inspect) after subscribing, and
    /// after each item. The stream ends, or yields an error and ends, when
    /// the server's channel breaks: subscribe again.
    async fn changes(&self, name: &str) -> Result<Option<Changes>, LockError> {
        let _ = name;
        Ok(None)
    }

    /// Take every name of `names` in one request to the server, all or
    /// none: `Ok(None)` when any of them is held by someone else, and then
    /// none was taken, not even for a moment. Offered for sets of up to
    /// [`Capabilities::atomic_sets`] names: [`LockError::Unsupported`]
    /// where that is 0 (the default), [`LockError::InvalidOptions`] for a
    /// larger set. The names are checked, deduplicated and sorted; the
    /// guards come in that order, each a lock of its own (lease, renewal,
    /// fencing token). `opts.wait` is not used.
    ///
    /// Call [`LockSetExt::try_acquire_all`](crate::LockSetExt::try_acquire_all)
    /// instead: it uses this where offered and takes other sets name by
    /// name. A wrapper that changes the guards it hands out implements
    /// this too, or says 0 in its capabilities.
    async fn try_acquire_set(
        &self,
        names: &[&str],
        opts: &LockOptions,
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        let _ = (names, opts);
        Err(LockError::Unsupported {
            backend: self.capabilities().backend,
            operation: "atomic lock sets",
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use std::sync::Arc;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;
    use crate::memory::MemoryLock;
    use crate::options::Wait;
    use crate::raw::wait::lease_if_in_time;
    use crate::raw::*;

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
        match locks.acquire("job", &options(Wait::UpTo(wait))).await {
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

        let opts = options(Wait::UpTo(Duration::from_secs(5)));
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

        let short = options(Wait::UpTo(Duration::from_millis(50)));
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
            locks.acquire("job", &options(Wait::UpTo(wait))),
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
