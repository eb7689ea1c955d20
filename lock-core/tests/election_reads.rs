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

/// The memory backend, except that `inspect` answers from a script, then
/// as the lock itself does.
struct Scripted {
    inner: Arc<dyn DistributedLock>,
    reads: std::sync::Mutex<std::collections::VecDeque<LockInfo>>,
}

#[async_trait]
impl LayeredLock for Scripted {
    fn inner(&self) -> &Arc<dyn DistributedLock> {
        &self.inner
    }

    async fn inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        let next = self.reads.lock().expect("script").pop_front();
        match next {
            Some(info) => Ok(info),
            None => self.inner.inspect(name).await,
        }
    }
}

/// A term that an observer saw end is never reported again: a server that
/// shows a new grant held before its term is written (Postgres row mode,
/// MySQL) still shows the term before for one round trip. The read is
/// skipped, and the new term is reported when it shows.
#[tokio::test]
async fn an_observer_never_reports_a_term_it_saw_end() {
    use futures_util::StreamExt;
    let held = |term| LockInfo::held().with_fencing_token(Some(term));
    let script = [
        held(7),
        LockInfo::free(),
        held(7),
        held(8),
        LockInfo::free(),
    ];
    let lock = Layered::new(Scripted {
        inner: Arc::new(MemoryLock::new()),
        reads: std::sync::Mutex::new(script.into()),
    });
    let election =
        Election::new(Arc::new(lock), "e").poll_interval(std::time::Duration::from_millis(1));
    let terms: Vec<Option<u64>> = election
        .observe()
        .take(4)
        .map(|item| item.expect("read").map(|l| l.term))
        .collect()
        .await;
    assert_eq!(terms, [Some(7), None, Some(8), None]);
}
