//! The shared network fault matrix (`lock_testkit::network`) against the
//! standalone ZooKeeper: the holder reaches it through a proxy that
//! partitions it or loses a grant, a release or a ping.

use std::time::Duration;

use lock_testkit::faults::{env, upstreams_of, with_upstreams};
use lock_testkit::network::NetworkTarget;
use lock_zk::ZkLock;

/// The session timeout of the clients: the server expires a silent
/// session, and its ephemeral lock node with it, after this long; an
/// unrenewed lock may not outlive it, so it is also the scenarios' TTL.
const SESSION: Duration = Duration::from_secs(2);

fn url() -> String {
    env("DISTLOCK_TEST_ZK_URL")
}

fn target() -> NetworkTarget {
    NetworkTarget::new(upstreams_of(&url()), |hosts| async move {
        let url = format!(
            "{}?session_timeout_ms={}",
            with_upstreams(&url(), &hosts),
            SESSION.as_millis()
        );
        ZkLock::connect(&url).await.expect("connect")
    })
    .ttl(SESSION)
    .freed_within(SESSION)
}

lock_testkit::network_fault_matrix!(target());
