//! OS processes contend on one SQLite database file: they exclude each
//! other, each gets a share, and a killed one leaves no token to be handed
//! out again.
//!
//! Each test runs twice over: as the parent it starts copies of this test
//! binary (selecting this same test, [`spawn_worker`]) with the test's
//! worker variable set; each copy then acts as a worker.
//!
//! In `two_processes_exclude_each_other`, workers update a counter kept in a
//! plain file non-atomically (read, sleep, write) while holding the lock,
//! and log every fencing token they were granted. The parent checks the
//! exact total and that all tokens are distinct across both processes and
//! increase within each.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lock_core::{DistributedLock, LockOptions, Wait};
use lock_sql::{SqliteConfig, SqliteLock};

const ROUNDS: u64 = 40;
const WORKER_ENV: &str = "DISTLOCK_SQLITE_WORKER";
const DIR_ENV: &str = "DISTLOCK_SQLITE_DIR";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_exclude_each_other() {
    match std::env::var(WORKER_ENV) {
        Ok(id) => worker(&id, Path::new(&std::env::var(DIR_ENV).expect("worker dir"))).await,
        Err(_) => parent().await,
    }
}

async fn parent() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("counter"), "0").expect("counter file");
    let children: Vec<_> = ["a", "b"]
        .iter()
        .map(|id| {
            spawn_worker(
                "two_processes_exclude_each_other",
                WORKER_ENV,
                id,
                dir.path(),
            )
        })
        .collect();
    wait_for(children).await;
    let total: u64 = read_number(&dir.path().join("counter"));
    assert_eq!(
        total,
        2 * ROUNDS,
        "lost updates: the two processes overlapped inside the lock"
    );
    let mut all = Vec::new();
    for id in ["a", "b"] {
        let tokens = tokens_of(&dir.path().join(format!("tokens-{id}")));
        assert_eq!(tokens.len() as u64, ROUNDS);
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "tokens of {id} not increasing: {tokens:?}"
        );
        all.extend(tokens);
    }
    all.sort_unstable();
    all.dedup();
    assert_eq!(
        all.len() as u64,
        2 * ROUNDS,
        "a fencing token was granted twice"
    );
    eprintln!(
        "two processes: {} grants, tokens {}..={}",
        2 * ROUNDS,
        all[0],
        all[all.len() - 1]
    );
}

async fn worker(id: &str, dir: &Path) {
    let locks = open_in(dir).await;
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Wait::UpTo(Duration::from_secs(60)));
    let counter = dir.join("counter");
    let mut tokens = Vec::new();
    for _ in 0..ROUNDS {
        let guard = locks
            .acquire("shared-counter", &opts)
            .await
            .expect("acquire");
        let seen = read_number(&counter);
        tokio::time::sleep(Duration::from_millis(2)).await;
        std::fs::write(&counter, (seen + 1).to_string()).expect("write counter");
        tokens.push(guard.fencing_token().expect("sqlite gives fencing tokens"));
        assert!(
            guard.release().await.expect("release"),
            "lock was not ours at release"
        );
    }
    let text: Vec<String> = tokens.iter().map(u64::to_string).collect();
    std::fs::write(dir.join(format!("tokens-{id}")), text.join("\n")).expect("write tokens");
}

fn read_number(path: &PathBuf) -> u64 {
    std::fs::read_to_string(path)
        .expect("read")
        .trim()
        .parse()
        .expect("number")
}

fn tokens_of(path: &PathBuf) -> Vec<u64> {
    std::fs::read_to_string(path)
        .expect("read tokens")
        .lines()
        .map(|l| l.parse().expect("token"))
        .collect()
}

const CRASH_ENV: &str = "DISTLOCK_SQLITE_CRASH_WORKER";

/// Fencing tokens never go backwards across a crash: a process granting
/// and releasing in a loop is killed with SIGKILL mid-loop, and the next
/// grant, in another process, exceeds every token the dead one was given
/// (the counter is committed before a grant is reported, and a commit
/// survives a killed process without a flush: `synchronous = NORMAL`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_survive_a_killed_process() {
    if std::env::var(CRASH_ENV).is_ok() {
        let dir = PathBuf::from(std::env::var(DIR_ENV).expect("worker dir"));
        let locks = open_in(&dir).await;
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(2))
            .wait(Wait::UpTo(Duration::from_secs(10)));
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("granted"))
            .expect("token log");
        loop {
            let g = locks.acquire("crash", &opts).await.expect("acquire");
            let token = g.fencing_token().expect("token");
            std::io::Write::write_all(&mut log, format!("{token}\n").as_bytes()).expect("log");
            assert!(g.release().await.expect("release"));
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = spawn_worker("tokens_survive_a_killed_process", CRASH_ENV, "", dir.path());
    let log = dir.path().join("granted");
    let started = tokio::time::Instant::now();
    while std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0) < 200 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the worker granted nothing"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("reap");
    let before = tokens_of(&log)
        .into_iter()
        .max()
        .expect("tokens before the kill");
    let locks = open_in(dir.path()).await;
    // The dead worker may have died holding the lock: its lease runs out.
    let g = locks
        .acquire(
            "crash",
            &LockOptions::new().wait(Wait::UpTo(Duration::from_secs(60))),
        )
        .await
        .expect("acquire after the kill");
    let after = g.fencing_token().expect("token");
    eprintln!("sqlite: last token logged before the kill {before}, next grant {after}");
    assert!(
        after > before,
        "token went backwards: {after} after {before}"
    );
    assert!(g.release().await.expect("release"));
}

