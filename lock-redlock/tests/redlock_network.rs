//! The shared network fault matrix (`lock_testkit::network`) against the
//! five Redlock masters: the holder reaches every node through a proxy of
//! its own, and all five partition it or lose its grant, release or
//! renewal at once.

use std::time::Duration;

use lock_redlock::Redlock;
use lock_testkit::faults::{env, upstreams_of, with_upstreams};
use lock_testkit::network::NetworkTarget;

fn url() -> String {
    env("DISTLOCK_TEST_REDLOCK_URL")
}

/// A node timeout well above a loaded machine's stalls; the lease's TTL
/// frees a silent holder's lock on every node.
fn target() -> NetworkTarget {
    NetworkTarget::new(upstreams_of(&url()), |hosts| async move {
        let url = format!(
            "{}?node_timeout_ms=250&connect_timeout_ms=300",
            with_upstreams(&url(), &hosts)
        );
        Redlock::connect(&url).await.expect("connect")
    })
    .ttl(Duration::from_secs(3))
    .freed_within(Duration::from_secs(3))
}

lock_testkit::network_fault_matrix!(target());
