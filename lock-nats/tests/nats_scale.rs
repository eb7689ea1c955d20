//! One client holds 2 000 auto-renewed locks on NATS (the single server
//! and the three-server cluster) and loses none (`scripts/scale.sh` holds
//! 10 000 for a minute, in a release build).

use lock_nats::NatsLock;
use lock_testkit::faults::{env, unique};
use lock_testkit::scale::holds_many_renewed_locks;

async fn holds_two_thousand(var: &str) {
    let lock = NatsLock::connect(&env(var)).await.expect("connect");
    let run = holds_many_renewed_locks(&lock, &unique("scale"), 2_000).await;
    eprintln!("{var}: {run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_renewed_locks_stay_held_on_one_server() {
    holds_two_thousand("DISTLOCK_TEST_NATS_URL").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_renewed_locks_stay_held_on_the_cluster() {
    holds_two_thousand("DISTLOCK_TEST_NATS_CLUSTER_URL").await;
}
