//! The shared network fault matrix (`lock_testkit::network`) against the
//! standalone etcd: the holder reaches it through a proxy that partitions
//! it or loses a grant, a release or a session keep-alive.

use std::time::Duration;

use lock_etcd::EtcdLock;
use lock_testkit::faults::{env, upstreams_of, with_upstreams};
use lock_testkit::network::NetworkTarget;

/// The session TTL of the clients: the lock lives on the session's lease,
/// which the server revokes when keep-alives stop.
const SESSION: Duration = Duration::from_secs(3);

fn url() -> String {
    env("DISTLOCK_TEST_ETCD_URL")
}

fn target() -> NetworkTarget {
    NetworkTarget::new(upstreams_of(&url()), |hosts| async move {
        let url = format!(
            "{}?session_ttl_s={}&request_timeout_ms=1000&connect_timeout_ms=1000",
            with_upstreams(&url(), &hosts),
            SESSION.as_secs()
        );
        EtcdLock::connect(&url).await.expect("connect")
    })
    .ttl(SESSION)
    .freed_within(SESSION)
}

lock_testkit::network_fault_matrix!(target());
