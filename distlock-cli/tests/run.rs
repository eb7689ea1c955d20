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
        env("DISTLOCK_TEST_REDIS_SENTINEL_URL"),
        env("DISTLOCK_TEST_REDIS_CLUSTER_URL"),
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

/// `--permits 2`: two commands run at once on distinct slots, each seeing
/// its slot and token; a third finds the semaphore full (busy, 75);
/// `distlock status --semaphore` shows both permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_let_two_commands_run_at_once_on_their_own_slots() {
    let url = env("DISTLOCK_TEST_REDIS_URL");
    let name = unique("permits");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut running = Vec::new();
    for i in 0..2 {
        let started = dir.path().join(format!("started-{i}"));
        let script = format!(
            r#"echo "$DISTLOCK_SLOT|$DISTLOCK_FENCING_TOKEN" > "{}"; sleep 30"#,
            started.display()
        );
        running.push(spawn_sh(&url, &["--permits", "2"], &name, &script));
        wait_for(&started).await;
    }
    let mut slots = Vec::new();
    for i in 0..2 {
        let seen = std::fs::read_to_string(dir.path().join(format!("started-{i}"))).expect("read");
        let (slot, token) = seen.trim().split_once('|').expect("slot|token");
        slots.push(slot.parse::<u32>().expect("a numeric slot"));
        token.parse::<u64>().expect("a numeric token");
    }
    slots.sort_unstable();
    assert_eq!(slots, [0, 1]);
    let out = run_sh(
        &url,
        &["--permits", "2", "--wait", "none"],
        &name,
        "echo ran",
    )
    .await;
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).is_empty(),
        "the third command did not run"
    );
    let out = distlock()
        .args(["status", "--url", &url, "--semaphore", "--json", &name])
        .output()
        .await
        .expect("status");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["limit"], 2, "{json}");
    assert_eq!(json["permits"].as_array().map(Vec::len), Some(2), "{json}");
    // SIGTERM: distlock stops the command's group and gives the permit back.
    for mut child in running {
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw)
            .expect("pid");
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("signal");
        let status = child.wait().await.expect("wait");
        assert_eq!(status.code(), Some(128 + 15));
    }
}

/// `--read`: two commands run at once, each told it reads; a `--write`
/// finds them (busy, 75); `distlock status --rw` shows both readers; once
/// they end, a writer runs with a token above theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_run_together_and_a_writer_alone() {
    let url = env("DISTLOCK_TEST_REDIS_URL");
    let name = unique("rw");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut running = Vec::new();
    for i in 0..2 {
        let started = dir.path().join(format!("started-{i}"));
        let script = format!(
            r#"echo "$DISTLOCK_ACCESS|$DISTLOCK_FENCING_TOKEN" > "{}"; sleep 30"#,
            started.display()
        );
        running.push(spawn_sh(&url, &["--read"], &name, &script));
        wait_for(&started).await;
    }
    let mut read_token = 0;
    for i in 0..2 {
        let seen = std::fs::read_to_string(dir.path().join(format!("started-{i}"))).expect("read");
        let (access, token) = seen.trim().split_once('|').expect("access|token");
        assert_eq!(access, "read");
        read_token = token.parse::<u64>().expect("a numeric token");
    }
    let out = run_sh(&url, &["--write", "--wait", "none"], &name, "echo ran").await;
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(text(&out.stdout).is_empty(), "the writer did not run");
    let out = distlock()
        .args(["status", "--url", &url, "--rw", "--json", &name])
        .output()
        .await
        .expect("status");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["mode"], "read", "{json}");
    assert_eq!(json["holders"].as_array().map(Vec::len), Some(2), "{json}");
    for mut child in running {
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw)
            .expect("pid");
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("signal");
        let status = child.wait().await.expect("wait");
        assert_eq!(status.code(), Some(128 + 15));
    }
    let out = run_sh(
        &url,
        &["--write", "--wait", "5s"],
        &name,
        r#"echo "$DISTLOCK_ACCESS|$DISTLOCK_FENCING_TOKEN""#,
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let seen = text(&out.stdout);
    let (access, token) = seen.trim().split_once('|').expect("access|token");
    assert_eq!(access, "write");
    assert!(token.parse::<u64>().expect("a numeric token") > read_token);
    let out = distlock()
        .args([
            "run",
            "--url",
            &url,
            "--read",
            "--permits",
            "2",
            &name,
            "--",
            "true",
        ])
        .output()
        .await
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(2),
        "--read with --permits is a usage error"
    );
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
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("held by someone else") && !stderr.contains("try_acquire"),
        "{stderr}"
    );
    // flock's habits: -E sets the busy code, -q says nothing, -w is --wait.
    let out = run_sh(&url, &["-w", "none", "-E", "3", "-q"], &name, "echo ran").await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(text(&out.stderr).is_empty(), "{}", text(&out.stderr));
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
        // Configuration errors: the same input fails the same way again.
        ("nosuch://host", vec![], 78),
        ("redis://127.0.0.1:1?colour=blue", vec![], 78),
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
    assert_eq!(out.status.code(), Some(78), "{}", text(&out.stderr));
}

