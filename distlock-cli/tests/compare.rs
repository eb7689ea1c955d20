//! `distlock compare`, the real binary against real servers: the table, the
//! JSON and CSV numbers and the three SVG charts, for Redis (alone, through
//! Sentinel and on a Cluster), etcd, Postgres (two of them labelled) and SQLite side by side; bad arguments are errors that say so, never a panic.

use std::process::Stdio;

mod common;
use common::{distlock, env, text};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compares_redis_etcd_postgres_and_sqlite() {
    let out_dir = tempfile::tempdir().expect("temporary directory");
    let sqlite = format!("sqlite://{}", out_dir.path().join("locks.db").display());
    let report = out_dir.path().join("report");
    let urls = [
        env("DISTLOCK_TEST_REDIS_URL"),
        format!("sentinel={}", env("DISTLOCK_TEST_REDIS_SENTINEL_URL")),
        format!("cluster={}", env("DISTLOCK_TEST_REDIS_CLUSTER_URL")),
        env("DISTLOCK_TEST_ETCD_URL"),
        env("DISTLOCK_TEST_POSTGRES_URL"),
        format!(
            "pg-advisory={}?mode=advisory",
            env("DISTLOCK_TEST_POSTGRES_URL")
        ),
        sqlite,
    ];
    let mut command = distlock();
    command.arg("compare");
    for url in &urls {
        command.args(["--url", url]);
    }
    let out = command
        .args(["--tasks", "1,3", "--duration", "1s", "--out"])
        .arg(&report)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("start distlock");
    let table = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}\n{table}", text(&out.stderr));
    for label in [
        "redis",
        "sentinel",
        "cluster",
        "etcd",
        "postgres",
        "pg-advisory",
        "sqlite",
    ] {
        assert!(
            table.lines().any(|l| l.trim_start().starts_with(label)),
            "{label} missing:\n{table}"
        );
    }
    assert!(table.contains("contended, 3 task(s)"), "{table}");
    assert!(
        !table.contains("distlock:distlock@"),
        "a password in the table"
    );

    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(report.join("report.json")).expect("report.json"))
            .expect("JSON");
    let rows = json["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), urls.len() * 3, "{json}");
    for row in rows {
        assert!(row["error"].is_null(), "{row}");
        assert!(
            !row["url"].as_str().unwrap_or("").contains(":distlock@"),
            "{row}"
        );
        if row["workload"] == "uncontended" {
            assert!(row["cycles"].as_u64().unwrap_or(0) > 0, "{row}");
            assert!(row["p50_us"].as_f64().unwrap_or(0.0) > 0.0, "{row}");
        } else if row["tasks"] == 3 {
            assert!(row["handoffs_per_s"].as_f64().unwrap_or(0.0) > 0.0, "{row}");
            assert!(row["per_task_min"].as_u64().is_some(), "{row}");
        } else {
            assert!(
                row["acquisitions_per_s"].as_f64().unwrap_or(0.0) > 0.0,
                "{row}"
            );
            // Hand-offs do not apply to one task.
            assert!(row["handoffs_per_s"].is_null(), "{row}");
            assert!(row["handoff_p50_us"].is_null(), "{row}");
        }
        if row["tasks"] == 3 {
            let turns: Vec<u64> = row["turns_per_task"]
                .as_array()
                .expect("turns per task")
                .iter()
                .filter_map(|t| t.as_u64())
                .collect();
            assert_eq!(turns.len(), 3, "{row}");
            assert!(turns.windows(2).all(|w| w[0] <= w[1]), "{row}");
            assert_eq!(Some(turns[0]), row["per_task_min"].as_u64(), "{row}");
        }
    }
    let csv = std::fs::read_to_string(report.join("report.csv")).expect("report.csv");
    assert_eq!(csv.lines().count(), 1 + urls.len() * 3, "{csv}");
    assert!(csv.starts_with("service,url,workload,tasks,"), "{csv}");
    // Figures to a tenth, without float noise.
    for field in csv.lines().skip(1).flat_map(|l| l.split(',')) {
        if let Some((_, decimals)) = field.split_once('.')
            && decimals.bytes().all(|b| b.is_ascii_digit())
        {
            assert!(decimals.len() <= 1, "{field} in {csv}");
        }
    }
    // After the quoted workload: tasks, cycles, p50, p99, acquisitions/s,
    // hand-offs/s, hand-off p50, p99, per task min, max, error.
    let one_task: Vec<&str> = csv
        .lines()
        .find_map(|l| l.split_once("\"contended, 1 tasks\","))
        .expect("a one-task row")
        .1
        .split(',')
        .collect();
    assert!(!one_task[4].is_empty(), "{one_task:?}");
    assert_eq!(
        one_task[5..8],
        ["", "", ""],
        "hand-offs of one task: {one_task:?}"
    );
    for chart in ["latency.svg", "handoffs.svg", "fairness.svg"] {
        let svg = std::fs::read_to_string(report.join(chart)).expect(chart);
        assert!(svg.contains("<svg"), "{chart}");
        for label in ["redis", "etcd", "sqlite"] {
            assert!(svg.contains(label), "{chart} does not name {label}");
        }
    }
}

#[tokio::test]
async fn bad_arguments_are_errors_not_panics() {
    for args in [
        vec!["compare"],
        vec!["compare", "--url", "redis://127.0.0.1:1", "--tasks", "0"],
        vec![
            "compare",
            "--url",
            "redis://127.0.0.1:1",
            "--duration",
            "soon",
        ],
        vec!["compare", "--url", "bogus://x"],
        vec![
            "compare",
            "--url",
            "redis://127.0.0.1:1",
            "--duration",
            "10ms",
        ],
    ] {
        let out = distlock()
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .await
            .expect("start distlock");
        let err = text(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(2 | 69 | 78)),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        let first = err.lines().next().unwrap_or("");
        assert!(
            first.starts_with("error:") || first.starts_with("distlock:"),
            "{args:?}: {err}"
        );
    }
}
