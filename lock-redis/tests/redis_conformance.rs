//! The conformance suite against the Redis that `scripts/services.sh` runs
//! (`DISTLOCK_TEST_REDIS_URL`), with two independent clients.

use std::sync::Arc;

use lock_core::testkit::{FaultHook, Harness, taken_away};
use lock_core::{DistributedLock, LockError, async_trait};
use lock_redis::RedisLock;

struct RedisHook(RedisLock);

#[async_trait]
impl FaultHook for RedisHook {
    async fn take_away(&self, name: &str) -> Result<(), LockError> {
        taken_away(name, self.0.force_release(name).await?)
    }

    async fn queued(&self, name: &str) -> Result<Option<usize>, LockError> {
        self.0.queued(name).await.map(Some)
    }
}

fn url() -> String {
    std::env::var("DISTLOCK_TEST_REDIS_URL")
        .expect("DISTLOCK_TEST_REDIS_URL is not set: run the tests through scripts/test.sh")
}

async fn harness() -> Harness {
    let lock = RedisLock::connect(&url()).await.expect("connect to redis");
    let other = RedisLock::connect(&url()).await.expect("connect to redis");
    Harness {
        hook: Arc::new(RedisHook(lock.clone())),
        lock: Arc::new(lock),
        other: Arc::new(other),
    }
}

lock_core::conformance_suite!(harness());
