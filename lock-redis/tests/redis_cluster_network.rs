//! The shared network fault matrix (`lock_testkit::network`) against the
//! project's Redis Cluster: the holder reaches each of the six nodes
//! through a proxy of its own (the URL's `node_map` maps each node's
//! announced address to its proxy, so the cluster client never goes
//! around them), which partitions it or loses a grant, a release or a
//! renewal.

use std::time::Duration;

use lock_redis::RedisLock;
use lock_testkit::faults::{env, upstreams_of};
use lock_testkit::network::NetworkTarget;

fn upstreams() -> Vec<String> {
    upstreams_of(&env("DISTLOCK_TEST_REDIS_CLUSTER_URL"))
}

/// Short timeouts, so that a silent node is noticed within a TTL; the
/// lease's TTL frees a silent holder's lock.
fn target() -> NetworkTarget {
    NetworkTarget::new(upstreams(), |hosts| async move {
        let map: Vec<String> = upstreams()
            .iter()
            .zip(&hosts)
            .map(|(node, via)| format!("{node}>{via}"))
            .collect();
        let url = format!(
            "redis+cluster://{}?node_map={}&connect_timeout=300ms&response_timeout=300ms",
            hosts.join(","),
            map.join(",")
        );
        RedisLock::connect(&url).await.expect("connect")
    })
    .ttl(Duration::from_secs(3))
    .freed_within(Duration::from_secs(3))
}

lock_testkit::network_fault_matrix!(target());
