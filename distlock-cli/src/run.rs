//! `distlock run`: acquire a lock, run a command while holding it, release
//! it when the command exits.
//!
//! - The lock is auto-renewed while the command runs. If it is lost
//!   (`lost()` fires: taken over, its session or connection gone, or a
//!   renewal failed until its validity deadline), the command gets SIGTERM,
//!   then SIGKILL after `--kill-grace`, and `distlock` exits with
//!   [`exit::LOST`].
//! - `--hold-at-least D` keeps the lock, renewed, until `D` after the grant
//!   even if the command ends sooner: `distlock` stays running and releases
//!   then. (A lease left to outlive the process would not work on the
//!   backends whose locks end with their connection.)
//! - SIGINT, SIGTERM and SIGHUP are passed on to the command; a signal that
//!   arrives while waiting for the lock stops the wait.

use std::convert::Infallible;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use distlock::{DistributedLock, LockError, LockGuard, LockOptions, Wait};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rustix::process::{Pid, Signal};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::exit;
use crate::status::held_by;
use crate::wait_arg::{parse_duration, parse_wait};

/// Arguments of `distlock run`.
#[derive(Args)]
pub(crate) struct RunArgs {
    /// The lock service, e.g. redis://host:6379, postgres://user:pass@host/db,
    /// etcd://host:2379, sqlite:///var/lib/app/locks.db
    #[arg(long, env = "DISTLOCK_URL", hide_env_values = true)]
    url: String,
    /// The lease TTL; the lock is renewed about every third of it while held.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    ttl: Duration,
    /// How long to wait for a held lock: a duration, `forever`, or `none`
    /// (one attempt).
    #[arg(long, default_value = "forever", value_parser = parse_wait, value_name = "DURATION|forever|none")]
    wait: Wait,
    /// Keep the lock until this long after it was granted, even if the
    /// command ends sooner (so that a job started on several machines runs
    /// once per period). distlock stays running, holding the lock, until
    /// then.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    hold_at_least: Option<Duration>,
    /// After a lost lock, how long the command has between SIGTERM and
    /// SIGKILL.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    kill_grace: Duration,
    /// The lock name.
    name: String,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// Run `args`, returning the exit code.
pub(crate) async fn run(args: RunArgs) -> u8 {
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("distlock: cannot watch for signals: {e}");
            return exit::UNAVAILABLE;
        }
    };
    let locks = match distlock::connect(&args.url).await {
        Ok(locks) => locks,
        Err(e) => return exit::failed(&e),
    };
    let opts = LockOptions::new()
        .ttl(args.ttl)
        .wait(args.wait)
        .auto_renew(true);
    let guard = tokio::select! {
        acquired = acquire(&*locks, &args.name, &opts) => match acquired {
            Ok(guard) => guard,
            Err(e) => return exit::failed(&e),
        },
        received = signals.next() => {
            eprintln!("distlock: stopped by {received:?} while waiting for {:?}", args.name);
            return exit::SIGNAL_BASE + signal_number(received);
        }
    };
    let granted = Instant::now();
    let backend = locks.capabilities().backend;
    tracing::debug!(lock = %args.name, token = ?guard.fencing_token(), backend, "lock acquired");
    let code = hold(&args, &guard, backend, &mut signals).await;
    if let Some(at_least) = args.hold_at_least
        && code != exit::LOST
    {
        keep_until(&guard, granted + at_least, &mut signals).await;
    }
    match guard.release().await {
        Ok(true) => {}
        Ok(false) => tracing::warn!(lock = %args.name, "the lock had already expired at release"),
        Err(e) => eprintln!("distlock: releasing {:?}: {e}", args.name),
    }
    code
}

/// Acquire, with a spinner on stderr while waiting (when it is a terminal).
async fn acquire(
    locks: &dyn DistributedLock,
    name: &str,
    opts: &LockOptions,
) -> Result<LockGuard, LockError> {
    let spinner = Spinner::after(
        Duration::from_millis(300),
        name,
        locks.capabilities().backend,
    );
    let acquired = tokio::select! {
        acquired = locks.acquire(name, opts) => acquired,
        never = spinner.run(locks, name) => match never {},
    };
    spinner.clear();
    acquired
}