/// Run this test binary again as a worker of `test`: `env` set to `id`, and
/// the shared directory in `DISTLOCK_SQLITE_DIR`.
fn spawn_worker(test: &str, env: &str, id: &str, dir: &Path) -> tokio::process::Child {
    tokio::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", test, "--nocapture"])
        .env(env, id)
        .env(DIR_ENV, dir)
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn worker process")
}

/// Wait for every worker, which must succeed.
async fn wait_for(children: Vec<tokio::process::Child>) {
    for mut child in children {
        let status = tokio::time::timeout(Duration::from_secs(120), child.wait())
            .await
            .expect("worker finished in time")
            .expect("worker status");
        assert!(status.success(), "worker process failed: {status}");
    }
}

const FAIR_ENV: &str = "DISTLOCK_SQLITE_FAIR_WORKER";
const FAIR_WORKERS: usize = 5;
const FAIR_RUN: Duration = Duration::from_secs(5);

/// Five processes loop on one lock for 5 s, each gets a share of the
/// grants. SQLite cannot notify waiters across processes, so this holds
/// only if waiters are served in order (their tickets in the file), not by
/// whoever polls at the right moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_processes_each_get_a_share() {
    if let Ok(id) = std::env::var(FAIR_ENV) {
        let dir = PathBuf::from(std::env::var(DIR_ENV).expect("worker dir"));
        let locks = open_in(&dir).await;
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(10))
            .wait(Wait::UpTo(Duration::from_secs(60)));
        let end = tokio::time::Instant::now() + FAIR_RUN;
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
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // Create the file first, so the workers do not race to set it up.
    drop(open_in(dir.path()).await);
    let children = (0..FAIR_WORKERS)
        .map(|id| {
            spawn_worker(
                "five_processes_each_get_a_share",
                FAIR_ENV,
                &id.to_string(),
                dir.path(),
            )
        })
        .collect();
    wait_for(children).await;
    let counts: Vec<u64> = (0..FAIR_WORKERS)
        .map(|id| read_number(&dir.path().join(format!("count-{id}"))))
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

/// See `lock_testkit::faults::killed_holder_frees_the_lock` (the TTL frees it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_frees_the_lock() {
    // Child and parent agree on the file: named after the parent's pid.
    let parent = if std::env::var(lock_testkit::faults::KILLED_HOLDER_ENV).is_ok() {
        std::os::unix::process::parent_id()
    } else {
        std::process::id()
    };
    let path = std::env::temp_dir().join(format!("distlock-killed-holder-{parent}.db"));
    let connect = async || {
        SqliteLock::open(&path, SqliteConfig::default())
            .await
            .expect("open sqlite")
    };
    lock_testkit::faults::killed_holder_frees_the_lock(
        "a_killed_holder_frees_the_lock",
        connect,
        LockOptions::new().ttl(Duration::from_secs(2)),
        Duration::ZERO,
    )
    .await;
    if std::env::var(lock_testkit::faults::KILLED_HOLDER_ENV).is_err() {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }
}

/// The lock file shared by a test's processes, in `dir`.
async fn open_in(dir: &Path) -> SqliteLock {
    SqliteLock::open(dir.join("locks.db"), SqliteConfig::default())
        .await
        .expect("open sqlite")
}

/// See `lock_testkit::faults::frozen_holder_loses_its_lock_to_a_later_token`: the
/// lease's TTL (1 s) in the shared file frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_loses_its_lock_to_a_later_token() {
    // Child and parent agree on the file: named after the parent's pid.
    let child = std::env::var(lock_testkit::faults::FROZEN_HOLDER_ENV).is_ok();
    let parent = if child {
        std::os::unix::process::parent_id()
    } else {
        std::process::id()
    };
    let path = std::env::temp_dir().join(format!("distlock-frozen-holder-{parent}.db"));
    let connect = async || {
        SqliteLock::open(&path, SqliteConfig::default())
            .await
            .expect("open sqlite")
    };
    lock_testkit::faults::frozen_holder_loses_its_lock_to_a_later_token(
        "a_frozen_holder_loses_its_lock_to_a_later_token",
        connect,
        LockOptions::new().ttl(Duration::from_secs(1)),
        Duration::from_secs(1),
    )
    .await;
    if !child {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }
}
