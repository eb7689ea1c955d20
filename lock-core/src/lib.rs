//! The distlock contract: one [`DistributedLock`] trait for every backend.
//!
//! - [`DistributedLock`]: `try_acquire`, `acquire` (cancel-safe, bounded by
//!   [`LockOptions::wait`]), [`Capabilities`], and for operators `inspect`
//!   ([`LockInfo`]) and `force_release`.
//! - [`LockGuard`]: RAII; `fencing_token()`, `lost()`, `extend()`, `release()`.
//! - [`raw`]: for backend authors (the guard's handle, lease state, the
//!   watchdog that renews every lease of a client, batching, wake-ups).
//! - [`LockOwner`]: explicit, opt-in reentrancy over any backend.
//! - [`MemoryLock`]: the in-process backend.
//!
//! The conformance suite every backend must pass, and the fault and
//! benchmark helpers, are in the `lock-testkit` crate.

mod batch;
mod capabilities;
mod error;
mod guard;
mod info;
mod lock;
mod lock_url;
mod loss;
mod memory;
mod name;
mod options;
mod owner;
mod reentrant;
mod url_options;
mod wakeup;
mod watchdog;

pub use capabilities::{Capabilities, CrashRelease, Fencing, Grade, Waiting};
pub use error::{BoxError, LockError};
pub use guard::{LockGuard, RELEASE_PATIENCE};
pub use info::LockInfo;
pub use lock::{DistributedLock, WAIT_OVERRUN};
pub use lock_url::redact_url;
pub use loss::{LossKind, LossReason};
pub use memory::MemoryLock;
pub use name::MAX_NAME_BYTES;
pub use options::{Backoff, LockOptions, MIN_TTL, Wait};
pub use reentrant::{LockOwner, ReentrantGuard};

pub mod raw {
    //! For backend authors: the pieces a backend is built from, none of which
    //! an application needs to take, hold or compare locks.
    //!
    //! - [`GuardHandle`] is what a backend implements behind a [`LockGuard`](crate::LockGuard)
    //!   (release and extend by owner token); [`PendingGrant`] makes one
    //!   acquisition attempt cancel-safe; [`OwnerToken`] is the random
    //!   identity a grant is stored under.
    //! - [`LeaseState`] tracks a lease's validity deadline and its loss;
    //!   [`validity_deadline`], [`safety_margin`] and the drift helpers
    //!   compute it; [`confirmed_lease_start`] is for servers that start a
    //!   lease when they grant it.
    //! - [`Watchdog`] renews every auto-renewed lease of a client from one
    //!   task, telling each lease's [`RenewalObserver`]s; [`Batcher`] serves
    //!   many renewals with one request.
    //! - [`RawLock`] is the trait a backend implements (one attempt, and a
    //!   wait until a [`Request`]'s deadline); [`DistributedLock`](crate::DistributedLock)
    //!   follows from it, with the checks, the deadline and `Wait::No` in
    //!   one place.
    //! - [`Wakeups`] wakes waiters by name; [`acquire_by_polling`] builds a
    //!   wait from single attempts; [`check_request`] and [`wait_deadline`]
    //!   are the checks and the deadline a [`Request`] is made with.
    //! - [`LockUrl`] is a backend URL parsed once (scheme, decoded
    //!   credentials, hosts, path, query) and shown without its password;
    //!   [`UrlOptions`] reads every backend URL's query options the same
    //!   way (typed, durations with units, unknown options refused).
    //! - [`validate_name`] and [`validate_ttl`] check what a caller hands in.
    //! - [`async_trait`](macro@async_trait) is the attribute every implementation of
    //!   [`RawLock`] and [`GuardHandle`] carries.

    pub use crate::batch::{BatchFn, Batcher};
    pub use crate::guard::{GuardHandle, PendingGrant, RawGuard, confirmed_lease_start};
    pub use crate::lock::{
        Attempt, RawLock, Request, acquire_by_polling, check_request, granted_too_late,
        wait_deadline,
    };
    pub use crate::lock_url::{HostPort, LockUrl};
    pub use crate::loss::{
        DEFAULT_DRIFT_FACTOR, DEFAULT_SAFETY_MARGIN, LeaseState, RenewalObserver, RenewalOutcome,
        drift_allowance, drift_allowance_with, safety_margin, validity_deadline,
    };
    pub use crate::name::validate_name;
    pub use crate::options::validate_ttl;
    pub use crate::owner::OwnerToken;
    pub use crate::url_options::UrlOptions;
    pub use crate::wakeup::Wakeups;
    pub use crate::watchdog::{Registration, Watchdog};
    pub use async_trait::async_trait;
}