/// Run the command under the held lock: its exit code, or [`exit::LOST`].
async fn hold(args: &RunArgs, guard: &LockGuard, backend: &str, signals: &mut Signals) -> u8 {
    let Some((program, rest)) = args.command.split_first() else {
        return exit::USAGE;
    };
    let mut command = Command::new(program);
    command
        .args(rest)
        .env("DISTLOCK_NAME", &args.name)
        .env("DISTLOCK_BACKEND", backend)
        .env_remove("DISTLOCK_FENCING_TOKEN")
        .env_remove("DISTLOCK_URL");
    if let Some(token) = guard.fencing_token() {
        command.env("DISTLOCK_FENCING_TOKEN", token.to_string());
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("distlock: cannot run {}: {e}", program.to_string_lossy());
            return match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
        }
    };
    loop {
        tokio::select! {
            status = child.wait() => return match status {
                Ok(status) => code_of(status),
                Err(e) => {
                    eprintln!("distlock: waiting for the command: {e}");
                    exit::UNAVAILABLE
                }
            },
            reason = guard.lost() => {
                eprintln!(
                    "distlock: lost the lock {:?} ({reason}); stopping the command",
                    args.name
                );
                stop(&mut child, args.kill_grace).await;
                return exit::LOST;
            }
            received = signals.next() => {
                tracing::debug!(signal = ?received, "passing a signal to the command");
                send(&child, received);
            }
        }
    }
}

/// Hold the lock (renewed) until `until`; a loss or a signal ends it early.
async fn keep_until(guard: &LockGuard, until: Instant, signals: &mut Signals) {
    tokio::select! {
        () = tokio::time::sleep_until(until) => {}
        reason = guard.lost() => {
            eprintln!("distlock: lost the lock {:?} during --hold-at-least ({reason})", guard.name());
        }
        received = signals.next() => {
            tracing::debug!(signal = ?received, "--hold-at-least cut short");
        }
    }
}

/// SIGTERM, then SIGKILL after `grace`; returns once the command is gone.
async fn stop(child: &mut Child, grace: Duration) {
    send(child, Signal::TERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        if let Err(e) = child.start_kill() {
            tracing::warn!(error = %e, "killing the command");
        }
        let _ = child.wait().await;
    }
}

/// Send `signal` to the command, if it is still running.
fn send(child: &Child, signal: Signal) {
    let Some(pid) = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(Pid::from_raw)
    else {
        return;
    };
    if let Err(e) = rustix::process::kill_process(pid, signal) {
        tracing::debug!(error = %e, ?signal, "signalling the command");
    }
}

/// The exit code that reports how the command ended.
fn code_of(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(signal)) => exit::SIGNAL_BASE.saturating_add(u8::try_from(signal).unwrap_or(0)),
        (None, None) => 1,
    }
}

fn signal_number(signal: Signal) -> u8 {
    u8::try_from(signal.as_raw()).unwrap_or(0)
}

/// The signals passed on to the command.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal received.
    async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.interrupt.recv() => Signal::INT,
            _ = self.terminate.recv() => Signal::TERM,
            _ = self.hangup.recv() => Signal::HUP,
        }
    }
}

/// "Waiting for NAME on BACKEND", with the time waited, on stderr while an
/// acquisition waits, if stderr is a terminal.
struct Spinner {
    bar: Option<ProgressBar>,
    delay: Duration,
    waiting_for: String,
}

impl Spinner {
    /// A spinner that appears after `delay` (a lock granted at once shows
    /// nothing).
    fn after(delay: Duration, name: &str, backend: &str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
                bar.set_style(style);
            }
            bar
        });
        let waiting_for = format!("waiting for lock {name:?} on {backend}");
        if let Some(bar) = &bar {
            bar.set_message(waiting_for.clone());
        }
        Spinner {
            bar,
            delay,
            waiting_for,
        }
    }

    /// Show the spinner after the delay, with what the backend tells of
    /// the holder (looked at every two seconds); never returns.
    async fn run(&self, locks: &dyn DistributedLock, name: &str) -> Infallible {
        tokio::time::sleep(self.delay).await;
        let Some(bar) = &self.bar else {
            return std::future::pending().await;
        };
        bar.enable_steady_tick(Duration::from_millis(120));
        loop {
            if let Ok(info) = locks.inspect(name).await {
                bar.set_message(format!("{}: {}", self.waiting_for, held_by(&info)));
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    fn clear(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
