//! Retries of what failed with a transient error: acquisitions, and a
//! guard's own `extend` and `release`.

use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::{
    GuardHandle, Layered, LayeredLock, LeaseState, RawGuard, Retry, RetryBudget, async_trait,
};
use lock_core::{Backoff, DistributedLock, LockError, LockGuard, LockOptions, Wait};
use tokio::time::Instant;

use crate::Layer;

/// Retries what failed with a transient error ([`LockError::is_transient`]:
/// the server unreachable, no quorum), with `backoff` between attempts,
/// for at most `patience`, and each retry paid for from a [`RetryBudget`]
/// shared by every lock this layer wraps (so that an outage does not
/// multiply the load on the servers as they come back).
///
/// - An acquisition is retried within the caller's wait; a refusal
///   (`Ok(None)`), a `Timeout` and any other error are returned at once.
/// - A guard's [`extend`](LockGuard::extend) is retried until its validity
///   deadline (setting the lease from now is the same request however
///   often it lands).
/// - A guard's [`release`](LockGuard::release) is retried too; when a
///   retry finds the lock gone after an earlier attempt failed, that
///   attempt may have released it, so the answer is the earlier attempt's
///   error rather than a `false` that would say the lock had been lost.
///
/// Renewals by the watchdog and operator calls (`inspect`,
/// `force_release`) are not retried: the watchdog keeps renewing on its
/// own schedule, and an operator sees the failure.
#[derive(Debug, Clone)]
pub struct RetryLayer {
    backoff: Backoff,
    patience: Duration,
    budget: Arc<RetryBudget>,
}

impl Default for RetryLayer {
    /// 50 ms growing to 2 s, for up to 30 s, within the default budget
    /// (20 % of first attempts plus 10 retries a second).
    fn default() -> Self {
        RetryLayer::new(
            Backoff::default()
                .with_initial(Duration::from_millis(50))
                .with_max(Duration::from_secs(2)),
            Duration::from_secs(30),
        )
    }
}

impl RetryLayer {
    /// Retry with `backoff` for at most `patience`, within the default
    /// budget.
    pub fn new(backoff: Backoff, patience: Duration) -> Self {
        RetryLayer {
            backoff,
            patience,
            budget: Arc::new(RetryBudget::default()),
        }
    }

    /// Pay for retries from `budget` instead of the default one.
    pub fn with_budget(mut self, budget: RetryBudget) -> Self {
        self.budget = Arc::new(budget);
        self
    }

    /// The retries of one request: no retry past `deadline`.
    fn retry(&self, deadline: Option<Instant>) -> Retry<'_> {
        Retry::with_backoff(self.backoff)
            .patience(self.patience)
            .deadline(deadline)
            .budget(&self.budget)
    }

    /// The guard with its `extend` and `release` retried.
    fn wrap(&self, guard: LockGuard, backend: &'static str) -> LockGuard {
        let lease = Arc::clone(guard.lease());
        let name = guard.name().to_string();
        guard.map_handle(|inner| {
            Arc::new(RetryingHandle {
                inner,
                backend,
                name,
                lease,
                layer: self.clone(),
            })
        })
    }
}

impl Layer for RetryLayer {
    fn layer(&self, inner: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
        Arc::new(Layered::new(Retrying {
            inner,
            layer: self.clone(),
        }))
    }
}

/// An acquisition's transient failure, other than a wait that ran out.
fn transient(e: &LockError) -> bool {
    e.is_transient() && !matches!(e, LockError::Timeout { .. })
}

struct Retrying {
    inner: Arc<dyn DistributedLock>,
    layer: RetryLayer,
}

impl Retrying {
    /// When the caller's wait, counted from `started`, ends (a single
    /// attempt's caller still gets our patience: the server was down, not
    /// the lock held).
    fn wait_deadline(opts: &LockOptions, started: Instant) -> Option<Instant> {
        match opts.wait {
            #[allow(deprecated)]
            Wait::UpTo(d) | Wait::Up(d) => started.checked_add(d),
            Wait::No | Wait::Forever => None,
        }
    }

