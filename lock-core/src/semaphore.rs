//! Semaphores: up to `limit` holders of one name at once.
//!
//! A permit is a lock on one of the name's `limit` slots: it has
//! everything a [`LockGuard`] has (a lease the watchdog renews, `lost()`,
//! `extend`, `release`, release on drop) and a [`slot`](LockGuard::slot).
//! Its fencing token rises per slot, so a resource partitioned by slot
//! (one register, file or connection per slot) refuses a stale holder of
//! that slot exactly as it would a stale holder of a lock. A request for a
//! permit is a lock request with [`LockOptions::permits`] set, so every
//! layer (tracing, metrics, retries, a fencing epoch, a migration) treats
//! permits as it treats locks. Semaphores and locks of one name are apart.

use std::sync::Arc;
use std::time::Duration;

use crate::capabilities::Capabilities;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::holder::Holder;
use crate::lock::DistributedLock;
use crate::name::validate_name;
use crate::options::LockOptions;

/// Up to `limit` holders of one name on a backend that offers semaphores
/// ([`Capabilities::semaphore`]).
///
/// ```
/// # #[tokio::main] async fn main() -> Result<(), lock_core::LockError> {
/// use std::sync::Arc;
/// use lock_core::{LockOptions, MemoryLock, Semaphore, Wait};
///
/// // At most two calls in flight to a partner's API.
/// let partner = Semaphore::new(Arc::new(MemoryLock::new()), "partner-api", 2)?;
/// let opts = LockOptions::new().wait(Wait::No);
/// let a = partner.acquire(&opts).await?;
/// let b = partner.acquire(&opts).await?;
/// assert_ne!(a.slot(), b.slot());
/// assert!(partner.try_acquire(&opts).await?.is_none());
/// a.release().await?;
/// assert!(partner.try_acquire(&opts).await?.is_some());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    locks: Arc<dyn DistributedLock>,
    name: String,
    limit: u32,
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name)
            .field("limit", &self.limit)
            .field("backend", &self.locks.capabilities().backend)
            .finish()
    }
}

impl Semaphore {
    /// Semaphore `name` of `limit` permits on `locks`. A bad name is
    /// [`LockError::InvalidName`]; a limit of 0 or above the backend's
    /// largest is [`LockError::InvalidOptions`]; a backend without
    /// semaphores answers [`LockError::Unsupported`].
    pub fn new(
        locks: Arc<dyn DistributedLock>,
        name: impl Into<String>,
        limit: u32,
    ) -> Result<Self, LockError> {
        let name = name.into();
        validate_name(&name)?;
        LockOptions::new()
            .permits(limit)
            .validate(&locks.capabilities())?;
        Ok(Semaphore { locks, name, limit })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many permits it has.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// What the backend's permits guarantee: its capabilities, with
    /// [`semaphore`](Capabilities::semaphore) saying what differs from
    /// its locks.
    pub fn capabilities(&self) -> Capabilities {
        self.locks.capabilities()
    }

    /// Take a permit, waiting as `opts.wait` says (then
    /// [`LockError::Timeout`]). A name whose permits are held with another
    /// limit is [`LockError::InvalidOptions`] naming both.
    pub async fn acquire(&self, opts: &LockOptions) -> Result<LockGuard, LockError> {
        self.locks.acquire(&self.name, &self.options(opts)).await
    }

    /// Take a permit if one is free now, without waiting; `None` when all
    /// are held.
    pub async fn try_acquire(&self, opts: &LockOptions) -> Result<Option<LockGuard>, LockError> {
        self.locks
            .try_acquire(&self.name, &self.options(opts))
            .await
    }

    /// The limit and the permits held now (a snapshot).
    pub async fn inspect(&self) -> Result<SemaphoreInfo, LockError> {
        self.locks.inspect_semaphore(&self.name).await
    }

    fn options(&self, opts: &LockOptions) -> LockOptions {
        opts.clone().permits(self.limit)
    }
}

/// What the server says about a semaphore
/// ([`DistributedLock::inspect_semaphore`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreInfo {
    /// The limit its permits are held with; `None` when none is held.
    pub limit: Option<u32>,
    /// The permits held, by slot.
    pub permits: Vec<PermitInfo>,
    /// How many acquisitions wait for a permit, where the server can tell.
    pub waiters: Option<usize>,
}

impl SemaphoreInfo {
    /// A semaphore whose permits are all free.
    pub fn free() -> Self {
        SemaphoreInfo::default()
    }

    /// Held with `limit`, by `permits`.
    pub fn held(limit: u32, mut permits: Vec<PermitInfo>) -> Self {
        permits.sort_by_key(|p| p.slot);
        SemaphoreInfo {
            limit: Some(limit),
            permits,
            waiters: None,
        }
    }

    /// With [`waiters`](Self::waiters).
    pub fn with_waiters(mut self, waiters: Option<usize>) -> Self {
        self.waiters = waiters;
        self
    }
}

/// One permit held ([`SemaphoreInfo::permits`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermitInfo {
    /// Its slot.
    pub slot: u32,
    /// Its fencing token, where the backend keeps it readable.
    pub fencing_token: Option<u64>,
    /// How long its lease runs unless renewed, where the server keeps one.
    pub expires_in: Option<Duration>,
    /// Who holds it, where the backend records it.
    pub holder: Option<Holder>,
}

impl PermitInfo {
    /// The permit on `slot`, the rest unknown until set.
    pub fn new(slot: u32) -> Self {
        PermitInfo {
            slot,
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

/// The typed error for a request whose limit differs from the one the
/// name's permits are held with.
pub fn limit_mismatch(name: &str, asked: u32, held: u32) -> LockError {
    LockError::invalid_options(format!(
        "semaphore `{name}` is held with a limit of {held}; asked with {asked}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Election, MemoryLock, Wait};

    /// An election has one leader: a campaign whose options ask for a
    /// semaphore's permit is refused, typed, instead of electing several.
    #[tokio::test]
    async fn an_election_refuses_options_asking_for_permits() {
        let election = Election::new(Arc::new(MemoryLock::new()), "leader");
        let opts = LockOptions::new().wait(Wait::No).permits(3);
        for refused in [
            election.try_campaign("a", &opts).await.err(),
            election.campaign("a", &opts).await.err(),
        ] {
            assert!(
                matches!(refused, Some(LockError::InvalidOptions { .. })),
                "{refused:?}"
            );
        }
    }

    /// Locks and semaphores of one name are apart: a held lock does not
    /// take a permit, and permits do not take the lock.
    #[tokio::test]
    async fn a_lock_and_a_semaphore_of_one_name_are_apart() {
        let locks: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
        let opts = LockOptions::new().wait(Wait::No);
        let lock = locks.acquire("job", &opts).await.expect("lock");
        let permits = Semaphore::new(locks.clone(), "job", 1).expect("semaphore");
        let permit = permits
            .acquire(&opts)
            .await
            .expect("a permit beside the lock");
        assert_eq!((lock.slot(), permit.slot()), (None, Some(0)));
        assert!(permit.release().await.expect("release"));
        assert!(lock.release().await.expect("release"));
    }
}
