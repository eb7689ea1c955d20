//! The conformance suite against the in-memory backend.

use std::sync::Arc;

use lock_core::testkit::{FaultHook, Harness, taken_away};
use lock_core::{DistributedLock, LockError, MemoryLock, async_trait};

struct MemoryHook(MemoryLock);

#[async_trait]
impl FaultHook for MemoryHook {
    async fn take_away(&self, name: &str) -> Result<(), LockError> {
        taken_away(name, self.0.force_release(name).await?)
    }

    async fn queued(&self, name: &str) -> Result<Option<usize>, LockError> {
        Ok(Some(self.0.queued(name)))
    }
}

async fn harness() -> Harness {
    let lock = MemoryLock::new();
    Harness {
        lock: Arc::new(lock.clone()),
        other: Arc::new(lock.clone()),
        hook: Arc::new(MemoryHook(lock)),
    }
}

lock_core::conformance_suite!(harness());