    /// `opts` with the caller's wait cut to what is left.
    fn remaining(opts: &LockOptions, started: Instant) -> LockOptions {
        match opts.wait {
            #[allow(deprecated)]
            Wait::UpTo(d) | Wait::Up(d) => opts
                .clone()
                .wait(Wait::UpTo(d.saturating_sub(started.elapsed()))),
            Wait::No | Wait::Forever => opts.clone(),
        }
    }
}

#[async_trait]
impl LayeredLock for Retrying {
    async fn try_acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let deadline = Self::wait_deadline(opts, Instant::now());
        let guard = self
            .layer
            .retry(deadline)
            .run("acquiring a lock", transient, |_| {
                self.inner.try_acquire(name, opts)
            })
            .await?;
        let backend = self.inner.capabilities().backend;
        Ok(guard.map(|g| self.layer.wrap(g, backend)))
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        let started = Instant::now();
        let deadline = Self::wait_deadline(opts, started);
        let guard = self
            .layer
            .retry(deadline)
            .run("acquiring a lock", transient, |_| {
                let opts = Self::remaining(opts, started);
                let inner = Arc::clone(&self.inner);
                async move { inner.acquire(name, &opts).await }
            })
            .await?;
        Ok(self.layer.wrap(guard, self.inner.capabilities().backend))
    }

    /// Retried as a try is; each member's guard retries its extends and
    /// release.
    async fn try_acquire_set(
        &self,
        names: &[&str],
        opts: &LockOptions,
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        let deadline = Self::wait_deadline(opts, Instant::now());
        let guards = self
            .layer
            .retry(deadline)
            .run("acquiring a lock set", transient, |_| {
                self.inner.try_acquire_set(names, opts)
            })
            .await?;
        let backend = self.inner.capabilities().backend;
        Ok(guards.map(|guards| {
            guards
                .into_iter()
                .map(|g| self.layer.wrap(g, backend))
                .collect()
        }))
    }

    fn inner(&self) -> &Arc<dyn DistributedLock> {
        &self.inner
    }
}

/// A guard's handle whose `extend` and `release` are retried.
struct RetryingHandle {
    inner: Arc<dyn GuardHandle>,
    backend: &'static str,
    name: String,
    lease: Arc<LeaseState>,
    layer: RetryLayer,
}

#[async_trait]
impl GuardHandle for RetryingHandle {
    async fn release(&self) -> Result<bool, LockError> {
        let mut last_send = 0;
        let outcome = self
            .layer
            .retry(self.lease.deadline())
            .run("releasing a lock", LockError::is_transient, |sent| {
                last_send = sent;
                self.inner.release()
            })
            .await;
        match outcome {
            // The earlier send may have released it: whether the lock was
            // still ours is not known.
            Ok(false) if last_send > 0 => Err(LockError::Unavailable {
                backend: self.backend,
                reason: format!(
                    "releasing lock {:?}: the lock was gone when a retry reached the server, \
                     and an earlier attempt that failed may have released it",
                    self.name
                ),
                source: None,
            }),
            other => other,
        }
    }

    fn detached_release(&self) -> Option<lock_core::raw::DetachedRelease> {
        self.inner.detached_release()
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        self.layer
            .retry(self.lease.deadline())
            .run("extending a lock", LockError::is_transient, |_| {
                self.inner.extend(ttl)
            })
            .await
    }

    /// Sent again on a transient failure: writing the same value twice is
    /// the same as once.
    async fn set_value(&self, value: &[u8]) -> Result<bool, LockError> {
        self.layer
            .retry(self.lease.deadline())
            .run(
                "replacing a holder's value",
                LockError::is_transient,
                |_| self.inner.set_value(value),
            )
            .await
    }

    /// Sent once: a transient failure is the caller's to retry (the guard
    /// is still an upgradeable read then, or the writer where the server
    /// completed the upgrade; its release gives either back).
    async fn upgrade(
        &self,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Option<u64>, LockError> {
        self.inner.upgrade(deadline).await
    }
}
