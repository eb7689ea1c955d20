//! The distlock contract: one [`DistributedLock`] trait for every backend.
//!
//! - [`DistributedLock`]: `try_acquire`, `acquire` (cancel-safe, bounded by
//!   [`LockOptions::wait`]), [`Capabilities`], and for operators `inspect`
//!   ([`LockInfo`]) and `force_release`.
//! - [`LockGuard`]: RAII; `fencing_token()`, `lost()`, `extend()`, `release()`.
//! - [`raw`]: for backend authors (the guard's handle, lease state, the
//!   watchdog that renews every lease of a client, batching, wake-ups).
//! - [`LockOwner`]: explicit, opt-in reentrancy over any backend.
//! - [`Election`]: leader election on any lock: `campaign`, `leader`,
//!   `observe`; a [`Leadership`] with its term, `proclaim`, `lost()` and
//!   `resign`.
//! - [`Holder`]: who holds a lock (identity, value), as `inspect` reads it.
//! - [`RwLockExt`]: reader-writer locks (many readers or one writer, writer
//!   preference, fenced) on every backend that offers them.
//! - [`MemoryLock`]: the in-process backend.
//!
//! The conformance suite every backend must pass, and the fault and
//! benchmark helpers, are in the `lock-testkit` crate.

mod capabilities;
mod election;
mod error;
mod guard;
mod holder;
mod info;
mod lock;
mod lock_set;
mod loss;
mod memory;
mod name;
mod options;
mod reentrant;
mod rw_lock;
mod semaphore;
mod with_lock;

pub use capabilities::{
    Capabilities, CrashRelease, Fencing, Grade, SemaphoreCapabilities, Waiting,
};
pub use election::{
    DEFAULT_NOTIFIED_REREAD, DEFAULT_POLL_INTERVAL, ELECTION_PREFIX, Election, Leader, Leadership,
    Led,
};
pub use error::{BoxError, LockError, Report};
pub use guard::{LockGuard, RELEASE_PATIENCE};
pub use holder::{Holder, MAX_IDENTITY_BYTES, MAX_VALUE_BYTES, default_identity};
pub use info::LockInfo;
pub use lock::{Changes, DistributedLock, WAIT_OVERRUN};
pub use lock_set::{LockSet, LockSetExt, MAX_SET_NAMES, MemberLost};
pub use loss::{LossKind, LossReason};
pub use memory::MemoryLock;
pub use name::MAX_NAME_BYTES;
pub use options::{Backoff, LockOptions, MIN_TTL, Wait};
pub use raw::url::redact_url;
pub use reentrant::{LockOwner, ReentrantGuard};
pub use rw_lock::{Access, RwHolderInfo, RwLockCapabilities, RwLockExt, RwLockInfo};
pub use semaphore::{PermitInfo, Semaphore, SemaphoreInfo};
pub use with_lock::with_lock;

pub mod raw;
