//! The RAII guard every backend returns. The handle a backend implements
//! behind it is in `raw/handle.rs`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::capabilities::Capabilities;
use crate::error::LockError;
use crate::loss::LossReason;
use crate::options::{LockOptions, validate_ttl};
use crate::raw::GuardHandle;
use crate::raw::LeaseState;
use crate::raw::detached::{release_detached, spawn_release};
use crate::raw::handle::clean_up;
use crate::raw::{Registration, Watchdog};
use crate::rw_lock::Access;

/// How long [`LockGuard::release`] waits for the server's answer before
/// it reports [`LockError::Unavailable`] and leaves the release to the
/// background.
pub const RELEASE_PATIENCE: Duration = Duration::from_secs(5);

/// A held lock. Dropping it releases the lock in the background on the
/// current tokio runtime; call [`release`](LockGuard::release) to learn
/// whether the lock was still ours.
///
/// A guard dropped as its runtime shuts down (at the end of a
/// `current_thread` `main` or a `#[tokio::test]`, or held by a task the
/// shutdown cancels), or dropped outside any runtime, is released too: on a
/// connection, thread and runtime of its own, waited for by the drop (at
/// most [`DETACHED_PATIENCE`](crate::raw::DETACHED_PATIENCE)). Each
/// backend's docs say what it sends then (the SQL session locks end with
/// their connection).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// use lock_core::{DistributedLock, LockOptions, MemoryLock};
/// let locks = MemoryLock::new();
/// let guard = locks.acquire("report", &LockOptions::new()).await?;
/// tokio::select! {
///     _ = async { /* protected work, passing guard.fencing_token() along */ } => {}
///     reason = guard.lost() => eprintln!("stopped: lock lost ({reason})"),
/// }
/// assert!(guard.release().await?);
/// # Ok(()) }
/// ```
#[must_use = "a guard dropped at once releases its lock at once: bind it (`let _guard = …`) for as long as the work runs"]
pub struct LockGuard {
    name: String,
    fencing_token: Option<u64>,
    slot: Option<u32>,
    access: Option<Access>,
    caps: Capabilities,
    lease: Arc<LeaseState>,
    handle: Option<Arc<dyn GuardHandle>>,
    renewal: Option<Registration>,
}

/// What the watchdog does with a grant its caller did not ask to have
/// renewed ([`RawGuard::kept_by`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unrenewed {
    /// Nothing: the server ends the lock when its TTL runs out, and
    /// `lost()` fires at the validity deadline.
    Left,
    /// Checked about every third of its TTL without being prolonged
    /// ([`Watchdog::watch`]), for a backend whose lock ends with its
    /// connection: a server crash then fires `lost()` within a third of the
    /// TTL, not at the validity deadline.
    Watched,
    /// Released `grace` after its validity deadline (as `extend` moves
    /// it), for a backend whose server would keep a lock past its TTL (a
    /// ZooKeeper node lives as long as its session). Also applies to a
    /// guard that is leaked.
    ReleasedAfter(Duration),
}

/// For backend authors and layers: building a [`LockGuard`] from a
/// backend's handle, and the parts of a guard a layer works with. Import
/// it (`use lock_core::raw::RawGuard`) to call these on a guard;
/// applications never need them.
pub trait RawGuard: Sized {
    /// Wrap a backend handle. Backends call this once the server granted the
    /// lock; `lease` carries the validity deadline measured from before the
    /// request was sent.
    fn new(
        name: impl Into<String>,
        fencing_token: Option<u64>,
        caps: Capabilities,
        lease: Arc<LeaseState>,
        handle: Arc<dyn GuardHandle>,
    ) -> Self;

    /// Hand the grant to `watchdog` as `opts` ask: renewed about every
    /// third of its TTL while the guard lives if `opts.auto_renew`, else
    /// as `unrenewed` says. Every backend finishes a grant with this.
    fn kept_by(self, watchdog: &Watchdog, opts: &LockOptions, unrenewed: Unrenewed) -> Self;

