//! OS processes contend on one SQLite database file; a killed one leaves
//! no token to be handed out again.
//!
//! The test runs twice over: as the parent it starts two copies of this test
//! binary (selecting this same test) with `DISTLOCK_SQLITE_WORKER` set; each
//! copy then acts as a worker. Workers update a counter kept in a plain file
//! non-atomically (read, sleep, write) while holding the lock, and log every
//! fencing token they were granted. The parent checks the exact total and
//! that all tokens are distinct across both processes and increase within each.

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
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = ["a", "b"]
        .iter()
        .map(|id| {
            tokio::process::Command::new(&exe)
                .args(["--exact", "two_processes_exclude_each_other", "--nocapture"])
                .env(WORKER_ENV, id)
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
    let locks = SqliteLock::open(dir.join("locks.db"), SqliteConfig::default())
        .await
        .expect("open sqlite");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Wait::Up(Duration::from_secs(60)));
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
/// (the counter is committed, `synchronous = FULL`, before a grant is
/// reported).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_survive_a_killed_process() {
    if let Ok(dir) = std::env::var(CRASH_ENV) {
        let dir = PathBuf::from(dir);
        let locks = SqliteLock::open(dir.join("locks.db"), SqliteConfig::default())
            .await
            .expect("open sqlite");
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(2))
            .wait(Wait::Up(Duration::from_secs(10)));
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
    let mut child = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "tokens_survive_a_killed_process", "--nocapture"])
        .env(CRASH_ENV, dir.path())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn worker");
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
    let locks = SqliteLock::open(dir.path().join("locks.db"), SqliteConfig::default())
        .await
        .expect("open sqlite");
    // The dead worker may have died holding the lock: its lease runs out.
    let g = locks
        .acquire(
            "crash",
            &LockOptions::new().wait(Wait::Up(Duration::from_secs(60))),
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
