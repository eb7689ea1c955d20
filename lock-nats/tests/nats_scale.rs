//! One client holds 10 000 auto-renewed locks on one NATS server, and
//! 2 000 on the three-server cluster, and loses none. `NATS_SCALE_N` asks
//! for another number on both. The cluster's bound is the servers': on a
//! two-core machine, three servers replicating 10 000 renewals a second
//! need about one core between them (`lock-nats/docs.md`).

use lock_nats::NatsLock;
use lock_testkit::faults::{env, unique};
use lock_testkit::scale::holds_many_renewed_locks;

async fn holds_many(var: &str, count: usize) {
    let lock = NatsLock::connect(&env(var)).await.expect("connect");
    let count = std::env::var("NATS_SCALE_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(count);
    let run = holds_many_renewed_locks(&lock, &unique("scale"), count).await;
    eprintln!("{var}: {run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_locks_stay_held_on_one_server() {
    holds_many("DISTLOCK_TEST_NATS_URL", 10_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_locks_stay_held_on_the_cluster() {
    holds_many("DISTLOCK_TEST_NATS_CLUSTER_URL", 2_000).await;
}
