//! For backend authors: the pieces a backend is built from, none of which
//! an application needs to take, hold or compare locks.
//!
//! - [`GuardHandle`] is what a backend implements behind a [`LockGuard`](crate::LockGuard)
//!   (release and extend by owner token, and a [`DetachedRelease`] for a
//!   guard dropped as its runtime shuts down); [`PendingGrant`] makes one
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
//!   wait until a [`Request`]'s deadline, whose [`Kind`] says which
//!   primitive it asks for; [`Kind::turn`] is the one queue decision); [`DistributedLock`](crate::DistributedLock)
//!   follows from it, with the checks, the deadline and `Wait::No` in
//!   one place.
//! - [`Retry`] sends one request again under a [`RetryPolicy`], a
//!   backoff and a [`RetryBudget`]: every retry of the library is one.
//! - [`LayeredLock`] is a lock that wraps another and writes only what it
//!   changes; [`Layered`] makes it a [`DistributedLock`](crate::DistributedLock)
//!   that forwards the rest.
//! - [`Wakeups`] wakes waiters by name; [`WaitLoop`] pauses a wait between
//!   its attempts (deadline, backoff, wake-up); [`acquire_by_polling`]
//!   builds a wait from single attempts; [`check_request`] and [`wait_deadline`]
//!   are the checks and the deadline a [`Request`] is made with.
//! - [`LockUrl`] is a backend URL parsed once (scheme, decoded
//!   credentials, hosts, path, query) and shown without its password;
//!   [`UrlOptions`] reads every backend URL's query options the same
//!   way (typed, durations with units, unknown options refused).
//! - [`HolderRecord`] is the byte string a grant stores for its holder
//!   (identity, time, value), the same on every backend.
//! - [`validate_name`] and [`validate_ttl`] check what a caller hands in.
//! - [`async_trait`](macro@async_trait) is the attribute every implementation of
//!   [`RawLock`] and [`GuardHandle`] carries.

mod backend;
mod batch;
pub(crate) mod detached;
pub(crate) mod handle;
mod kind;
mod layered;
mod lease;
mod owner;
mod request;
mod retry;
pub(crate) mod timing;
pub(crate) mod url;
mod url_options;
pub(crate) mod wait;
mod wait_mark;
mod wakeup;
mod watchdog;

pub use crate::guard::{RawGuard, Unrenewed};
pub use crate::holder::HolderRecord;
pub use crate::name::validate_name;
pub use crate::options::validate_ttl;
pub use crate::semaphore::limit_mismatch;
pub use async_trait::async_trait;
pub use backend::RawLock;
pub use batch::{BatchFn, Batcher};
pub use detached::{DETACHED_PATIENCE, DetachedRelease};
pub use handle::{CleanUpOnDrop, GuardHandle, PendingGrant, confirmed_lease_start};
pub use kind::{Kind, Turn};
pub use layered::{Layered, LayeredLock};
pub use lease::{
    DEFAULT_DRIFT_FACTOR, DEFAULT_SAFETY_MARGIN, LeaseState, RenewalObserver, RenewalOutcome,
    drift_allowance, drift_allowance_with, lease_millis, safety_margin, validity_deadline,
};
pub use owner::OwnerToken;
pub use request::{Request, check_request, wait_deadline};
pub use retry::{Retry, RetryBudget, RetryPolicy};
pub use timing::asked_options;
pub use url::{HostPort, LockUrl};
pub use url_options::UrlOptions;
pub use wait::{Attempt, Pace, WaitLoop, acquire_by_polling, granted_too_late};
pub use wait_mark::{Arrival, MARK_RENEWAL, MARK_TTL, READER_MARK, Unmark, WaitMark};
pub use wakeup::Wakeups;
pub use watchdog::{Registration, Watchdog};
