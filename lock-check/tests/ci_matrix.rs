//! The short history-check matrix CI runs: every backend with a server,
//! each primitive in one mixed run of 24 s whose nemeses take turns every
//! 2 s (holder SIGKILL, holder SIGSTOP, and server kill/restart for the
//! correctness-grade backends), so that every fault meets every
//! primitive; Redis through Sentinel and on a Redis Cluster with
//! failovers of the master among the faults. Two runs go on at once,
//! never two on the same servers (a server nemesis would strike the other
//! run), whether the cases run as threads of one process (`cargo test`) or
//! as processes of their own (`cargo nextest`): the turns are file locks.
//! The full 60 s matrix, a run per nemesis, is `scripts/check-matrix.sh`.
//!
//! The lock cases run plain workers; the `election_*` cases run with
//! `--election` (candidates and observers) on every backend that offers
//! elections, the `permits_*` cases with `--permits 2` on every backend
//! that offers semaphores, the `set_*` cases with `--set 2` (sets of two
//! names of a pool of four) on every backend, and the `rw_*` cases with
//! `--rw 0.5` (half reads, half writes) on every backend that offers
//! reader-writer locks.

use std::fs::File;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use lock_testkit::faults::env;
use rustix::fs::{FlockOperation, flock};

const BIN: &str = env!("CARGO_BIN_EXE_lock-check");

/// How many `lock-check` runs go on at once.
const AT_ONCE: usize = 2;

/// A turn to run on one group of servers: an exclusive lock on the
/// group's file and on one of [`AT_ONCE`] slot files, in the temporary
/// directory; dropping it closes them, which lets a waiting case go.
struct Turn {
    _group: File,
    _slot: File,
}