    /// The same grant carrying another fencing token: for a layer that maps
    /// a backend's tokens into its own space (an epoch in the high bits, a
    /// migration that keeps the old backend's tokens).
    fn with_fencing_token(self, token: Option<u64>) -> Self;

    /// The same grant as a semaphore's permit on `slot` (a backend sets it
    /// on every permit it grants; a layer keeps or maps it).
    fn with_slot(self, slot: Option<u32>) -> Self;

    /// The same grant as a reader-writer lock's, for `access` (a backend
    /// sets it on every read or write grant; a layer keeps it).
    fn with_access(self, access: Option<Access>) -> Self;

    /// The same grant with its handle wrapped by `wrap`: for a layer that
    /// changes how the guard's own `extend` and `release` reach the
    /// backend (retries, measurements). The watchdog's renewals keep the
    /// backend's handle.
    fn map_handle(self, wrap: impl FnOnce(Arc<dyn GuardHandle>) -> Arc<dyn GuardHandle>) -> Self;

    /// Stop the watchdog's renewal of this lock: the server then keeps it
    /// until its lease runs out, and `lost()` fires at the validity
    /// deadline. For a layer that holds a lock made of several and gives up
    /// the healthy parts once one is lost.
    fn stop_renewal(&mut self);

    /// The shared lease state (for layers built on top of a guard).
    fn lease(&self) -> &Arc<LeaseState>;
}

impl RawGuard for LockGuard {
    fn new(
        name: impl Into<String>,
        fencing_token: Option<u64>,
        caps: Capabilities,
        lease: Arc<LeaseState>,
        handle: Arc<dyn GuardHandle>,
    ) -> Self {
        LockGuard {
            name: name.into(),
            fencing_token,
            slot: None,
            access: None,
            caps,
            lease,
            handle: Some(handle),
            renewal: None,
        }
    }

    fn kept_by(mut self, watchdog: &Watchdog, opts: &LockOptions, unrenewed: Unrenewed) -> Self {
        let Some(handle) = &self.handle else {
            return self;
        };
        self.renewal = match (opts.auto_renew, unrenewed) {
            (true, _) => Some(watchdog.register(handle, &self.lease)),
            (false, Unrenewed::Left) => None,
            (false, Unrenewed::Watched) => Some(watchdog.watch(handle, &self.lease)),
            (false, Unrenewed::ReleasedAfter(grace)) => {
                Some(watchdog.expire(handle, &self.lease, grace))
            }
        };
        self
    }

    fn with_fencing_token(mut self, token: Option<u64>) -> Self {
        self.fencing_token = token;
        self
    }

    fn with_slot(mut self, slot: Option<u32>) -> Self {
        self.slot = slot;
        self
    }

    fn with_access(mut self, access: Option<Access>) -> Self {
        self.access = access;
        self
    }

    fn map_handle(
        mut self,
        wrap: impl FnOnce(Arc<dyn GuardHandle>) -> Arc<dyn GuardHandle>,
    ) -> Self {
        self.handle = self.handle.take().map(wrap);
        self
    }

    fn stop_renewal(&mut self) {
        self.renewal.take();
    }

    fn lease(&self) -> &Arc<LeaseState> {
        &self.lease
    }
}

impl LockGuard {
    /// The lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fencing token of this grant: strictly greater than every earlier
    /// grant's token for the same name (see [`Capabilities::fencing`] for how
    /// far that holds). Tokens are per lock name: two names' tokens are not
    /// comparable. Pass it to the protected resource so it can refuse
    /// writes from an older holder.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// For a semaphore's permit, its slot: `0 ≤ slot < limit`, held by no
    /// other permit of the name while this one lives. The fencing token
    /// then rises per slot (a resource partitioned by slot checks it per
    /// slot). `None` for a lock.
    pub fn slot(&self) -> Option<u32> {
        self.slot
    }

    /// For a reader-writer lock's grant, whether it reads or writes; `None`
    /// for a lock or a permit. A reader's [`fencing_token`](Self::fencing_token)
    /// is the latest write grant's.
    pub fn access(&self) -> Option<Access> {
        self.access
    }

