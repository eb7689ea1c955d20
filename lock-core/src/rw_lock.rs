//! Reader-writer locks: many readers or one writer per name.
//!
//! A reader-writer grant is a lock request with [`LockOptions::access`]
//! set, so it has everything a [`LockGuard`] has (a lease the watchdog
//! renews, `lost()`, `extend`, `release`, release on drop) and every layer
//! (tracing, metrics, retries, a fencing epoch) treats it as it treats a
//! lock. [`RwLockExt`] gives every [`DistributedLock`] the four ways in.
//!
//! - **Exclusion**: a writer holds alone; readers hold together.
//! - **Writer preference** (where [`RwLockCapabilities::writer_preference`]):
//!   once a writer waits, readers that come later queue behind it, so a
//!   steady stream of readers never starves a writer; readers that arrived
//!   before it keep their place.
//! - **Fencing**: one counter per name. Each write grant takes a new token;
//!   a read grant carries the token of the latest write grant before it (on
//!   a quorum backend, Redlock, possibly a larger counter that a write the
//!   majority refused left on some nodes: never a smaller one). A
//!   resource that refuses a write whose token is below the highest it has
//!   accepted refuses a writer that lost its lock to a later one (paused
//!   past its lease, cut off); a reader can check that the data it read was
//!   written under the token it carries.
//!
//! - **Upgradeable reads** (where [`RwLockCapabilities::upgradeable`]): an
//!   upgradeable reader reads beside the readers but excludes writers and
//!   other upgradeable readers, and [`LockGuard::upgrade`] makes it the
//!   writer without letting another writer in between: the upgrade waits
//!   for the other readers to leave, and readers that come after it wait
//!   behind it. The upgraded grant takes a new write token.
//!
//! Reader-writer locks, plain locks and semaphores of one name are apart.

use std::time::Duration;

use async_trait::async_trait;

use crate::capabilities::Waiting;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::holder::Holder;
use crate::lock::DistributedLock;
use crate::options::LockOptions;

/// Which side of a reader-writer lock a request asks for
/// ([`LockOptions::access`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Access {
    /// Shared: held together with other readers, never with a writer.
    Read,
    /// Exclusive: held alone.
    Write,
    /// Shared with readers, exclusive of writers and of other upgradeable
    /// readers, and able to become the writer ([`LockGuard::upgrade`])
    /// without another writer in between.
    Upgradeable,
}

impl Access {
    /// `"read"`, `"write"` or `"upgradeable"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
            Access::Upgradeable => "upgradeable",
        }
    }

    /// Whether this access shares the lock with readers (a read, an
    /// upgradeable read).
    pub fn is_shared(self) -> bool {
        self != Access::Write
    }

    /// Whether a holder of this access keeps `other` out: a writer keeps
    /// everyone out and is kept out by everyone; upgradeable readers keep
    /// each other out; readers share.
    pub fn keeps_out(self, other: Access) -> bool {
        self == Access::Write
            || other == Access::Write
            || (self == Access::Upgradeable && other == Access::Upgradeable)
    }
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a backend's reader-writer locks guarantee beyond what its
/// [`Capabilities`](crate::Capabilities) say of every grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwLockCapabilities {
    /// A waiting writer blocks readers that come after it, so writers are
    /// never starved.
    pub writer_preference: bool,
    /// Waiters (writers, and readers behind a writer) are served in
    /// arrival order.
    pub fair_queue: bool,
    /// How a waiter learns that the lock may be free.
    pub waiting: Waiting,
    /// Upgradeable reads ([`Access::Upgradeable`], [`LockGuard::upgrade`]).
    pub upgradeable: bool,
}

impl RwLockCapabilities {
    /// Reader-writer locks without writer preference, unfair, polled.
    pub const fn new() -> Self {
        RwLockCapabilities {
            writer_preference: false,
            fair_queue: false,
            waiting: Waiting::Polling,
            upgradeable: false,
        }
    }

    /// With [`writer_preference`](Self::writer_preference).
    pub const fn with_writer_preference(mut self, on: bool) -> Self {
        self.writer_preference = on;
        self
    }

    /// With [`fair_queue`](Self::fair_queue).
    pub const fn with_fair_queue(mut self, fair_queue: bool) -> Self {
        self.fair_queue = fair_queue;
        self
    }

    /// With [`waiting`](Self::waiting).
    pub const fn with_waiting(mut self, waiting: Waiting) -> Self {
        self.waiting = waiting;
        self
    }

    /// With [`upgradeable`](Self::upgradeable).
    pub const fn with_upgradeable(mut self, on: bool) -> Self {
        self.upgradeable = on;
        self
    }
}

impl Default for RwLockCapabilities {
    fn default() -> Self {
        Self::new()
    }
}

/// Reader-writer locking on every [`DistributedLock`] (a blanket
/// implementation; bring the trait into scope). A backend without
/// reader-writer locks ([`Capabilities::rw_lock`](crate::Capabilities::rw_lock)
/// is `None`) answers [`LockError::Unsupported`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// use lock_core::{LockOptions, MemoryLock, RwLockExt};
/// let locks = MemoryLock::new();
/// let opts = LockOptions::new();
/// // Two jobs read the dataset together...
/// let a = locks.acquire_read("dataset", &opts).await?;
/// let b = locks.acquire_read("dataset", &opts).await?;
/// // ...while nobody rewrites it.
/// assert!(locks.try_acquire_write("dataset", &opts).await?.is_none());
/// a.release().await?;
/// b.release().await?;
/// let writer = locks.acquire_write("dataset", &opts).await?;
/// assert!(writer.fencing_token().is_some());
/// # Ok(()) }
/// ```
#[async_trait]
pub trait RwLockExt: DistributedLock {
    /// Take `name` for reading, waiting as `opts.wait` says (then
    /// [`LockError::Timeout`]). Cancel-safe.
    async fn acquire_read(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        self.acquire(name, &opts.clone().access(Access::Read)).await
    }

