//! `distlock elect`, the real binary against the real servers of
//! `scripts/services.sh`: the command runs while leader with its term,
//! others see the leader and are refused, a lost leadership stops the
//! command (and with `--again` campaigns anew with a higher term), and a
//! backend without elections is refused.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use distlock::Election;
use tokio::time::Instant;

mod common;
use common::{distlock, env, text, unique};

/// The backends that offer elections, by URL (SQLite's file in `dir`).
fn election_urls(dir: &Path) -> Vec<String> {
    vec![
        format!("sqlite://{}/locks.db", dir.display()),
        env("DISTLOCK_TEST_POSTGRES_URL"),
        format!("{}?mode=advisory", env("DISTLOCK_TEST_MYSQL_URL")),
        env("DISTLOCK_TEST_REDIS_URL"),
        env("DISTLOCK_TEST_REDLOCK_URL"),
        env("DISTLOCK_TEST_ETCD_URL"),
        env("DISTLOCK_TEST_ZK_URL"),
    ]
}

/// Wait until `path` holds at least `lines` lines; its lines.
async fn lines_of(path: &Path, lines: usize) -> Vec<String> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let got: Vec<String> = text.lines().map(String::from).collect();
        if got.len() >= lines {
            return got;
        }
        assert!(
            Instant::now() < until,
            "{} has {got:?}, not {lines} lines",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The leader's command sees its term (= its fencing token); `leader`
/// shows that term and the value; a second candidate with `--wait none`
/// is refused with 75; when the command exits, its code is distlock's and
/// the election has no leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_runs_with_its_term_and_the_others_see_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    for url in election_urls(dir.path()) {
        let name = unique("elect");
        let seen = dir.path().join(format!("{:x}", common::rand_u64()));
        let go = dir.path().join(format!("{:x}", common::rand_u64()));
        let script = r#"echo "$DISTLOCK_TERM|$DISTLOCK_FENCING_TOKEN|$DISTLOCK_NAME" > "$SEEN"
while [ ! -e "$GO" ]; do sleep 0.05; done; exit 7"#;
        let leader = distlock()
            .args(["elect", "--url", &url, "--value", "10.0.0.7:8080"])
            .args(["--identity", "replica-1", &name, "--", "sh", "-c", script])
            .env("SEEN", &seen)
            .env("GO", &go)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start distlock elect");
        let fields = lines_of(&seen, 1).await[0].clone();
        let fields: Vec<&str> = fields.split('|').collect();
        assert_eq!(fields.len(), 3, "{url}: {fields:?}");
        let term: u64 = fields[0].parse().expect("a numeric term");
        assert_eq!(fields[1], fields[0], "{url}: the term is the fencing token");
        assert_eq!(fields[2], name);

        let locks = distlock::connect(&url).await.expect("connect");
        let election = Election::new(Arc::clone(&locks), name.clone());
        let now = election.leader().await.expect("leader").expect("a leader");
        assert_eq!(
            (now.term, now.identity.as_str(), now.value.as_slice()),
            (term, "replica-1", b"10.0.0.7:8080".as_slice()),
            "{url}"
        );
        let out = distlock()
            .args(["elect", "--url", &url, "--wait", "none", &name])
            .args(["--", "sh", "-c", "echo ran"])
            .output()
            .await
            .expect("second candidate");
        assert_eq!(out.status.code(), Some(75), "{url}: {}", text(&out.stderr));
        assert!(text(&out.stdout).is_empty(), "{url}: it did not run");
        assert!(
            text(&out.stderr).contains("led by another candidate"),
            "{url}: {}",
            text(&out.stderr)
        );

        std::fs::write(&go, "").expect("go");
        let out = tokio::time::timeout(Duration::from_secs(30), leader.wait_with_output())
            .await
            .expect("the leader ends")
            .expect("wait");
        assert_eq!(out.status.code(), Some(7), "{url}: {}", text(&out.stderr));
        assert!(
            election.leader().await.expect("leader").is_none(),
            "{url}: resigned when the command exited"
        );
    }
}

/// The leadership is taken away on the server (`release --force`): the
/// command is stopped and distlock exits 76; with `--again` it campaigns
/// again and runs the command anew, with a higher term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_leadership_stops_the_command_and_again_campaigns_anew() {
    let url = env("DISTLOCK_TEST_REDIS_URL");
    let dir = tempfile::tempdir().expect("tempdir");
    let script = r#"echo "$DISTLOCK_TERM" >> "$TERMS"; exec sleep 60"#;
    for again in [false, true] {
        let name = unique("elect-lost");
        let terms = dir.path().join(format!("terms-{again}"));
        let mut elect = distlock();
        elect
            .args(["elect", "--url", &url, "--ttl", "3s", "--kill-grace", "1s"])
            .env("TERMS", &terms)
            .stderr(Stdio::piped());
        if again {
            elect.arg("--again");
        }
        let elect = elect
            .args([&name, "--", "sh", "-c", script])
            .spawn()
            .expect("start distlock elect");
        let first: u64 = lines_of(&terms, 1).await[0].parse().expect("term");
        let out = distlock()
            .args(["release", "--force", "--yes", "--url", &url])
            .arg(format!("{}{name}", distlock::ELECTION_PREFIX))
            .output()
            .await
            .expect("release --force");
        assert!(out.status.success(), "{}", text(&out.stderr));
        if again {
            let second: u64 = lines_of(&terms, 2).await[1].parse().expect("term");
            assert!(second > first, "terms {first} then {second}");
            let pid = rustix::process::Pid::from_raw(
                i32::try_from(elect.id().expect("running")).expect("pid"),
            )
            .expect("pid");
            rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
        }
        let out = tokio::time::timeout(Duration::from_secs(15), elect.wait_with_output())
            .await
            .expect("distlock elect ends")
            .expect("wait");
        let stderr = text(&out.stderr);
        if again {
            assert!(stderr.contains("campaigning again"), "{stderr}");
            // SIGTERM was passed on to the command, which it ended.
            assert_eq!(out.status.code(), Some(128 + 15), "{stderr}");
        } else {
            assert_eq!(out.status.code(), Some(76), "{stderr}");
            assert!(
                stderr.contains("lost the leadership of election"),
                "{stderr}"
            );
            assert_eq!(lines_of(&terms, 1).await.len(), 1, "ran once");
        }
    }
}

/// A backend without elections (a SQL lock with `fencing=false`: no
/// terms, no holder record) is refused with 78 before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_without_elections_is_refused() {
    let url = format!(
        "{}?mode=advisory&fencing=false",
        env("DISTLOCK_TEST_POSTGRES_URL")
    );
    let out = distlock()
        .args(["elect", "--url", &url, "jobs", "--", "sh", "-c", "echo ran"])
        .output()
        .await
        .expect("distlock elect");
    assert_eq!(out.status.code(), Some(78), "{}", text(&out.stderr));
    assert!(text(&out.stdout).is_empty());
    let out = distlock()
        .args(["elect", "--url", &env("DISTLOCK_TEST_REDIS_URL")])
        .args(["--value", &"x".repeat(2000), "jobs", "--", "true"])
        .output()
        .await
        .expect("distlock elect");
    assert_eq!(
        out.status.code(),
        Some(78),
        "a value over 1 KiB: {}",
        text(&out.stderr)
    );
}