    /// The fencing token as an `i64`, the type of a SQL `BIGINT` column
    /// (Postgres, MySQL and SQLite integers are signed). Every token this
    /// crate's backends give fits: they are database sequences, etcd
    /// revisions, ZooKeeper transaction ids and Redis counters, all signed
    /// 64-bit on their servers, and a fencing epoch keeps them below 2^63.
    /// `None` when the backend has no tokens (or, from a backend of
    /// another crate, for a token above `i64::MAX`).
    pub fn fencing_token_i64(&self) -> Option<i64> {
        self.fencing_token.and_then(|t| i64::try_from(t).ok())
    }

    /// `Ok` while the lock is neither known nor suspected lost and its
    /// validity deadline has not passed; else [`LockError::Lost`] with the
    /// reason. The check right before each write to the protected resource,
    /// which checks the fencing token as well: `lost()` alone can be
    /// noticed late by a busy scheduler.
    pub fn ensure_held(&self) -> Result<(), LockError> {
        match self.lease.lost_now() {
            None => Ok(()),
            Some(reason) => Err(LockError::Lost {
                name: self.name.clone(),
                reason,
            }),
        }
    }

    /// Resolves when the lock is known or suspected lost: a renewal found it
    /// gone, the validity deadline passed, or the backend's connection or
    /// session failed. Use it in `tokio::select!` to stop protected work.
    pub async fn lost(&self) -> LossReason {
        self.lease.lost().await
    }

    /// The loss, if the lock is known or suspected lost right now.
    pub fn is_lost(&self) -> Option<LossReason> {
        self.lease.lost_now()
    }

    /// When the server may expire the lock unless it is renewed, by the local
    /// monotonic clock; `None` for locks held by a connection or session.
    pub fn validity_deadline(&self) -> Option<Instant> {
        self.lease.deadline()
    }

    /// Prolong the lock: the server keeps it for `ttl` from now. Returns
    /// the new [validity deadline](Self::validity_deadline), which says
    /// what the backend gave: less than `ttl` ahead where the lock is also
    /// bounded by something else (a ZooKeeper node by its session's
    /// timeout), and `None` for a lock held by a connection or session.
    /// Fails with [`LockError::NotHeld`] (and fires [`lost`](Self::lost)) if
    /// the lock is no longer ours, and with [`LockError::Lost`] if it was
    /// already lost or its validity deadline passed before the renewal landed.
    pub async fn extend(&self, ttl: Duration) -> Result<Option<Instant>, LockError> {
        validate_ttl(ttl, &self.caps)?;
        let server_ttl = self.lease.server_ttl(ttl);
        validate_ttl(server_ttl, &self.caps)?;
        self.ensure_held()?;
        let handle = self.handle.as_ref().ok_or_else(|| LockError::NotHeld {
            name: self.name.clone(),
        })?;
        let sent_at = Instant::now();
        if handle.extend(server_ttl).await? {
            self.lease.renewed(sent_at, ttl);
            // A renewal that lands after the validity deadline cannot undo
            // the window in which the lock may have been someone else's.
            self.ensure_held()?;
            Ok(self.lease.deadline())
        } else {
            self.lease.mark_lost(LossReason::TakenOver);
            Err(LockError::NotHeld {
                name: self.name.clone(),
            })
        }
    }

    /// Replace the value this grant recorded beside its holder
    /// ([`LockOptions::value`]), as [`inspect`](crate::DistributedLock::inspect)
    /// and an election's observers read it. Fails with
    /// [`LockError::NotHeld`] (and fires [`lost`](Self::lost)) if the lock
    /// is no longer ours, [`LockError::Lost`] if it was already lost,
    /// [`LockError::InvalidOptions`] for a value over
    /// [`MAX_VALUE_BYTES`](crate::MAX_VALUE_BYTES), and
    /// [`LockError::Unsupported`] where the backend keeps no holder record
    /// ([`Capabilities::holder`]).
    pub async fn set_value(&self, value: &[u8]) -> Result<(), LockError> {
        crate::holder::validate_value(value)?;
        if !self.caps.holder {
            return Err(LockError::Unsupported {
                backend: self.caps.backend,
                operation: "replacing a holder's value",
            });
        }
        self.ensure_held()?;
        let handle = self.handle.as_ref().ok_or_else(|| LockError::NotHeld {
            name: self.name.clone(),
        })?;
        if handle.set_value(value).await? {
            self.ensure_held()
        } else {
            self.lease.mark_lost(LossReason::TakenOver);
            Err(LockError::NotHeld {
                name: self.name.clone(),
            })
        }
    }

