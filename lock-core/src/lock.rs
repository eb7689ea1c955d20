//! The `DistributedLock` trait and the acquire loop shared by polling backends.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::capabilities::Capabilities;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::info::LockInfo;
use crate::name::validate_name;
use crate::options::{LockOptions, Wait};

/// A lock service: one implementation per backend, used as
/// `Arc<dyn DistributedLock>` so the backend is picked at run time.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// use std::sync::Arc;
/// use lock_core::{DistributedLock, LockOptions, MemoryLock};
/// let locks: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
/// let guard = locks.try_acquire("nightly-report", &LockOptions::new()).await?;
/// assert!(guard.is_some());
/// # Ok(()) }
/// ```
#[async_trait]
pub trait DistributedLock: Send + Sync {
    /// One attempt: `Ok(None)` when someone else holds the lock.
    async fn try_acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError>;

    /// Wait until the lock is granted or `opts.wait` passes
    /// ([`LockError::Timeout`]). Cancel-safe: dropping the future leaves
    /// nothing held and no waiter registered.
    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError>;

    /// What this backend guarantees.
    fn capabilities(&self) -> Capabilities;

    /// What the server says about `name` now, without taking it: whether it
    /// is held and, where the backend can read them, the holder's fencing
    /// token, its lease's time left and the number of waiters. A snapshot
    /// for operators (`distlock status`); it may change at once. Every
    /// backend of this project implements it; the default answers
    /// [`LockError::Unsupported`].
    async fn inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        let _ = name;
        Err(LockError::Unsupported {
            backend: self.capabilities().backend,
            operation: "inspect",
        })
    }

    /// The operator's way out for a lock whose holder is gone but whose
    /// lease is long: free `name` on the server whoever holds it, without
    /// the holder's consent. The holder's `lost()` fires when its client
    /// next hears from the server. Returns whether there was a holder.
    ///
    /// Where a lock lives as long as a session or connection (Postgres and
    /// MySQL, etcd's shared session lease), that session is ended, and the
    /// other locks it carried are lost with it; each backend's
    /// documentation says what it removes. Never part of normal locking:
    /// a holder that is alive loses its lock while it may still be working.
    async fn force_release(&self, name: &str) -> Result<bool, LockError> {
        let _ = name;
        Err(LockError::Unsupported {
            backend: self.capabilities().backend,
            operation: "force_release",
        })
    }
}

/// The outcome of one attempt by a polling backend.
#[derive(Debug)]
pub enum Attempt {
    /// The lock was granted.
    Acquired(LockGuard),
    /// Someone else holds it; `expires_in` is how long their lease has left,
    /// if the server said so (used to cap the next sleep).
    Held {
        /// The holder's remaining lease, if known.
        expires_in: Option<Duration>,
    },
}

impl Attempt {
    /// The guard, if the attempt acquired; `try_acquire` in one call.
    pub fn into_guard(self) -> Option<LockGuard> {
        match self {
            Attempt::Acquired(g) => Some(g),
            Attempt::Held { .. } => None,
        }
    }
}

/// The checks every backend makes before touching its server: the name is
/// acceptable ([`validate_name`]) and the options fit the backend
/// ([`LockOptions::validate`]).
pub fn check_request(name: &str, opts: &LockOptions, caps: &Capabilities) -> Result<(), LockError> {
    validate_name(name)?;
    opts.validate(caps)
}

/// When `opts.wait` ends, measured from `start`; `None` for [`Wait::Forever`]
/// and for a wait too long to represent as an instant (`Duration::MAX`).
pub fn wait_deadline(start: Instant, wait: Wait) -> Option<Instant> {
    match wait {
        Wait::No => Some(start),
        Wait::Up(d) => start.checked_add(d),
        Wait::Forever => None,
    }
}

/// Repeat `attempt` with `opts.backoff` (never sleeping past the holder's
/// remaining lease or the wait deadline) until it acquires or `opts.wait`
/// ends. For backends whose server cannot notify waiters. If `wake` is
/// given, a notification on it (a release elsewhere in this process, see
/// [`Wakeups`](crate::raw::Wakeups)) cuts the current sleep short; a wake-up that
/// arrives while an attempt is in flight is not lost.
///
/// `attempt` receives the number of earlier attempts, so a backend can make
/// later attempts cheaper (check before taking a write lock).
pub async fn acquire_by_polling<F, Fut>(
    name: &str,
    opts: &LockOptions,
    wake: Option<Arc<Notify>>,
    mut attempt: F,
) -> Result<LockGuard, LockError>
where
    F: FnMut(u32) -> Fut + Send,
    Fut: Future<Output = Result<Attempt, LockError>> + Send,
{
    let start = Instant::now();
    let deadline = wait_deadline(start, opts.wait);
    let idle = Notify::new();
    let wake = wake.as_deref().unwrap_or(&idle);
    let mut tries: u32 = 0;
    loop {
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let expires_in = match attempt(tries).await? {
            Attempt::Acquired(guard) => return Ok(guard),
            Attempt::Held { expires_in } => expires_in,
        };
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(LockError::Timeout {
                name: name.to_string(),
                waited: now - start,
            });
        }
        let mut pause = opts.backoff.delay(tries);
        if let Some(left) = expires_in {
            pause = pause.min(left + Duration::from_millis(1));
        }
        let mut until = now + pause;
        if let Some(d) = deadline {
            until = until.min(d);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(until) => {}
            _ = woken => {}
        }
        tries = tries.saturating_add(1);
    }
}
