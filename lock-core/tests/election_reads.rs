//! How an election reads a lock's state that is not a settled leadership.

use std::sync::Arc;

use async_trait::async_trait;
use lock_core::raw::{Layered, LayeredLock};
use lock_core::{DistributedLock, Election, LockError, LockInfo, MemoryLock};

/// The memory backend, except that `inspect` shows the lock held with no
/// fencing token: what Redlock shows between a grant's majority and the
/// write-back of its token.
struct GrantInProgress(Arc<dyn DistributedLock>);

#[async_trait]
impl LayeredLock for GrantInProgress {
    fn inner(&self) -> &Arc<dyn DistributedLock> {
        &self.0
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
    let lock = Layered::new(GrantInProgress(Arc::new(MemoryLock::new())));
    let election = Election::new(Arc::new(lock), "e");
    assert!(election.leader().await.expect("read").is_none());
}