/// The lock file `name` of the matrix, opened.
fn lock_file(name: &str) -> File {
    let path: PathBuf = std::env::temp_dir().join(format!("distlock-ci-matrix-{name}.lock"));
    File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

impl Turn {
    /// Wait until no other run uses `servers`, then until fewer than
    /// [`AT_ONCE`] runs go on.
    fn take(servers: &str) -> Self {
        let group = lock_file(&format!("group-{servers}"));
        flock(&group, FlockOperation::LockExclusive).expect("lock the server group");
        loop {
            for i in 0..AT_ONCE {
                let slot = lock_file(&format!("slot-{i}"));
                if flock(&slot, FlockOperation::NonBlockingLockExclusive).is_ok() {
                    return Turn {
                        _group: group,
                        _slot: slot,
                    };
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The lock's run of `case` on `url`: one mixed run whose nemeses take
/// turns (holder SIGKILL, holder SIGSTOP, and `server_kill`'s servers
/// killed if any); it must pass. `servers` names the server group it uses.
fn check(case: &str, servers: &str, url: &str, server_kill: &'static [&'static str]) {
    check_runs(case, servers, url, &mixed_faults(server_kill), &MIXED_RUN);
}

/// Run `lock-check` on `url` with `extra` arguments (its duration among
/// them) under each nemesis (with its servers); all must pass.
fn check_runs(case: &str, servers: &str, url: &str, nemeses: &[(&str, &[&str])], extra: &[&str]) {
    let _turn = Turn::take(servers);
    let root = tempfile::tempdir().expect("tempdir");
    let mut failed = Vec::new();
    for (nemesis, servers) in nemeses {
        let label = nemesis.replace(',', "+");
        let dir = root.path().join(format!("{case}-{label}"));
        let mut cmd = Command::new(BIN);
        cmd.args(["run", "--url", url, "--nemesis", nemesis])
            .arg("--dir")
            .arg(&dir)
            .args(["--name", &format!("ci/{case}/{label}")])
            .args(extra);
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
        if extra.contains(&"--rw") {
            let json = std::fs::read_to_string(dir.join("report.json")).unwrap_or_default();
            let report: serde_json::Value = serde_json::from_str(&json).unwrap_or_default();
            if report["rw"].as_f64().is_none() || report["writer_wait_longest_ms"].is_null() {
                failed.push(format!("{nemesis}: no reader-writer part in report.json"));
            }
            // Where the backend offers upgradeable reads, half the writers
            // upgrade one: some must have.
            if report["upgradeable"] == true && report["upgrades"].as_u64().unwrap_or(0) == 0 {
                failed.push(format!("{nemesis}: no upgrade went through"));
            }
        }
        if extra.contains(&"--election") {
            let json = std::fs::read_to_string(dir.join("report.json")).unwrap_or_default();
            let report: serde_json::Value = serde_json::from_str(&json).unwrap_or_default();
            if report["election"]["observations"].as_u64().unwrap_or(0) == 0 {
                failed.push(format!("{nemesis}: no election part in report.json"));
            }
        }
    }
    assert!(failed.is_empty(), "{case}: failed runs {failed:?}");
}

#[test]
fn sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    check("sqlite", "sqlite", &url, &[]);
}

#[test]
fn redis() {
    check("redis", "redis", &env("DISTLOCK_TEST_REDIS_URL"), &[]);
}

/// Redis through Sentinel, in one mixed run: the holder faults and
/// failovers of the group's master taking turns. Efficiency-grade, so the
/// run passes whatever a failover loses; the figures are in the report.
#[test]
fn redis_sentinel() {
    check_runs(
        "redis-sentinel",
        "sentinel",
        &env("DISTLOCK_TEST_REDIS_SENTINEL_URL"),
        &[("kill-holder,pause-holder,failover", &[])],
        &MIXED_RUN,
    );
}

/// Redis Cluster, in one mixed run: the holder faults and failovers of
/// the master serving the lock's slot taking turns (efficiency-grade, as
/// through Sentinel).
#[test]
fn redis_cluster() {
    check_runs(
        "redis-cluster",
        "cluster",
        &env("DISTLOCK_TEST_REDIS_CLUSTER_URL"),
        &[("kill-holder,pause-holder,cluster-failover", &[])],
        &MIXED_RUN,
    );
}

#[test]
fn redlock() {
    check("redlock", "redlock", &env("DISTLOCK_TEST_REDLOCK_URL"), &[]);
}

#[test]
fn postgres_row() {
    let url = format!("{}?mode=row", env("DISTLOCK_TEST_POSTGRES_URL"));
    check("postgres-row", "postgres", &url, &["postgres"]);
}

#[test]
fn postgres_advisory() {
    let url = format!("{}?mode=advisory", env("DISTLOCK_TEST_POSTGRES_URL"));
    check("postgres-advisory", "postgres", &url, &["postgres"]);
}

#[test]
fn mysql_row() {
    let url = format!("{}?mode=row", env("DISTLOCK_TEST_MYSQL_URL"));
    check("mysql-row", "mysql", &url, &["mysql"]);
}

#[test]
fn mysql_advisory() {
    let url = format!("{}?mode=advisory", env("DISTLOCK_TEST_MYSQL_URL"));
    check("mysql-advisory", "mysql", &url, &["mysql"]);
}

#[test]
fn etcd() {
    check("etcd", "etcd", &env("DISTLOCK_TEST_ETCD_URL"), &["etcd"]);
}

#[test]
fn zookeeper() {
    check("zookeeper", "zk", &env("DISTLOCK_TEST_ZK_URL"), &["zk"]);
}

/// NATS on its three-server cluster (a stream of three replicas, the
/// correctness-grade set-up): one server of the three killed among the
/// faults, a minority.
#[test]
fn nats_cluster() {
    let url = env("DISTLOCK_TEST_NATS_CLUSTER_URL");
    check("nats-cluster", "nats-cluster", &url, &["nats1"]);
}

/// The one run of an election, semaphore or set case: kill-holder and
/// pause-holder, and kill-server on `server_kill`'s servers if any, taking
/// turns.
fn mixed_faults(
    server_kill: &'static [&'static str],
) -> [(&'static str, &'static [&'static str]); 1] {
    if server_kill.is_empty() {
        [("kill-holder,pause-holder", &[])]
    } else {
        [("kill-holder,pause-holder,kill-server", server_kill)]
    }
}

/// The arguments of a mixed run, before the primitive's own.
const MIXED_RUN: [&str; 4] = ["--duration", "24s", "--interval", "2s"];

/// [`MIXED_RUN`] followed by `args`.
fn mixed_run<'a>(args: &[&'a str]) -> Vec<&'a str> {
    MIXED_RUN
        .iter()
        .copied()
        .chain(args.iter().copied())
        .collect()
}

/// The election's run of `case`: candidates and observers under the
/// mixed faults (and `server_kill`'s servers killed, if any); the
/// report's election part must be there and clean.
fn check_election(case: &str, servers: &str, url: &str, server_kill: &'static [&'static str]) {
    check_runs(
        &format!("election-{case}"),
        servers,
        url,
        &mixed_faults(server_kill),
        &mixed_run(&["--election", "--observers", "2"]),
    );
}

#[test]
fn election_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    check_election("sqlite", "sqlite", &url, &[]);
}

