//! The exit codes of `distlock run`. A command that ran passes its own
//! code through; the codes distlock adds are chosen from `sysexits.h` and
//! the shell's conventions, so that a script can tell them apart.

use distlock::LockError;

/// The command line was invalid (clap's own code).
pub(crate) const USAGE: u8 = 2;
/// The backend could not be reached, or the URL, lock name or options were
/// rejected (`EX_UNAVAILABLE`).
pub(crate) const UNAVAILABLE: u8 = 69;
/// The lock is held by someone else: the wait ran out, or `--wait none`
/// found it held (`EX_TEMPFAIL`: try again later).
pub(crate) const BUSY: u8 = 75;
/// The lock was lost while the command ran; the command was stopped.
pub(crate) const LOST: u8 = 76;
/// The command could not be started: found but not executable.
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// The command could not be started: not found.
pub(crate) const NOT_FOUND: u8 = 127;
/// The command was ended by signal N: 128 + N (as shells report it).
pub(crate) const SIGNAL_BASE: u8 = 128;

/// The exit-code table of `distlock run --help`.
pub(crate) const RUN_HELP: &str = "\
Environment of the command:
  DISTLOCK_NAME           the lock name
  DISTLOCK_FENCING_TOKEN  the grant's fencing token (if the backend has tokens);
                          pass it to the resource the lock protects
  DISTLOCK_BACKEND        the backend's name (redis, postgres, etcd, ...)

Exit codes:
  the command's own   the command ran and exited
  2                   invalid command line
  69                  backend unavailable, or a bad URL, name or option
  75                  lock busy: --wait ran out, or --wait none found it held
  76                  lock lost while the command ran: the command got SIGTERM,
                      then SIGKILL after --kill-grace
  126, 127            the command could not be executed / was not found
  128 + N             the command was ended by signal N

SIGINT, SIGTERM and SIGHUP sent to distlock are passed on to the command;
the lock is released once the command has exited.";

/// Report `e` on stderr (one line) and return its exit code.
pub(crate) fn failed(e: &LockError) -> u8 {
    eprintln!("distlock: {e}");
    for_error(e)
}

/// The exit code for a failed acquisition.
pub(crate) fn for_error(e: &LockError) -> u8 {
    match e {
        LockError::Timeout { .. } => BUSY,
        _ => UNAVAILABLE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_timeout_is_busy_and_everything_else_unavailable() {
        let timeout = LockError::Timeout {
            name: "n".into(),
            waited: Duration::ZERO,
        };
        assert_eq!(for_error(&timeout), BUSY);
        assert_eq!(for_error(&LockError::invalid_options("bad")), UNAVAILABLE);
        let codes = [
            USAGE,
            UNAVAILABLE,
            BUSY,
            LOST,
            CANNOT_EXECUTE,
            NOT_FOUND,
            SIGNAL_BASE,
        ];
        for (i, a) in codes.iter().enumerate() {
            assert!(codes[i + 1..].iter().all(|b| a != b), "{a} twice");
        }
    }
}
