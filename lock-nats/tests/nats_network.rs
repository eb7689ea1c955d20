//! The shared network fault matrix (`lock_testkit::network`) against the
//! single NATS server: the holder reaches it through a proxy that
//! partitions it or loses a grant, a release or a renewal.

use std::time::Duration;

use lock_nats::NatsLock;
use lock_testkit::faults::{env, upstreams_of, with_upstreams};
use lock_testkit::network::NetworkTarget;

/// The TTL of the locks: the message expires with it when its holder
/// goes silent.
const TTL: Duration = Duration::from_secs(3);

fn url() -> String {
    env("DISTLOCK_TEST_NATS_URL")
}

fn target() -> NetworkTarget {
    NetworkTarget::new(upstreams_of(&url()), |hosts| async move {
        let url = format!(
            "{}?request_timeout=1s&connect_timeout=1s",
            with_upstreams(&url(), &hosts)
        );
        NatsLock::connect(&url).await.expect("connect")
    })
    .ttl(TTL)
    .freed_within(TTL)
    // A release deletes the message by its sequence: the request names
    // the stream, not the lock.
    .release_is_anonymous()
}

lock_testkit::network_fault_matrix!(target());
