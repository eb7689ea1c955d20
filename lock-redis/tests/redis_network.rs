//! The shared network fault matrix (`lock_testkit::network`) against the
//! project's Redis: the holder reaches it through a proxy that partitions
//! it or loses a grant, a release or a renewal.

use std::time::Duration;

use lock_redis::RedisLock;
use lock_testkit::faults::{env, upstreams_of, with_upstreams};
use lock_testkit::network::NetworkTarget;

fn url() -> String {
    env("DISTLOCK_TEST_REDIS_URL")
}

/// Short timeouts, so that a silent server is noticed within a TTL; the
/// lease's TTL frees a silent holder's lock.
fn target() -> NetworkTarget {
    NetworkTarget::new(upstreams_of(&url()), |hosts| async move {
        let url = format!(
            "{}/0?connect_timeout_ms=300&response_timeout_ms=300",
            with_upstreams(&url(), &hosts)
        );
        RedisLock::connect(&url).await.expect("connect")
    })
    .ttl(Duration::from_secs(3))
    .freed_within(Duration::from_secs(3))
}

lock_testkit::network_fault_matrix!(target());
