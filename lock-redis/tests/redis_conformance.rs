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

/// The suite's lock cases again, on locks built from a `redis::Client` the application
/// made itself (`RedisLock::with_client`), as most applications make it:
/// speaking RESP2, redis-rs's default. The lock's own connections speak
/// RESP3, so waiters are still woken by push messages
/// (`notified_waiters_do_not_poll`).
mod own_client {
    use lock_redis::{RedisConfig, RedisLock, redis};
    use lock_testkit::conformance::Harness;
    use lock_testkit::faults::env;

    async fn harness() -> Harness {
        let url = env("DISTLOCK_TEST_REDIS_URL");
        Harness::of(async || {
            let client = redis::Client::open(url.as_str()).expect("the application's client");
            assert_eq!(
                client.get_connection_info().redis_settings().protocol(),
                redis::ProtocolVersion::RESP2
            );
            RedisLock::with_client(client, RedisConfig::default())
                .await
                .expect("a lock on the application's client")
        })
        .await
    }

    // The lock cases: the other primitives run the same code on the
    // lock's own connections, whichever client they were made from.
    lock_testkit::lock_conformance_suite!(harness());
}

/// The crate's `docs.md` opens with the capability checklist this backend
/// reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_open_with_the_capability_checklist() {
    let h = harness().await;
    lock_testkit::docs::assert_checklist(include_str!("../docs.md"), &h.lock.capabilities());
}

/// The suite again, through the project's Sentinel group
/// (`DISTLOCK_TEST_REDIS_SENTINEL_URL`): every client follows the group's
/// master.
mod sentinel {
    use lock_redis::RedisLock;
    use lock_testkit::conformance::Harness;
    use lock_testkit::faults::env;

    async fn harness() -> Harness {
        let url = env("DISTLOCK_TEST_REDIS_SENTINEL_URL");
        Harness::of(async || {
            RedisLock::connect(&url)
                .await
                .expect("connect through sentinel")
        })
        .await
    }

    lock_testkit::conformance_suite!(harness());

    /// The checklist's `redis+sentinel` column is what a client through
    /// Sentinel reports.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn docs_state_the_sentinel_capabilities() {
        let h = harness().await;
        lock_testkit::docs::assert_checklist_column(
            include_str!("../docs.md"),
            "redis+sentinel",
            &h.lock.capabilities(),
        );
    }
}

/// The suite again, on the project's Redis Cluster
/// (`DISTLOCK_TEST_REDIS_CLUSTER_URL`): three masters, each with a replica.
mod cluster {
    use lock_redis::RedisLock;
    use lock_testkit::conformance::Harness;
    use lock_testkit::faults::env;

    async fn harness() -> Harness {
        let url = env("DISTLOCK_TEST_REDIS_CLUSTER_URL");
        Harness::of(async || {
            RedisLock::connect(&url)
                .await
                .expect("connect to the cluster")
        })
        .await
    }

    lock_testkit::conformance_suite!(harness());

    /// The checklist's `redis+cluster` column is what a client on a
    /// cluster reports.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn docs_state_the_cluster_capabilities() {
        let h = harness().await;
        lock_testkit::docs::assert_checklist_column(
            include_str!("../docs.md"),
            "redis+cluster",
            &h.lock.capabilities(),
        );
    }
}
