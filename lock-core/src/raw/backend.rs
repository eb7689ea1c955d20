//! The trait a backend implements, [`RawLock`], and the one request path
//! that makes every `RawLock` a [`DistributedLock`]: the checks, the wait
//! deadline, `Wait::No` and the `Timeout` error are written here once, so
//! that no backend repeats them.

use async_trait::async_trait;

use crate::capabilities::Capabilities;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::info::LockInfo;
use crate::lock::{Changes, DistributedLock, WAIT_OVERRUN};
use crate::lock_set::{check_atomic_set, set_names};
use crate::options::{LockOptions, Wait};
use crate::raw::timing::{server_options, with_hold};
use crate::raw::{Attempt, Request, acquire_by_polling};
use crate::rw_lock::RwLockInfo;
use crate::semaphore::SemaphoreInfo;

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

    /// One request for a whole set, all or none, without waiting
    /// ([`DistributedLock::try_acquire_set`]): `Ok(None)` when any member
    /// is held by someone else, and then none was taken. `reqs` are the
    /// members, checked, distinct and in the names' order, at most
    /// [`Capabilities::atomic_sets`]; the guards come in the same order.
    /// Must be cancel-safe. Only called where `atomic_sets` is not 0; the
    /// default answers [`LockError::Unsupported`].
    async fn attempt_set_once(
        &self,
        reqs: &[Request<'_>],
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        let _ = reqs;
        Err(LockError::Unsupported {
            backend: self.raw_capabilities().backend,
            operation: "atomic lock sets",
        })
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

    /// See [`DistributedLock::inspect_semaphore`]; `name` is not yet
    /// validated. The default answers [`LockError::Unsupported`].
    async fn raw_inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        let _ = name;
        Err(LockError::Unsupported {
            backend: self.raw_capabilities().backend,
            operation: "semaphores",
        })
    }

    /// See [`DistributedLock::inspect_rw`]; `name` is validated. The
    /// default answers [`LockError::Unsupported`].
    async fn raw_inspect_rw(&self, name: &str) -> Result<RwLockInfo, LockError> {
        let _ = name;
        Err(LockError::Unsupported {
            backend: self.raw_capabilities().backend,
            operation: "reader-writer locks",
        })
    }

    /// See [`DistributedLock::changes`]; `name` is not yet validated. The
    /// default answers `Ok(None)`: no notifications, observers poll.
    async fn raw_changes(&self, name: &str) -> Result<Option<Changes>, LockError> {
        let _ = name;
        Ok(None)
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
        let server = server_options(opts);
        let req = Request {
            opts: &server,
            ..Request::checked(name, opts, &self.raw_capabilities())?
        };
        Ok(self.attempt_once(req).await?.map(|g| with_hold(g, opts)))
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        let server = server_options(opts);
        let req = Request {
            opts: &server,
            ..Request::checked(name, opts, &self.raw_capabilities())?
        };
        let granted = match (opts.wait, req.deadline) {
            (Wait::No, _) => self.attempt_once(req).await?,
            (_, Some(deadline)) => {
                match tokio::time::timeout_at(deadline + WAIT_OVERRUN, self.wait(req)).await {
                    Ok(granted) => granted?,
                    Err(_) => {
                        tracing::warn!(target: "distlock",
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
        granted
            .map(|g| with_hold(g, opts))
            .ok_or_else(|| req.timeout())
    }

    fn capabilities(&self) -> Capabilities {
        self.raw_capabilities()
    }

    async fn try_acquire_set(
        &self,
        names: &[&str],
        opts: &LockOptions,
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        let caps = self.raw_capabilities();
        let names = set_names(names, opts)?;
        check_atomic_set(&caps, names.len())?;
        let server = server_options(opts);
        let reqs = names
            .iter()
            .map(|name| {
                Ok(Request {
                    opts: &server,
                    ..Request::checked(name, opts, &caps)?
                })
            })
            .collect::<Result<Vec<_>, LockError>>()?;
        Ok(self
            .attempt_set_once(&reqs)
            .await?
            .map(|guards| guards.into_iter().map(|g| with_hold(g, opts)).collect()))
    }

    async fn inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        self.raw_inspect(name).await
    }

    async fn inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        crate::name::validate_name(name)?;
        self.raw_inspect_semaphore(name).await
    }

    async fn inspect_rw(&self, name: &str) -> Result<RwLockInfo, LockError> {
        crate::name::validate_name(name)?;
        self.raw_inspect_rw(name).await
    }

    async fn changes(&self, name: &str) -> Result<Option<Changes>, LockError> {
        self.raw_changes(name).await
    }

    async fn force_release(&self, name: &str) -> Result<bool, LockError> {
        self.raw_force_release(name).await
    }
}