/// An unreachable server's message carries the cause, not only what was
/// being done, and a refused connection is reported at once, not at the
/// end of the connect timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_reported_with_its_cause() {
    for url in [
        "redis://127.0.0.1:1?connect_timeout=10s",
        "postgres://app:s3cret@127.0.0.1:1/db?connect_timeout=10s",
        "mysql://app:s3cret@127.0.0.1:1/db?connect_timeout=10s",
    ] {
        let started = std::time::Instant::now();
        let out = run_sh(url, &[], &unique("cause"), "echo ran").await;
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{url}: {stderr}");
        assert!(
            stderr.to_lowercase().contains("refused"),
            "{url}: no cause in: {stderr}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{url}: a refused connection took {:?} to report (connect timeout 10 s)",
            started.elapsed()
        );
    }
}

/// An option no backend knows is a configuration error on every SQL
/// server too (sqlx would only log it and go on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_sql_option_is_a_configuration_error() {
    for url in [
        "postgres://app:s3cret@127.0.0.1:1/db?mode=advisory&sesions=3",
        "mysql://app:s3cret@127.0.0.1:1/db?bogus=1",
    ] {
        let out = run_sh(url, &[], &unique("option"), "echo ran").await;
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{url}: {stderr}");
        assert!(stderr.contains("unknown option"), "{url}: {stderr}");
        assert!(!stderr.contains("s3cret"), "{url}: {stderr}");
    }
}

/// distlock's log lines carry no colour codes when stderr is not a
/// terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_lines_carry_no_colour_off_a_terminal() {
    let out = distlock()
        .args(["run", "--url", "memory://", &unique("plain"), "--", "true"])
        .env("DISTLOCK_LOG", "debug")
        .output()
        .await
        .expect("start distlock");
    let stderr = text(&out.stderr);
    assert!(stderr.contains("lock acquired"), "no log lines: {stderr}");
    assert!(!stderr.contains('\x1b'), "colour codes in: {stderr:?}");
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
/// three seconds after its grant. On Redis the server keeps the released
/// lock: the first run exits with its command. On Postgres, whose locks
/// end with their connection, the first run stays running until then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_at_least_keeps_a_second_run_out() {
    const HOLD: Duration = Duration::from_secs(3);
    let cases = [
        (env("DISTLOCK_TEST_REDIS_URL"), false),
        (
            format!("{}?mode=advisory", env("DISTLOCK_TEST_POSTGRES_URL")),
            true,
        ),
    ];
    for (url, stays) in &cases {
        let name = unique("at-least");
        let dir = tempfile::tempdir().expect("tempdir");
        let ran = dir.path().join("ran");
        let started = Instant::now();
        let mut first = spawn_sh(
            url,
            &["--hold-at-least", "3s"],
            &name,
            &format!("touch \"{}\"", ran.display()),
        );
        wait_for(&ran).await;
        let second = run_sh(url, &["--wait", "none"], &name, "echo second").await;
        assert_eq!(
            second.status.code(),
            Some(75),
            "{url}: the second run got the lock {:?} after the first's start",
            started.elapsed()
        );
        let status = first.wait().await.expect("wait");
        assert!(status.success(), "{url}: {status:?}");
        let first_ran = started.elapsed();
        if *stays {
            assert!(
                first_ran >= HOLD,
                "{url}: the first run let go after {first_ran:?}"
            );
        } else {
            assert!(
                first_ran < HOLD,
                "{url}: the server keeps the hold, yet the first run stayed {first_ran:?}"
            );
            let during = run_sh(url, &["--wait", "none"], &name, "echo second").await;
            assert!(
                during.status.code() == Some(75) || started.elapsed() >= HOLD,
                "{url}: a second run got the lock {:?} after the first's start, within its hold",
                started.elapsed()
            );
        }
        let second = run_sh(url, &["--wait", "10s"], &name, "echo second").await;
        assert_eq!(
            second.status.code(),
            Some(0),
            "{url}: {}",
            text(&second.stderr)
        );
        assert_eq!(text(&second.stdout).trim(), "second");
        assert!(
            started.elapsed() >= HOLD,
            "{url}: the second run got the lock {:?} after the first's start",
            started.elapsed()
        );
    }
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
        "--conflict-exit-code",
        "78",
        "Examples:",
        "process group",
    ] {
        assert!(help.contains(needle), "--help lacks {needle:?}:\n{help}");
    }
    assert!(!help.contains("s3cret"), "--help shows the URL's password");
}

