//! `distlock run`, the real binary against the real servers of
//! `scripts/services.sh`: the command's environment, every exit code, a
//! lock lost while the command runs, signals passed on, and
//! `--hold-at-least`.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use distlock::{DistributedLock, LockOptions, Wait};
use tokio::process::Child;
use tokio::time::Instant;

mod common;
use common::{distlock, env, text, unique};

/// `distlock run --url URL [extra…] NAME -- sh -c SCRIPT`, to completion.
async fn run_sh(url: &str, extra: &[&str], name: &str, script: &str) -> Output {
    distlock()
        .args(["run", "--url", url])
        .args(extra)
        .args([name, "--", "sh", "-c", script])
        .output()
        .await
        .expect("start distlock")
}

/// The same, left running.
fn spawn_sh(url: &str, extra: &[&str], name: &str, script: &str) -> Child {
    distlock()
        .args(["run", "--url", url])
        .args(extra)
        .args([name, "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start distlock")
}

/// Wait until `path` exists (the command has started).
async fn wait_for(path: &Path) {
    let until = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(Instant::now() < until, "{} never appeared", path.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether someone holds `name` (a single attempt is refused).
async fn is_held(locks: &dyn DistributedLock, name: &str) -> bool {
    let attempt = locks.try_acquire(name, &quick()).await.expect("try");
    attempt.is_none()
}

fn quick() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Wait::No)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_sees_its_lock_name_backend_and_a_rising_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let urls = [
        format!("sqlite://{}/locks.db", dir.path().display()),
        env("DISTLOCK_TEST_REDIS_URL"),
        format!("{}?mode=advisory", env("DISTLOCK_TEST_POSTGRES_URL")),
        env("DISTLOCK_TEST_ETCD_URL"),
        env("DISTLOCK_TEST_ZK_URL"),
    ];
    for url in &urls {
        let name = unique("env");
        let mut tokens = Vec::new();
        for _ in 0..2 {
            let out = run_sh(
                url,
                &[],
                &name,
                r#"echo "$DISTLOCK_NAME|$DISTLOCK_FENCING_TOKEN|$DISTLOCK_BACKEND|${DISTLOCK_URL:-none}""#,
            )
            .await;
            assert!(out.status.success(), "{url}: {}", text(&out.stderr));
            let stdout = text(&out.stdout);
            let fields: Vec<&str> = stdout.trim().split('|').collect();
            assert_eq!(fields.len(), 4, "{stdout}");
            assert_eq!(fields[0], name);
            tokens.push(fields[1].parse::<u64>().expect("a numeric token"));
            assert!(!fields[2].is_empty(), "the backend is named");
            assert_eq!(
                fields[3], "none",
                "the URL (and its credentials) is not passed on"
            );
        }
        assert!(tokens[1] > tokens[0], "{url}: tokens {tokens:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_is_busy() {
    let url = env("DISTLOCK_TEST_REDIS_URL");
    let name = unique("busy");
    let locks = distlock::connect(&url).await.expect("connect");
    let held = locks.acquire(&name, &quick()).await.expect("hold");
    let out = run_sh(&url, &["--wait", "none"], &name, "echo ran").await;
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(text(&out.stdout).is_empty(), "the command did not run");
    let started = Instant::now();
    let out = run_sh(&url, &["--wait", "700ms"], &name, "echo ran").await;
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(started.elapsed() >= Duration::from_millis(700));
    assert!(held.release().await.expect("release"));
    let out = run_sh(&url, &["--wait", "none"], &name, "echo ran").await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_an_unreachable_server_give_one_line_errors() {
    let name = unique("bad");
    for (url, extra, code) in [
        // Nothing listens on port 1.
        ("redis://127.0.0.1:1?connect_timeout_ms=500", vec![], 69),
        (
            "postgres://app:s3cret@127.0.0.1:1/db?connect_timeout_ms=500",
            vec![],
            69,
        ),
        ("nosuch://host", vec![], 69),
        ("redis://127.0.0.1:1?colour=blue", vec![], 69),
        ("memory://", vec!["--ttl", "5x"], 2),
        ("memory://", vec!["--wait", "soon"], 2),
        ("memory://", vec!["--kill-grace=-1s"], 2),
    ] {
        let out = run_sh(url, &extra, &name, "echo ran").await;
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{url} {extra:?}: {stderr}");
        assert!(
            text(&out.stdout).is_empty(),
            "{url} {extra:?}: the command ran"
        );
        assert!(
            !stderr.contains("s3cret"),
            "{url}: password shown: {stderr}"
        );
        assert!(
            !stderr.contains("panicked") && !stderr.contains("backtrace"),
            "{url} {extra:?}: {stderr}"
        );
        let lines = stderr.lines().filter(|l| !l.trim().is_empty()).count();
        assert!(
            (1..=2).contains(&lines),
            "{url} {extra:?}: expected a one-line error (and clap's hint): {stderr}"
        );
    }
    // An invalid lock name.
    let out = run_sh("memory://", &[], "", "echo ran").await;
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commands_own_exit_code_and_signal_are_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/locks.db", dir.path().display());
    let name = unique("codes");
    let out = run_sh(&url, &[], &name, "exit 7").await;
    assert_eq!(out.status.code(), Some(7));
    let out = run_sh(&url, &[], &name, "kill -KILL $$").await;
    assert_eq!(out.status.code(), Some(128 + 9));
    let out = distlock()
        .args(["run", "--url", &url, &name, "--", "/nonexistent/program"])
        .output()
        .await
        .expect("start distlock");
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
    // Every failure released the lock.
    let locks = distlock::connect(&url).await.expect("connect");
    let g = locks.acquire(&name, &quick()).await.expect("free again");
    assert!(g.release().await.expect("release"));
}

/// The lock is taken away on the server while the command sleeps: the
/// command gets SIGTERM, or SIGKILL after the grace if it ignores SIGTERM,
/// and distlock exits 76.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_stops_the_command() {
    let url = format!("{}?mode=advisory", env("DISTLOCK_TEST_POSTGRES_URL"));
    let operator = distlock::PgLock::connect(&url).await.expect("connect");
    let dir = tempfile::tempdir().expect("tempdir");
    for (case, script) in [
        ("term", "echo $$ > \"$PIDFILE\"; exec sleep 60"),
        (
            "kill",
            "echo $$ > \"$PIDFILE\"; trap '' TERM; exec sleep 60",
        ),
    ] {
        let name = unique(case);
        let pidfile = dir.path().join(case);
        let mut run = distlock()
            .args(["run", "--url", &url, "--ttl", "3s", "--kill-grace", "1s"])
            .args([&name, "--", "sh", "-c", script])
            .env("PIDFILE", &pidfile)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start distlock");
        wait_for(&pidfile).await;
        let pid = std::fs::read_to_string(&pidfile).expect("pid");
        assert!(
            operator.force_release(&name).await.expect("take away"),
            "{case}: held"
        );
        let taken = Instant::now();
        let status = tokio::time::timeout(Duration::from_secs(15), run.wait())
            .await
            .unwrap_or_else(|_| panic!("{case}: distlock still running 15 s after the loss"))
            .expect("wait");
        let took = taken.elapsed();
        let mut stderr = String::new();
        if let Some(mut e) = run.stderr.take() {
            use tokio::io::AsyncReadExt;
            let _ = e.read_to_string(&mut stderr).await;
        }
        assert_eq!(status.code(), Some(76), "{case}: {stderr}");
        assert!(stderr.contains("lost the lock"), "{case}: {stderr}");
        // Found within a renewal interval (TTL/3), plus the grace.
        assert!(
            took < Duration::from_secs(6),
            "{case}: stopped after {took:?}"
        );
        assert!(
            !Path::new(&format!("/proc/{}", pid.trim())).exists(),
            "{case}: the command still runs"
        );
    }
}

/// SIGTERM to distlock reaches the command, whose exit code distlock then
/// reports, and the lock is released only after the command has exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_reach_the_command_and_the_lock_is_released_after_it() {
    let url = env("DISTLOCK_TEST_REDIS_URL");
    let locks = distlock::connect(&url).await.expect("connect");
    let dir = tempfile::tempdir().expect("tempdir");
    use rustix::process::Signal;
    for (signal, sig) in [("TERM", Signal::TERM), ("INT", Signal::INT)] {
        let name = unique("signal");
        let started = dir.path().join(format!("started-{signal}"));
        let script = format!(
            "trap 'sleep 0.5; exit 3' {signal}; touch \"{}\"; while :; do sleep 0.05; done",
            started.display()
        );
        let mut run = spawn_sh(&url, &[], &name, &script);
        wait_for(&started).await;
        assert!(is_held(&*locks, &name).await, "held while the command runs");
        let pid = run
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw)
            .expect("pid");
        rustix::process::kill_process(pid, sig).expect("signal distlock");
        // The command's trap takes half a second: the lock stays held until
        // it exits.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            is_held(&*locks, &name).await,
            "{signal}: released before the command exited"
        );
        let status = tokio::time::timeout(Duration::from_secs(10), run.wait())
            .await
            .expect("distlock exits")
            .expect("wait");
        assert_eq!(status.code(), Some(3), "{signal}: the command's own code");
        let g = locks
            .try_acquire(&name, &quick())
            .await
            .expect("try")
            .expect("released once the command exited");
        assert!(g.release().await.expect("release"));
    }
}

