//! The backend side of a held lock: the [`GuardHandle`] a backend
//! implements behind a guard, the [`PendingGrant`] that makes one
//! acquisition attempt cancel-safe, and the confirmation of a grant that
//! was answered late.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::error::LockError;
use crate::options::LockOptions;
use crate::raw::detached::{DetachedRelease, release_detached, spawn_release};
use crate::raw::wait::lease_if_in_time;
use crate::raw::{LeaseState, Retry};

/// The backend side of one held lock: what a [`LockGuard`](crate::LockGuard) calls to give the
/// lock back or prolong it. Implementations compare the owner token on the
/// server and never touch a lock that is not theirs.
#[async_trait]
pub trait GuardHandle: Send + Sync + 'static {
    /// Give the lock back. `Ok(true)` if it was still ours until now,
    /// `Ok(false)` if it had expired or belonged to someone else (in which
    /// case nothing was changed).
    async fn release(&self) -> Result<bool, LockError>;

    /// Set the remaining lease to `ttl` from now. `Ok(true)` on success,
    /// `Ok(false)` if the lock is no longer ours.
    async fn extend(&self, ttl: Duration) -> Result<bool, LockError>;

    /// Replace the value of the holder record this grant stored with
    /// `value` (already checked against [`MAX_VALUE_BYTES`](crate::MAX_VALUE_BYTES)),
    /// by owner token: `Ok(true)` if the lock was still ours and now
    /// carries it, `Ok(false)` if it is no longer ours (nothing changed).
    /// A backend whose [`Capabilities::holder`](crate::Capabilities::holder)
    /// is `true` implements it; the default answers
    /// [`LockError::Unsupported`].
    async fn set_value(&self, value: &[u8]) -> Result<bool, LockError> {
        let _ = value;
        Err(LockError::Unsupported {
            backend: "this backend",
            operation: "replacing a holder's value",
        })
    }

    /// Make this upgradeable read ([`Access::Upgradeable`](crate::Access::Upgradeable))
    /// the writer: wait until no other reader holds (readers that come
    /// meanwhile wait behind it; no writer can come in between, as the
    /// upgradeable read excludes them), then hold alone, with a new write
    /// token, which it answers (`None` where the backend has no tokens).
    /// Waits until `deadline` at most (`None`: for ever), then fails with
    /// [`LockError::Timeout`], still an upgradeable read, and lets the
    /// readers in again. [`LockError::NotHeld`] if the grant is no longer
    /// ours. A backend whose [`RwLockCapabilities::upgradeable`](crate::RwLockCapabilities::upgradeable)
    /// is `true` implements it; the default answers
    /// [`LockError::Unsupported`]. A layer that wraps handles forwards it.
    async fn upgrade(&self, deadline: Option<Instant>) -> Result<Option<u64>, LockError> {
        let _ = deadline;
        Err(LockError::Unsupported {
            backend: "this backend",
            operation: "upgradeable reads",
        })
    }

    /// A release of this lock that needs nothing from the runtime it was
    /// taken on: the returned future makes a connection of its own (from the
    /// client's configuration, never from its live connections, which die
    /// with their runtime) and gives the lock back by owner token over it.
    ///
    /// It runs when a release cannot run where the guard was dropped: the
    /// guard was dropped as its runtime shut down (its background release
    /// was dropped unfinished), or outside any runtime. It then runs on a
    /// thread and a runtime of its own, at most
    /// [`DETACHED_PATIENCE`](crate::raw::DETACHED_PATIENCE).
    ///
    /// `None` (the default) leaves the lock to its lease, or to its
    /// session when the backend's lock ends with the connection that holds
    /// it (the SQL backends): say which in the backend's `docs.md`.
    fn detached_release(&self) -> Option<DetachedRelease> {
        None
    }
}

/// A clean-up that runs in the background, on the current runtime, when
/// this is dropped armed: for a step whose future may be dropped in the
/// middle (an upgrade that gives up or is cancelled lets the readers in
/// again). [`disarm`](Self::disarm) it once the step completed. Dropped
/// outside a runtime, the clean-up is dropped unrun: the server's lease
/// ends what it would have cleaned up.
pub struct CleanUpOnDrop {
    work: Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl CleanUpOnDrop {
    /// Armed with `work`.
    pub fn new(work: impl Future<Output = ()> + Send + 'static) -> Self {
        CleanUpOnDrop {
            work: Some(Box::pin(work)),
        }
    }

    /// The step completed: nothing to clean up.
    pub fn disarm(&mut self) {
        self.work = None;
    }
}

impl Drop for CleanUpOnDrop {
    fn drop(&mut self) {
        if let (Some(work), Ok(rt)) = (self.work.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(work);
        }
    }
}

/// Cancel-safety for one acquisition attempt without a spawned task.
///
/// Create it with the handle (owner token fixed) *before* sending the
/// request; [`disarm`](PendingGrant::disarm) it once the outcome is known.
/// If the attempt's future is dropped in between, or the attempt fails — the
/// request may have been granted, and nobody would hold a guard — dropping
/// this releases by owner token in the background (retrying while the
/// server is unreachable), which is a no-op when nothing was granted.
pub struct PendingGrant {
    handle: Arc<dyn GuardHandle>,
    armed: bool,
}

impl PendingGrant {
    /// Arm for `handle`.
    pub fn new(handle: Arc<dyn GuardHandle>) -> Self {
        PendingGrant {
            handle,
            armed: true,
        }
    }

    /// The outcome is known: hand back the handle (to wrap in a guard, or to
    /// drop when nothing was granted).
    pub fn disarm(mut self) -> Arc<dyn GuardHandle> {
        self.armed = false;
        Arc::clone(&self.handle)
    }