/// Processes whose command line holds `marker`.
fn running_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(marker) {
            found.push(format!(
                "{}: {cmdline}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}

/// A `sleep` whose command line is unique: `sleep 3600.<digits>`.
fn marked_sleep() -> String {
    format!("3600.{}", common::rand_u64() % 1_000_000_000)
}

/// A command that starts a grandchild (`sleep` in the background of a
/// shell) leaves nothing running once `distlock run` has exited: when its
/// lock is taken away, when `distlock` gets SIGTERM, when `--kill-grace`
/// runs out for a group that ignores SIGTERM, and when the command exits
/// leaving the grandchild behind. Each case holds its lock until the group
/// is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_started_under_the_lock_outlives_it() {
    let url = env("DISTLOCK_TEST_REDIS_URL");
    let operator = distlock::connect(&url).await.expect("connect");
    let dir = tempfile::tempdir().expect("tempdir");
    for case in ["taken-away", "sigterm", "grace-runs-out", "left-behind"] {
        let name = unique(case);
        let started = dir.path().join(case);
        let marker = marked_sleep();
        let script = match case {
            "grace-runs-out" => format!(
                "trap '' TERM; sleep {marker} & touch \"{}\"; wait",
                started.display()
            ),
            // The command exits 2 s after its grandchild started, so the
            // grandchild can be seen running before distlock stops it.
            "left-behind" => format!("sleep {marker} & touch \"{}\"; sleep 2", started.display()),
            _ => format!("sleep {marker} & touch \"{}\"; wait", started.display()),
        };
        let mut run = distlock()
            .args(["run", "--url", &url, "--kill-grace", "1s", &name, "--"])
            .args(["bash", "-c", &script])
            .stderr(Stdio::piped())
            .spawn()
            .expect("start distlock");
        wait_for(&started).await;
        assert!(!running_with(&marker).is_empty(), "{case}: no grandchild");
        match case {
            "taken-away" | "grace-runs-out" => {
                assert!(operator.force_release(&name).await.expect("take away"));
            }
            "sigterm" => {
                let pid = run
                    .id()
                    .and_then(|id| i32::try_from(id).ok())
                    .and_then(rustix::process::Pid::from_raw)
                    .expect("pid");
                rustix::process::kill_process(pid, rustix::process::Signal::TERM)
                    .expect("signal distlock");
            }
            _ => {}
        }
        let status = tokio::time::timeout(Duration::from_secs(20), run.wait())
            .await
            .unwrap_or_else(|_| panic!("{case}: distlock still running after 20 s"))
            .expect("wait");
        let left = running_with(&marker);
        assert!(
            left.is_empty(),
            "{case}: still running after distlock exited: {left:?}"
        );
        let expected = match case {
            "taken-away" | "grace-runs-out" => 76,
            "sigterm" => 128 + 15,
            _ => 0,
        };
        assert_eq!(status.code(), Some(expected), "{case}");
        if case == "left-behind" {
            let g = operator.try_acquire(&name, &quick()).await.expect("try");
            let g = g.expect("released once the group was gone");
            assert!(g.release().await.expect("release"));
        }
    }
}

/// The lock is taken away while a short command runs, too briefly for a
/// renewal to notice: the release finds it no longer ours, and distlock
/// exits 76 with the reason, not the command's 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_found_at_release_is_never_success() {
    let url = env("DISTLOCK_TEST_REDIS_URL");
    let operator = distlock::connect(&url).await.expect("connect");
    let dir = tempfile::tempdir().expect("tempdir");
    let name = unique("lost-at-release");
    let started = dir.path().join("started");
    let go_on = dir.path().join("go-on");
    let script = format!(
        "touch \"{}\"; while [ ! -e \"{}\" ]; do sleep 0.02; done",
        started.display(),
        go_on.display()
    );
    let run = spawn_sh(&url, &[], &name, &script);
    wait_for(&started).await;
    assert!(operator.force_release(&name).await.expect("take away"));
    std::fs::write(&go_on, b"").expect("let the command end");
    let out = tokio::time::timeout(Duration::from_secs(20), run.wait_with_output())
        .await
        .expect("distlock exits")
        .expect("wait");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(76), "{stderr}");
    assert!(stderr.contains("no longer ours at release"), "{stderr}");
    assert!(stderr.contains("taken over"), "{stderr}");
}

