//! `fencing_epoch=N` on any lock URL: tokens in a higher epoch, so that a
//! resource which accepted the old backend's tokens accepts the new one's.

use std::sync::Arc;

use lock_core::raw::{RawGuard, async_trait};
use lock_core::{Capabilities, DistributedLock, LockError, LockGuard, LockInfo, LockOptions};

/// The URL option that sets the epoch.
pub const EPOCH_OPTION: &str = "fencing_epoch";
/// Bits below the epoch: a backend's own token must stay under 2^48.
pub const EPOCH_SHIFT: u32 = 48;

/// A lock whose fencing tokens are the inner backend's with `epoch` in the
/// high 16 bits: `(epoch << 48) | token`. Every token of epoch N+1 is larger
/// than every token of epoch N, so the last step of a migration (the new
/// backend alone, with a higher epoch than the old one's) never hands out a
/// token a fenced resource has seen beaten.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::LockError> {
/// use std::sync::Arc;
/// use distlock::{DistributedLock, EpochLock, LockOptions, MemoryLock};
/// let locks = EpochLock::new(Arc::new(MemoryLock::new()), 1);
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
    /// `inner` with its tokens moved into `epoch`.
    pub fn new(inner: Arc<dyn DistributedLock>, epoch: u16) -> Self {
        EpochLock { inner, epoch }
    }

    /// The epoch.
    pub fn epoch(&self) -> u16 {
        self.epoch
    }

    fn retoken(&self, guard: LockGuard) -> Result<LockGuard, LockError> {
        let Some(token) = guard.fencing_token() else {
            return Ok(guard);
        };
        let lifted = self.lift(guard.name(), token)?;
        Ok(guard.with_fencing_token(Some(lifted)))
    }

    /// The backend's `token` of lock `name` with the epoch above it.
    fn lift(&self, name: &str, token: u64) -> Result<u64, LockError> {
        if token >> EPOCH_SHIFT != 0 {
            return Err(LockError::Backend {
                backend: self.inner.capabilities().backend,
                reason: format!(
                    "fencing token {token} of lock `{name}` does not fit below the epoch bits (2^{EPOCH_SHIFT}); drop `{EPOCH_OPTION}` from the URL"
                ),
                source: None,
            });
        }
        Ok(u64::from(self.epoch) << EPOCH_SHIFT | token)
    }
}

#[async_trait]
impl DistributedLock for EpochLock {
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

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    /// The backend's answer, its token with the epoch above it.
    async fn inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        let info = self.inner.inspect(name).await?;
        let token = info.fencing_token.map(|t| self.lift(name, t)).transpose()?;
        Ok(info.with_fencing_token(token))
    }

    async fn force_release(&self, name: &str) -> Result<bool, LockError> {
        self.inner.force_release(name).await
    }
}

/// `url` without its `fencing_epoch` option, and the epoch if one was given.
/// The option is looked for in the query after the user-info (a password
/// may hold a `?`).
pub fn split_epoch(url: &str) -> Result<(String, Option<u16>), String> {
    let authority_end = url.rfind('@').unwrap_or(0);
    let Some(q) = url[authority_end..].find('?').map(|i| i + authority_end) else {
        return Ok((url.to_string(), None));
    };
    let (base, query) = (&url[..q], &url[q + 1..]);
    let mut epoch = None;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((EPOCH_OPTION, value)) => {
                let n: u16 = value.parse().map_err(|_| {
                    format!(
                        "`{EPOCH_OPTION}` must be a whole number from 0 to 65535, got `{value}`"
                    )
                })?;
                if epoch.replace(n).is_some() {
                    return Err(format!("`{EPOCH_OPTION}` given twice"));
                }
            }
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, epoch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_epoch_option_is_taken_out_of_the_url() {
        assert_eq!(
            split_epoch("etcd://h:1/p?fencing_epoch=2&session_ttl_s=5"),
            Ok(("etcd://h:1/p?session_ttl_s=5".to_string(), Some(2)))
        );
        assert_eq!(
            split_epoch("redis://:pa?ss@h:1?fencing_epoch=1"),
            Ok(("redis://:pa?ss@h:1".to_string(), Some(1)))
        );
        assert_eq!(
            split_epoch("sqlite:///x.db"),
            Ok(("sqlite:///x.db".to_string(), None))
        );
        assert!(split_epoch("etcd://h?fencing_epoch=x").is_err());
        assert!(split_epoch("etcd://h?fencing_epoch=70000").is_err());
        assert!(split_epoch("etcd://h?fencing_epoch=1&fencing_epoch=2").is_err());
    }
}
