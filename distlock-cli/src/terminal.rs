//! The terminal's foreground, lent to the command while it runs.
//!
//! When `distlock run` is the terminal's foreground job, the command's
//! process group becomes the foreground, as a shell does for a job: the
//! command reads the terminal, and a Ctrl-C or Ctrl-\ reaches its whole
//! group once, straight from the terminal, while `distlock` (no longer in
//! the foreground) does not pass it on a second time. The terminal comes
//! back to `distlock`'s group when the command's group is gone, so that
//! the script or shell that ran `distlock` can go on reading it.
//!
//! Without a terminal on stdin, or when `distlock` runs in the background,
//! nothing is lent, and the signals `distlock` receives are passed on to
//! the command's group by `distlock` (see [`crate::signals`]).

use std::io::IsTerminal;

use nix::sys::signal::{SigSet, SigmaskHow, Signal as NixSignal, pthread_sigmask};
use rustix::process::{Pid, Signal};

use crate::group::Group;

/// The terminal, lent to the command's group; given back on drop.
#[derive(Debug)]
pub(crate) struct Lent {
    /// `distlock`'s own process group, the foreground before.
    ours: Pid,
}

impl Lent {
    /// Make `group` the foreground of the terminal on stdin, if there is
    /// one and `distlock`'s group is its foreground now.
    pub(crate) fn to(group: &Group) -> Option<Lent> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let ours = rustix::process::getpgrp();
        if rustix::termios::tcgetpgrp(&stdin).ok() != Some(ours) {
            return None;
        }
        if let Err(e) = rustix::termios::tcsetpgrp(&stdin, group.id()) {
            tracing::debug!(target: "distlock", error = %e, "cannot lend the terminal to the command");
            return None;
        }
        // A command that read the terminal before it was in the foreground
        // was stopped for it (SIGTTIN): it goes on now.
        group.signal(Signal::CONT);
        Some(Lent { ours })
    }
}

impl Drop for Lent {
    /// Take the terminal back. `distlock` is in the background now, and a
    /// background group that sets the foreground is sent SIGTTOU unless it
    /// blocks it: this thread blocks it for the call.
    fn drop(&mut self) {
        let mut ttou = SigSet::empty();
        ttou.add(NixSignal::SIGTTOU);
        let mut before = SigSet::empty();
        if let Err(e) = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut before)) {
            tracing::debug!(target: "distlock", error = %e, "cannot block SIGTTOU");
            return;
        }
        if let Err(e) = rustix::termios::tcsetpgrp(std::io::stdin(), self.ours) {
            tracing::debug!(target: "distlock", error = %e, "cannot take the terminal back");
        }
        if let Err(e) = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&before), None) {
            tracing::debug!(target: "distlock", error = %e, "cannot restore the signal mask");
        }
    }
}
