//! The distlock contract: one [`DistributedLock`] trait for every backend.
//!
//! - [`DistributedLock`]: `try_acquire`, `acquire` (cancel-safe, bounded by
//!   [`LockOptions::wait`]), [`Capabilities`], and for operators `inspect`
//!   ([`LockInfo`]) and `force_release`.
//! - [`LockGuard`]: RAII; `fencing_token()`, `lost()`, `extend()`, `release()`.
//! - [`Watchdog`]: one renewal task per client for all auto-renewed leases;
//!   [`Batcher`] lets a backend serve many renewals with one request.
//! - [`LockOwner`]: explicit, opt-in reentrancy over any backend.
//! - [`MemoryLock`]: the in-process backend.
//! - `testkit` (feature): the conformance suite every backend must pass,
//!   with `benchkit`, `faultkit` and `tcp_proxy` for benchmarks and fault
//!   tests.

mod batch;
mod capabilities;
mod error;
mod guard;
mod info;
mod lock;
mod loss;
mod memory;
mod name;
mod options;
mod owner;
mod reentrant;
mod url_text;
mod wakeup;
mod watchdog;

#[cfg(feature = "testkit")]
pub mod benchkit;
#[cfg(feature = "testkit")]
pub mod faultkit;
#[cfg(feature = "testkit")]
pub mod scalekit;
#[cfg(feature = "testkit")]
pub mod tcp_proxy;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use async_trait::async_trait;
pub use batch::{BatchFn, Batcher};
pub use capabilities::{Capabilities, CrashRelease, Fencing, Grade, Waiting};
pub use error::{BoxError, LockError};
pub use guard::{GuardHandle, LockGuard, PendingGrant, confirmed_lease_start};
pub use info::LockInfo;
pub use lock::{Attempt, DistributedLock, acquire_by_polling, check_request, wait_deadline};
pub use loss::{
    DEFAULT_DRIFT_FACTOR, DEFAULT_SAFETY_MARGIN, LeaseState, LossKind, LossReason, drift_allowance,
    drift_allowance_with, safety_margin, validity_deadline,
};
pub use memory::MemoryLock;
pub use name::{MAX_NAME_BYTES, validate_name};
pub use options::{Backoff, LockOptions, MIN_TTL, Wait, validate_ttl};
pub use owner::OwnerToken;
pub use reentrant::{LockOwner, ReentrantGuard};
pub use url_text::{encode_userinfo, percent_decode, redact_url};
pub use wakeup::Wakeups;
pub use watchdog::{Registration, Watchdog};
