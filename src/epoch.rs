//! `fencing_epoch=N` on any lock URL: tokens in a higher epoch, so that a
//! resource which accepted the old backend's tokens accepts the new one's.

use std::sync::Arc;

use std::time::Duration;

use lock_core::raw::{GuardHandle, Layered, LayeredLock, RawGuard, async_trait};
use lock_core::{
    Access, DistributedLock, LockError, LockGuard, LockInfo, LockOptions, RwLockInfo, SemaphoreInfo,
};
use tokio::time::Instant;

/// The URL option that sets the epoch.
pub const EPOCH_OPTION: &str = "fencing_epoch";
/// Bits below the epoch: a backend's own token must stay under 2^48.
pub const EPOCH_SHIFT: u32 = 48;
/// The largest epoch: 2^15 − 1, so that every token with an epoch fits in
/// an `i64` (a SQL `BIGINT`, [`LockGuard::fencing_token_i64`]).
pub const MAX_EPOCH: u16 = (1 << (63 - EPOCH_SHIFT)) - 1;

/// A lock whose fencing tokens are the inner backend's with `epoch` in the
/// high bits: `(epoch << 48) | token`, the epoch at most [`MAX_EPOCH`]. Every token of epoch N+1 is larger
/// than every token of epoch N, so the last step of a migration (the new
/// backend alone, with a higher epoch than the old one's) never hands out a
/// token a fenced resource has seen beaten.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::LockError> {
/// use std::sync::Arc;
/// use distlock::{DistributedLock, EpochLock, LockOptions, MemoryLock};
/// let locks = EpochLock::new(Arc::new(MemoryLock::new()), 1)?;
/// let guard = locks.acquire("report", &LockOptions::new()).await?;
/// assert_eq!(guard.fencing_token(), Some((1 << 48) | 1));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EpochLock {
    inner: Arc<dyn DistributedLock>,
    epoch: u16,
}

impl EpochLock {
    /// `inner` with its tokens moved into `epoch`, as a lock;
    /// [`LockError::InvalidOptions`] for an epoch above [`MAX_EPOCH`].
    pub fn new(inner: Arc<dyn DistributedLock>, epoch: u16) -> Result<Layered<Self>, LockError> {
        if epoch > MAX_EPOCH {
            return Err(LockError::invalid_options(format!(
                "fencing epoch {epoch} is above {MAX_EPOCH}: tokens would not fit in an i64"
            )));
        }
        Ok(Layered::new(EpochLock { inner, epoch }))
    }

    /// The epoch.
    pub fn epoch(&self) -> u16 {
        self.epoch
    }

    fn retoken(&self, guard: LockGuard) -> Result<LockGuard, LockError> {
        // An upgrade answers the backend's new token: lifted the same way.
        let guard = if guard.access() == Some(Access::Upgradeable) {
            let lift = self.lifter(guard.name());
            guard.map_handle(|inner| Arc::new(LiftedUpgrade { inner, lift }))
        } else {
            guard
        };
        let Some(token) = guard.fencing_token() else {
            return Ok(guard);
        };
        let lifted = self.lift(guard.name(), token)?;
        Ok(guard.with_fencing_token(Some(lifted)))
    }

    /// The backend's `token` of lock `name` with the epoch above it.
    fn lift(&self, name: &str, token: u64) -> Result<u64, LockError> {
        self.lifter(name).lift(token)
    }

    fn lifter(&self, name: &str) -> Lifter {
        Lifter {
            epoch: self.epoch,
            backend: self.inner.capabilities().backend,
            name: name.to_string(),
        }
    }
}

/// What lifts the tokens of one lock into an epoch.
struct Lifter {
    epoch: u16,
    backend: &'static str,
    name: String,
}

impl Lifter {
    fn lift(&self, token: u64) -> Result<u64, LockError> {
        if token >> EPOCH_SHIFT != 0 {
            return Err(LockError::Backend {
                backend: self.backend,
                reason: format!(
                    "fencing token {token} of lock `{}` does not fit below the epoch bits (2^{EPOCH_SHIFT}); drop `{EPOCH_OPTION}` from the URL",
                    self.name
                ),
                source: None,
            });
        }
        Ok(u64::from(self.epoch) << EPOCH_SHIFT | token)
    }
}

/// An upgradeable read's handle whose upgrade answers the new write token
/// in the epoch; the rest forwarded.
struct LiftedUpgrade {
    inner: Arc<dyn GuardHandle>,
    lift: Lifter,
}

#[async_trait]
impl GuardHandle for LiftedUpgrade {
    async fn release(&self) -> Result<bool, LockError> {
        self.inner.release().await
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        self.inner.extend(ttl).await
    }

    async fn set_value(&self, value: &[u8]) -> Result<bool, LockError> {
        self.inner.set_value(value).await
    }

