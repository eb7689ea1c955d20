//! The conformance suite against `MigratingLock` over real backends: memory
//! → SQLite, Redis → etcd and SQLite → Postgres, two independent clients
//! each (each its own pair of backend clients). The fault hook takes the
//! lock away on both backends; `one_lost_part_loses_the_lock` takes it away
//! on one.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use distlock::{DistributedLock, LockError, LockOptions, MemoryLock, MigratingLock, Wait};
use lock_core::raw::async_trait;
use lock_testkit::conformance::{FaultHook, Harness, taken_away};

type TakeAway = Box<
    dyn Fn(String) -> std::pin::Pin<Box<dyn Future<Output = Result<bool, LockError>> + Send>>
        + Send
        + Sync,
>;

/// Takes the lock away on every listed backend.
struct BothHook(Vec<TakeAway>);

#[async_trait]
impl FaultHook for BothHook {
    async fn take_away(&self, name: &str) -> Result<(), LockError> {
        let mut any = false;
        for take in &self.0 {
            any |= take(name.to_string()).await?;
        }
        taken_away(name, any)
    }
}

fn env(var: &str) -> String {
    std::env::var(var)
        .unwrap_or_else(|_| panic!("{var} is not set: run the tests through scripts/test.sh"))
}

fn db_dir() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temporary directory"))
}

async fn sqlite() -> distlock::SqliteLock {
    distlock::SqliteLock::open(
        &db_dir().path().join("migrate.db"),
        distlock::SqliteConfig::default(),
    )
    .await
    .expect("open sqlite")
}

fn memory_take(lock: MemoryLock) -> TakeAway {
    Box::new(move |name| {
        let lock = lock.clone();
        Box::pin(async move { lock.force_release(&name).await })
    })
}

macro_rules! take {
    ($lock:expr) => {{
        let lock = $lock.clone();
        Box::new(move |name: String| {
            let lock = lock.clone();
            Box::pin(async move { lock.force_release(&name).await })
                as std::pin::Pin<Box<dyn Future<Output = Result<bool, LockError>> + Send>>
        }) as TakeAway
    }};
}

fn harness_of(
    from: [Arc<dyn DistributedLock>; 2],
    to: [Arc<dyn DistributedLock>; 2],
    hook: BothHook,
) -> Harness {
    let [from_a, from_b] = from;
    let [to_a, to_b] = to;
    Harness {
        lock: Arc::new(MigratingLock::new(from_a, to_a)),
        other: Arc::new(MigratingLock::new(from_b, to_b)),
        hook: Arc::new(hook),
    }
}

mod memory_to_sqlite {
    use super::*;

    pub(super) async fn harness() -> Harness {
        let memory = MemoryLock::new();
        let (a, b) = (sqlite().await, sqlite().await);
        let hook = BothHook(vec![memory_take(memory.clone()), take!(a)]);
        harness_of(
            [Arc::new(memory.clone()), Arc::new(memory)],
            [Arc::new(a), Arc::new(b)],
            hook,
        )
    }

    lock_testkit::conformance_suite!(harness());
}

mod redis_to_etcd {
    use super::*;

    pub(super) async fn harness() -> Harness {
        let (redis, etcd) = (
            env("DISTLOCK_TEST_REDIS_URL"),
            env("DISTLOCK_TEST_ETCD_URL"),
        );
        let connect_redis = || distlock::RedisLock::connect(&redis);
        let connect_etcd = || distlock::EtcdLock::connect(&etcd);
        let (ra, rb) = (
            connect_redis().await.expect("redis"),
            connect_redis().await.expect("redis"),
        );
        let (ea, eb) = (
            connect_etcd().await.expect("etcd"),
            connect_etcd().await.expect("etcd"),
        );
        let hook = BothHook(vec![take!(ra), take!(ea)]);
        harness_of(
            [Arc::new(ra), Arc::new(rb)],
            [Arc::new(ea), Arc::new(eb)],
            hook,
        )
    }

    lock_testkit::conformance_suite!(harness());
}

mod sqlite_to_postgres {
    use super::*;

    pub(super) async fn harness() -> Harness {
        let url = env("DISTLOCK_TEST_POSTGRES_URL");
        let pg = || distlock::PgLock::connect(&url);
        let (sa, sb) = (sqlite().await, sqlite().await);
        let (pa, pb) = (pg().await.expect("postgres"), pg().await.expect("postgres"));
        let hook = BothHook(vec![take!(sa), take!(pa)]);
        harness_of(
            [Arc::new(sa), Arc::new(sb)],
            [Arc::new(pa), Arc::new(pb)],
            hook,
        )
    }

    lock_testkit::conformance_suite!(harness());
}

/// Taking the lock away on one backend only: the migrating guard's `lost()`
/// fires by the backend's signal, the other part is no longer renewed (a
/// holder ignoring the loss does not block others past a lease), and a
/// release reports the lock as no longer ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_lost_part_loses_the_lock() {
    let memory = MemoryLock::new();
    let (a, b) = (sqlite().await, sqlite().await);
    let ttl = Duration::from_secs(2);
    for take_from in [true, false] {
        let lock = MigratingLock::new(Arc::new(memory.clone()), Arc::new(a.clone()));
        let other = MigratingLock::new(Arc::new(memory.clone()), Arc::new(b.clone()));
        let name = format!("one-part/{take_from}/{:x}", rand::random::<u64>());
        let opts = LockOptions::new().ttl(ttl);
        let g = lock.acquire(&name, &opts).await.expect("acquire");
        if take_from {
            assert!(memory.force_release(&name).await.expect("take away"));
        } else {
            assert!(a.force_release(&name).await.expect("take away"));
        }
        let reason = tokio::time::timeout(ttl, g.lost())
            .await
            .expect("lost() fires when one part is taken away");
        assert_ne!(reason, distlock::LossReason::DeadlinePassed);
        // The guard is kept (the loss ignored): the healthy part must still
        // end with its lease, though it was being renewed.
        let g2 = other
            .acquire(&name, &opts.clone().wait(Wait::UpTo(ttl * 3)))
            .await
            .expect("the healthy part ended with its lease");
        assert!(!g.release().await.expect("release"));
        assert!(g2.release().await.expect("release"));
    }
}

/// A process on the new backend alone holds the lock: a migrating process
/// gives `from` back when its wait for `to` runs out, so an old-style
/// process is not blocked by a migrating one queued behind the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_timed_out_wait_for_to_gives_from_back() {
    let (old, new) = (MemoryLock::new(), MemoryLock::new());
    let migrating = MigratingLock::new(Arc::new(old.clone()), Arc::new(new.clone()));
    let on_new = new
        .acquire("job", &LockOptions::new())
        .await
        .expect("new-style holder");
    let err = migrating
        .acquire(
            "job",
            &LockOptions::new().wait(Wait::UpTo(Duration::from_millis(300))),
        )
        .await
        .expect_err("`to` is held");
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    let on_old = old
        .try_acquire("job", &LockOptions::new())
        .await
        .expect("try")
        .expect("`from` was given back");
    assert!(on_old.release().await.expect("release"));
    assert!(on_new.release().await.expect("release"));
}
