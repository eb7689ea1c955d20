//! `distlock run`: acquire a lock, run a command while holding it, release
//! it when the command and everything it started have exited.
//!
//! - The command leads a process group of its own ([`crate::group`]);
//!   nothing started in it outlives the lock: on a loss, and when the
//!   command exits leaving processes behind, the whole group gets SIGTERM,
//!   then SIGKILL after `--kill-grace`, and the lock is released only once
//!   the group is gone.
//! - The lock is auto-renewed while the command runs. If it is lost
//!   (`lost()` fires: taken over, its session or connection gone, or a
//!   renewal failed until its validity deadline), or found no longer ours
//!   at release, `distlock` exits with [`exit::LOST`], never with the
//!   command's own code.
//! - `--hold-at-least D` keeps the lock until `D` after the grant even if
//!   the command ends sooner. Where the backend keeps a released lock for
//!   the rest of a hold ([`Capabilities::hold_at_least`](distlock::Capabilities::hold_at_least):
//!   memory, SQLite, Redis, Redlock), the lock is asked with
//!   [`LockOptions::hold_at_least`] and `distlock` exits with the command;
//!   elsewhere (locks that end with their connection or session) it stays
//!   running, holding the lock renewed, and releases then.
//! - Signals: see [`crate::signals`] and [`crate::terminal`].

use std::ffi::OsString;
use std::io::IsTerminal;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use distlock::{Access, DistributedLock, LockError, LockGuard, LockOptions, Wait};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};
use rustix::process::Signal;
use tokio::process::Command;
use tokio::time::Instant;

use crate::exit;
use crate::group::{self, Group};
use crate::signals::{self, Received, Signals};
use crate::status::held_by;
use crate::terminal;
use crate::wait_arg::{parse_duration, parse_wait};

/// How long an acquisition waits before the spinner appears: a lock that
/// is free at once shows nothing.
const SPINNER_AFTER: Duration = Duration::from_millis(300);

/// Arguments of `distlock run`.
#[derive(Args)]
pub(crate) struct RunArgs {
    /// The lock service, e.g. redis://host:6379, postgres://user:pass@host/db,
    /// etcd://host:2379, sqlite:///var/lib/app/locks.db
    #[arg(short = 'u', long, env = "DISTLOCK_URL", hide_env_values = true)]
    url: String,
    /// The lease TTL; the lock is renewed about every third of it while held.
    #[arg(short = 't', long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    ttl: Duration,
    /// How long to wait for a held lock: a duration, `forever`, or `none`
    /// (one attempt).
    #[arg(short = 'w', long, default_value = "forever", value_parser = parse_wait, value_name = "DURATION|forever|none")]
    wait: Wait,
    /// Keep the lock until this long after it was granted, even if the
    /// command ends sooner (so that a job started on several machines runs
    /// once per period). Where the backend can keep a released lock until
    /// then (memory, SQLite, Redis, Redlock), distlock exits with the
    /// command and the server keeps it; elsewhere distlock stays running,
    /// holding the lock, until then.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    hold_at_least: Option<Duration>,
    /// After a lost lock (or when the command exits leaving processes
    /// behind), how long the command's process group has between SIGTERM
    /// and SIGKILL.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    kill_grace: Duration,
    /// The exit code when the lock is held by someone else (as flock's -E).
    #[arg(short = 'E', long, default_value_t = exit::BUSY, value_name = "N")]
    conflict_exit_code: u8,
    /// Say nothing of distlock's own but errors and a lost lock: no
    /// spinner, no message for a busy lock.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Take one of N permits of the semaphore NAME instead of its lock: at
    /// most N commands run under NAME at once. The command gets its slot
    /// (0 ≤ slot < N) as DISTLOCK_SLOT; its token rises per slot.
    #[arg(long, value_name = "N")]
    permits: Option<u32>,
    /// Take the reader-writer lock NAME for reading: commands run with
    /// `--read` run together, never beside one run with `--write`. The
    /// command's token is the latest write's.
    #[arg(long, conflicts_with_all = ["permits", "write"])]
    read: bool,
    /// Take the reader-writer lock NAME for writing: alone, and ahead of
    /// readers that come after it (where the backend gives writers
    /// preference). Each write takes a new, larger token.
    #[arg(long, conflicts_with = "permits")]
    write: bool,
    /// The lock name.
    name: String,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// What a command that runs a program under a lock sets up first: the
/// signals it passes on, `distlock` as the subreaper of what it starts,
/// and the lock client for `url`; `Err` with the exit code (said on
/// stderr) if any of it fails.
pub(crate) async fn prepare(url: &str) -> Result<(Signals, Arc<dyn DistributedLock>), u8> {
    let signals = match Signals::new() {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("distlock: cannot watch for signals: {e}");
            return Err(exit::UNAVAILABLE);
        }
    };
    group::become_subreaper();
    match distlock::connect(url).await {
        Ok(locks) => Ok((signals, locks)),
        Err(e) => Err(exit::failed(&e)),
    }
}

