//! The exit codes of `distlock run`, and its error messages. A command
//! that ran passes its own code through; the codes distlock adds are
//! chosen from `sysexits.h` and the shell's conventions, so that a script
//! can tell a transient failure (69, 75) from a mistake (2, 78) and from a
//! lost lock (76).

use distlock::LockError;

/// The command line was invalid (clap's own code).
pub(crate) const USAGE: u8 = 2;
/// The backend could not be reached or failed (`EX_UNAVAILABLE`): worth
/// trying again later.
pub(crate) const UNAVAILABLE: u8 = 69;
/// The lock is held by someone else: the wait ran out, or `--wait none`
/// found it held (`EX_TEMPFAIL`: try again later). `--conflict-exit-code`
/// replaces it.
pub(crate) const BUSY: u8 = 75;
/// The lock was lost while the command ran (the command was stopped), or
/// found no longer ours when it was released.
pub(crate) const LOST: u8 = 76;
/// The URL, lock name or options were rejected, or the URL's backend is
/// not compiled in (`EX_CONFIG`): trying again unchanged cannot help.
pub(crate) const CONFIG: u8 = 78;
/// The command could not be started: found but not executable.
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// The command could not be started: not found.
pub(crate) const NOT_FOUND: u8 = 127;
/// The command was ended by signal N: 128 + N (as shells report it).
pub(crate) const SIGNAL_BASE: u8 = 128;

/// The environment, exit codes, signals and examples of `distlock run --help`.
pub(crate) const RUN_HELP: &str = "\
Environment of the command:
  DISTLOCK_NAME           the lock name
  DISTLOCK_FENCING_TOKEN  the grant's fencing token (if the backend has tokens);
                          pass it to the resource the lock protects
  DISTLOCK_BACKEND        the backend's name (redis, postgres, etcd, ...)
  DISTLOCK_SLOT           with --permits: the permit's slot (0 <= slot < N);
                          its fencing token rises per slot
  DISTLOCK_ACCESS         with --read or --write: read or write; a reader's
                          token is the latest write's

Exit codes:
  the command's own   the command ran and exited, holding the lock throughout
  2                   invalid command line
  69                  backend unavailable or failing (try again later)
  75                  lock busy: --wait ran out, or --wait none found it held
                      (--conflict-exit-code sets another)
  76                  lock lost: while the command ran (its process group got
                      SIGTERM, then SIGKILL after --kill-grace), or found no
                      longer ours at release
  78                  bad URL, lock name or option, or a backend not compiled in
  126, 127            the command could not be executed / was not found
  128 + N             the command was ended by signal N

Processes:
  The command runs in a process group of its own; everything it starts stays
  in that group unless it leaves on purpose (setsid, as daemons do). On a lost
  lock, after --kill-grace and when the command exits leaving processes behind,
  the whole group is stopped (SIGTERM, then SIGKILL after --kill-grace), and
  the lock is released only once the group is gone.

Signals:
  SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to distlock are passed on to the
  command's group, once. When distlock is the terminal's foreground job, the
  command gets the terminal: Ctrl-C and Ctrl-\\ reach its group straight from
  the terminal, once. Ctrl-Z is refused (a stopped holder keeps its lock).

Examples:
  # One nightly report at a time across the fleet; give up if it is running.
  distlock run -u redis://cache:6379 -w none nightly-report -- ./report.sh

  # Wait up to 10 minutes; the fencing token goes to the database write.
  distlock run -u postgres://app@db/app -w 10m -t 1m migrate -- \\
      sh -c 'psql -v token=\"$DISTLOCK_FENCING_TOKEN\" -f migrate.sql'

  # A cron job that runs once per hour even if cron fires on three hosts.
  distlock run -u etcd://etcd:2379 -w none -E 0 --hold-at-least 50m hourly -- ./job";

/// Report `e` on stderr (one line: the message and its causes) and return
/// its exit code.
pub(crate) fn failed(e: &LockError) -> u8 {
    failed_with(e, BUSY)
}

/// [`failed`], with `busy` as the code for a lock held by someone else.
pub(crate) fn failed_with(e: &LockError, busy: u8) -> u8 {
    eprintln!("distlock: {}", message(e));
    for_error(e, busy)
}

/// The exit code for a failed acquisition; `busy` when the lock is held.
pub(crate) fn for_error(e: &LockError, busy: u8) -> u8 {
    match e {
        LockError::Timeout { .. } => busy,
        e if e.is_config() => CONFIG,
        _ => UNAVAILABLE,
    }
}

/// `e` in words for the command's user: a busy lock without the library's
/// advice, anything else with its causes, each once.
pub(crate) fn message(e: &LockError) -> String {
    match e {
        LockError::Timeout { name, waited } if waited.is_zero() => {
            format!("lock {name:?} is held by someone else")
        }
        LockError::Timeout { name, waited } => format!(
            "lock {name:?} is still held by someone else after waiting {}",
            humantime::format_duration(*waited)
        ),
        e => e.report().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_timeout_is_busy_a_bad_input_config_and_the_rest_unavailable() {
        let timeout = LockError::Timeout {
            name: "n".into(),
            waited: Duration::ZERO,
        };
        assert_eq!(for_error(&timeout, BUSY), BUSY);
        assert_eq!(for_error(&timeout, 3), 3);
        assert_eq!(for_error(&LockError::invalid_options("bad"), BUSY), CONFIG);
        let unreachable = LockError::unavailable("redis", "connecting", "refused");
        assert_eq!(for_error(&unreachable, BUSY), UNAVAILABLE);
        let codes = [
            USAGE,
            UNAVAILABLE,
            BUSY,
            LOST,
            CONFIG,
            CANNOT_EXECUTE,
            NOT_FOUND,
            SIGNAL_BASE,
        ];
        for (i, a) in codes.iter().enumerate() {
            assert!(codes[i + 1..].iter().all(|b| a != b), "{a} twice");
        }
    }

    #[test]
    fn messages_carry_each_cause_once_and_no_advice_for_a_busy_lock() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let e = LockError::unavailable("redis", "connecting to redis://127.0.0.1:1/0", io);
        assert_eq!(
            message(&e),
            "redis is unavailable: connecting to redis://127.0.0.1:1/0: Connection refused"
        );
        let busy = LockError::Timeout {
            name: "job".into(),
            waited: Duration::ZERO,
        };
        assert_eq!(message(&busy), "lock \"job\" is held by someone else");
        let waited = LockError::Timeout {
            name: "job".into(),
            waited: Duration::from_millis(700),
        };
        assert_eq!(
            message(&waited),
            "lock \"job\" is still held by someone else after waiting 700ms"
        );
    }
}
