//! One client holds 2 000 auto-renewed locks on NATS (the single server
//! and the three-server cluster) and loses none. `NATS_SCALE_N` asks for
//! another number: in a test build on a loaded two-core machine, 10 000
//! do not all stay held yet (`lock-nats/docs.md`).

use lock_nats::NatsLock;
use lock_testkit::faults::{env, unique};
use lock_testkit::scale::holds_many_renewed_locks;

async fn holds_many(var: &str) {
    let lock = NatsLock::connect(&env(var)).await.expect("connect");
    let run = holds_many_renewed_locks(
        &lock,
        &unique("scale"),
        std::env::var("NATS_SCALE_N")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(2_000),
    )
    .await;
    eprintln!("{var}: {run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_locks_stay_held_on_one_server() {
    holds_many("DISTLOCK_TEST_NATS_URL").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_locks_stay_held_on_the_cluster() {
    holds_many("DISTLOCK_TEST_NATS_CLUSTER_URL").await;
}
