//! `rediss://` sets up TLS without panicking even when the program links
//! more than one rustls crypto provider (the workspace's ZooKeeper client
//! brings a second one), and a server that does not speak TLS is a typed
//! error.

use lock_core::{DistributedLock, LockError, LockOptions, Wait};
use lock_redis::RedisLock;

#[tokio::test]
async fn rediss_to_a_plain_server_is_a_typed_error() {
    let plain = lock_testkit::faults::env("DISTLOCK_TEST_REDIS_URL");
    let tls = plain.replacen("redis://", "rediss://", 1);
    let outcome = match RedisLock::connect(&format!("{tls}?connect_timeout_ms=500")).await {
        Err(e) => Err(e),
        Ok(locks) => locks
            .try_acquire("tls-check", &LockOptions::new().wait(Wait::No))
            .await
            .map(|_| ()),
    };
    assert!(
        matches!(outcome, Err(LockError::Unavailable { .. })),
        "{outcome:?}"
    );
}
