//! One program, several backends: the same function runs unchanged against
//! Redis and etcd (and any other URL), only the URL differs. This is what a
//! migration from `redis://` to `etcd://` looks like.

#![cfg(all(feature = "redis", feature = "etcd"))]

use std::sync::Arc;
use std::time::Duration;

use distlock::{DistributedLock, LockOptions};

/// An application's use of the lock: a nightly job that must not run twice
/// at once, run by three workers, each writing with its fencing token.
async fn nightly_job(locks: Arc<dyn DistributedLock>, name: &str) -> Vec<u64> {
    let opts = LockOptions::new().wait_timeout(Duration::from_secs(10));
    let mut workers = Vec::new();
    for _ in 0..3 {
        let (locks, name, opts) = (locks.clone(), name.to_string(), opts.clone());
        workers.push(tokio::spawn(async move {
            let guard = locks.acquire(&name, &opts).await.expect("acquire");
            let token = guard.fencing_token().expect("a fencing token");
            // While we hold it, nobody else gets it.
            let busy = locks
                .try_acquire(&name, &LockOptions::new())
                .await
                .expect("try_acquire");
            assert!(busy.is_none(), "two holders at once");
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(guard.release().await.expect("release"));
            token
        }));
    }
    let mut tokens = Vec::new();
    for w in workers {
        tokens.push(w.await.expect("worker"));
    }
    tokens.sort_unstable();
    tokens
}

fn env(var: &str) -> String {
    std::env::var(var)
        .unwrap_or_else(|_| panic!("{var} is not set: run the tests through scripts/test.sh"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_program_runs_on_redis_and_on_etcd() {
    let name = format!("portable/{:x}", rand_suffix());
    for var in ["DISTLOCK_TEST_REDIS_URL", "DISTLOCK_TEST_ETCD_URL"] {
        let locks = distlock::connect(&env(var)).await.expect("connect");
        let tokens = nightly_job(locks.clone(), &name).await;
        assert_eq!(tokens.len(), 3);
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "{var}: tokens {tokens:?}"
        );
        eprintln!("{}: tokens {tokens:?}", locks.capabilities().backend);
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}