/// Row mode: a grant shows as held before its term is written.
#[test]
fn election_postgres_row() {
    let url = format!("{}?mode=row", env("DISTLOCK_TEST_POSTGRES_URL"));
    check_election("postgres-row", "postgres", &url, &["postgres"]);
}

/// Advisory mode: a grant after a wait draws its term in a statement of
/// its own (a grant without waiting, in the same).
#[test]
fn election_mysql_advisory() {
    let url = format!("{}?mode=advisory", env("DISTLOCK_TEST_MYSQL_URL"));
    check_election("mysql-advisory", "mysql", &url, &["mysql"]);
}

#[test]
fn election_redis() {
    check_election("redis", "redis", &env("DISTLOCK_TEST_REDIS_URL"), &[]);
}

#[test]
fn election_redlock() {
    check_election("redlock", "redlock", &env("DISTLOCK_TEST_REDLOCK_URL"), &[]);
}

#[test]
fn election_etcd() {
    check_election("etcd", "etcd", &env("DISTLOCK_TEST_ETCD_URL"), &["etcd"]);
}

#[test]
fn election_zookeeper() {
    check_election("zookeeper", "zk", &env("DISTLOCK_TEST_ZK_URL"), &["zk"]);
}

#[test]
fn election_nats_cluster() {
    let url = env("DISTLOCK_TEST_NATS_CLUSTER_URL");
    check_election("nats-cluster", "nats-cluster", &url, &["nats1"]);
}

/// The semaphore's run of `case`: four workers taking permits of a
/// semaphore of two (`--permits 2`, per-slot registers) under the mixed
/// faults (and `server_kill`'s servers killed, if any), on every backend
/// that offers semaphores.
fn check_permits(case: &str, servers: &str, url: &str, server_kill: &'static [&'static str]) {
    check_runs(
        &format!("permits-{case}"),
        servers,
        url,
        &mixed_faults(server_kill),
        &mixed_run(&["--permits", "2"]),
    );
}

#[test]
fn permits_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    check_permits("sqlite", "sqlite", &url, &[]);
}

/// A permit is a row lock in either mode: advisory mode here (its pooled
/// connections also carry advisory locks' session bounds).
#[test]
fn permits_postgres_advisory() {
    let url = format!("{}?mode=advisory", env("DISTLOCK_TEST_POSTGRES_URL"));
    check_permits("postgres-advisory", "postgres", &url, &["postgres"]);
}

#[test]
fn permits_mysql_row() {
    let url = format!("{}?mode=row", env("DISTLOCK_TEST_MYSQL_URL"));
    check_permits("mysql-row", "mysql", &url, &["mysql"]);
}

#[test]
fn permits_redis() {
    check_permits("redis", "redis", &env("DISTLOCK_TEST_REDIS_URL"), &[]);
}

#[test]
fn permits_etcd() {
    check_permits("etcd", "etcd", &env("DISTLOCK_TEST_ETCD_URL"), &["etcd"]);
}

#[test]
fn permits_zookeeper() {
    check_permits("zookeeper", "zk", &env("DISTLOCK_TEST_ZK_URL"), &["zk"]);
}

#[test]
fn permits_nats_cluster() {
    let url = env("DISTLOCK_TEST_NATS_CLUSTER_URL");
    check_permits("nats-cluster", "nats-cluster", &url, &["nats1"]);
}