/// A fast first run with `--hold-at-least 3s` keeps a second run out until
/// three seconds after its grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_at_least_keeps_a_second_run_out() {
    let url = env("DISTLOCK_TEST_REDIS_URL");
    let name = unique("at-least");
    let dir = tempfile::tempdir().expect("tempdir");
    let ran = dir.path().join("ran");
    let started = Instant::now();
    let mut first = spawn_sh(
        &url,
        &["--hold-at-least", "3s"],
        &name,
        &format!("touch \"{}\"", ran.display()),
    );
    wait_for(&ran).await;
    let second = run_sh(&url, &["--wait", "none"], &name, "echo second").await;
    assert_eq!(
        second.status.code(),
        Some(75),
        "the second run got the lock"
    );
    let status = first.wait().await.expect("wait");
    assert!(status.success());
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "the first run let go after {:?}",
        started.elapsed()
    );
    let second = run_sh(&url, &["--wait", "none"], &name, "echo second").await;
    assert_eq!(second.status.code(), Some(0), "{}", text(&second.stderr));
    assert_eq!(text(&second.stdout).trim(), "second");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_names_the_environment_and_the_exit_codes() {
    let out = distlock()
        .args(["run", "--help"])
        .env("DISTLOCK_URL", "postgres://app:s3cret@db/app")
        .output()
        .await
        .expect("help");
    assert!(out.status.success());
    let help = text(&out.stdout);
    for needle in [
        "DISTLOCK_FENCING_TOKEN",
        "--hold-at-least",
        "--kill-grace",
        "75",
        "76",
        "[env: DISTLOCK_URL]",
    ] {
        assert!(help.contains(needle), "--help lacks {needle:?}:\n{help}");
    }
    assert!(!help.contains("s3cret"), "--help shows the URL's password");
}