    /// Take `name` for writing, waiting as `opts.wait` says (then
    /// [`LockError::Timeout`]). Cancel-safe.
    async fn acquire_write(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        self.acquire(name, &opts.clone().access(Access::Write))
            .await
    }

    /// Take `name` for reading if that can be done now (no writer holds
    /// or waits); `None` otherwise.
    async fn try_acquire_read(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.try_acquire(name, &opts.clone().access(Access::Read))
            .await
    }

    /// Take `name` for writing if nobody holds it now; `None` otherwise.
    async fn try_acquire_write(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.try_acquire(name, &opts.clone().access(Access::Write))
            .await
    }

    /// Take `name` for an upgradeable read, waiting as `opts.wait` says
    /// (then [`LockError::Timeout`]): beside the readers, alone among
    /// writers and upgradeable readers; [`LockGuard::upgrade`] makes it
    /// the writer. [`LockError::Unsupported`] where the backend offers no
    /// upgradeable reads ([`RwLockCapabilities::upgradeable`]). Cancel-safe.
    async fn acquire_upgradeable(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        self.acquire(name, &opts.clone().access(Access::Upgradeable))
            .await
    }

    /// Take `name` for an upgradeable read if that can be done now (no
    /// writer or upgradeable reader holds, no writer waits); `None`
    /// otherwise.
    async fn try_acquire_upgradeable(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.try_acquire(name, &opts.clone().access(Access::Upgradeable))
            .await
    }
}

impl<L: DistributedLock + ?Sized> RwLockExt for L {}

/// What the server says about a reader-writer lock
/// ([`DistributedLock::inspect_rw`]). A snapshot, as
/// [`inspect`](DistributedLock::inspect) is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwLockInfo {
    /// How it is held now: by a writer, by readers, or (`None`) not at all.
    pub mode: Option<Access>,
    /// The holders: one writer, or the readers (an upgradeable reader
    /// among them), where the backend can list them (Postgres and MySQL
    /// list a writer, not the readers sharing a row).
    pub holders: Vec<RwHolderInfo>,
    /// The token of the latest write grant, where the backend keeps it
    /// readable (the token a new reader would carry).
    pub fencing_token: Option<u64>,
    /// How many writers wait, where the server can tell.
    pub waiting_writers: Option<usize>,
    /// How many readers wait, where the server can tell.
    pub waiting_readers: Option<usize>,
}

impl RwLockInfo {
    /// A lock nobody holds.
    pub fn free() -> Self {
        RwLockInfo::default()
    }

    /// Held by `holders` (readers, an upgradeable reader among them, or
    /// one writer); free if empty.
    pub fn held(holders: Vec<RwHolderInfo>) -> Self {
        let mode = if holders.iter().any(|h| h.access == Access::Write) {
            Some(Access::Write)
        } else if holders.is_empty() {
            None
        } else {
            Some(Access::Read)
        };
        RwLockInfo {
            mode,
            holders,
            ..RwLockInfo::default()
        }
    }

    /// With [`fencing_token`](Self::fencing_token).
    pub fn with_fencing_token(mut self, token: Option<u64>) -> Self {
        self.fencing_token = token;
        self
    }

    /// With the numbers of waiting writers and readers.
    pub fn with_waiting(mut self, writers: Option<usize>, readers: Option<usize>) -> Self {
        self.waiting_writers = writers;
        self.waiting_readers = readers;
        self
    }
}

/// One holder of a reader-writer lock ([`RwLockInfo::holders`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwHolderInfo {
    /// Reading or writing.
    pub access: Access,
    /// Its fencing token (a reader's: the latest write's), where readable.
    pub fencing_token: Option<u64>,
    /// How long its lease runs unless renewed, where the server keeps one.
    pub expires_in: Option<Duration>,
    /// Who holds it, where the backend records it.
    pub holder: Option<Holder>,
}

impl RwHolderInfo {
    /// A holder for `access`, the rest unknown until set.
    pub fn new(access: Access) -> Self {
        RwHolderInfo {
            access,
            fencing_token: None,
            expires_in: None,
            holder: None,
        }
    }

    /// With [`fencing_token`](Self::fencing_token).
    pub fn with_fencing_token(mut self, token: Option<u64>) -> Self {
        self.fencing_token = token;
        self
    }

    /// With [`expires_in`](Self::expires_in).
    pub fn with_expires_in(mut self, expires_in: Option<Duration>) -> Self {
        self.expires_in = expires_in;
        self
    }

    /// With [`holder`](Self::holder).
    pub fn with_holder(mut self, holder: Option<Holder>) -> Self {
        self.holder = holder;
        self
    }
}

/// Check the reader-writer side of `opts`: offered by the backend
/// (`offered`), and not mixed with a semaphore's permits.
pub(crate) fn validate_access(
    opts: &LockOptions,
    offered: Option<RwLockCapabilities>,
    backend: &'static str,
) -> Result<(), LockError> {
    let Some(access) = opts.access else {
        return Ok(());
    };
    let Some(offered) = offered else {
        return Err(LockError::Unsupported {
            backend,
            operation: "reader-writer locks",
        });
    };
    if access == Access::Upgradeable && !offered.upgradeable {
        return Err(LockError::Unsupported {
            backend,
            operation: "upgradeable reads",
        });
    }
    if let Some(limit) = opts.permits {
        return Err(LockError::invalid_options(format!(
            "a request is for a {access} lock or for one of {limit} permits, not both"
        )));
    }
    Ok(())
}
