//! Retries of acquisitions that failed with a transient error.

use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::async_trait;
use lock_core::{
    Backoff, Capabilities, DistributedLock, LockError, LockGuard, LockInfo, LockOptions, Wait,
};
use tokio::time::Instant;

use crate::Layer;

/// Retries an acquisition that failed with a transient error
/// ([`LockError::is_transient`]: the server unreachable, no quorum), with
/// `backoff` between attempts, for at most `patience` and never past the
/// caller's wait. A refusal (`Ok(None)`), a `Timeout` and any other error
/// are returned at once. Releases, renewals and operator calls are not
/// retried.
#[derive(Debug, Clone, Copy)]
pub struct RetryLayer {
    backoff: Backoff,
    patience: Duration,
}

impl Default for RetryLayer {
    /// 50 ms growing to 2 s, for up to 30 s.
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
    /// Retry with `backoff` for at most `patience`.
    pub fn new(backoff: Backoff, patience: Duration) -> Self {
        RetryLayer { backoff, patience }
    }
}

impl Layer for RetryLayer {
    fn layer(&self, inner: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
        Arc::new(Retrying {
            inner,
            policy: *self,
        })
    }
}

struct Retrying {
    inner: Arc<dyn DistributedLock>,
    policy: RetryLayer,
}

impl Retrying {
    /// The moment after which no attempt starts: the caller's wait or our
    /// patience, whichever ends first (a single attempt's caller still
    /// gets our patience: the server was down, not the lock held).
    fn give_up_at(&self, opts: &LockOptions, started: Instant) -> Instant {
        let patience = started + self.policy.patience;
        match opts.wait {
            Wait::Up(d) => started.checked_add(d).map_or(patience, |w| w.min(patience)),
            Wait::No | Wait::Forever => patience,
        }
    }

    /// `opts` with the caller's wait cut to what is left.
    fn remaining(opts: &LockOptions, started: Instant) -> LockOptions {
        match opts.wait {
            Wait::Up(d) => opts
                .clone()
                .wait(Wait::Up(d.saturating_sub(started.elapsed()))),
            Wait::No | Wait::Forever => opts.clone(),
        }
    }

    async fn pause(&self, attempt: u32, give_up_at: Instant, e: &LockError) -> bool {
        let next = Instant::now() + self.policy.backoff.delay(attempt);
        if !e.is_transient() || matches!(e, LockError::Timeout { .. }) || next >= give_up_at {
            return false;
        }
        tracing::debug!(target: "distlock", error = %e, attempt, "transient acquisition failure; retrying");
        tokio::time::sleep_until(next).await;
        true
    }
}

#[async_trait]
impl DistributedLock for Retrying {
    async fn try_acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let give_up_at = self.give_up_at(opts, Instant::now());
        let mut attempt = 0;
        loop {
            match self.inner.try_acquire(name, opts).await {
                Err(e) if self.pause(attempt, give_up_at, &e).await => attempt += 1,
                done => return done,
            }
        }
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        let started = Instant::now();
        let give_up_at = self.give_up_at(opts, started);
        let mut attempt = 0;
        loop {
            let opts = Self::remaining(opts, started);
            match self.inner.acquire(name, &opts).await {
                Err(e) if self.pause(attempt, give_up_at, &e).await => attempt += 1,
                done => return done,
            }
        }
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        self.inner.inspect(name).await
    }

    async fn force_release(&self, name: &str) -> Result<bool, LockError> {
        self.inner.force_release(name).await
    }
}
