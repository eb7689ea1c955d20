//! `distlock elect`: campaign in an election, run a command while leader
//! (with the term in its environment), stop it when the leadership is
//! lost, and with `--again` campaign again and run it anew.
//!
//! The command runs and is stopped exactly as under `distlock run`
//! ([`crate::run::hold`]): its own process group, signals passed on, the
//! group stopped (SIGTERM, then SIGKILL after `--kill-grace`) on a loss,
//! and the leadership given up only once the group is gone.

use std::ffi::OsString;
use std::time::Duration;

use clap::Args;
use distlock::{Election, LockError, LockOptions, Wait};

use crate::exit;
use crate::run::{Program, hold, prepare, release};
use crate::signals;
use crate::wait_arg::{parse_duration, parse_wait};

/// The environment, exit codes and examples of `distlock elect --help`.
pub(crate) const HELP: &str = "\
Environment of the command:
  DISTLOCK_NAME           the election's name
  DISTLOCK_TERM           the leadership's term: greater than every earlier
                          leader's; pass it to what the leader writes, which
                          refuses a lower one
  DISTLOCK_FENCING_TOKEN  the same number (the term is the fencing token of
                          the election's lock)
  DISTLOCK_BACKEND        the backend's name (redis, etcd, zookeeper, ...)

Exit codes: as for `distlock run` (the command's own code when it ran and
exited while leader; 75 when --wait ran out with another leader; 76 when the
leadership was lost and --again was not given; 69, 78, 126, 127, 128 + N).

Election NAME is the lock election/NAME, apart from a plain lock NAME: read
or force it by that name (`distlock inspect election/NAME`).

With --again, a lost leadership stops the command's group, then distlock
campaigns again (within --wait) and runs the command anew with the new term;
it ends when the command exits while leader.

Examples:
  # One scheduler among the replicas; its address for the others to read
  # (distlock leader --url etcd://etcd:2379 scheduler).
  distlock elect -u etcd://etcd:2379 --value 10.0.0.7:8080 --again scheduler -- ./scheduler";

/// Arguments of `distlock elect`.
#[derive(Args)]
pub(crate) struct ElectArgs {
    /// The lock service, as for `distlock run`.
    #[arg(short = 'u', long, env = "DISTLOCK_URL", hide_env_values = true)]
    url: String,
    /// The leadership's lease TTL; it is renewed about every third of it.
    #[arg(short = 't', long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    ttl: Duration,
    /// How long to wait for the leadership: a duration, `forever`, or
    /// `none` (one attempt).
    #[arg(short = 'w', long, default_value = "forever", value_parser = parse_wait, value_name = "DURATION|forever|none")]
    wait: Wait,
    /// The value published while leader (an address, say), up to 1 KiB;
    /// `distlock leader` shows it.
    #[arg(long, default_value = "")]
    value: String,
    /// Who this candidate is, as the leader's record shows it (default:
    /// host, pid and program).
    #[arg(long)]
    identity: Option<String>,
    /// After a lost leadership, campaign again and run the command anew.
    #[arg(long)]
    again: bool,
    /// After a lost leadership (or when the command exits leaving
    /// processes behind), how long the command's process group has between
    /// SIGTERM and SIGKILL.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    kill_grace: Duration,
    /// Say nothing of distlock's own but errors and a loss.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// The election's name.
    name: String,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// Run `args`, returning the exit code.
pub(crate) async fn elect(args: ElectArgs) -> u8 {
    let (mut signals, locks) = match prepare(&args.url).await {
        Ok(prepared) => prepared,
        Err(code) => return code,
    };
    let backend = locks.capabilities().backend;
    let mut opts = LockOptions::new()
        .ttl(args.ttl)
        .wait(args.wait)
        .auto_renew(true);
    if let Some(identity) = &args.identity {
        opts = opts.identity(identity.clone());
    }
    let election = Election::new(locks, args.name.clone());
    loop {
        let leadership = tokio::select! {
            won = election.campaign(args.value.as_bytes(), &opts) => match won {
                Ok(leadership) => leadership,
                Err(LockError::Timeout { waited, .. }) => {
                    eprintln!("distlock: {}", led_by_another(&args.name, waited));
                    return exit::BUSY;
                }
                Err(e) => return exit::failed(&e),
            },
            received = signals.next_stop() => {
                eprintln!(
                    "distlock: stopped by {} while campaigning in election {:?}",
                    signals::name(received),
                    args.name
                );
                return exit::SIGNAL_BASE + signals::number(received);
            }
        };
        let term = leadership.term();
        tracing::info!(target: "distlock", election = %args.name, term, backend, "leading");
        let program = Program {
            name: &args.name,
            command: &args.command,
            kill_grace: args.kill_grace,
            quiet: args.quiet,
            held: "leadership of election",
            env: vec![("DISTLOCK_TERM", term.to_string())],
        };
        let code = hold(&program, leadership.guard(), backend, &mut signals).await;
        let code = release(leadership.into_guard(), code).await;
        if code == exit::LOST && args.again {
            if !args.quiet {
                eprintln!(
                    "distlock: campaigning again in election {:?} (term {term} lost)",
                    args.name
                );
            }
            continue;
        }
        return code;
    }
}

/// A campaign that ran out of `--wait`, in words of an election.
fn led_by_another(name: &str, waited: Duration) -> String {
    if waited.is_zero() {
        format!("election {name:?} is led by another candidate")
    } else {
        format!(
            "election {name:?} is still led by another candidate after waiting {}",
            humantime::format_duration(waited)
        )
    }
}
