//! The faults a run injects, and the record of what is broken right now so
//! that every exit path puts it back.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process};

/// One kind of fault, applied every few seconds during a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Nemesis {
    /// No faults: the baseline.
    None,
    /// SIGKILL the current holder; a new worker takes its place.
    KillHolder,
    /// SIGSTOP the current holder for 1.5–3 × TTL, then SIGCONT.
    PauseHolder,
    /// Kill every server of the backend and start them again.
    KillServer,
    /// Pause every server of the backend for 1.5–3 × TTL, then resume.
    PauseServer,
    /// Kill a minority of a cluster's members and restart them; once per run
    /// (halfway) a majority, for a moment.
    KillMinority,
    /// Kill the Sentinel group's current master (`services.sh failover
    /// kill`: the Sentinels promote a replica), and after 1–3 s bring the
    /// old master back as a replica (`services.sh rejoin`).
    Failover,
    /// Kill the Redis Cluster master serving the run's lock name's hash
    /// slot (`services.sh cluster-failover KEY`: the cluster promotes its
    /// replica), and after 1–3 s bring it back as a replica (`services.sh
    /// rejoin`).
    ClusterFailover,
}

impl Nemesis {
    /// The name used on the command line, in logs and reports.
    pub fn name(self) -> &'static str {
        match self {
            Nemesis::None => "none",
            Nemesis::KillHolder => "kill-holder",
            Nemesis::PauseHolder => "pause-holder",
            Nemesis::KillServer => "kill-server",
            Nemesis::PauseServer => "pause-server",
            Nemesis::KillMinority => "kill-minority",
            Nemesis::Failover => "failover",
            Nemesis::ClusterFailover => "cluster-failover",
        }
    }

    /// Acts on the servers named by `--server`.
    pub fn needs_servers(self) -> bool {
        matches!(
            self,
            Nemesis::KillServer | Nemesis::PauseServer | Nemesis::KillMinority
        )
    }
}

/// The name of a run's nemeses, as logs and reports show it: one name, or
/// several joined by `+` (`kill-holder+pause-holder`).
pub fn names(nemeses: &[Nemesis]) -> String {
    nemeses
        .iter()
        .map(|n| n.name())
        .collect::<Vec<_>>()
        .join("+")
}

/// How long a pause lasts: 1.5–3 × TTL.
pub fn pause_length(ttl: Duration) -> Duration {
    ttl.mul_f64(rand::random_range(1.5..3.0))
}

/// Send `signal` to `pid`; a process that is already gone is not an error.
pub fn signal(pid: u32, signal: Signal) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw)
        && let Err(e) = kill_process(pid, signal)
    {
        tracing::debug!(pid = pid.as_raw_nonzero().get(), error = %e, "signal not delivered");
    }
}

/// `scripts/services.sh`, which acts on the servers.
#[derive(Debug, Clone)]
pub struct Services {
    script: PathBuf,
}

impl Services {
    /// The script at `script`.
    pub fn new(script: &Path) -> Self {
        Services {
            script: script.to_path_buf(),
        }
    }

    /// `services.sh ARGS`' first line of output (a server's name).
    pub async fn output(&self, args: &[&str]) -> std::io::Result<String> {
        Ok(self
            .lines(args)
            .await?
            .into_iter()
            .next()
            .unwrap_or_default())
    }

    /// `services.sh ARGS`' lines of output, trimmed.
    pub async fn lines(&self, args: &[&str]) -> std::io::Result<Vec<String>> {
        let out = tokio::process::Command::new("bash")
            .arg(&self.script)
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .await?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "`services.sh {}` failed: {}",
                args.join(" "),
                out.status
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim().to_string())
            .collect())
    }

    /// Run `services.sh VERB NAME` for each name, in turn.
    pub async fn each(&self, verb: &str, names: &[String]) -> std::io::Result<()> {
        for name in names {
            let status = tokio::process::Command::new("bash")
                .arg(&self.script)
                .args([verb, name])
                .stdout(std::process::Stdio::null())
                .status()
                .await?;
            if !status.success() {
                return Err(std::io::Error::other(format!(
                    "`services.sh {verb} {name}` failed: {status}"
                )));
            }
        }
        Ok(())
    }

    fn each_blocking(&self, verb: &str, names: &[String]) {
        for name in names {
            let result = std::process::Command::new("bash")
                .arg(&self.script)
                .args([verb, name])
                .stdout(std::process::Stdio::null())
                .status();
            if !result.is_ok_and(|s| s.success()) {
                tracing::warn!(server = %name, verb, "could not restore server");
            }
        }
    }
}

/// What the run has broken and not yet put back: paused workers, killed or
/// paused servers. [`restore`](Self::restore) (also run on drop) undoes it.
#[derive(Debug)]
pub struct Broken {
    services: Services,
    /// Workers stopped with SIGSTOP.
    pub paused_workers: Vec<u32>,
    /// Servers killed and not yet started.
    pub killed_servers: Vec<String>,
    /// Servers paused and not yet resumed.
    pub paused_servers: Vec<String>,
}

impl Broken {
    /// Nothing broken yet.
    pub fn new(services: Services) -> Self {
        Broken {
            services,
            paused_workers: Vec::new(),
            killed_servers: Vec::new(),
            paused_servers: Vec::new(),
        }
    }

    /// Put everything back: continue paused workers, resume paused servers,
    /// start killed ones.
    pub fn restore(&mut self) {
        for pid in self.paused_workers.drain(..) {
            signal(pid, Signal::CONT);
        }
        let paused = std::mem::take(&mut self.paused_servers);
        self.services.each_blocking("resume", &paused);
        let killed = std::mem::take(&mut self.killed_servers);
        self.services.each_blocking("start", &killed);
    }
}

impl Drop for Broken {
    fn drop(&mut self) {
        self.restore();
    }
}
