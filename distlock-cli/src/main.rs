//! The `distlock` command: run a program under a distributed lock on any
//! backend distlock supports, with the lock's fencing token in the
//! program's environment.
//!
//! ```text
//! distlock run --url redis://cache:6379 --ttl 30s --wait 10s nightly-report -- ./report.sh
//! distlock status --url redis://cache:6379 nightly-report
//! distlock elect --url etcd://etcd:2379 --value 10.0.0.7:8080 --again scheduler -- ./scheduler
//! distlock leader --url etcd://etcd:2379 --watch scheduler
//! distlock release --force --url redis://cache:6379 nightly-report
//! distlock compare --url redis://cache:6379 --url etcd://etcd:2379 --out report/
//! ```
//!
//! Exit codes are listed in [`exit`] and in `distlock run --help`.

mod compare;
mod elect;
mod exit;
mod group;
mod leader;
mod release;
mod run;
mod signals;
mod status;
mod terminal;
mod wait_arg;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run programs under distributed locks (Redis, Redlock, Postgres,
/// MySQL/MariaDB, SQLite, etcd, ZooKeeper), with the lock's fencing token
/// in the program's environment.
#[derive(Parser)]
#[command(name = "distlock", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Acquire a lock, run a command while holding it (auto-renewed), and
    /// release it when the command exits.
    #[command(after_long_help = exit::RUN_HELP)]
    Run(run::RunArgs),
    /// Show whether a lock is held and, where the backend can tell, the
    /// holder's fencing token, its lease's time left and the waiters.
    Status(status::StatusArgs),
    /// Campaign in an election and run a command while leader, with the
    /// term in its environment; stop it if the leadership is lost (and
    /// with --again campaign again).
    #[command(after_long_help = elect::HELP)]
    Elect(elect::ElectArgs),
    /// Show an election's leader (term, identity, value) and, with
    /// --watch, every change.
    Leader(leader::LeaderArgs),
    /// Take a lock from its holder (--force): the operator's way out for a
    /// lock whose holder is gone but whose lease is long.
    #[command(after_long_help = release::WARNING)]
    Release(release::ReleaseArgs),
    /// Run the same workloads on several lock services side by side
    /// (uncontended latency, contended throughput, hand-offs, fairness):
    /// a table, and with --out the numbers as JSON/CSV and SVG charts.
    Compare(compare::CompareArgs),
}

/// Whether distlock's log lines on stderr may carry colour: only on a
/// terminal, and not when `NO_COLOR` is set to anything but "".
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(colour_on_stderr())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DISTLOCK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("distlock: cannot start the runtime: {e}");
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(args).await,
            Command::Status(args) => status::status(args).await,
            Command::Elect(args) => elect::elect(args).await,
            Command::Leader(args) => leader::leader(args).await,
            Command::Release(args) => release::release(args).await,
            Command::Compare(args) => compare::compare(args).await,
        }
    });
    ExitCode::from(code)
}