    /// Make this upgradeable read ([`Access::Upgradeable`], from
    /// [`RwLockExt::acquire_upgradeable`](crate::RwLockExt::acquire_upgradeable))
    /// the writer, without another writer in between: wait, as `wait` says,
    /// until the other readers have left (readers that come meanwhile wait
    /// behind it), then hold alone. The guard is then a write grant
    /// ([`access`](Self::access) is [`Access::Write`]) with a new fencing
    /// token; its lease, renewal and `lost()` go on as they were.
    ///
    /// Fails with [`LockError::Timeout`] when the wait ends first (the
    /// guard is still an upgradeable read, and the readers are let in
    /// again), [`LockError::NotHeld`] (and fires [`lost`](Self::lost)) if
    /// the grant is no longer ours, [`LockError::Lost`] if it was already
    /// lost, and [`LockError::InvalidOptions`] for a guard that is not an
    /// upgradeable read. Cancel-safe: a cancelled upgrade leaves the guard
    /// an upgradeable read (an upgrade the server completed just before
    /// the cancellation leaves it the writer on the server, which its
    /// release gives back as well).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_core::LockError> {
    /// use lock_core::{Access, LockOptions, MemoryLock, RwLockExt, Wait};
    /// let locks = MemoryLock::new();
    /// let opts = LockOptions::new();
    /// let mut guard = locks.acquire_upgradeable("dataset", &opts).await?;
    /// // Readers still read beside it; writers wait.
    /// let reader = locks.acquire_read("dataset", &opts).await?;
    /// assert!(locks.try_acquire_write("dataset", &opts).await?.is_none());
    /// reader.release().await?;
    /// // The data needs rewriting: become the writer.
    /// guard.upgrade(Wait::Forever).await?;
    /// assert_eq!(guard.access(), Some(Access::Write));
    /// assert!(locks.try_acquire_read("dataset", &opts).await?.is_none());
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn upgrade(&mut self, wait: crate::options::Wait) -> Result<(), LockError> {
        if self.access != Some(Access::Upgradeable) {
            return Err(LockError::invalid_options(format!(
                "only an upgradeable read can be upgraded; lock {:?} is held as {}",
                self.name,
                self.access.map_or("a lock or a permit", Access::as_str)
            )));
        }
        self.ensure_held()?;
        let handle = self.handle.as_ref().ok_or_else(|| LockError::NotHeld {
            name: self.name.clone(),
        })?;
        let deadline = crate::raw::wait_deadline(Instant::now(), wait);
        match handle.upgrade(deadline).await {
            Ok(token) => {
                self.access = Some(Access::Write);
                self.fencing_token = token;
                self.ensure_held()
            }
            Err(e @ LockError::NotHeld { .. }) => {
                self.lease.mark_lost(LossReason::TakenOver);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// What this lock's backend guarantees.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// Give the lock back. `Ok(true)` if it was still ours, `Ok(false)` if it
    /// had already expired or been taken over (nothing is removed then).
    ///
    /// Returns within [`RELEASE_PATIENCE`]: a server that does not answer
    /// by then (frozen, a client still reconnecting), or that fails the
    /// release with a transient error first (crashed, refusing connections,
    /// a failover under way), makes it [`LockError::Unavailable`], and the
    /// release goes on in the background, retried while the server stays
    /// unreachable, until it lands or the lock's lease or session ends it.
    pub async fn release(mut self) -> Result<bool, LockError> {
        self.renewal.take();
        let Some(handle) = self.handle.take() else {
            return Ok(false);
        };
        let failure = match tokio::time::timeout(RELEASE_PATIENCE, handle.release()).await {
            Ok(Err(e)) if e.is_transient() => {
                tracing::warn!(target: "distlock",
                    lock = %self.name,
                    error = %e.report(),
                    "release failed; going on in the background"
                );
                going_on(e, &self.name)
            }
            Ok(outcome) => return outcome,
            Err(_) => {
                tracing::warn!(target: "distlock",
                    lock = %self.name,
                    patience = ?RELEASE_PATIENCE,
                    "release unanswered; going on in the background"
                );
                LockError::Unavailable {
                    backend: self.caps.backend,
                    reason: format!(
                        "releasing lock {:?}: no answer within {RELEASE_PATIENCE:?}; the release \
                         goes on in the background",
                        self.name
                    ),
                    source: None,
                }
            }
        };
        let name = self.name.clone();
        spawn_release(
            &tokio::runtime::Handle::current(),
            Arc::clone(&handle),
            name,
            clean_up(handle),
        );
        Err(failure)
    }
}

impl Drop for LockGuard {
    /// Release in the background, on the current runtime. If that runtime
    /// is shutting down (its tasks are dropped unrun), or there is none,
    /// the backend's [`detached_release`](GuardHandle::detached_release)
    /// runs on a connection, thread and runtime of its own, and the drop
    /// waits for it (at most [`DETACHED_PATIENCE`](crate::raw::DETACHED_PATIENCE)).
    fn drop(&mut self) {
        self.renewal.take();
        let Some(handle) = self.handle.take() else {
            return;
        };
        let name = std::mem::take(&mut self.name);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let work = release_on_drop(Arc::clone(&handle), name.clone());
                spawn_release(&rt, handle, name, work);
            }
            Err(_) => release_detached(handle.as_ref(), &name),
        }
    }
}

/// A transient release failure as the caller sees it: an `Unavailable`
/// says the release goes on in the background (other kinds are left as
/// they are).
fn going_on(e: LockError, name: &str) -> LockError {
    match e {
        LockError::Unavailable {
            backend,
            reason,
            source,
        } => LockError::Unavailable {
            backend,
            reason: format!("{reason}; the release of lock {name:?} goes on in the background"),
            source,
        },
        other => other,
    }
}

/// A dropped guard's release, in the background.
async fn release_on_drop(handle: Arc<dyn GuardHandle>, name: String) {
    match handle.release().await {
        Ok(true) => tracing::debug!(target: "distlock", lock = %name, "released on drop"),
        Ok(false) => {
            tracing::debug!(target: "distlock", lock = %name, "dropped guard's lock was no longer held")
        }
        Err(e) => tracing::warn!(target: "distlock",
            lock = %name, error = %e.report(),
            "release on drop failed; the server frees the lock when its lease ends"
        ),
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.name)
            .field("backend", &self.caps.backend)
            .field("fencing_token", &self.fencing_token)
            .field("slot", &self.slot)
            .field("access", &self.access)
            .field("validity_deadline", &self.lease.deadline())
            .field("lost", &self.lease.lost_now())
            .field("auto_renew", &self.renewal.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::raw::{PendingGrant, confirmed_lease_start};

    /// A grant whose confirmations take the listed times, then answer at once.
    struct SlowConfirmations {
        delays: Mutex<Vec<Duration>>,
        held: bool,
    }

    #[async_trait::async_trait]
    impl GuardHandle for SlowConfirmations {
        async fn release(&self) -> Result<bool, LockError> {
            Ok(true)
        }

        async fn extend(&self, _ttl: Duration) -> Result<bool, LockError> {
            let delay = {
                let mut delays = self.delays.lock().unwrap_or_else(|e| e.into_inner());
                (!delays.is_empty()).then(|| delays.remove(0))
            };
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            Ok(self.held)
        }
    }

    fn pending(delays: &[u64], held: bool) -> PendingGrant {
        PendingGrant::new(Arc::new(SlowConfirmations {
            delays: Mutex::new(delays.iter().map(|&ms| Duration::from_millis(ms)).collect()),
            held,
        }))
    }

    const TTL: Duration = Duration::from_secs(3);

    /// A lock whose server never answers a release.
    struct Unanswered {
        releases: std::sync::atomic::AtomicU32,
    }

    #[async_trait::async_trait]
    impl GuardHandle for Unanswered {
        async fn release(&self) -> Result<bool, LockError> {
            self.releases
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::future::pending().await
        }

        async fn extend(&self, _ttl: Duration) -> Result<bool, LockError> {
            Ok(true)
        }
    }

    /// `release()` returns within `RELEASE_PATIENCE` when the server does
    /// not answer, as `Unavailable`, and the release goes on in the
    /// background.
    #[tokio::test(start_paused = true)]
    async fn an_unanswered_release_returns_and_goes_on_in_the_background() {
        let handle = Arc::new(Unanswered {
            releases: Default::default(),
        });
        let opts = crate::LockOptions::new().ttl(TTL);
        let guard = LockGuard::new(
            "n",
            Some(1),
            crate::DistributedLock::capabilities(&crate::MemoryLock::new()),
            Arc::new(LeaseState::granted(Instant::now(), &opts)),
            Arc::clone(&handle) as Arc<dyn GuardHandle>,
        );
        let start = Instant::now();
        let outcome = tokio::time::timeout(Duration::from_secs(3600), guard.release())
            .await
            .expect("release() returns by itself");
        let took = start.elapsed();
        assert!(
            matches!(&outcome, Err(LockError::Unavailable { reason, .. }) if reason.contains("background")),
            "{outcome:?}"
        );
        assert_eq!(took, RELEASE_PATIENCE);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            handle.releases.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "the release is sent again in the background"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_prompt_grant_starts_when_its_request_was_sent() {
        let sent_at = Instant::now();
        tokio::time::advance(Duration::from_millis(200)).await;
        let start = confirmed_lease_start(&pending(&[5000], true), sent_at, TTL, "test", "n")
            .await
            .expect("prompt grant");
        assert_eq!(start, sent_at);
    }

    /// A confirmation that straddled a server outage must not become the
    /// lease's start: the guard would be lost on arrival.
    #[tokio::test(start_paused = true)]
    async fn a_slow_confirmation_is_sent_again() {
        let sent_at = Instant::now();
        tokio::time::advance(Duration::from_secs(5)).await;
        let start = confirmed_lease_start(&pending(&[4000, 10], true), sent_at, TTL, "test", "n")
            .await
            .expect("the second confirmation is prompt");
        let spent = start.elapsed();
        assert!(
            spent <= TTL / 3,
            "the lease starts {spent:?} before the grant is handed over, of a {TTL:?} TTL"
        );
    }

    /// A confirmation slowed by a busy pool or server, but back within the
    /// renewal period, starts the lease: it is not sent again.
    #[tokio::test(start_paused = true)]
    async fn a_confirmation_slowed_by_load_is_taken() {
        let sent_at = Instant::now();
        tokio::time::advance(Duration::from_secs(5)).await;
        let start =
            confirmed_lease_start(&pending(&[600, 600, 600], true), sent_at, TTL, "test", "n")
                .await
                .expect("a confirmation within the renewal period is taken");
        assert_eq!(start.elapsed(), Duration::from_millis(600));
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_never_confirmed_promptly_is_unavailable() {
        let sent_at = Instant::now();
        tokio::time::advance(Duration::from_secs(5)).await;
        let outcome = confirmed_lease_start(
            &pending(&[1500, 1500, 1500, 0], true),
            sent_at,
            TTL,
            "test",
            "n",
        )
        .await;
        assert!(
            matches!(&outcome, Err(LockError::Unavailable { reason, .. }) if reason.contains("3 confirmations")),
            "{outcome:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_gone_at_its_confirmation_is_unavailable() {
        let sent_at = Instant::now();
        tokio::time::advance(Duration::from_secs(5)).await;
        let outcome = confirmed_lease_start(&pending(&[], false), sent_at, TTL, "test", "n").await;
        assert!(
            matches!(&outcome, Err(LockError::Unavailable { reason, .. }) if reason.contains("lost right after")),
            "{outcome:?}"
        );
    }
}
