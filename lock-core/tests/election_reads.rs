//! How an election reads a lock's state that is not a settled leadership.

use std::sync::Arc;

use async_trait::async_trait;
use lock_core::{
    Capabilities, DistributedLock, Election, LockError, LockGuard, LockInfo, LockOptions,
    MemoryLock,
};

/// The memory backend, except that `inspect` shows the lock held with no
/// fencing token: what Redlock shows between a grant's majority and the
/// write-back of its token.
struct GrantInProgress(MemoryLock);

#[async_trait]
impl DistributedLock for GrantInProgress {
    async fn try_acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.0.try_acquire(name, opts).await
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        self.0.acquire(name, opts).await
    }

    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    async fn inspect(&self, _name: &str) -> Result<LockInfo, LockError> {
        Ok(LockInfo::held())
    }
}

/// No leader yet, rather than an error that an observer's stream would
/// carry (and the CLI would report) for a state that settles a moment
/// later.
#[tokio::test]
async fn a_grant_still_writing_its_term_reads_as_no_leader_yet() {
    let election = Election::new(Arc::new(GrantInProgress(MemoryLock::new())), "e");
    assert!(election.leader().await.expect("read").is_none());
}
