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

/// The crate's `docs.md` opens with the capability checklist this backend
/// reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_open_with_the_capability_checklist() {
    let h = harness().await;
    lock_testkit::docs::assert_checklist(include_str!("../docs.md"), &h.lock.capabilities());
}
