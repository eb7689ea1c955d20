//! `distlock release --force`: the operator's way out for a lock whose
//! holder is gone but whose lease is long.

use std::io::{BufRead, IsTerminal, Write};

use clap::Args;

use crate::exit;
use crate::status::as_text;

/// Arguments of `distlock release`.
#[derive(Args)]
pub(crate) struct ReleaseArgs {
    /// The lock service, as for `distlock run`.
    #[arg(long, env = "DISTLOCK_URL", hide_env_values = true)]
    url: String,
    /// Required: release the lock whoever holds it. A lock is normally
    /// released by its holder; this takes it from another process, which
    /// may still be working under it.
    #[arg(long)]
    force: bool,
    /// Do not ask for confirmation (needed when stdin is not a terminal).
    #[arg(long, short = 'y')]
    yes: bool,
    /// The lock name.
    name: String,
}

/// What happens to the holder, for the confirmation and the help.
pub(crate) const WARNING: &str = "The holder's lost() fires and its command (under `distlock run`) is \
stopped. On Postgres, MySQL/MariaDB and etcd the holder's session or connection is ended, \
and every other lock it carried is lost with it.";

/// Force-release `args.name`, returning the exit code: 0 when it was
/// released or was not held, 2 without `--force` or a confirmation, 69
/// when the backend failed.
pub(crate) async fn release(args: ReleaseArgs) -> u8 {
    if !args.force {
        eprintln!(
            "distlock: `release` takes a lock from its holder; say --force to do that (a holder releases its own lock itself)"
        );
        return exit::USAGE;
    }
    let locks = match distlock::connect(&args.url).await {
        Ok(locks) => locks,
        Err(e) => return exit::failed(&e),
    };
    let backend = locks.capabilities().backend;
    let before = match locks.inspect(&args.name).await {
        Ok(info) => info,
        Err(e) => return exit::failed(&e),
    };
    if !before.held {
        print!("{}", as_text(&args.name, backend, &before));
        println!("nothing to release");
        return 0;
    }
    if !args.yes {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            eprintln!(
                "distlock: stdin is not a terminal; say --yes to force-release without asking"
            );
            return exit::USAGE;
        }
        eprint!(
            "{}{WARNING}\nForce-release {:?}? [y/N] ",
            as_text(&args.name, backend, &before),
            args.name
        );
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        if stdin.lock().read_line(&mut answer).is_err()
            || !matches!(answer.trim(), "y" | "Y" | "yes")
        {
            eprintln!("distlock: not released");
            return exit::USAGE;
        }
    }
    match locks.force_release(&args.name).await {
        Ok(true) => {
            let token = before
                .fencing_token
                .map_or(String::new(), |t| format!(" (fencing token {t})"));
            println!(
                "released {:?} on {backend}: removed its holder{token}",
                args.name
            );
            0
        }
        Ok(false) => {
            println!(
                "{:?} on {backend} was no longer held; nothing removed",
                args.name
            );
            0
        }
        Err(e) => exit::failed(&e),
    }
}
