//! The `lock-check` command: `run` a checked history (the controller),
//! `analyse` a run directory again, or be a `worker` (started by `run`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use lock_check::nemesis::Nemesis;
use lock_check::sabotage::Sabotage;
use lock_check::scale::ScaleConfig;
use lock_check::worker::{self, Role, WorkerConfig};
use lock_check::{Report, RunConfig, analysis, controller};

/// Exit code of a run whose history exceeds what the backend allows.
const EXIT_VIOLATION: u8 = 1;
/// Exit code of a run that could not be carried out (bad arguments, I/O).
const EXIT_ERROR: u8 = 2;
/// Exit code of a run stopped by SIGINT or SIGTERM.
const EXIT_INTERRUPTED: u8 = 130;

/// History checker for distlock backends: worker processes on one lock, a
/// fenced register, faults, and an analysis held to the backend's
/// capabilities.
#[derive(Parser)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run workers under a nemesis, then analyse; exit 1 on a violation.
    Run(RunArgs),
    /// Analyse an existing run directory again.
    Analyse {
        /// The run directory.
        dir: PathBuf,
        /// Also write the report as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// A Markdown table of the `report.json` in each run directory.
    Table {
        /// Run directories.
        dirs: Vec<PathBuf>,
    },
    /// One worker process (started by `run`).
    #[command(hide = true)]
    Worker(WorkerArgs),
    /// The scale benchmark: one client holds many auto-renewed locks; a
    /// Markdown table of locks held, losses, memory, CPU and server load.
    Scale(ScaleArgs),
}

#[derive(Args)]
struct ScaleArgs {
    /// Lock URLs, measured one after another.
    #[arg(long = "url", required = true)]
    urls: Vec<String>,
    /// How many locks to hold (repeat for several sizes).
    #[arg(long = "locks", default_values_t = [1_000, 10_000])]
    locks: Vec<usize>,
    /// The locks' TTL (auto-renewed about every third of it).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// How long to hold them all.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    hold: Duration,
    /// Also write the reports as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args)]
struct RunArgs {
    /// The lock URL (any scheme `distlock::connect` knows). Repeat it to
    /// split the workers between several URLs (the neighbouring steps of a
    /// migration); holder kills then go round them.
    #[arg(
        long = "url",
        env = "DISTLOCK_URL",
        hide_env_values = true,
        required = true
    )]
    urls: Vec<String>,
    /// The run directory: logs, register, report.json.
    #[arg(long)]
    dir: PathBuf,
    /// The lock name.
    #[arg(long, default_value = "lock-check")]
    name: String,
    /// Concurrent worker processes.
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Lease TTL.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// How long each acquire may wait.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    wait: Duration,
    /// How long to apply faults.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Time between nemesis actions.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// The faults to inject: one, or several separated by commas, applied
    /// in turn, one per `--interval` (`kill-holder,pause-holder`).
    #[arg(
        long = "nemesis",
        value_enum,
        value_delimiter = ',',
        default_value = "none"
    )]
    nemeses: Vec<Nemesis>,
    /// A server the nemesis acts on (a `scripts/services.sh` name); repeat
    /// for a cluster's members.
    #[arg(long = "server")]
    servers: Vec<String>,
    /// `scripts/services.sh`.
    #[arg(long, env = "DISTLOCK_SERVICES_SCRIPT", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/services.sh"))]
    services: PathBuf,
    /// Break the workers' backend on purpose (the checker must then fail).
    #[arg(long, value_enum)]
    sabotage: Option<Sabotage>,
    /// Use this fenced register (kept if it exists) instead of the run
    /// directory's, so consecutive runs share it.
    #[arg(long)]
    register: Option<PathBuf>,
    /// Check leader election instead of the bare lock: the workers are
    /// candidates (campaign, write with the term, proclaim values, resign
    /// or lose), and `--observers` processes observe the election; the
    /// report adds what the observers saw (terms going back, values no
    /// leader published).
    #[arg(long)]
    election: bool,
    /// Observer processes of an `--election` run.
    #[arg(long, default_value_t = 2)]
    observers: u32,
    /// Check a semaphore of this many permits instead of the lock: the
    /// workers take permits of the name, each slot has a fenced register
    /// of its own, and the report checks exclusion and token order per
    /// slot (and that no slot reaches the limit).
    #[arg(long, conflicts_with = "election")]
    permits: Option<u32>,
    /// Check lock sets instead of the lock: each worker takes sets of this
    /// many names (`acquire_all`) out of a pool of twice as many, in a
    /// random order, and writes each name's fenced register with that
    /// name's token; the report checks exclusion and token order per name,
    /// and counts acquisitions that never complete (a deadlock) as hangs.
    #[arg(long, conflicts_with_all = ["election", "permits"], value_parser = clap::value_parser!(u32).range(1..=512))]
    set: Option<u32>,
    /// Check the name's reader-writer lock instead of the lock: each
    /// acquisition reads with this probability (0 to 1) and writes
    /// otherwise; writers write the fenced register with their token. The
    /// report counts grants made beside a conflicting holder that still
    /// believed it held (`rw_overlap`), checks write tokens in order and
    /// each reader's token against the writes before it, and counts
    /// readers let in ahead of a writer that was already waiting
    /// (`writer_starvation`, a failure where the backend promises writer
    /// preference), beside the longest writer wait and the longest hold.
    #[arg(long, conflicts_with_all = ["election", "permits", "set"], value_parser = read_share)]
    rw: Option<f64>,
}

