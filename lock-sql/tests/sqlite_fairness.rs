//! Five OS processes loop on one lock of one SQLite file: each gets a
//! share of the grants. SQLite cannot notify waiters across processes, so
//! this holds only if waiters are served in order (their tickets in the
//! file), not by whoever polls at the right moment.
//!
//! The parent starts five copies of this test binary (selecting this same
//! test) with `DISTLOCK_SQLITE_FAIR_WORKER` set; each worker loops for a
//! fixed time and writes how many grants it got.

use std::path::Path;
use std::time::Duration;

use lock_core::{DistributedLock, LockOptions, Wait};
use lock_sql::{SqliteConfig, SqliteLock};

const WORKERS: usize = 5;
const RUN: Duration = Duration::from_secs(5);
const WORKER_ENV: &str = "DISTLOCK_SQLITE_FAIR_WORKER";
const DIR_ENV: &str = "DISTLOCK_SQLITE_FAIR_DIR";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_processes_each_get_a_share() {
    match std::env::var(WORKER_ENV) {
        Ok(id) => worker(&id, Path::new(&std::env::var(DIR_ENV).expect("worker dir"))).await,
        Err(_) => parent().await,
    }
}

async fn parent() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Create the file first, so the workers do not race to set it up.
    drop(
        SqliteLock::open(dir.path().join("locks.db"), SqliteConfig::default())
            .await
            .expect("open sqlite"),
    );
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = (0..WORKERS)
        .map(|id| {
            tokio::process::Command::new(&exe)
                .args(["--exact", "five_processes_each_get_a_share", "--nocapture"])
                .env(WORKER_ENV, id.to_string())
                .env(DIR_ENV, dir.path())
                .stdout(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn worker process")
        })
        .collect();
    for mut child in children {
        let status = tokio::time::timeout(Duration::from_secs(120), child.wait())
            .await
            .expect("worker finished in time")
            .expect("worker status");
        assert!(status.success(), "worker process failed: {status}");
    }
    let counts: Vec<u64> = (0..WORKERS)
        .map(|id| {
            std::fs::read_to_string(dir.path().join(format!("count-{id}")))
                .expect("count file")
                .trim()
                .parse()
                .expect("count")
        })
        .collect();
    let (min, max) = (
        counts.iter().copied().min().unwrap_or(0),
        counts.iter().copied().max().unwrap_or(0),
    );
    eprintln!(
        "sqlite fairness: grants per process {counts:?}, min/max {:.2}",
        min as f64 / max.max(1) as f64
    );
    assert!(min > 0, "a process got no grant at all: {counts:?}");
    assert!(
        min * 2 >= max,
        "grants spread unevenly across processes: {counts:?}"
    );
}

async fn worker(id: &str, dir: &Path) {
    let locks = SqliteLock::open(dir.join("locks.db"), SqliteConfig::default())
        .await
        .expect("open sqlite");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Wait::Up(Duration::from_secs(60)));
    let end = tokio::time::Instant::now() + RUN;
    let mut grants = 0u64;
    while tokio::time::Instant::now() < end {
        let guard = locks.acquire("contended", &opts).await.expect("acquire");
        tokio::time::sleep(Duration::from_millis(3)).await;
        assert!(
            guard.release().await.expect("release"),
            "not ours at release"
        );
        grants += 1;
    }
    std::fs::write(dir.join(format!("count-{id}")), grants.to_string()).expect("write count");
}
