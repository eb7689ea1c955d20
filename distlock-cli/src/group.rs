//! The command's process group: the command runs as the leader of a group
//! of its own, which everything it starts joins (unless it leaves on
//! purpose, as a daemon does with `setsid`), so that a signal to the group
//! reaches the whole tree and "the group is gone" means nothing started
//! under the lock still runs.
//!
//! `distlock` is the tree's child subreaper (Linux): a process whose parent
//! exits is handed to `distlock` rather than to pid 1, and `distlock` reaps
//! the group's exited members itself, so that a group of zombies, which a
//! container's pid 1 may never reap, does not count as running.

use std::time::Duration;

use rustix::io::Errno;
use rustix::process::{Pid, Signal, WaitOptions};
use tokio::process::Child;
use tokio::time::Instant;

/// How often the group is looked at while waiting for it to be gone.
const POLL: Duration = Duration::from_millis(20);

/// How long the group has to be gone after SIGKILL (which cannot be
/// ignored, but a process in an uninterruptible sleep takes a moment).
const AFTER_KILL: Duration = Duration::from_secs(5);

/// Make `distlock` the child subreaper of what it starts. Failure (not
/// Linux, or refused) only means orphans go to pid 1; the group's members
/// are still signalled.
pub(crate) fn become_subreaper() {
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        tracing::debug!(target: "distlock", error = %e, "cannot become the child subreaper");
    }
}

/// The process group the command leads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Group {
    pgid: Pid,
}

impl Group {
    /// The group led by `child` (spawned with `process_group(0)`); `None`
    /// if it has already been reaped.
    pub(crate) fn of(child: &Child) -> Option<Self> {
        let pgid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(Pid::from_raw)?;
        Some(Group { pgid })
    }

    /// The group's id (that of its leader, the command).
    pub(crate) fn id(&self) -> Pid {
        self.pgid
    }

    /// Send `signal` to every process of the group.
    pub(crate) fn signal(&self, signal: Signal) {
        match rustix::process::kill_process_group(self.pgid, signal) {
            Ok(()) | Err(Errno::SRCH) => {}
            Err(e) => {
                tracing::debug!(target: "distlock", error = %e, ?signal, "signalling the command's group")
            }
        }
    }

    /// Whether the group's leader, the command, is stopped (by Ctrl-Z on a
    /// terminal lent to it, say), as Linux's `/proc` tells.
    pub(crate) fn leader_stopped(&self) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pgid.as_raw_nonzero()));
        // The state follows the command name, which is in parentheses and
        // may itself hold spaces or parentheses.
        stat.ok()
            .and_then(|s| {
                let after_name = s.rfind(')').map(|i| &s[i + 1..])?;
                after_name
                    .split_whitespace()
                    .next()
                    .map(|state| state == "T")
            })
            .unwrap_or(false)
    }

    /// Whether no process of the group runs any more; its exited members
    /// that `distlock` is the parent of are reaped first. Call only once
    /// the leader has been waited for (reaping it here would take its exit
    /// status from `Child::wait`).
    pub(crate) fn is_gone(&self) -> bool {
        while let Ok(Some(_)) = rustix::process::waitpgid(self.pgid, WaitOptions::NOHANG) {}
        matches!(
            rustix::process::test_kill_process_group(self.pgid),
            Err(Errno::SRCH)
        )
    }

    /// Wait until the group is gone or `deadline` passes: whether it is gone.
    async fn gone_by(&self, deadline: Instant) -> bool {
        loop {
            if self.is_gone() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
        }
    }

    /// Stop the whole group: SIGTERM, then SIGKILL to whatever still runs
    /// after `grace`. Returns the leader's exit status once the group is
    /// gone (or, past SIGKILL, after a last short wait, with a warning).
    pub(crate) async fn stop(
        &self,
        leader: &mut Child,
        grace: Duration,
    ) -> Option<std::process::ExitStatus> {
        self.signal(Signal::TERM);
        let deadline = Instant::now() + grace;
        if let Ok(status) = tokio::time::timeout_at(deadline, leader.wait()).await
            && self.gone_by(deadline).await
        {
            return status.ok();
        }
        self.signal(Signal::KILL);
        let status = leader.wait().await.ok();
        if !self.gone_by(Instant::now() + AFTER_KILL).await {
            tracing::warn!(target: "distlock", group = self.pgid.as_raw_nonzero().get(), "processes of the command's group still exist after SIGKILL");
        }
        status
    }
}
