//! The shared network fault matrix (`lock_testkit::network`) against the
//! single NATS server and the three-server cluster: the holder reaches
//! the servers through proxies that partition it or lose a grant, a
//! release or a renewal.

use std::time::Duration;

use lock_nats::NatsLock;
use lock_testkit::faults::{env, upstreams_of, with_upstreams};
use lock_testkit::network::NetworkTarget;

/// The TTL of the locks: the message expires with it when its holder
/// goes silent.
const TTL: Duration = Duration::from_secs(3);

/// The target on the servers of `var`'s URL, each behind a proxy.
/// `discover=false`: the client keeps to the proxies, never connecting to
/// the addresses the servers advertise (which would go round them).
fn target(var: &'static str) -> NetworkTarget {
    NetworkTarget::new(upstreams_of(&env(var)), move |hosts| async move {
        let url = with_upstreams(&env(var), &hosts);
        let joint = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{joint}request_timeout=1s&connect_timeout=1s&discover=false");
        NatsLock::connect(&url).await.expect("connect")
    })
    .ttl(TTL)
    .freed_within(TTL)
    // A release deletes the message by its sequence: the request names
    // the stream, not the lock.
    .release_is_anonymous()
}

mod single_server {
    use super::*;
    lock_testkit::network_fault_matrix!(target("DISTLOCK_TEST_NATS_URL"));
}

/// A stream of three replicas: the client reaches each of the three
/// servers through a proxy of its own.
mod cluster {
    use super::*;
    lock_testkit::network_fault_matrix!(target("DISTLOCK_TEST_NATS_CLUSTER_URL"));
}
