//! The comparison as a table, JSON and CSV.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use super::{Outcome, Target, chart};

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn per_sec(n: usize, ran: Duration) -> f64 {
    n as f64 / ran.as_secs_f64().max(f64::EPSILON)
}

/// `x` to one decimal, for the JSON and CSV figures (no float noise such
/// as `414.43300000000005`).
fn tenths(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// What the table shows where a figure does not apply (hand-offs with one
/// task).
const NOT_APPLICABLE: &str = "—";

/// The table printed to stdout.
pub(super) fn table(targets: &[Target], outcomes: &[Outcome], duration: Duration) -> String {
    let mut out = String::new();
    let width = targets
        .iter()
        .map(|t| t.label.len())
        .max()
        .unwrap_or(0)
        .max(8);
    let _ = writeln!(
        out,
        "\nuncontended acquire + release ({} per service)",
        humantime::format_duration(duration)
    );
    let _ = writeln!(
        out,
        "  {:<width$} {:>9} {:>12} {:>12}",
        "", "cycles", "p50 µs", "p99 µs"
    );
    for (t, o) in targets.iter().zip(outcomes) {
        match &o.uncontended {
            Ok(u) => {
                let _ = writeln!(
                    out,
                    "  {:<width$} {:>9} {:>12.1} {:>12.1}",
                    t.label,
                    u.samples.len(),
                    us(u.percentiles.0),
                    us(u.percentiles.1)
                );
            }
            Err(e) => {
                let _ = writeln!(out, "  {:<width$} failed: {e}", t.label);
            }
        }
    }
    let counts: Vec<usize> = outcomes
        .first()
        .map(|o| o.contended.iter().map(|(n, _)| *n).collect())
        .unwrap_or_default();
    for (k, tasks) in counts.iter().enumerate() {
        let _ = writeln!(out, "\ncontended, {tasks} task(s) with a client each");
        let _ = writeln!(
            out,
            "  {:<width$} {:>10} {:>12} {:>26} {:>18}",
            "", "acq/s", "handoffs/s", "handoff gap p50 / p99 µs", "per task min/max"
        );
        for (t, o) in targets.iter().zip(outcomes) {
            match &o.contended[k].1 {
                Ok(c) => {
                    let r = &c.run;
                    let (handoffs, gap) = if *tasks > 1 {
                        (
                            format!("{:.1}", per_sec(r.handoffs, c.ran)),
                            format!(
                                "{:>12.1} / {:>11.1}",
                                us(r.handoff_gap.0),
                                us(r.handoff_gap.1)
                            ),
                        )
                    } else {
                        (NOT_APPLICABLE.to_string(), NOT_APPLICABLE.to_string())
                    };
                    let _ = writeln!(
                        out,
                        "  {:<width$} {:>10.1} {:>12} {:>26} {:>10} / {}",
                        t.label,
                        per_sec(r.acquisitions, c.ran),
                        handoffs,
                        gap,
                        r.per_task.0,
                        r.per_task.1
                    );
                }
                Err(e) => {
                    let _ = writeln!(out, "  {:<width$} failed: {e}", t.label);
                }
            }
        }
    }
    out
}

/// One row per service and workload, for JSON and CSV.
fn rows(targets: &[Target], outcomes: &[Outcome]) -> Vec<serde_json::Value> {
    let mut rows = Vec::new();
    for (t, o) in targets.iter().zip(outcomes) {
        let mut row = serde_json::json!({
            "service": t.label,
            "url": t.url,
            "workload": "uncontended",
        });
        match &o.uncontended {
            Ok(u) => {
                row["cycles"] = u.samples.len().into();
                row["p50_us"] = tenths(us(u.percentiles.0)).into();
                row["p99_us"] = tenths(us(u.percentiles.1)).into();
            }
            Err(e) => row["error"] = e.to_string().into(),
        }
        rows.push(row);
        for (tasks, run) in &o.contended {
            let mut row = serde_json::json!({
                "service": t.label,
                "url": t.url,
                "workload": format!("contended, {tasks} tasks"),
                "tasks": tasks,
            });
            match run {
                Ok(c) => {
                    let r = &c.run;
                    row["acquisitions_per_s"] = tenths(per_sec(r.acquisitions, c.ran)).into();
                    // Hand-offs do not apply to one task: left empty.
                    if *tasks > 1 {
                        row["handoffs_per_s"] = tenths(per_sec(r.handoffs, c.ran)).into();
                        row["handoff_p50_us"] = tenths(us(r.handoff_gap.0)).into();
                        row["handoff_p99_us"] = tenths(us(r.handoff_gap.1)).into();
                    }
                    row["per_task_min"] = r.per_task.0.into();
                    row["per_task_max"] = r.per_task.1.into();
                    row["turns_per_task"] = r.turns.clone().into();
                }
                Err(e) => row["error"] = e.to_string().into(),
            }
            rows.push(row);
        }
    }
    rows
}

/// The CSV columns, in order.
const COLUMNS: [&str; 14] = [
    "service",
    "url",
    "workload",
    "tasks",
    "cycles",
    "p50_us",
    "p99_us",
    "acquisitions_per_s",
    "handoffs_per_s",
    "handoff_p50_us",
    "handoff_p99_us",
    "per_task_min",
    "per_task_max",
    "error",
];

/// Write `report.json`, `report.csv` (without the turns of each task),
/// `latency.svg`, `handoffs.svg` and `fairness.svg` into `dir` (created if
/// missing).
pub(super) fn write(
    dir: &Path,
    targets: &[Target],
    outcomes: &[Outcome],
    duration: Duration,
) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let rows = rows(targets, outcomes);
    let json = serde_json::json!({
        "duration_ms": duration.as_millis() as u64,
        "rows": rows,
    });
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    let mut csv = csv::Writer::from_path(dir.join("report.csv"))?;
    csv.write_record(COLUMNS)?;
    for row in &rows {
        csv.write_record(COLUMNS.iter().map(|c| match &row[*c] {
            serde_json::Value::Null => String::new(),
            serde_json::Value::String(s) => s.clone(),
            v => v.to_string(),
        }))?;
    }
    csv.flush()?;
    chart::latency(&dir.join("latency.svg"), targets, outcomes)?;
    chart::handoffs(&dir.join("handoffs.svg"), targets, outcomes)?;
    chart::fairness(&dir.join("fairness.svg"), targets, outcomes)?;
    Ok(())
}
