//! The shared network fault matrix (`lock_testkit::network`) through the
//! project's Sentinel group: the holder reaches each Sentinel and each of
//! the group's three nodes through a proxy of its own (the URL's
//! `node_map` maps each node's address, as the Sentinels name it, to its
//! proxy), which partitions it or loses a grant, a release or a renewal.

use std::time::Duration;

use lock_redis::RedisLock;
use lock_testkit::faults::{env, upstreams_of};
use lock_testkit::network::NetworkTarget;

/// The group's data nodes (`scripts/services.sh`: sredis1..3).
const NODES: [&str; 3] = ["127.0.0.1:16390", "127.0.0.1:16391", "127.0.0.1:16392"];

/// The Sentinels, then the nodes.
fn upstreams() -> Vec<String> {
    let mut all = upstreams_of(&env("DISTLOCK_TEST_REDIS_SENTINEL_URL"));
    all.extend(NODES.iter().map(|n| n.to_string()));
    all
}

/// The group's name, the URL's path.
fn group() -> String {
    let url = env("DISTLOCK_TEST_REDIS_SENTINEL_URL");
    let path = url.rsplit_once('/').map(|(_, g)| g).unwrap_or_default();
    path.to_string()
}

/// Short timeouts, so that a silent server is noticed within a TTL; the
/// lease's TTL frees a silent holder's lock.
fn target() -> NetworkTarget {
    NetworkTarget::new(upstreams(), |hosts| async move {
        let sentinels = hosts.len() - NODES.len();
        let map: Vec<String> = NODES
            .iter()
            .zip(&hosts[sentinels..])
            .map(|(node, via)| format!("{node}>{via}"))
            .collect();
        let url = format!(
            "redis+sentinel://{}/{}?node_map={}&connect_timeout=300ms&response_timeout=300ms",
            hosts[..sentinels].join(","),
            group(),
            map.join(",")
        );
        RedisLock::connect(&url).await.expect("connect")
    })
    .ttl(Duration::from_secs(3))
    .freed_within(Duration::from_secs(3))
}

lock_testkit::network_fault_matrix!(target());