/// Run `args`, returning the exit code.
pub(crate) async fn run(args: RunArgs) -> u8 {
    let (mut signals, locks) = match prepare(&args.url).await {
        Ok(prepared) => prepared,
        Err(code) => return code,
    };
    let mut opts = LockOptions::new()
        .ttl(args.ttl)
        .wait(args.wait)
        .auto_renew(true);
    if let Some(limit) = args.permits {
        opts = opts.permits(limit);
    }
    let access = match (args.read, args.write) {
        (true, _) => Some(Access::Read),
        (_, true) => Some(Access::Write),
        _ => None,
    };
    if let Some(access) = access {
        opts = opts.access(access);
    }
    // The server keeps the lock for the rest of the hold where it can;
    // elsewhere distlock holds it, running, until then.
    let caps = locks.capabilities();
    let server_hold = args.hold_at_least.filter(|&d| {
        caps.hold_at_least && args.permits.is_none() && access.is_none() && d <= caps.max_ttl
    });
    if let Some(at_least) = server_hold {
        opts = opts.hold_at_least(at_least);
    }
    let guard = tokio::select! {
        acquired = acquire(&*locks, &args.name, &opts, args.quiet) => match acquired {
            Ok(guard) => guard,
            Err(e @ LockError::Timeout { .. }) if args.quiet => {
                return exit::for_error(&e, args.conflict_exit_code);
            }
            Err(e) => return exit::failed_with(&e, args.conflict_exit_code),
        },
        received = signals.next_stop() => {
            eprintln!(
                "distlock: stopped by {} while waiting for lock {:?}",
                signals::name(received),
                args.name
            );
            return exit::SIGNAL_BASE + signals::number(received);
        }
    };
    let granted = Instant::now();
    let backend = locks.capabilities().backend;
    tracing::debug!(target: "distlock", lock = %args.name, token = ?guard.fencing_token(), backend, "lock acquired");
    let program = Program {
        name: &args.name,
        command: &args.command,
        kill_grace: args.kill_grace,
        quiet: args.quiet,
        held: match access {
            _ if args.permits.is_some() => "permit of",
            Some(Access::Read) => "read lock",
            Some(_) => "write lock",
            None => "lock",
        },
        env: guard
            .slot()
            .map(|slot| ("DISTLOCK_SLOT", slot.to_string()))
            .into_iter()
            .chain(
                guard
                    .access()
                    .map(|a| ("DISTLOCK_ACCESS", a.as_str().to_string())),
            )
            .collect(),
    };
    let mut code = hold(&program, &guard, backend, &mut signals).await;
    if let Some(at_least) = args.hold_at_least
        && server_hold.is_none()
        && code != exit::LOST
        && keep_until(&guard, granted + at_least, &mut signals).await
    {
        code = exit::LOST;
    }
    release(guard, code).await
}

/// Give the lock back: `code`, or [`exit::LOST`] if the lock was no longer
/// ours (said with the reason, unless a loss was said already).
pub(crate) async fn release(guard: LockGuard, code: u8) -> u8 {
    let name = guard.name().to_string();
    let why = match guard.is_lost() {
        Some(reason) => reason.to_string(),
        None if guard
            .validity_deadline()
            .is_some_and(|d| d <= Instant::now()) =>
        {
            "its lease had expired".to_string()
        }
        None => "it was taken over: gone, or held by someone else".to_string(),
    };
    match guard.release().await {
        Ok(true) => code,
        Ok(false) if code == exit::LOST => code,
        Ok(false) => {
            eprintln!(
                "distlock: lock {name:?} was no longer ours at release ({why}); the command may have run part of the time without it"
            );
            exit::LOST
        }
        Err(e) => {
            eprintln!("distlock: releasing lock {name:?}: {}", exit::message(&e));
            code
        }
    }
}

/// Acquire, with a spinner on stderr once the wait has lasted a moment
/// (when stderr is a terminal and not `quiet`).
async fn acquire(
    locks: &dyn DistributedLock,
    name: &str,
    opts: &LockOptions,
    quiet: bool,
) -> Result<LockGuard, LockError> {
    // A permit's or a reader-writer lock's wait shows no holder: the
    // lock's would not be its.
    if quiet || opts.permits.is_some() || opts.access.is_some() || !std::io::stderr().is_terminal()
    {
        return locks.acquire(name, opts).await;
    }
    tokio::select! {
        acquired = locks.acquire(name, opts) => acquired,
        never = spinner(locks, name) => match never {},
    }
}

