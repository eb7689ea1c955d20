//! The rolling migration, proven with processes: one lock name, one fenced
//! register, and groups of worker processes on neighbouring steps of the
//! rollout, with holders killed in turn from each group.
//!
//! Phase A runs step 1 (the old URL) beside step 2 (`migrate://`), phase B
//! step 2 beside step 3 (the new URL with `fencing_epoch=1`), on the
//! register phase A left. In both: no grant while an earlier holder still
//! believed in its lock, no write by an older holder after a newer grant,
//! every group granted and killed while holding. In phase A tokens never go
//! backwards; in phase B the register may refuse step-2 holders granted
//! after a step-3 holder wrote (the documented cost of the epoch switch),
//! but never accepts a write out of order.

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use distlock::{Access, LockOptions, Wait};
use lock_check::register::FencedRegister;

use lock_testkit::faults::env;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_lock-check");
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn encode(url: &str) -> String {
    url::form_urlencoded::byte_serialize(url.as_bytes()).collect()
}

fn with_option(url: &str, option: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{option}")
}

fn phase(dir: &Path, register: &Path, name: &str, urls: &[&str], rw: Option<&str>) -> Value {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "run",
        "--duration",
        "15s",
        "--workers",
        "4",
        "--interval",
        "2s",
    ])
    .args(["--nemesis", "kill-holder", "--name", name])
    .arg("--dir")
    .arg(dir)
    .arg("--register")
    .arg(register);
    for url in urls {
        cmd.args(["--url", url]);
    }
    if let Some(share) = rw {
        cmd.args(["--rw", share]);
    }
    let out = cmd.output().expect("lock-check runs");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    let text = std::fs::read_to_string(dir.join("report.json"))
        .unwrap_or_else(|e| panic!("no report ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    serde_json::from_str(&text).expect("report.json")
}

fn count(report: &Value, pointer: &str) -> u64 {
    report
        .pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{pointer} missing in {report:#}"))
}

fn assert_exclusive(phase: &str, report: &Value) {
    for pointer in [
        "/in_time/running/count",
        "/in_time/paused/count",
        "/exclusion/rejected/count",
        "/exclusion/harmless/count",
        "/exclusion/fencing_failures/count",
        "/lost_on_arrival/count",
        "/liveness/hangs/count",
        "/crashes/count",
    ] {
        assert_eq!(
            count(report, pointer),
            0,
            "{phase}: {pointer} in {report:#}"
        );
    }
    let groups = report["groups"].as_object().expect("groups");
    assert_eq!(groups.len(), 2, "{phase}: {groups:?}");
    for (group, counts) in groups {
        assert!(
            counts["grants"].as_u64() > Some(0),
            "{phase}: {group} never granted"
        );
        assert!(
            counts["holder_kills"].as_u64() > Some(0),
            "{phase}: {group} never killed while holding"
        );
    }
}

/// The rollout from `old` to `new`; with `rw`, of a reader-writer lock
/// with that share of readers.
fn rollout(case: &str, old: &str, new: &str, rw: Option<&str>) {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = tempfile::tempdir().expect("tempdir");
    let register = root.path().join("register");
    let name = format!("rollout/{case}/{:x}", rand::random::<u64>());
    let migrate = format!("migrate://?from={}&to={}", encode(old), encode(new));
    let new_epoch = with_option(new, "fencing_epoch=1");

    let a = phase(
        &root.path().join("a"),
        &register,
        &name,
        &[old, &migrate],
        rw,
    );
    assert_exclusive("phase A (steps 1 + 2)", &a);
    assert_eq!(count(&a, "/token_order/count"), 0, "{a:#}");
    assert_eq!(count(&a, "/newest_holder_rejected/count"), 0, "{a:#}");
    if rw.is_some() {
        // Steps 1 and 2 wait for a write on the same (old) backend, so a
        // writer of either is served before the later readers of both.
        assert_eq!(count(&a, "/writer_starvation/count"), 0, "{a:#}");
        assert_eq!(count(&a, "/read_tokens/count"), 0, "{a:#}");
    }

    let b = phase(
        &root.path().join("b"),
        &register,
        &name,
        &[&migrate, &new_epoch],
        rw,
    );
    assert_exclusive("phase B (steps 2 + 3)", &b);
    // Afterwards a step-3 holder's write is accepted, and the register then
    // holds a step-3 token: above every old one. (The workers of phase B
    // need not have written as step 3: with 70 % readers, its writers may
    // all have been of step 2.)
    let token = write_as_step_three(&new_epoch, &name, &register, rw.is_some());
    assert!(
        token >> distlock::EPOCH_SHIFT == 1,
        "a step-3 token is of epoch 1: {token}"
    );
    let (_, highest) = FencedRegister::open(&register).state().expect("register");
    assert_eq!(highest, Some(token), "the register's highest token");
}

/// Take the lock (as a writer, with `rw`) through `url` once the workers
/// are gone, write to the register with its token and release it; the
/// token is returned, the write must have been accepted.
fn write_as_step_three(url: &str, name: &str, register: &Path, rw: bool) -> u64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let locks = distlock::connect(url).await.expect("connect");
        let mut opts = LockOptions::new().wait(Wait::UpTo(Duration::from_secs(60)));
        if rw {
            opts = opts.access(Access::Write);
        }
        let guard = locks.acquire(name, &opts).await.expect("acquire");
        let token = guard.fencing_token().expect("a fencing token");
        let out = FencedRegister::open(register)
            .write(Some(token))
            .expect("write");
        assert!(out.accepted, "a step-3 write after the rollout: {out:?}");
        guard.release().await.expect("release");
        token
    })
}

#[test]
fn redis_to_etcd() {
    rollout(
        "redis-etcd",
        &env("DISTLOCK_TEST_REDIS_URL"),
        &env("DISTLOCK_TEST_ETCD_URL"),
        None,
    );
}

/// A reader-writer lock through the same rollout: writers exclude
/// everyone across neighbouring steps, 70 % of the workers read.
#[test]
fn redis_to_etcd_reader_writer() {
    rollout(
        "redis-etcd-rw",
        &env("DISTLOCK_TEST_REDIS_URL"),
        &env("DISTLOCK_TEST_ETCD_URL"),
        Some("0.7"),
    );
}

#[test]
fn sqlite_to_postgres() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite = format!("sqlite://{}", dir.path().join("locks.db").display());
    rollout(
        "sqlite-postgres",
        &sqlite,
        &env("DISTLOCK_TEST_POSTGRES_URL"),
        None,
    );
}