/// A reader share: a number from 0 to 1.
fn read_share(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|share| (0.0..=1.0).contains(share))
        .ok_or_else(|| format!("a read share is a number from 0 to 1, not {text:?}"))
}

#[derive(Args)]
struct WorkerArgs {
    #[arg(long)]
    url: String,
    #[arg(long, default_value_t = 0)]
    group: usize,
    #[arg(long)]
    register: PathBuf,
    #[arg(long)]
    name: String,
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    id: u32,
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Duration,
    #[arg(long, value_parser = humantime::parse_duration)]
    wait: Duration,
    #[arg(long, value_enum)]
    sabotage: Option<Sabotage>,
    #[arg(long, value_enum, default_value = "holder")]
    role: Role,
    #[arg(long)]
    permits: Option<u32>,
    #[arg(long)]
    set: Option<u32>,
    #[arg(long)]
    rw: Option<f64>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lock-check: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    match cli.command {
        Command::Worker(a) => {
            let cfg = WorkerConfig {
                url: a.url,
                group: a.group,
                register: a.register,
                name: a.name,
                dir: a.dir,
                id: a.id,
                ttl: a.ttl,
                wait: a.wait,
                sabotage: a.sabotage,
                role: a.role,
                permits: a.permits,
                set: a.set,
                rw: a.rw,
            };
            match runtime.block_on(worker::run(cfg)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("lock-check worker: {e}");
                    ExitCode::from(EXIT_ERROR)
                }
            }
        }
        Command::Run(a) => {
            let cfg = RunConfig {
                urls: a.urls,
                register: a.register,
                name: a.name,
                dir: a.dir.clone(),
                workers: a.workers,
                ttl: a.ttl,
                wait: a.wait,
                duration: a.duration,
                interval: a.interval,
                nemeses: a.nemeses,
                servers: a.servers,
                services: a.services,
                sabotage: a.sabotage,
                election: a.election,
                observers: if a.election { a.observers } else { 0 },
                permits: a.permits,
                set: a.set,
                rw: a.rw,
            };
            match runtime.block_on(controller::run(cfg)) {
                Ok(report) => publish(&report, Some(&a.dir.join("report.json"))),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                    eprintln!("lock-check: {e}");
                    ExitCode::from(EXIT_INTERRUPTED)
                }
                Err(e) => {
                    eprintln!("lock-check: {e}");
                    ExitCode::from(EXIT_ERROR)
                }
            }
        }
        Command::Table { dirs } => {
            let mut runs = Vec::new();
            for dir in dirs {
                let report = std::fs::read_to_string(dir.join("report.json"))
                    .map_err(|e| e.to_string())
                    .and_then(|t| serde_json::from_str::<Report>(&t).map_err(|e| e.to_string()));
                match report {
                    Ok(r) => runs.push((label(&dir), r)),
                    Err(e) => {
                        eprintln!("lock-check: {}: {e}", dir.display());
                        return ExitCode::from(EXIT_ERROR);
                    }
                }
            }
            print!("{}", analysis::table(&runs));
            ExitCode::SUCCESS
        }
        Command::Scale(a) => runtime.block_on(scale(a)),
        Command::Analyse { dir, json } => match analysis::analyse(&dir) {
            Ok(report) => publish(&report, json.as_deref()),
            Err(e) => {
                eprintln!("lock-check: {e}");
                ExitCode::from(EXIT_ERROR)
            }
        },
    }
}

/// Every URL × size in turn, each row printed as it is measured (to
/// stderr), then the whole table; exit 1 if a lock was lost or a release
/// failed.
async fn scale(a: ScaleArgs) -> ExitCode {
    let mut reports = Vec::new();
    for url in &a.urls {
        for &locks in &a.locks {
            let cfg = ScaleConfig {
                url: url.clone(),
                locks,
                ttl: a.ttl,
                hold: a.hold,
            };
            match lock_check::scale::run(&cfg).await {
                Ok(report) => {
                    eprint!(
                        "{}",
                        lock_check::scale::table(std::slice::from_ref(&report))
                    );
                    reports.push(report);
                }
                Err(e) => {
                    eprintln!("lock-check scale: {}: {e}", distlock::redact_url(url));
                    return ExitCode::from(EXIT_ERROR);
                }
            }
        }
    }
    print!("{}", lock_check::scale::table(&reports));
    if let Some(path) = &a.json
        && !write_json(path, &reports)
    {
        return ExitCode::from(EXIT_ERROR);
    }
    if reports
        .iter()
        .all(|r| r.lost == 0 && r.release_failures == 0)
    {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_VIOLATION)
    }
}

/// Write `value` as JSON to `path`; `false` (said on stderr) if that fails.
fn write_json(path: &std::path::Path, value: &impl serde::Serialize) -> bool {
    let written = serde_json::to_string_pretty(value)
        .map_err(std::io::Error::from)
        .and_then(|text| std::fs::write(path, text));
    if let Err(e) = &written {
        eprintln!("lock-check: cannot write {}: {e}", path.display());
    }
    written.is_ok()
}

/// Print the report, write its JSON, and turn the verdict into the exit code.
fn publish(report: &Report, json: Option<&std::path::Path>) -> ExitCode {
    print!("{report}");
    if let Some(path) = json
        && !write_json(path, report)
    {
        return ExitCode::from(EXIT_ERROR);
    }
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_VIOLATION)
    }
}

/// A run directory's last path component.
fn label(dir: &std::path::Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| dir.display().to_string())
}
