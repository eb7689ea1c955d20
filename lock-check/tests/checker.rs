//! The checker's own tests, on the embedded SQLite backend (no server): a
//! clean history passes, deliberately broken backends fail with the right
//! findings, and an interrupted run leaves no process behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_lock-check");

fn run(dir: &Path, extra: &[&str]) -> (Output, Value) {
    let url = format!("sqlite://{}", dir.join("locks.db").display());
    let out = Command::new(BIN)
        .args(["run", "--url", &url, "--dir"])
        .arg(dir.join("run"))
        .args(["--duration", "6s", "--ttl", "2s"])
        .args(extra)
        .output()
        .expect("lock-check runs");
    let text = std::fs::read_to_string(dir.join("run/report.json")).unwrap_or_else(|e| {
        panic!(
            "no report ({e}); stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let report = serde_json::from_str(&text).expect("report.json is JSON");
    (out, report)
}

fn count(report: &Value, pointer: &str) -> u64 {
    report
        .pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{pointer} missing in {report:#}"))
}

#[test]
fn a_correct_backend_passes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, report) = run(
        dir.path(),
        &["--nemesis", "kill-holder", "--interval", "1s"],
    );
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(count(&report, "/grants") >= 3, "{shown}");
    assert!(count(&report, "/liveness/holder_kills") >= 1, "{shown}");
    assert_eq!(report["failures"], Value::Array(vec![]));
}

/// Several nemeses separated by commas take turns: the run both kills and
/// pauses holders, and the report names both.
#[test]
fn nemeses_given_together_take_turns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, report) = run(
        dir.path(),
        &["--nemesis", "kill-holder,pause-holder", "--interval", "1s"],
    );
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert_eq!(report["nemesis"], "kill-holder+pause-holder", "{shown}");
    assert!(count(&report, "/liveness/holder_kills") >= 1, "{shown}");
    let log =
        std::fs::read_to_string(dir.path().join("run/controller.jsonl")).expect("controller log");
    assert!(log.contains("\"paused\""), "no pause in {log}");
    assert!(log.contains("\"killed_holder\""), "no kill in {log}");
}

#[test]
fn tokens_going_backwards_fail_the_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, report) = run(dir.path(), &["--sabotage", "lower-token"]);
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    assert!(count(&report, "/token_order/count") > 0, "{report:#}");
    assert!(
        count(&report, "/newest_holder_rejected/count") > 0,
        "{report:#}"
    );
}

#[test]
fn a_double_grant_fails_the_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, report) = run(dir.path(), &["--sabotage", "double-grant"]);
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    assert!(count(&report, "/in_time/running/count") > 0, "{report:#}");
    assert!(count(&report, "/token_order/count") > 0, "{report:#}");
}

/// The pids of every worker the run started.
fn worker_pids(run_dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(run_dir.join("controller.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["action"] == "spawned")
        .filter_map(|v| v["pid"].as_u64().and_then(|p| u32::try_from(p).ok()))
        .collect()
}

fn alive(pid: u32) -> bool {
    PathBuf::from(format!("/proc/{pid}")).exists()
}

#[test]
fn an_interrupted_run_leaves_no_worker_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir = dir.path().join("run");
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let mut controller = Command::new(BIN)
        .args(["run", "--url", &url, "--dir"])
        .arg(&run_dir)
        .args(["--duration", "60s", "--ttl", "2s", "--interval", "500ms"])
        .args(["--nemesis", "pause-holder"])
        .spawn()
        .expect("lock-check starts");
    // Interrupt while a worker is stopped (SIGSTOP).
    let start = Instant::now();
    while !std::fs::read_to_string(run_dir.join("controller.jsonl"))
        .unwrap_or_default()
        .contains("\"paused\"")
    {
        assert!(start.elapsed() < Duration::from_secs(30), "no pause");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid =
        rustix::process::Pid::from_raw(i32::try_from(controller.id()).expect("pid")).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::INT).expect("SIGINT");
    let status = controller.wait().expect("controller exits");
    assert_eq!(status.code(), Some(130));
    let pids = worker_pids(&run_dir);
    assert!(pids.len() >= 4);
    let left: Vec<u32> = pids.into_iter().filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "workers left running: {left:?}");
    // The stopped worker was continued and, like the others, finished on
    // its own (a worker still stopped would have been killed as a straggler).
    let exits: Vec<Value> = std::fs::read_to_string(run_dir.join("controller.jsonl"))
        .expect("log")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["action"] == "exited")
        .collect();
    assert_eq!(exits.len(), worker_pids(&run_dir).len());
    assert!(
        exits.iter().all(|e| e["code"] == 0),
        "workers did not finish cleanly: {exits:?}"
    );
}
