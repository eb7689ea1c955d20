//! A guard dropped as its runtime shuts down is released, on every backend:
//! the lock is free for another client long before its TTL ends.
//!
//! This is what every `#[tokio::main(flavor = "current_thread")]` program
//! and every `#[tokio::test]` does: the guard is dropped at the end of the
//! async body (or a task holding one is cancelled by the shutdown), the
//! background release it spawns never runs, and without a release that
//! needs nothing of the dying runtime the lock stayed held for its TTL.

use std::sync::Arc;
use std::time::Duration;

use distlock::{DistributedLock, LockOptions, Wait};

/// Longer than the test could ever wait: a lock still held when the test
/// looks was not released.
const TTL: Duration = Duration::from_secs(120);

/// How long the other client waits for the lock: round trips and a fresh
/// connection, on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(10);

fn env(var: &str) -> String {
    std::env::var(var)
        .unwrap_or_else(|_| panic!("{var} is not set: run the tests through scripts/test.sh"))
}

fn unique(case: &str) -> String {
    format!("shutdown/{case}/{:016x}", rand::random::<u64>())
}

/// How the guard meets the end of its runtime.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// Dropped at the end of the runtime's main future, as `main` returns.
    DroppedAsMainReturns,
    /// Held by a spawned task that the runtime's shutdown cancels.
    HeldByACancelledTask,
}

/// On a `current_thread` runtime of its own, on a thread of its own:
/// connect to `url` (or use `shared`), take `name`, and let the guard meet
/// `ending`; then the runtime is dropped.
fn hold_until_the_runtime_ends(
    url: String,
    shared: Option<Arc<dyn DistributedLock>>,
    name: String,
    ending: Ending,
) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current_thread runtime");
        rt.block_on(async move {
            let locks = match shared {
                Some(locks) => locks,
                None => distlock::connect(&url).await.expect("connect"),
            };
            let opts = LockOptions::new().ttl(TTL).wait(Wait::No);
            let guard = locks.acquire(&name, &opts).await.expect("acquire");
            match ending {
                Ending::DroppedAsMainReturns => drop(guard),
                Ending::HeldByACancelledTask => {
                    let (held, taken) = tokio::sync::oneshot::channel::<()>();
                    tokio::spawn(async move {
                        let _guard = guard;
                        let _ = held.send(());
                        std::future::pending::<()>().await;
                    });
                    taken.await.expect("the task holds the guard");
                }
            }
        });
        drop(rt);
    })
    .join()
    .expect("the holder's thread");
}

/// The lock of `name` can be taken by `other` within [`PATIENCE`].
async fn free_soon(other: &Arc<dyn DistributedLock>, name: &str, what: &str) {
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Wait::UpTo(PATIENCE));
    match other.acquire(name, &opts).await {
        Ok(guard) => {
            assert!(guard.release().await.expect("release"));
        }
        Err(e) => panic!("{what}: the lock was not released at shutdown ({e})"),
    }
}

async fn check(url: &str, shared: Option<Arc<dyn DistributedLock>>) {
    let other = match &shared {
        Some(locks) => Arc::clone(locks),
        None => distlock::connect(url)
            .await
            .expect("connect the other client"),
    };
    for ending in [Ending::DroppedAsMainReturns, Ending::HeldByACancelledTask] {
        let name = unique(&format!("{ending:?}"));
        let (url, shared, held) = (url.to_string(), shared.clone(), name.clone());
        tokio::task::spawn_blocking(move || hold_until_the_runtime_ends(url, shared, held, ending))
            .await
            .expect("holder");
        let what = format!("{} ({ending:?})", other.capabilities().backend);
        free_soon(&other, &name, &what).await;
    }
}

#[tokio::test]
async fn memory() {
    let locks: Arc<dyn DistributedLock> = Arc::new(distlock::MemoryLock::new());
    check("memory://", Some(locks)).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    check(&url, None).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis() {
    check(&env("DISTLOCK_TEST_REDIS_URL"), None).await;
}

#[cfg(feature = "redlock")]
#[tokio::test]
async fn redlock() {
    check(&env("DISTLOCK_TEST_REDLOCK_URL"), None).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres() {
    both_modes("DISTLOCK_TEST_POSTGRES_URL").await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql() {
    both_modes("DISTLOCK_TEST_MYSQL_URL").await;
}

/// A SQL server's URL, in row mode and in advisory mode.
#[allow(dead_code)]
async fn both_modes(var: &str) {
    let url = env(var);
    let sep = if url.contains('?') { '&' } else { '?' };
    for mode in ["row", "advisory"] {
        check(&format!("{url}{sep}mode={mode}"), None).await;
    }
}

#[cfg(feature = "etcd")]
#[tokio::test]
async fn etcd() {
    check(&env("DISTLOCK_TEST_ETCD_URL"), None).await;
}

#[cfg(feature = "zookeeper")]
#[tokio::test]
async fn zookeeper() {
    check(&env("DISTLOCK_TEST_ZK_URL"), None).await;
}

#[cfg(feature = "nats")]
#[tokio::test]
async fn nats() {
    check(&env("DISTLOCK_TEST_NATS_URL"), None).await;
}
