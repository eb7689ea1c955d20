//! `distlock compare`: the same workloads on several lock services side by
//! side, in one run, alternating between them in short slices so that the
//! machine's noise falls on all alike.
//!
//! - **Uncontended**: one client acquires and releases a name of its own
//!   over and over: latency p50/p99 of the cycle, and its distribution.
//! - **Contended**, for each `--tasks N`: N tasks, each with a client of its
//!   own, acquire one name as fast as they can: acquisitions and hand-offs
//!   (a grant to another task than the last) per second, the hand-off gap
//!   (release to the next task's grant) p50/p99, and fairness (the fewest
//!   and most turns of any task).
//!
//! The table goes to stdout; `--out DIR` also writes `report.json`,
//! `report.csv`, `latency.svg`, `handoffs.svg` and `fairness.svg`.

mod chart;
mod measure;
mod report;
mod stats;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use distlock::{DistributedLock, LockError, LockOptions, redact_url};

use crate::exit;
use crate::wait_arg::parse_duration;

pub(crate) use measure::{Contended, Uncontended};

/// Arguments of `distlock compare`.
#[derive(Args)]
pub(crate) struct CompareArgs {
    /// A lock service to measure; repeat for each (e.g. --url redis://… --url etcd://…).
    /// `LABEL=URL` names it in the table and charts (default: its backend).
    #[arg(long = "url", required = true, value_name = "[LABEL=]URL")]
    urls: Vec<String>,
    /// Numbers of contending tasks, each task with a client of its own.
    #[arg(long, value_delimiter = ',', default_value = "1,8", value_parser = clap::value_parser!(u16).range(1..=64))]
    tasks: Vec<u16>,
    /// How long each workload runs on each service (in slices that
    /// alternate between the services).
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    duration: Duration,
    /// The lease TTL of every acquisition (auto-renewed, as by default).
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    ttl: Duration,
    /// Write report.json, report.csv, latency.svg, handoffs.svg and fairness.svg here.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// One service under comparison.
pub(crate) struct Target {
    /// Its label in the table and charts: the backend's name, numbered
    /// when two services share a backend.
    pub label: String,
    /// Its URL without credentials.
    pub url: String,
    /// One client per contending task (the first also runs the
    /// uncontended workload).
    clients: Vec<Arc<dyn DistributedLock>>,
}

/// What was measured on one service.
pub(crate) struct Outcome {
    /// The uncontended cycle.
    pub uncontended: Result<Uncontended, LockError>,
    /// One entry per `--tasks` count.
    pub contended: Vec<(usize, Result<Contended, LockError>)>,
}

/// Compare the services of `args`, returning the exit code: 0 when every
/// workload ran everywhere, 69 when a service could not be reached or
/// failed during a workload (its row says why), 2 for bad arguments.
pub(crate) async fn compare(args: CompareArgs) -> u8 {
    if args.duration < Duration::from_millis(200) {
        eprintln!("distlock: --duration must be at least 200ms");
        return exit::USAGE;
    }
    let most = args.tasks.iter().copied().max().unwrap_or(1) as usize;
    let mut targets = Vec::new();
    for url in &args.urls {
        match connect(url, most, &targets).await {
            Ok(target) => targets.push(target),
            Err(e) => return exit::failed(&e),
        }
    }
    let opts = LockOptions::new().ttl(args.ttl).auto_renew(true);
    eprintln!(
        "distlock: measuring {} services for {} per workload…",
        targets.len(),
        humantime::format_duration(args.duration)
    );
    let uncontended = measure::uncontended(&targets, &opts, args.duration).await;
    let mut contended: Vec<Vec<(usize, Result<Contended, LockError>)>> =
        targets.iter().map(|_| Vec::new()).collect();
    for &tasks in &args.tasks {
        let runs = measure::contended(&targets, tasks as usize, &opts, args.duration).await;
        for (row, run) in contended.iter_mut().zip(runs) {
            row.push((tasks as usize, run));
        }
    }
    let outcomes: Vec<Outcome> = uncontended
        .into_iter()
        .zip(contended)
        .map(|(uncontended, contended)| Outcome {
            uncontended,
            contended,
        })
        .collect();
    print!("{}", report::table(&targets, &outcomes, args.duration));
    if let Some(dir) = &args.out {
        if let Err(e) = report::write(dir, &targets, &outcomes, args.duration) {
            eprintln!("distlock: writing the report to {}: {e}", dir.display());
            return exit::UNAVAILABLE;
        }
        eprintln!(
            "distlock: wrote report.json, report.csv, latency.svg, handoffs.svg and fairness.svg to {}",
            dir.display()
        );
    }
    let failed = outcomes
        .iter()
        .any(|o| o.uncontended.is_err() || o.contended.iter().any(|(_, r)| r.is_err()));
    if failed { exit::UNAVAILABLE } else { 0 }
}

/// A `LABEL=` in front of a URL: a label is what comes before the first
/// `=` if that holds no `:` or `/` (a URL's own `=` are in its query).
fn split_label(arg: &str) -> (Option<&str>, &str) {
    match arg.split_once('=') {
        Some((label, url)) if !label.is_empty() && !label.contains([':', '/']) => {
            (Some(label), url)
        }
        _ => (None, arg),
    }
}

/// `clients` clients of `arg` (`[LABEL=]URL`), labelled after its backend
/// unless a label is given.
async fn connect(arg: &str, clients: usize, earlier: &[Target]) -> Result<Target, LockError> {
    let (label, url) = split_label(arg);
    let mut all = Vec::with_capacity(clients);
    for _ in 0..clients {
        all.push(distlock::connect(url).await?);
    }
    let backend = all[0].capabilities().backend;
    let same = earlier
        .iter()
        .filter(|t| t.label.split(' ').next() == Some(backend))
        .count();
    let label = match label {
        Some(label) => label.to_string(),
        None if same == 0 => backend.to_string(),
        None => format!("{backend} ({})", same + 1),
    };
    Ok(Target {
        label,
        url: redact_url(url),
        clients: all,
    })
}

#[cfg(test)]
mod tests {
    use super::split_label;

    #[test]
    fn a_label_is_a_plain_word_before_the_url() {
        assert_eq!(
            split_label("pg-advisory=postgres://u:p@h/db?mode=advisory"),
            (Some("pg-advisory"), "postgres://u:p@h/db?mode=advisory")
        );
        assert_eq!(
            split_label("postgres://u:p@h/db?mode=advisory"),
            (None, "postgres://u:p@h/db?mode=advisory")
        );
        assert_eq!(
            split_label("sqlite:///tmp/a=b.db"),
            (None, "sqlite:///tmp/a=b.db")
        );
        assert_eq!(split_label("=redis://h"), (None, "=redis://h"));
    }
}
