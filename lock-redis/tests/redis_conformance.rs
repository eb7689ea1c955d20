//! The conformance suite against the Redis that `scripts/services.sh` runs
//! (`DISTLOCK_TEST_REDIS_URL`), with independent clients.

use lock_redis::RedisLock;
use lock_testkit::conformance::Harness;
use lock_testkit::faults::env;

async fn harness() -> Harness {
    let url = env("DISTLOCK_TEST_REDIS_URL");
    Harness::of(async || RedisLock::connect(&url).await.expect("connect to redis")).await
}

lock_testkit::conformance_suite!(harness());

/// The suite again, on locks built from a `redis::Client` the application
/// made itself (`RedisLock::with_client`).
mod own_client {
    use lock_redis::{RedisConfig, RedisLock, redis};
    use lock_testkit::conformance::Harness;
    use lock_testkit::faults::env;

    async fn harness() -> Harness {
        let url = format!("{}?protocol=resp3", env("DISTLOCK_TEST_REDIS_URL"));
        Harness::of(async || {
            let client = redis::Client::open(url.as_str()).expect("the application's client");
            RedisLock::with_client(client, RedisConfig::default())
                .await
                .expect("a lock on the application's client")
        })
        .await
    }

    lock_testkit::conformance_suite!(harness());

    /// A client that speaks RESP2 cannot deliver wake-ups: refused, typed.
    #[tokio::test]
    async fn a_resp2_client_is_refused() {
        let client = redis::Client::open(env("DISTLOCK_TEST_REDIS_URL").as_str()).expect("client");
        match RedisLock::with_client(client, RedisConfig::default()).await {
            Err(lock_core::LockError::InvalidOptions { reason }) => {
                assert!(reason.contains("RESP3"), "{reason}")
            }
            Err(e) => panic!("a RESP2 client gave {e:?}"),
            Ok(_) => panic!("a RESP2 client was accepted"),
        }
    }
}

/// The crate's `docs.md` opens with the capability checklist this backend
/// reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_open_with_the_capability_checklist() {
    let h = harness().await;
    lock_testkit::docs::assert_checklist(include_str!("../docs.md"), &h.lock.capabilities());
}
