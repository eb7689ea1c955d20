//! Locks made by wrapping another: a [`LayeredLock`] writes only what it
//! changes, and [`Layered`] makes it a [`DistributedLock`] that forwards
//! the rest (as OpenDAL's `LayeredAccess`).

use std::sync::Arc;

use async_trait::async_trait;

use crate::capabilities::Capabilities;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::info::LockInfo;
use crate::lock::{Changes, DistributedLock};
use crate::options::LockOptions;
use crate::rw_lock::RwLockInfo;
use crate::semaphore::SemaphoreInfo;

/// A lock that wraps another: every method forwards to
/// [`inner`](Self::inner) unless the wrapper overrides it. Wrap it in
/// [`Layered`] to use it as a [`DistributedLock`].
#[async_trait]
pub trait LayeredLock: Send + Sync + 'static {
    /// The wrapped lock.
    fn inner(&self) -> &Arc<dyn DistributedLock>;

    /// [`DistributedLock::try_acquire`]; forwards by default.
    async fn try_acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.inner().try_acquire(name, opts).await
    }

    /// [`DistributedLock::acquire`]; forwards by default.
    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        self.inner().acquire(name, opts).await
    }

    /// [`DistributedLock::try_acquire_set`]; forwards by default. A layer
    /// that changes the guards [`try_acquire`](Self::try_acquire) hands
    /// out changes these too, or says 0
    /// [`atomic_sets`](Capabilities::atomic_sets) in its capabilities.
    async fn try_acquire_set(
        &self,
        names: &[&str],
        opts: &LockOptions,
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        self.inner().try_acquire_set(names, opts).await
    }

    /// [`DistributedLock::capabilities`]; forwards by default.
    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }

    /// [`DistributedLock::inspect`]; forwards by default.
    async fn inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        self.inner().inspect(name).await
    }

    /// [`DistributedLock::inspect_semaphore`]; forwards by default.
    async fn inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        self.inner().inspect_semaphore(name).await
    }

    /// [`DistributedLock::inspect_rw`]; forwards by default.
    async fn inspect_rw(&self, name: &str) -> Result<RwLockInfo, LockError> {
        self.inner().inspect_rw(name).await
    }

    /// [`DistributedLock::changes`]; forwards by default.
    async fn changes(&self, name: &str) -> Result<Option<Changes>, LockError> {
        self.inner().changes(name).await
    }

    /// [`DistributedLock::force_release`]; forwards by default.
    async fn force_release(&self, name: &str) -> Result<bool, LockError> {
        self.inner().force_release(name).await
    }
}

/// A [`LayeredLock`] as a [`DistributedLock`].
#[derive(Debug, Clone, Default)]
pub struct Layered<L>(L);

impl<L: LayeredLock> Layered<L> {
    /// `layer` as a lock.
    pub fn new(layer: L) -> Self {
        Layered(layer)
    }

    /// The wrapper.
    pub fn get_ref(&self) -> &L {
        &self.0
    }

    /// The wrapper, unwrapped.
    pub fn into_inner(self) -> L {
        self.0
    }
}

#[async_trait]
impl<L: LayeredLock> DistributedLock for Layered<L> {
    async fn try_acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.0.try_acquire(name, opts).await
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        self.0.acquire(name, opts).await
    }

    async fn try_acquire_set(
        &self,
        names: &[&str],
        opts: &LockOptions,
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        self.0.try_acquire_set(names, opts).await
    }

    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    async fn inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        self.0.inspect(name).await
    }

    async fn inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        self.0.inspect_semaphore(name).await
    }

    async fn inspect_rw(&self, name: &str) -> Result<RwLockInfo, LockError> {
        self.0.inspect_rw(name).await
    }

    async fn changes(&self, name: &str) -> Result<Option<Changes>, LockError> {
        self.0.changes(name).await
    }

    async fn force_release(&self, name: &str) -> Result<bool, LockError> {
        self.0.force_release(name).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryLock;

    /// Changes nothing but the fencing token.
    struct Doubled(Arc<dyn DistributedLock>);

    #[async_trait]
    impl LayeredLock for Doubled {
        fn inner(&self) -> &Arc<dyn DistributedLock> {
            &self.0
        }

        async fn inspect(&self, name: &str) -> Result<LockInfo, LockError> {
            let info = self.0.inspect(name).await?;
            let token = info.fencing_token.map(|t| t * 2);
            Ok(info.with_fencing_token(token))
        }
    }

    #[tokio::test]
    async fn a_layer_forwards_what_it_does_not_change() {
        let inner: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
        let lock = Layered::new(Doubled(Arc::clone(&inner)));
        assert_eq!(lock.capabilities(), inner.capabilities());
        let opts = LockOptions::new();
        let guard = lock.acquire("a", &opts).await.unwrap();
        assert!(lock.try_acquire("a", &opts).await.unwrap().is_none());
        let token = guard.fencing_token().unwrap();
        assert_eq!(
            lock.inspect("a").await.unwrap().fencing_token,
            Some(token * 2)
        );
        assert!(lock.force_release("a").await.unwrap());
        assert!(inner.try_acquire("a", &opts).await.unwrap().is_some());
    }
}
