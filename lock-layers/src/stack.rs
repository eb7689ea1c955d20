//! A concrete lock under its layers, still reachable as its own type.

use std::fmt;
use std::sync::Arc;

use lock_core::raw::async_trait;
use lock_core::{
    Capabilities, Changes, DistributedLock, LockError, LockGuard, LockInfo, LockOptions,
    RwLockInfo, SemaphoreInfo,
};

use crate::Layer;

/// A lock of type `T` wrapped by layers: a [`DistributedLock`] that goes
/// through the layers, and the `T` underneath for its own methods
/// (`PgLock::begin`, `EtcdLock::fencing_compare`), as tower's wrappers give
/// `get_ref` and `into_inner`.
///
/// Made by [`LayerExt::layer`](crate::LayerExt::layer) on an `Arc<T>`;
/// each further `.layer(…)` wraps the outermost layer.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// use std::sync::Arc;
/// use lock_core::{DistributedLock, LockOptions, MemoryLock};
/// use lock_layers::{LayerExt, MetricsLayer, TracingLayer};
///
/// let locks = Arc::new(MemoryLock::new()).layer(MetricsLayer).layer(TracingLayer);
/// let guard = locks.acquire("invoice-run", &LockOptions::new()).await?; // through both layers
/// let memory: &MemoryLock = locks.get_ref(); // the lock underneath, as its own type
/// assert!(memory.inspect("invoice-run").await?.held);
/// assert!(guard.release().await?);
/// # Ok(()) }
/// ```
pub struct LayerStack<T: ?Sized> {
    inner: Arc<T>,
    outer: Arc<dyn DistributedLock>,
}

impl<T: DistributedLock + 'static> LayerStack<T> {
    /// `inner` with no layer yet.
    pub fn new(inner: Arc<T>) -> Self {
        let outer: Arc<dyn DistributedLock> = Arc::clone(&inner) as Arc<dyn DistributedLock>;
        LayerStack { inner, outer }
    }
}

impl<T: ?Sized> LayerStack<T> {
    /// Wrapped by `layer`, outside the layers it has.
    pub fn layer(self, layer: impl Layer) -> Self {
        LayerStack {
            outer: layer.layer(self.outer),
            inner: self.inner,
        }
    }

    /// The lock underneath the layers.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// The lock underneath the layers, shared.
    pub fn inner(&self) -> &Arc<T> {
        &self.inner
    }

    /// The lock underneath the layers; the layers are dropped.
    pub fn into_inner(self) -> Arc<T> {
        self.inner
    }

    /// The layered lock, its type erased (to store beside other backends'
    /// locks, or to pass where an `Arc<dyn DistributedLock>` is expected).
    pub fn into_dyn(self) -> Arc<dyn DistributedLock> {
        self.outer
    }

    /// The outermost layer.
    pub fn outer(&self) -> &Arc<dyn DistributedLock> {
        &self.outer
    }
}

impl<T: ?Sized> Clone for LayerStack<T> {
    fn clone(&self) -> Self {
        LayerStack {
            inner: Arc::clone(&self.inner),
            outer: Arc::clone(&self.outer),
        }
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for LayerStack<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerStack")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<T: ?Sized> From<LayerStack<T>> for Arc<dyn DistributedLock> {
    fn from(stack: LayerStack<T>) -> Self {
        stack.outer
    }
}

#[async_trait]
impl<T: ?Sized + Send + Sync> DistributedLock for LayerStack<T> {
    async fn try_acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.outer.try_acquire(name, opts).await
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        self.outer.acquire(name, opts).await
    }

    async fn try_acquire_set(
        &self,
        names: &[&str],
        opts: &LockOptions,
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        self.outer.try_acquire_set(names, opts).await
    }

    fn capabilities(&self) -> Capabilities {
        self.outer.capabilities()
    }

    async fn inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        self.outer.inspect(name).await
    }

    async fn inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        self.outer.inspect_semaphore(name).await
    }

    async fn inspect_rw(&self, name: &str) -> Result<RwLockInfo, LockError> {
        self.outer.inspect_rw(name).await
    }

    async fn changes(&self, name: &str) -> Result<Option<Changes>, LockError> {
        self.outer.changes(name).await
    }

    async fn force_release(&self, name: &str) -> Result<bool, LockError> {
        self.outer.force_release(name).await
    }
}
