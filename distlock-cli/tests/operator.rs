//! `distlock status` and `distlock release --force`, the real binary
//! against every backend's real server: a held lock is reported with its
//! holder's token (text and JSON), a free one as free; `release` refuses
//! without `--force`, and without `--yes` when stdin is not a terminal;
//! `release --force --yes` frees the lock for the next acquisition at
//! once and says what it removed.

use std::process::{Output, Stdio};
use std::time::Duration;

use distlock::{LockOptions, Wait};

mod common;
use common::{distlock, env, text, unique};

/// Every backend's URL.
fn urls() -> Vec<String> {
    let dir = std::env::temp_dir().join(format!("distlock-cli-operator-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temporary directory");
    vec![
        format!("sqlite://{}", dir.join("locks.db").display()),
        env("DISTLOCK_TEST_REDIS_URL"),
        env("DISTLOCK_TEST_REDIS_SENTINEL_URL"),
        env("DISTLOCK_TEST_REDIS_CLUSTER_URL"),
        env("DISTLOCK_TEST_REDLOCK_URL"),
        env("DISTLOCK_TEST_POSTGRES_URL"),
        format!("{}?mode=advisory", env("DISTLOCK_TEST_POSTGRES_URL")),
        env("DISTLOCK_TEST_MYSQL_URL"),
        format!("{}?mode=advisory", env("DISTLOCK_TEST_MYSQL_URL")),
        env("DISTLOCK_TEST_ETCD_URL"),
        env("DISTLOCK_TEST_ZK_URL"),
    ]
}

async fn cli(args: &[&str]) -> Output {
    distlock()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("start distlock")
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&out.stdout)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_forced_release_on_every_backend() {
    for url in urls() {
        let locks = distlock::connect(&url).await.expect("connect");
        let backend = locks.capabilities().backend;
        // The lock of an election, read as a lock and as the election.
        let election = unique("operator");
        let name = format!("{}{election}", distlock::ELECTION_PREFIX);
        // Renewed every 2 s: the holder hears of the release that soon.
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(6))
            .wait(Wait::No)
            .auto_renew(true)
            .identity("api-2 (pid 4312)")
            .value(&b"10.0.0.7:8080"[..]);
        let guard = locks.acquire(&name, &opts).await.expect("acquire");
        let keeps_holder = locks.capabilities().holder;

        let out = cli(&["status", "--url", &url, "--json", &name]).await;
        assert_eq!(
            out.status.code(),
            Some(0),
            "{backend}: {}",
            text(&out.stderr)
        );
        let report = json(&out);
        assert_eq!(report["held"], true, "{backend}: {report}");
        assert_eq!(report["backend"], backend, "{report}");
        assert_eq!(
            report["fencing_token"].as_u64(),
            guard.fencing_token(),
            "{backend}: {report}"
        );
        if keeps_holder {
            assert_eq!(
                report["holder"]["identity"], "api-2 (pid 4312)",
                "{backend}: {report}"
            );
            assert_eq!(report["holder"]["value"], "10.0.0.7:8080", "{report}");
            // The same lock read as an election.
            let out = cli(&["leader", "--url", &url, "--json", &election]).await;
            assert_eq!(
                out.status.code(),
                Some(0),
                "{backend}: {}",
                text(&out.stderr)
            );
            let leader = json(&out);
            assert_eq!(
                leader["leader"]["term"].as_u64(),
                guard.fencing_token(),
                "{backend}: {leader}"
            );
            assert_eq!(leader["leader"]["value"], "10.0.0.7:8080", "{leader}");
        } else {
            assert!(report["holder"].is_null(), "{backend}: {report}");
            let out = cli(&["leader", "--url", &url, &election]).await;
            assert_eq!(out.status.code(), Some(78), "{backend}: elections refused");
        }
        let out = cli(&["status", "--url", &url, &name]).await;
        let shown = text(&out.stdout);
        assert!(shown.contains(": held"), "{backend}: {shown}");
        if keeps_holder {
            assert!(
                shown.contains("held by        api-2 (pid 4312) since"),
                "{backend}: {shown}"
            );
        }
        if let Some(token) = guard.fencing_token() {
            assert!(shown.contains(&token.to_string()), "{backend}: {shown}");
        }

        // Refused without --force, and without --yes on a non-terminal.
        let out = cli(&["release", "--url", &url, &name]).await;
        assert_eq!(
            out.status.code(),
            Some(2),
            "{backend}: {}",
            text(&out.stderr)
        );
        let out = cli(&["release", "--force", "--url", &url, &name]).await;
        assert_eq!(
            out.status.code(),
            Some(2),
            "{backend}: {}",
            text(&out.stderr)
        );
        assert!(text(&out.stderr).contains("--yes"), "{}", text(&out.stderr));
        assert_eq!(
            guard.is_lost(),
            None,
            "{backend}: a refused release took the lock"
        );

        let out = cli(&["release", "--force", "--yes", "--url", &url, &name]).await;
        assert_eq!(
            out.status.code(),
            Some(0),
            "{backend}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stdout).contains("released"),
            "{backend}: {}",
            text(&out.stdout)
        );
        let next = locks
            .try_acquire(&name, &opts)
            .await
            .expect("try_acquire")
            .unwrap_or_else(|| panic!("{backend}: still held after release --force"));
        tokio::time::timeout(Duration::from_secs(30), guard.lost())
            .await
            .unwrap_or_else(|_| panic!("{backend}: the holder never learned of the release"));
        assert!(next.release().await.expect("release"));

        let out = cli(&["status", "--url", &url, "--json", &name]).await;
        assert_eq!(json(&out)["held"], false, "{backend}");
        if keeps_holder {
            let out = cli(&["leader", "--url", &url, &election]).await;
            assert_eq!(
                text(&out.stdout).trim(),
                format!("election {election:?}: no leader"),
                "{backend}"
            );
        }
        let out = cli(&["release", "--force", "--yes", "--url", &url, &name]).await;
        assert_eq!(out.status.code(), Some(0), "{backend}");
        assert!(
            text(&out.stdout).contains("nothing to release"),
            "{backend}: {}",
            text(&out.stdout)
        );
    }
}

#[tokio::test]
async fn bad_input_is_one_line_and_names_no_password() {
    let out = cli(&[
        "status",
        "--url",
        "postgres://user:s3cret@127.0.0.1:1/db",
        "name",
    ])
    .await;
    assert_eq!(out.status.code(), Some(69));
    let err = text(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!err.contains("s3cret"), "{err}");
    // Configuration errors are 78 (EX_CONFIG), apart from the server's 69.
    let out = cli(&["status", "--url", "bogus://x", "name"]).await;
    assert_eq!(out.status.code(), Some(78));
    let out = cli(&["status", "--url", &env("DISTLOCK_TEST_REDIS_URL"), ""]).await;
    assert_eq!(out.status.code(), Some(78), "{}", text(&out.stderr));
}
