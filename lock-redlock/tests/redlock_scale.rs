//! One client holds 2 000 auto-renewed locks on the five masters through
//! several renewal rounds, and loses none (renewals to each master go out
//! in batches).

use lock_redlock::Redlock;
use lock_testkit::faults::env;
use lock_testkit::scale::holds_many_renewed_locks;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_renewed_locks_stay_held() {
    let lock = Redlock::connect(&env("DISTLOCK_TEST_REDLOCK_URL"))
        .await
        .expect("connect to the redlock nodes");
    let prefix = format!("scale/{}", std::process::id());
    let run = holds_many_renewed_locks(&lock, &prefix, 2_000).await;
    println!("redlock: {run:?}");
}