/// The command [`hold`] runs, and how.
pub(crate) struct Program<'a> {
    /// What is held, by the name the user gave (an election's, not its
    /// lock's): `DISTLOCK_NAME`, and messages.
    pub(crate) name: &'a str,
    /// The program and its arguments.
    pub(crate) command: &'a [OsString],
    /// SIGTERM to SIGKILL, when the group is stopped.
    pub(crate) kill_grace: Duration,
    /// Say nothing but errors and a loss.
    pub(crate) quiet: bool,
    /// What is held, in messages: "lock", "leadership of election".
    pub(crate) held: &'static str,
    /// Variables for the command beside `DISTLOCK_NAME`,
    /// `DISTLOCK_BACKEND` and `DISTLOCK_FENCING_TOKEN`.
    pub(crate) env: Vec<(&'static str, String)>,
}

/// Run the command while `guard` holds: its exit code, or [`exit::LOST`].
/// Returns once the command's whole process group is gone.
pub(crate) async fn hold(
    program: &Program<'_>,
    guard: &LockGuard,
    backend: &str,
    signals: &mut Signals,
) -> u8 {
    let Some((executable, rest)) = program.command.split_first() else {
        return exit::USAGE;
    };
    let mut command = Command::new(executable);
    command
        .args(rest)
        .process_group(0)
        .env("DISTLOCK_NAME", program.name)
        .env("DISTLOCK_BACKEND", backend)
        .env_remove("DISTLOCK_FENCING_TOKEN")
        .env_remove("DISTLOCK_TERM")
        .env_remove("DISTLOCK_SLOT")
        .env_remove("DISTLOCK_URL");
    if let Some(token) = guard.fencing_token() {
        command.env("DISTLOCK_FENCING_TOKEN", token.to_string());
    }
    command.envs(program.env.iter().map(|(k, v)| (k, v)));
    let program_name = executable.to_string_lossy();
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("distlock: cannot run {program_name}: {e}");
            return match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
        }
    };
    let Some(group) = Group::of(&child) else {
        return match child.wait().await {
            Ok(status) => code_of(status),
            Err(_) => exit::UNAVAILABLE,
        };
    };
    let lent = terminal::Lent::to(&group);
    let code = loop {
        tokio::select! {
            status = child.wait() => break match status {
                Ok(status) => code_of(status),
                Err(e) => {
                    eprintln!("distlock: waiting for the command: {e}");
                    exit::UNAVAILABLE
                }
            },
            reason = guard.lost() => {
                eprintln!(
                    "distlock: lost the {} {:?} ({reason}); stopping the command's process group",
                    program.held,
                    program.name
                );
                group.stop(&mut child, program.kill_grace).await;
                drop(lent);
                return exit::LOST;
            }
            received = signals.next() => match received {
                Received::PassOn(signal) => {
                    tracing::debug!(target: "distlock", signal = signals::name(signal), "passing a signal to the command's group");
                    group.signal(signal);
                }
                Received::Suspend => signals::refuse_suspension(),
                Received::ChildChanged => {
                    if group.leader_stopped() {
                        group.signal(Signal::CONT);
                        signals::refuse_suspension();
                    }
                }
            }
        }
    };
    if !group.is_gone() {
        if !program.quiet {
            eprintln!(
                "distlock: the command exited, leaving processes in its group; stopping them before the {} is given up",
                program.held
            );
        }
        group.stop(&mut child, program.kill_grace).await;
    }
    drop(lent);
    code
}

/// Hold the lock (renewed) until `until`; a signal ends it early. Whether
/// the lock was lost meanwhile (said on stderr).
async fn keep_until(guard: &LockGuard, until: Instant, signals: &mut Signals) -> bool {
    tokio::select! {
        () = tokio::time::sleep_until(until) => false,
        reason = guard.lost() => {
            eprintln!("distlock: lost the lock {:?} during --hold-at-least ({reason})", guard.name());
            true
        }
        received = signals.next_stop() => {
            tracing::debug!(target: "distlock", signal = signals::name(received), "--hold-at-least cut short");
            false
        }
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

/// "Waiting for NAME on BACKEND", with the time waited and what the
/// backend tells of the holder (looked at every two seconds), on stderr,
/// from [`SPINNER_AFTER`] on; never returns, and is cleared when dropped.
async fn spinner(locks: &dyn DistributedLock, name: &str) -> std::convert::Infallible {
    tokio::time::sleep(SPINNER_AFTER).await;
    let waiting_for = format!(
        "waiting for lock {name:?} on {}",
        locks.capabilities().backend
    );
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
        .with_finish(ProgressFinish::AndClear);
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        bar.set_style(style);
    }
    bar.set_message(waiting_for.clone());
    bar.enable_steady_tick(Duration::from_millis(120));
    loop {
        if let Ok(info) = locks.inspect(name).await {
            bar.set_message(format!("{waiting_for}: {}", held_by(&info)));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
