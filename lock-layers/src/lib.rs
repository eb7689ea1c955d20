//! Layers for any distlock lock: each wraps an `Arc<dyn DistributedLock>`
//! and is one itself, so they stack, tower-style.
//!
//! - [`TracingLayer`]: a `tracing` span per acquisition, release and
//!   renewal (backend, outcome, time waited, fencing token; the lock's name
//!   only when `debug` is enabled, since names can carry user data).
//! - [`MetricsLayer`]: metrics through the [`metrics`] facade, names
//!   defined once in [`names`]; no exporter is forced on the application.
//! - [`RetryLayer`]: retries what failed with a transient error
//!   (`Unavailable`, `QuorumNotReached`): an acquisition within the
//!   caller's wait, a guard's `extend` and `release` within its lease,
//!   with backoff and a retry budget shared by the locks it wraps.
//!
//! Order matters as with tower: the outermost layer sees what the inner
//! ones produce. `retry` inside `metrics` records one acquisition however
//! many attempts it took; `metrics` inside `retry` records every attempt.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_core::LockError> {
//! use std::sync::Arc;
//! use lock_core::{DistributedLock, LockOptions, MemoryLock};
//! use lock_layers::{LayerExt, MetricsLayer, RetryLayer, TracingLayer};
//!
//! let locks: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
//! let locks = locks
//!     .layer(RetryLayer::default())
//!     .layer(MetricsLayer)
//!     .layer(TracingLayer);
//! let guard = locks.acquire("invoice-run", &LockOptions::new()).await?;
//! assert!(guard.release().await?);
//! # Ok(()) }
//! ```

mod events;
mod metrics_layer;
mod retry;
mod stack;
mod tracing_layer;

use std::sync::Arc;

use lock_core::DistributedLock;

pub use metrics_layer::{MetricsLayer, names};
pub use retry::RetryLayer;
pub use stack::LayerStack;
pub use tracing_layer::TracingLayer;

/// Wraps a lock in another that adds behaviour (tracing, metrics,
/// retries) and is used the same way.
pub trait Layer {
    /// `inner`, wrapped.
    fn layer(&self, inner: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock>;
}

/// `lock.layer(l)`: on an `Arc<dyn DistributedLock>`, the layered lock; on
/// an `Arc` of a concrete lock (`Arc::new(PgLock::with_pool(…).await?)`),
/// a [`LayerStack`], which is the layered lock and keeps the concrete one
/// reachable ([`get_ref`](LayerStack::get_ref), for `PgLock::begin` or
/// `EtcdLock::fencing_compare`); on a [`LayerStack`], the stack with one
/// more layer outside.
pub trait LayerExt {
    /// What wrapping this lock gives.
    type Output;

    /// This lock wrapped by `layer`.
    fn layer(self, layer: impl Layer) -> Self::Output;
}

impl LayerExt for Arc<dyn DistributedLock> {
    type Output = Arc<dyn DistributedLock>;

    fn layer(self, layer: impl Layer) -> Arc<dyn DistributedLock> {
        layer.layer(self)
    }
}

impl<L: DistributedLock + 'static> LayerExt for Arc<L> {
    type Output = LayerStack<L>;

    fn layer(self, layer: impl Layer) -> LayerStack<L> {
        LayerStack::new(self).layer(layer)
    }
}

impl<L: ?Sized> LayerExt for LayerStack<L> {
    type Output = LayerStack<L>;

    fn layer(self, layer: impl Layer) -> LayerStack<L> {
        LayerStack::layer(self, layer)
    }
}
