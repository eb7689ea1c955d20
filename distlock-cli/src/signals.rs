//! The signals `distlock run` handles.
//!
//! - SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to `distlock` are passed on
//!   to the command's whole process group, once; while `distlock` waits
//!   for the lock, they stop the wait.
//! - SIGTSTP (Ctrl-Z when the terminal is not lent to the command) is
//!   refused: a suspended `distlock` would stop renewing the lock while the
//!   command goes on, and a suspended command would keep a renewed lock
//!   for as long as it stays stopped.
//! - SIGCHLD tells that the command changed state: if the terminal stopped
//!   it (Ctrl-Z while the terminal is lent), it is continued.

use rustix::process::Signal;
use tokio::signal::unix::{SignalKind, signal};

/// What [`Signals::next`] received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Received {
    /// A signal to pass on to the command's group.
    PassOn(Signal),
    /// A request to suspend `distlock` (SIGTSTP).
    Suspend,
    /// A child of `distlock` changed state (SIGCHLD).
    ChildChanged,
}

/// The signal handlers of `distlock run`, installed for its whole run.
pub(crate) struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    suspend: tokio::signal::unix::Signal,
    child: tokio::signal::unix::Signal,
}

impl Signals {
    /// Install the handlers.
    pub(crate) fn new() -> std::io::Result<Self> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
            suspend: signal(SignalKind::from_raw(Signal::TSTP.as_raw()))?,
            child: signal(SignalKind::child())?,
        })
    }

    /// The next signal received.
    pub(crate) async fn next(&mut self) -> Received {
        tokio::select! {
            _ = self.interrupt.recv() => Received::PassOn(Signal::INT),
            _ = self.terminate.recv() => Received::PassOn(Signal::TERM),
            _ = self.hangup.recv() => Received::PassOn(Signal::HUP),
            _ = self.quit.recv() => Received::PassOn(Signal::QUIT),
            _ = self.suspend.recv() => Received::Suspend,
            _ = self.child.recv() => Received::ChildChanged,
        }
    }

    /// The next signal that should stop a wait (one to pass on); a refused
    /// suspension is said once per request.
    pub(crate) async fn next_stop(&mut self) -> Signal {
        loop {
            match self.next().await {
                Received::PassOn(signal) => return signal,
                Received::Suspend => refuse_suspension(),
                Received::ChildChanged => {}
            }
        }
    }
}

/// Say on stderr that a suspension (Ctrl-Z) is refused.
pub(crate) fn refuse_suspension() {
    eprintln!("distlock: not suspending: a lock stays renewed while its holder is stopped");
}

/// The signal's name as `kill -l` and the shells print it: `SIGTERM`.
pub(crate) fn name(signal: Signal) -> &'static str {
    match signal {
        Signal::INT => "SIGINT",
        Signal::TERM => "SIGTERM",
        Signal::HUP => "SIGHUP",
        Signal::QUIT => "SIGQUIT",
        Signal::KILL => "SIGKILL",
        Signal::TSTP => "SIGTSTP",
        Signal::CONT => "SIGCONT",
        _ => "a signal",
    }
}

/// The signal's number, for the exit code 128 + N.
pub(crate) fn number(signal: Signal) -> u8 {
    u8::try_from(signal.as_raw()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_are_those_of_the_shell() {
        assert_eq!(name(Signal::TERM), "SIGTERM");
        assert_eq!(name(Signal::INT), "SIGINT");
        assert_eq!(number(Signal::TERM), 15);
        assert_eq!(number(Signal::INT), 2);
        assert_eq!(number(Signal::QUIT), 3);
    }
}