/// A terminal of the test's own: the master side and the slave's path.
fn pseudo_terminal() -> (std::fs::File, std::path::PathBuf) {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).expect("openpt");
    grantpt(&master).expect("grantpt");
    unlockpt(&master).expect("unlockpt");
    let slave = ptsname(&master, Vec::new()).expect("ptsname");
    let slave = std::path::PathBuf::from(slave.to_string_lossy().into_owned());
    (std::fs::File::from(master), slave)
}

/// Under a terminal, one Ctrl-C reaches the command once: the terminal's
/// foreground is the command's group while it runs, and distlock does not
/// pass the same interrupt on a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_ctrl_c_on_a_terminal_reaches_the_command_once() {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/locks.db", dir.path().display());
    let (mut master, slave) = pseudo_terminal();
    let terminal = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&slave)
            .expect("open the terminal")
    };
    let (started, interrupts) = (dir.path().join("started"), dir.path().join("interrupts"));
    let script = format!(
        "trap 'echo INT >> \"{}\"' INT; touch \"{}\"; while :; do sleep 0.05; done",
        interrupts.display(),
        started.display()
    );
    // setsid -c: a new session whose controlling terminal is stdin, as a
    // login shell's; distlock is its foreground job.
    let mut run = tokio::process::Command::new("setsid")
        .arg("-c")
        .arg(env!("CARGO_BIN_EXE_distlock"))
        .args([
            "run",
            "--url",
            &url,
            &unique("ctrl-c"),
            "--",
            "sh",
            "-c",
            &script,
        ])
        .env_remove("DISTLOCK_URL")
        .stdin(terminal())
        .stdout(terminal())
        .stderr(terminal())
        .kill_on_drop(true)
        .spawn()
        .expect("start distlock on the terminal");
    // Keep what the terminal shows, so that nothing blocks writing to it.
    let shown = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut reader = master.try_clone().expect("clone the master");
    let keep = std::sync::Arc::clone(&shown);
    std::thread::spawn(move || {
        use std::io::Read;
        let mut buf = [0u8; 1024];
        while let Ok(n @ 1..) = reader.read(&mut buf) {
            keep.lock().expect("shown").extend_from_slice(&buf[..n]);
        }
    });
    let shown = move || text(&shown.lock().expect("shown"));
    let until = Instant::now() + Duration::from_secs(30);
    while !started.exists() {
        assert!(
            Instant::now() < until,
            "never started; the terminal showed: {}",
            shown()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    master.write_all(b"\x03").expect("type Ctrl-C");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let seen = std::fs::read_to_string(&interrupts).unwrap_or_default();
    let pid = run
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(rustix::process::Pid::from_raw)
        .expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("end distlock");
    let status = tokio::time::timeout(Duration::from_secs(20), run.wait())
        .await
        .expect("distlock exits")
        .expect("wait");
    assert_eq!(
        seen.lines().count(),
        1,
        "interrupts seen by the command: {seen:?}"
    );
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "the command ended by SIGTERM"
    );
    assert!(
        !shown().contains("waiting for lock"),
        "a spinner for a free lock: {}",
        shown()
    );
}
