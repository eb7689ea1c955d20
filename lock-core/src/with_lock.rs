//! `with_lock`: take a lock, run the work under it, stop the work if the
//! lock is lost, give the lock back.

use crate::error::LockError;
use crate::guard::LockGuard;
use crate::lock::DistributedLock;
use crate::loss::LossReason;
use crate::options::LockOptions;

/// Acquire `name` on `locks` (waiting as `opts` say), run `work` with the
/// guard, release, and return the work's result. Also a method of
/// `dyn DistributedLock` ([`with_lock`](trait.DistributedLock.html#method.with_lock)).
///
/// The work is cancelled (its future dropped) the moment the lock is lost,
/// and the result is then [`LockError::Lost`]. A release that finds the
/// lock no longer ours is [`LockError::Lost`] too (taken over while the
/// work ran, unnoticed before it finished): a result computed partly
/// without the lock is never returned as if it were protected. A release
/// that fails for want of a server ([`LockError::Unavailable`]) still
/// returns the result: the lock was ours to the end, and its lease frees
/// it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// use lock_core::{LockOptions, MemoryLock, with_lock};
/// let locks = MemoryLock::new();
/// let total = with_lock(&locks, "invoice-run", &LockOptions::new(), async |guard| {
///     // The protected work, passing guard.fencing_token() along.
///     guard.fencing_token().unwrap_or(0) + 41
/// })
/// .await?;
/// assert_eq!(total, 42);
/// # Ok(()) }
/// ```
pub async fn with_lock<L, T, F>(
    locks: &L,
    name: &str,
    opts: &LockOptions,
    work: F,
) -> Result<T, LockError>
where
    L: DistributedLock + ?Sized,
    F: AsyncFnOnce(&LockGuard) -> T,
{
    let guard = locks.acquire(name, opts).await?;
    let outcome = tokio::select! {
        done = work(&guard) => Ok(done),
        reason = guard.lost() => Err(reason),
    };
    let name = guard.name().to_string();
    let released = guard.release().await;
    match (outcome, released) {
        (Err(reason), _) => Err(LockError::Lost { name, reason }),
        (Ok(_), Ok(false)) => Err(LockError::Lost {
            name,
            reason: LossReason::TakenOver,
        }),
        (Ok(done), Ok(true)) => Ok(done),
        (Ok(done), Err(e)) => {
            tracing::warn!(target: "distlock", lock = %name, error = %e.report(), "release after the work failed; the lock's lease frees it");
            Ok(done)
        }
    }
}

impl dyn DistributedLock {
    /// [`with_lock`](crate::with_lock) on this lock: acquire `name`, run
    /// `work` with the guard (cancelled if the lock is lost), release, and
    /// return the work's result.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_core::LockError> {
    /// use std::sync::Arc;
    /// use lock_core::{DistributedLock, LockOptions, MemoryLock};
    /// let locks: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
    /// let rows = locks
    ///     .with_lock("nightly-report", &LockOptions::new(), async |_guard| 7)
    ///     .await?;
    /// assert_eq!(rows, 7);
    /// # Ok(()) }
    /// ```
    pub async fn with_lock<T, F>(
        &self,
        name: &str,
        opts: &LockOptions,
        work: F,
    ) -> Result<T, LockError>
    where
        F: AsyncFnOnce(&LockGuard) -> T,
    {
        with_lock(self, name, opts, work).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::MemoryLock;

    #[tokio::test]
    async fn the_work_runs_under_the_lock_and_the_lock_is_given_back() {
        let locks = MemoryLock::new();
        let opts = LockOptions::new();
        let seen = with_lock(&locks, "job", &opts, async |guard| {
            let held = locks.try_acquire("job", &opts).await.expect("try");
            (guard.name().to_string(), held.is_none())
        })
        .await
        .expect("with_lock");
        assert_eq!(seen, ("job".to_string(), true), "held during the work");
        let again = locks.try_acquire("job", &opts).await.expect("try");
        assert!(again.is_some(), "released after the work");
    }

    #[tokio::test(start_paused = true)]
    async fn a_loss_cancels_the_work() {
        let locks = MemoryLock::new();
        let opts = LockOptions::new().ttl(Duration::from_secs(30));
        let finished = std::sync::atomic::AtomicBool::new(false);
        let outcome = with_lock(&locks, "job", &opts, async |_guard| {
            assert!(locks.force_release("job").await.expect("take away"));
            tokio::time::sleep(Duration::from_secs(60)).await;
            finished.store(true, std::sync::atomic::Ordering::SeqCst);
        })
        .await;
        assert!(
            matches!(outcome, Err(LockError::Lost { .. })),
            "{outcome:?}"
        );
        assert!(!finished.load(std::sync::atomic::Ordering::SeqCst));
    }

    /// Taken away during work too short for a renewal to notice: the
    /// release finds it, and the result is not handed out as protected.
    #[tokio::test]
    async fn a_loss_found_at_release_is_an_error() {
        let locks: std::sync::Arc<dyn DistributedLock> = std::sync::Arc::new(MemoryLock::new());
        let opts = LockOptions::new().ttl(Duration::from_secs(30));
        let outcome = locks
            .with_lock("job", &opts, async |_guard| {
                locks.force_release("job").await.expect("take away")
            })
            .await;
        assert!(
            matches!(outcome, Err(LockError::Lost { .. })),
            "{outcome:?}"
        );
    }
}