    /// Nothing was granted and the caller leaves (a refused single attempt,
    /// a wait that timed out): release now, in line, whatever the attempt
    /// left on the server (a queue entry, a waiter's key or node), so that
    /// it is gone before the caller reports the outcome. A process that
    /// exits on a timeout never runs a background clean-up, and a waiter it
    /// leaves behind can be handed the lock.
    pub async fn give_back(self) -> Result<bool, LockError> {
        self.disarm().release().await
    }

    /// A grant of `name`, answered now to a request sent at `sent_at` under
    /// `opts`: the handle and its lease, counted from `sent_at`. If the
    /// lease's validity deadline (the TTL less the safety margin) has
    /// already passed, the grant is given back, in line, and the error of a
    /// grant too late to be of use comes back instead (transient; a backend
    /// reports it as [`Attempt::TooLate`](crate::raw::Attempt::TooLate)):
    /// no guard is ever handed out already past its deadline.
    pub async fn grant_in_time(
        self,
        backend: &'static str,
        name: &str,
        sent_at: Instant,
        opts: &LockOptions,
    ) -> Result<(Arc<dyn GuardHandle>, Arc<LeaseState>), LockError> {
        match lease_if_in_time(backend, name, sent_at, opts) {
            Ok(lease) => Ok((self.disarm(), Arc::new(lease))),
            Err(too_late) => {
                let _ = self.give_back().await;
                Err(too_late)
            }
        }
    }
}

impl Drop for PendingGrant {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let handle = Arc::clone(&self.handle);
        let what = "a cancelled acquisition".to_string();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => spawn_release(&rt, Arc::clone(&handle), what, clean_up(handle)),
            Err(_) => release_detached(handle.as_ref(), &what),
        }
    }
}

/// How long the background clean-up of an abandoned acquisition (or of a
/// release left unanswered) keeps retrying while the server is unreachable.
const CLEAN_UP_PATIENCE: Duration = Duration::from_secs(60);

/// Release what an abandoned acquisition may have left on the server (or
/// finish a release that went unanswered), retrying transient failures
/// (with backoff, for up to
/// [`CLEAN_UP_PATIENCE`]): the acquisition usually failed because the
/// network did, and the first clean-up then fails the same way, while what
/// it must remove (a key whose grant reply was lost) can outlive the fault
/// indefinitely where a session keeps it (an etcd session lease kept
/// alive, a ZooKeeper session that reconnects).
pub(crate) async fn clean_up(handle: Arc<dyn GuardHandle>) {
    let backoff = crate::options::Backoff::default()
        .with_initial(Duration::from_millis(100))
        .with_max(Duration::from_secs(2));
    let released = Retry::with_backoff(backoff)
        .patience(CLEAN_UP_PATIENCE)
        .run(
            "cleaning up an abandoned acquisition",
            LockError::is_transient,
            |_| handle.release(),
        )
        .await;
    if let Err(e) = released {
        tracing::warn!(target: "distlock", error = %e.report(), "clean-up of an abandoned acquisition failed; its lease or session ends it");
    }
}

/// How many confirmations [`confirmed_lease_start`] sends, at most, before
/// it gives up on a grant it cannot confirm promptly.
const CONFIRMATIONS: u32 = 3;

/// When a lease granted by a request sent at `sent_at` may be taken to
/// start, for a backend whose server starts the lease when it *grants*
/// (a row lock's idle timeout, a session's node) rather than when the
/// request arrived: time the request spent queued in the server must not
/// count against the new holder.
///
/// A grant that came back within a tenth of the TTL starts at `sent_at`
/// (the guard loses at most that tenth). After a longer wait, a renewal
/// (`handle.extend(ttl)`) confirms the lock, and the lease starts when that
/// request was sent. A confirmation may take up to a third of the TTL, the
/// renewal period: the guard then starts with no less of its lease than one
/// whose routine renewal is due, which a loaded pool or server can cost. A
/// slower confirmation (its connection dropped and came back, the server
/// stalled) would hand the caller a lease mostly or wholly spent, a guard
/// lost on arrival: it is sent again, up to three confirmations in all.
/// If a confirmation finds the lock gone (its connection died right after
/// the grant), or none came back in time, the acquisition failed:
/// `Unavailable`, transient. On `Err` the caller drops `pending`, which
/// releases the grant in the background.
pub async fn confirmed_lease_start(
    pending: &PendingGrant,
    sent_at: Instant,
    ttl: Duration,
    backend: &'static str,
    name: &str,
) -> Result<Instant, LockError> {
    if sent_at.elapsed() <= ttl / 10 {
        return Ok(sent_at);
    }
    let in_time = ttl / 3;
    let mut slowest = Duration::ZERO;
    for _ in 0..CONFIRMATIONS {
        let again = Instant::now();
        if !pending.handle.extend(ttl).await? {
            return Err(LockError::Unavailable {
                backend,
                reason: format!("lock {name:?} was lost right after it was granted; try again"),
                source: None,
            });
        }
        let took = again.elapsed();
        if took <= in_time {
            return Ok(again);
        }
        tracing::debug!(target: "distlock",
            name,
            ?took,
            "a grant's confirmation was slow; confirming again"
        );
        slowest = slowest.max(took);
    }
    Err(LockError::Unavailable {
        backend,
        reason: format!(
            "lock {name:?} was granted, but {CONFIRMATIONS} confirmations each took longer than \
             a third of its TTL (up to {slowest:?}); try again"
        ),
        source: None,
    })
}
