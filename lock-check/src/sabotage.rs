//! Deliberately broken backends, so the checker's own tests can show that it
//! fails when a backend misbehaves. A wrapper around any real backend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::raw::{GuardHandle, Layered, LayeredLock, LeaseState, RawGuard, async_trait};
use lock_core::{DistributedLock, LockError, LockGuard, LockOptions};

/// A defect to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Sabotage {
    /// Every other grant hands out a token lower than the real one, as a
    /// backend whose counter went backwards would.
    LowerToken,
    /// Every second acquire grants at once without asking the server (with
    /// the last token this process saw), as a backend that skipped the
    /// owner check would.
    DoubleGrant,
}

impl Sabotage {
    /// The name used on the command line and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Sabotage::LowerToken => "lower-token",
            Sabotage::DoubleGrant => "double-grant",
        }
    }
}

/// `inner`, broken as `mode` says.
pub struct SabotagedLock {
    inner: Arc<dyn DistributedLock>,
    mode: Sabotage,
    acquires: AtomicU64,
    last_token: Mutex<Option<u64>>,
}

impl SabotagedLock {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn DistributedLock>, mode: Sabotage) -> Layered<Self> {
        Layered::new(SabotagedLock {
            inner,
            mode,
            acquires: AtomicU64::new(0),
            last_token: Mutex::new(None),
        })
    }

    fn remember(&self, guard: &LockGuard) {
        if let Ok(mut last) = self.last_token.lock() {
            *last = guard.fencing_token().or(*last);
        }
    }

    fn tamper(&self, guard: LockGuard) -> LockGuard {
        self.remember(&guard);
        let n = self.acquires.fetch_add(1, Ordering::Relaxed);
        if self.mode == Sabotage::LowerToken && n % 2 == 1 {
            let token = guard.fencing_token().map(|t| t / 2);
            return guard.with_fencing_token(token);
        }
        guard
    }
}

/// A handle for a grant the server never made.
struct Phantom;

#[async_trait]
impl GuardHandle for Phantom {
    async fn release(&self) -> Result<bool, LockError> {
        Ok(true)
    }

    async fn extend(&self, _ttl: Duration) -> Result<bool, LockError> {
        Ok(true)
    }
}

#[async_trait]
impl LayeredLock for SabotagedLock {
    async fn try_acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        Ok(self
            .inner
            .try_acquire(name, opts)
            .await?
            .map(|g| self.tamper(g)))
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        if self.mode == Sabotage::DoubleGrant {
            let n = self.acquires.fetch_add(1, Ordering::Relaxed);
            let last = self.last_token.lock().ok().and_then(|t| *t);
            if n % 2 == 1 && last.is_some() {
                let lease = Arc::new(LeaseState::granted(tokio::time::Instant::now(), opts));
                let caps = self.inner.capabilities();
                return Ok(LockGuard::new(name, last, caps, lease, Arc::new(Phantom)));
            }
            let guard = self.inner.acquire(name, opts).await?;
            self.remember(&guard);
            return Ok(guard);
        }
        let guard = self.inner.acquire(name, opts).await?;
        Ok(self.tamper(guard))
    }

    async fn try_acquire_set(
        &self,
        names: &[&str],
        opts: &LockOptions,
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        Ok(self
            .inner
            .try_acquire_set(names, opts)
            .await?
            .map(|guards| guards.into_iter().map(|g| self.tamper(g)).collect()))
    }

    fn inner(&self) -> &Arc<dyn DistributedLock> {
        &self.inner
    }
}