/// The lock sets' run of `case`: four workers taking sets of two names of
/// a pool of four (`--set 2`, a register per name) under the mixed
/// faults (and `server_kill`'s servers killed, if any).
fn check_set(case: &str, servers: &str, url: &str, server_kill: &'static [&'static str]) {
    check_runs(
        &format!("set-{case}"),
        servers,
        url,
        &mixed_faults(server_kill),
        &mixed_run(&["--set", "2"]),
    );
}

#[test]
fn set_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    check_set("sqlite", "sqlite", &url, &[]);
}

#[test]
fn set_redis() {
    check_set("redis", "redis", &env("DISTLOCK_TEST_REDIS_URL"), &[]);
}

#[test]
fn set_redlock() {
    check_set("redlock", "redlock", &env("DISTLOCK_TEST_REDLOCK_URL"), &[]);
}

#[test]
fn set_postgres_row() {
    let url = format!("{}?mode=row", env("DISTLOCK_TEST_POSTGRES_URL"));
    check_set("postgres-row", "postgres", &url, &["postgres"]);
}

#[test]
fn set_postgres_advisory() {
    let url = format!("{}?mode=advisory", env("DISTLOCK_TEST_POSTGRES_URL"));
    check_set("postgres-advisory", "postgres", &url, &["postgres"]);
}

#[test]
fn set_mysql_advisory() {
    let url = format!("{}?mode=advisory", env("DISTLOCK_TEST_MYSQL_URL"));
    check_set("mysql-advisory", "mysql", &url, &["mysql"]);
}

#[test]
fn set_etcd() {
    check_set("etcd", "etcd", &env("DISTLOCK_TEST_ETCD_URL"), &["etcd"]);
}

#[test]
fn set_zookeeper() {
    check_set("zookeeper", "zk", &env("DISTLOCK_TEST_ZK_URL"), &["zk"]);
}

#[test]
fn set_nats_cluster() {
    let url = env("DISTLOCK_TEST_NATS_CLUSTER_URL");
    check_set("nats-cluster", "nats-cluster", &url, &["nats1"]);
}

/// The reader-writer lock's run of `case`: four workers reading with half
/// their acquisitions and writing with the rest (`--rw 0.5`, writers
/// fence the register) under the mixed faults (and `server_kill`'s
/// servers killed, if any), on every backend that offers reader-writer
/// locks: no writer beside anyone, write tokens in order, readers with the
/// latest write's token, and no reader let in ahead of a waiting writer
/// where the backend promises writer preference. Where the backend offers
/// upgradeable reads, half the writers upgrade one instead, and some
/// upgrades must go through.
fn check_rw(case: &str, servers: &str, url: &str, server_kill: &'static [&'static str]) {
    check_runs(
        &format!("rw-{case}"),
        servers,
        url,
        &mixed_faults(server_kill),
        &mixed_run(&["--rw", "0.5"]),
    );
}

#[test]
fn rw_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    check_rw("sqlite", "sqlite", &url, &[]);
}

#[test]
fn rw_redis() {
    check_rw("redis", "redis", &env("DISTLOCK_TEST_REDIS_URL"), &[]);
}

#[test]
fn rw_etcd() {
    check_rw("etcd", "etcd", &env("DISTLOCK_TEST_ETCD_URL"), &["etcd"]);
}

#[test]
fn rw_zookeeper() {
    check_rw("zookeeper", "zk", &env("DISTLOCK_TEST_ZK_URL"), &["zk"]);
}

#[test]
fn rw_postgres_row() {
    let url = format!("{}?mode=row", env("DISTLOCK_TEST_POSTGRES_URL"));
    check_rw("postgres-row", "postgres", &url, &["postgres"]);
}

#[test]
fn rw_mysql_advisory() {
    let url = format!("{}?mode=advisory", env("DISTLOCK_TEST_MYSQL_URL"));
    check_rw("mysql-advisory", "mysql", &url, &["mysql"]);
}

#[test]
fn rw_redlock() {
    check_rw("redlock", "redlock", &env("DISTLOCK_TEST_REDLOCK_URL"), &[]);
}

#[test]
fn rw_nats_cluster() {
    let url = env("DISTLOCK_TEST_NATS_CLUSTER_URL");
    check_rw("nats-cluster", "nats-cluster", &url, &["nats1"]);
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
