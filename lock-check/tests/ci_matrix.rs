//! The short history-check matrix CI runs: every backend with a server ×
//! {none, holder SIGKILL, holder SIGSTOP} for 15 s each, plus server
//! kill/restart for the correctness-grade backends. Two runs go on at once,
//! never two on the same servers (a server nemesis would strike the other
//! run). The full 60 s matrix is `scripts/check-matrix.sh`.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::{Condvar, Mutex, MutexGuard};

use lock_testkit::faults::env;

const BIN: &str = env!("CARGO_BIN_EXE_lock-check");

/// How many `lock-check` runs go on at once.
const AT_ONCE: usize = 2;

/// The server groups that a run is using now.
static BUSY: Mutex<BTreeSet<&str>> = Mutex::new(BTreeSet::new());
/// Signalled whenever a run ends.
static FREED: Condvar = Condvar::new();

/// A turn to run on one group of servers; ending it lets a waiting case go.
struct Turn(&'static str);

impl Turn {
    /// Wait until fewer than [`AT_ONCE`] runs go on and none uses `servers`.
    fn take(servers: &'static str) -> Self {
        let mut busy = busy();
        while busy.len() >= AT_ONCE || busy.contains(servers) {
            busy = FREED.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        busy.insert(servers);
        Self(servers)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        busy().remove(self.0);
        FREED.notify_all();
    }
}

fn busy() -> MutexGuard<'static, BTreeSet<&'static str>> {
    BUSY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Run `lock-check` on `url` under each nemesis (with its servers); all must
/// pass. `servers` names the server group the runs use.
fn check(case: &str, servers: &'static str, url: &str, nemeses: &[(&str, &[&str])]) {
    let _turn = Turn::take(servers);
    let root = tempfile::tempdir().expect("tempdir");
    let mut failed = Vec::new();
    for (nemesis, servers) in nemeses {
        let dir = root.path().join(format!("{case}-{nemesis}"));
        let mut cmd = Command::new(BIN);
        cmd.args([
            "run",
            "--url",
            url,
            "--duration",
            "15s",
            "--nemesis",
            nemesis,
        ])
        .arg("--dir")
        .arg(&dir)
        .args(["--name", &format!("ci/{case}/{nemesis}")]);
        for s in *servers {
            cmd.args(["--server", s]);
        }
        let out = cmd.output().expect("lock-check runs");
        let report = String::from_utf8_lossy(&out.stdout);
        println!("{report}");
        if !out.status.success() {
            eprintln!("{}", String::from_utf8_lossy(&out.stderr));
            failed.push(format!("{nemesis}: {:?}", out.status.code()));
        }
    }
    assert!(failed.is_empty(), "{case}: failed runs {failed:?}");
}

const HOLDER_FAULTS: [(&str, &[&str]); 3] =
    [("none", &[]), ("kill-holder", &[]), ("pause-holder", &[])];

#[test]
fn sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    check("sqlite", "sqlite", &url, &HOLDER_FAULTS);
}

#[test]
fn redis() {
    check(
        "redis",
        "redis",
        &env("DISTLOCK_TEST_REDIS_URL"),
        &HOLDER_FAULTS,
    );
}

#[test]
fn redlock() {
    check(
        "redlock",
        "redlock",
        &env("DISTLOCK_TEST_REDLOCK_URL"),
        &HOLDER_FAULTS,
    );
}

fn with_server_kill(
    server: &'static [&'static str],
) -> Vec<(&'static str, &'static [&'static str])> {
    let mut all = HOLDER_FAULTS.to_vec();
    all.push(("kill-server", server));
    all
}

#[test]
fn postgres_row() {
    let url = format!("{}?mode=row", env("DISTLOCK_TEST_POSTGRES_URL"));
    check(
        "postgres-row",
        "postgres",
        &url,
        &with_server_kill(&["postgres"]),
    );
}

#[test]
fn postgres_advisory() {
    let url = format!("{}?mode=advisory", env("DISTLOCK_TEST_POSTGRES_URL"));
    check(
        "postgres-advisory",
        "postgres",
        &url,
        &with_server_kill(&["postgres"]),
    );
}

#[test]
fn mysql_row() {
    let url = format!("{}?mode=row", env("DISTLOCK_TEST_MYSQL_URL"));
    check("mysql-row", "mysql", &url, &with_server_kill(&["mysql"]));
}

#[test]
fn mysql_advisory() {
    let url = format!("{}?mode=advisory", env("DISTLOCK_TEST_MYSQL_URL"));
    check(
        "mysql-advisory",
        "mysql",
        &url,
        &with_server_kill(&["mysql"]),
    );
}

#[test]
fn etcd() {
    check(
        "etcd",
        "etcd",
        &env("DISTLOCK_TEST_ETCD_URL"),
        &with_server_kill(&["etcd"]),
    );
}

#[test]
fn zookeeper() {
    check(
        "zookeeper",
        "zk",
        &env("DISTLOCK_TEST_ZK_URL"),
        &with_server_kill(&["zk"]),
    );
}

/// An interrupted run puts a paused server back.
#[test]
fn an_interrupted_run_resumes_a_paused_server() {
    let _turn = Turn::take("redis");
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir = dir.path().join("run");
    let mut controller = Command::new(BIN)
        .args(["run", "--url", &env("DISTLOCK_TEST_REDIS_URL")])
        .arg("--dir")
        .arg(&run_dir)
        .args(["--duration", "60s", "--interval", "500ms", "--ttl", "2s"])
        .args(["--nemesis", "pause-server", "--server", "redis"])
        .spawn()
        .expect("lock-check starts");
    let start = std::time::Instant::now();
    while !std::fs::read_to_string(run_dir.join("controller.jsonl"))
        .unwrap_or_default()
        .contains("\"servers_paused\"")
    {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "no pause"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let pid =
        rustix::process::Pid::from_raw(i32::try_from(controller.id()).expect("pid")).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    assert_eq!(controller.wait().expect("exits").code(), Some(130));
    let out = Command::new("bash")
        .arg(env("DISTLOCK_SERVICES_SCRIPT"))
        .args(["pid", "redis"])
        .output()
        .expect("services.sh runs");
    let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("redis runs");
    let state = state
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .next();
    assert_ne!(state, Some("T"), "redis left stopped");
}