    async fn upgrade(&self, deadline: Option<Instant>) -> Result<Option<u64>, LockError> {
        self.inner
            .upgrade(deadline)
            .await?
            .map(|token| self.lift.lift(token))
            .transpose()
    }

    fn detached_release(&self) -> Option<lock_core::raw::DetachedRelease> {
        self.inner.detached_release()
    }
}

#[async_trait]
impl LayeredLock for EpochLock {
    async fn try_acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.inner
            .try_acquire(name, opts)
            .await?
            .map(|g| self.retoken(g))
            .transpose()
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        let guard = self.inner.acquire(name, opts).await?;
        self.retoken(guard)
    }

    /// The backend's set, each member's token with the epoch above it.
    async fn try_acquire_set(
        &self,
        names: &[&str],
        opts: &LockOptions,
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        self.inner
            .try_acquire_set(names, opts)
            .await?
            .map(|guards| guards.into_iter().map(|g| self.retoken(g)).collect())
            .transpose()
    }

    /// The backend's answer, its token with the epoch above it.
    async fn inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        let info = self.inner.inspect(name).await?;
        let token = info.fencing_token.map(|t| self.lift(name, t)).transpose()?;
        Ok(info.with_fencing_token(token))
    }

    /// The backend's answer, each permit's token with the epoch above it.
    async fn inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        let mut info = self.inner.inspect_semaphore(name).await?;
        for permit in &mut info.permits {
            permit.fencing_token = permit
                .fencing_token
                .map(|t| self.lift(name, t))
                .transpose()?;
        }
        Ok(info)
    }

    /// The backend's answer, every token with the epoch above it.
    async fn inspect_rw(&self, name: &str) -> Result<RwLockInfo, LockError> {
        let mut info = self.inner.inspect_rw(name).await?;
        info.fencing_token = info.fencing_token.map(|t| self.lift(name, t)).transpose()?;
        for holder in &mut info.holders {
            holder.fencing_token = holder
                .fencing_token
                .map(|t| self.lift(name, t))
                .transpose()?;
        }
        Ok(info)
    }

    fn inner(&self) -> &Arc<dyn DistributedLock> {
        &self.inner
    }
}

/// The value of a `fencing_epoch` option.
pub(crate) fn parse_epoch(value: &str) -> Result<u16, String> {
    value
        .parse()
        .ok()
        .filter(|epoch| *epoch <= MAX_EPOCH)
        .ok_or_else(|| {
            format!("`{EPOCH_OPTION}` must be a whole number from 0 to {MAX_EPOCH}, got `{value}`")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_are_numbers_up_to_the_largest() {
        assert_eq!(parse_epoch("2"), Ok(2));
        assert_eq!(parse_epoch("32767"), Ok(MAX_EPOCH));
        for bad in ["x", "32768", "65535", "70000", "-1", ""] {
            assert!(parse_epoch(bad).is_err(), "{bad}");
        }
    }

    /// The largest token of the largest epoch is a positive `i64`, and an
    /// epoch above it is refused.
    #[tokio::test]
    async fn a_token_with_the_largest_epoch_fits_in_an_i64() {
        let locks = EpochLock::new(Arc::new(lock_core::MemoryLock::new()), MAX_EPOCH)
            .expect("the largest epoch");
        let guard = locks
            .acquire("epoch", &LockOptions::new())
            .await
            .expect("acquire");
        let token = guard.fencing_token_i64().expect("a token that fits");
        assert_eq!(token, i64::from(MAX_EPOCH) << EPOCH_SHIFT | 1);
        let largest = u64::from(MAX_EPOCH) << EPOCH_SHIFT | ((1 << EPOCH_SHIFT) - 1);
        assert!(i64::try_from(largest).is_ok(), "{largest}");
        assert!(EpochLock::new(Arc::new(lock_core::MemoryLock::new()), MAX_EPOCH + 1).is_err());
    }

    /// An upgrade's new write token is lifted into the epoch as a grant's
    /// is, and stays above the upgradeable read's.
    #[tokio::test]
    async fn an_upgrade_takes_a_token_in_the_epoch() {
        use lock_core::{RwLockExt, Wait};
        let locks = EpochLock::new(Arc::new(lock_core::MemoryLock::new()), 3).expect("epoch 3");
        let opts = LockOptions::new();
        let mut guard = locks
            .acquire_upgradeable("epoch", &opts)
            .await
            .expect("upgradeable");
        let read = guard.fencing_token().expect("a token");
        assert_eq!(read >> EPOCH_SHIFT, 3);
        guard.upgrade(Wait::No).await.expect("upgrade");
        let write = guard.fencing_token().expect("a token");
        assert_eq!(write >> EPOCH_SHIFT, 3, "{write}");
        assert!(write > read, "{write} after {read}");
        assert_eq!(guard.access(), Some(Access::Write));
        assert!(guard.release().await.expect("release"));
    }
}
