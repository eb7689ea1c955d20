//! The controller: starts the workers, applies the nemesis, stops the run,
//! puts every fault back (also on Ctrl-C or an error), then analyses.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use rustix::process::Signal;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::analysis::{self, Report};
use crate::event::{Action, EventLog};
use crate::nemesis::{self, Broken, Nemesis, Services, pause_length, signal};
use crate::register::FencedRegister;
use crate::sabotage::Sabotage;
use crate::worker::{Role, files};

/// A run's settings.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The lock URLs: workers are split evenly between them (groups), as
    /// processes of neighbouring configurations are during a rolling
    /// migration.
    pub urls: Vec<String>,
    /// The lock name all workers contend for.
    pub name: String,
    /// The run directory (logs, register); created if missing.
    pub dir: PathBuf,
    /// Concurrent worker processes.
    pub workers: u32,
    /// Lease TTL.
    pub ttl: Duration,
    /// How long each acquire may wait.
    pub wait: Duration,
    /// How long faults are applied.
    pub duration: Duration,
    /// Time between nemesis actions.
    pub interval: Duration,
    /// The faults, applied in turn, one per interval (one, or several for a
    /// run that mixes them).
    pub nemeses: Vec<Nemesis>,
    /// The servers (`scripts/services.sh` names) the nemesis acts on.
    pub servers: Vec<String>,
    /// `scripts/services.sh`.
    pub services: PathBuf,
    /// The fenced register, if not the run directory's own: an existing one
    /// is kept, so consecutive runs (the phases of a migration) share it.
    pub register: Option<PathBuf>,
    /// A deliberate defect for the workers' backend.
    pub sabotage: Option<Sabotage>,
    /// The workers are candidates of an election on `name` instead of
    /// holders of its lock.
    pub election: bool,
    /// Observer processes of an election run (beside `workers`).
    pub observers: u32,
    /// The workers take permits of a semaphore of this limit on `name`
    /// instead of its lock; each slot has a fenced register of its own.
    pub permits: Option<u32>,
    /// The workers take sets of this many names of a pool of twice as
    /// many (derived from `name`) instead of its lock; each name has a
    /// fenced register of its own.
    pub set: Option<u32>,
    /// The workers take the reader-writer lock of `name`, reading with
    /// this share of their acquisitions (0 to 1) and writing with the
    /// rest; writers write the fenced register.
    pub rw: Option<f64>,
}

/// The worker processes of a run.
struct Fleet {
    cfg: RunConfig,
    exe: PathBuf,
    /// pid → (worker number, URL group, role, process).
    children: BTreeMap<u32, (u32, usize, Role, Child)>,
    killed: HashSet<u32>,
    next_id: u32,
    /// Holder kills so far, per URL group.
    kills: Vec<usize>,
}

impl Fleet {
    fn spawn(&mut self, log: &EventLog, group: usize, role: Role) -> std::io::Result<()> {
        let id = self.next_id;
        self.next_id += 1;
        let stderr = std::fs::File::create(self.cfg.dir.join(format!("worker-{id:04}.stderr")))?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("worker")
            .args(["--url", &self.cfg.urls[group], "--name", &self.cfg.name])
            .args(["--group", &group.to_string()])
            .arg("--dir")
            .arg(&self.cfg.dir)
            .arg("--register")
            .arg(register_path(&self.cfg))
            .args(["--id", &id.to_string()])
            .args([
                "--ttl",
                &humantime::format_duration(self.cfg.ttl).to_string(),
            ])
            .args([
                "--wait",
                &humantime::format_duration(self.cfg.wait).to_string(),
            ])
            .args(["--role", role.name()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true);
        if let Some(s) = self.cfg.sabotage {
            cmd.args(["--sabotage", s.name()]);
        }
        if let Some(limit) = self.cfg.permits {
            cmd.args(["--permits", &limit.to_string()]);
        }
        if let Some(k) = self.cfg.set {
            cmd.args(["--set", &k.to_string()]);
        }
        if let Some(share) = self.cfg.rw {
            cmd.args(["--rw", &share.to_string()]);
        }
        let child = cmd.spawn()?;
        let pid = child.id().unwrap_or(0);
        log.log(&Action::Spawned {
            worker: id,
            pid,
            observer: role == Role::Observer,
        })?;
        self.children.insert(pid, (id, group, role, child));
        Ok(())
    }

    /// Log the workers that ended; replace them if `respawn`.
    fn reap(&mut self, log: &EventLog, respawn: bool) -> std::io::Result<()> {
        let mut ended = Vec::new();
        for (pid, (id, group, role, child)) in &mut self.children {
            if let Some(status) = child.try_wait()? {
                ended.push((*pid, *id, *group, *role, status));
            }
        }
        for (pid, id, group, role, status) in ended {
            self.children.remove(&pid);
            use std::os::unix::process::ExitStatusExt;
            log.log(&Action::Exited {
                worker: id,
                pid,
                code: status.code(),
                signal: status.signal(),
                by_controller: self.killed.contains(&pid),
            })?;
            if respawn {
                self.spawn(log, group, role)?;
            }
        }
        Ok(())
    }

    /// The worker that announced the latest grant, if it is still ours.
    fn holder(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.cfg.dir.join(files::HOLDER)).ok()?;
        let pid = text.trim().parse().ok()?;
        self.children.contains_key(&pid).then_some(pid)
    }

    /// The worker that announced the latest grant, waiting for one until
    /// `until` (after a kill, its replacement's first grant).
    async fn holder_by(&self, until: Instant) -> Option<u32> {
        loop {
            if let Some(pid) = self.holder() {
                return Some(pid);
            }
            if Instant::now() >= until {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// The holder to kill next: with several URL groups, one of a group
    /// killed the fewest times so far, waiting for one to hold the lock
    /// until `until` (the run's end: a group whose grants are rare is still
    /// killed, and the groups that hold often are killed meanwhile, not
    /// kept waiting for its turn).
    async fn next_victim(&mut self, until: Instant) -> Option<u32> {
        loop {
            let fewest = self.kills.iter().copied().min().unwrap_or(0);
            let group = self
                .holder()
                .and_then(|pid| Some((pid, self.children.get(&pid)?.1)))
                .filter(|&(_, group)| self.kills.get(group) == Some(&fewest));
            if let Some((pid, group)) = group {
                self.kills[group] += 1;
                return Some(pid);
            }
            if Instant::now() >= until {
                return None;
            }
            // A group whose holds are short and rare (a rollout's phase
            // with few grants) may hold for a few milliseconds only.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// Run the checker as `cfg` says and analyse the history.
pub async fn run(cfg: RunConfig) -> std::io::Result<Report> {
    if cfg.nemeses.is_empty() {
        return Err(std::io::Error::other("no nemesis given (`none` for none)"));
    }
    if let Some(n) = cfg.nemeses.iter().find(|n| n.needs_servers())
        && cfg.servers.is_empty()
    {
        return Err(std::io::Error::other(format!(
            "nemesis {} needs --server NAME (a scripts/services.sh name)",
            n.name()
        )));
    }
    if cfg.urls.is_empty() {
        return Err(std::io::Error::other("no lock URL given"));
    }
    std::fs::create_dir_all(&cfg.dir)?;
    for file in [files::STOP, files::HOLDER, files::CONTROLLER_LOG] {
        let _ = std::fs::remove_file(cfg.dir.join(file));
    }
    let register = register_path(&cfg);
    if cfg.register.is_none() || !register.exists() {
        FencedRegister::create(&register)?;
    }
    let slots = cfg.permits.or(cfg.set.map(|k| 2 * k)).unwrap_or(0);
    for slot in 0..slots {
        let path = slot_register(&register, slot);
        if cfg.register.is_none() || !path.exists() {
            FencedRegister::create(&path)?;
        }
    }
    let log = EventLog::create(&cfg.dir.join(files::CONTROLLER_LOG))?;
    log.log(&Action::RunStarted {
        url: cfg
            .urls
            .iter()
            .map(|u| distlock::redact_url(u))
            .collect::<Vec<_>>()
            .join(" + "),
        nemesis: nemesis::names(&cfg.nemeses),
        workers: cfg.workers,
        ttl_ms: millis(cfg.ttl),
        wait_ms: millis(cfg.wait),
        duration_ms: millis(cfg.duration),
        election: cfg.election,
        observers: cfg.observers,
        permits: cfg.permits,
        set: cfg.set,
        rw: cfg.rw,
    })?;
    let services = Services::new(&cfg.services);
    let mut broken = Broken::new(services.clone());
    let mut fleet = Fleet {
        cfg: cfg.clone(),
        exe: std::env::current_exe()?,
        children: BTreeMap::new(),
        killed: HashSet::new(),
        next_id: 0,
        kills: vec![0; cfg.urls.len()],
    };
    let outcome = drive(&cfg, &log, &services, &mut broken, &mut fleet).await;
    // Whatever happened: put faults back, let workers finish, kill the rest.
    broken.restore();
    let finished = finish(&cfg, &log, &mut fleet).await;
    let interrupted = outcome?;
    finished?;
    if interrupted {
        return Err(std::io::Error::new(
            std::io::ErrorKind::Interrupted,
            "interrupted; every worker stopped and every server restored",
        ));
    }
    analysis::analyse(&cfg.dir)
}

/// Spawn the workers and apply the nemesis until the run's time is up;
/// `Ok(true)` if interrupted by SIGINT or SIGTERM.
async fn drive(
    cfg: &RunConfig,
    log: &EventLog,
    services: &Services,
    broken: &mut Broken,
    fleet: &mut Fleet,
) -> std::io::Result<bool> {
    let mut interrupt = Box::pin(interrupted());
    let role = if cfg.election {
        Role::Candidate
    } else {
        Role::Holder
    };
    for i in 0..cfg.workers {
        fleet.spawn(log, i as usize % cfg.urls.len(), role)?;
    }
    for i in 0..cfg.observers {
        fleet.spawn(log, i as usize % cfg.urls.len(), Role::Observer)?;
    }
    let start = Instant::now();
    let end = start + cfg.duration;
    let mut next = start + cfg.interval;
    let mut majority_done = false;
    let mut turn = 0;
    loop {
        tokio::select! {
            biased;
            r = &mut interrupt => { r?; return Ok(true); }
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        fleet.reap(log, true)?;
        let now = Instant::now();
        if now >= end {
            return Ok(false);
        }
        if now < next {
            continue;
        }
        let nemesis = cfg.nemeses[turn % cfg.nemeses.len()];
        turn += 1;
        let majority =
            nemesis == Nemesis::KillMinority && !majority_done && now >= start + cfg.duration / 2;
        majority_done |= majority;
        tokio::select! {
            biased;
            r = &mut interrupt => { r?; return Ok(true); }
            r = act(Step { nemesis, majority }, cfg, log, services, broken, fleet, end) => {
                if let Err(e) = r {
                    log.log(&Action::NemesisFailed { error: e.to_string() })?;
                }
            }
        }
        next = Instant::now() + cfg.interval;
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn interrupted() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}

/// One turn of a run's nemeses.
#[derive(Debug, Clone, Copy)]
struct Step {
    /// The nemesis whose turn it is.
    nemesis: Nemesis,
    /// `kill-minority` kills a majority this time.
    majority: bool,
}

/// One nemesis action: `step`'s.
async fn act(
    step: Step,
    cfg: &RunConfig,
    log: &EventLog,
    services: &Services,
    broken: &mut Broken,
    fleet: &mut Fleet,
    end: Instant,
) -> std::io::Result<()> {
    let Step { nemesis, majority } = step;
    match nemesis {
        Nemesis::None => {}
        Nemesis::KillHolder => {
            if let Some(pid) = fleet.next_victim(end).await {
                fleet.killed.insert(pid);
                signal(pid, Signal::KILL);
                log.log(&Action::KilledHolder { pid })?;
            }
        }
        Nemesis::PauseHolder => {
            if let Some(pid) = fleet.holder_by(end).await {
                broken.paused_workers.push(pid);
                signal(pid, Signal::STOP);
                log.log(&Action::Paused { pid })?;
                tokio::time::sleep(pause_length(cfg.ttl)).await;
                signal(pid, Signal::CONT);
                broken.paused_workers.retain(|p| *p != pid);
                log.log(&Action::Continued { pid })?;
            }
        }
        Nemesis::KillServer => {
            kill_and_restart(cfg.servers.clone(), rest(), log, services, broken).await?;
        }
        Nemesis::PauseServer => {
            let servers = cfg.servers.clone();
            broken.paused_servers.extend(servers.iter().cloned());
            services.each("pause", &servers).await?;
            log.log(&Action::ServersPaused {
                servers: servers.clone(),
            })?;
            tokio::time::sleep(pause_length(cfg.ttl)).await;
            services.each("resume", &servers).await?;
            broken.paused_servers.clear();
            log.log(&Action::ServersResumed { servers })?;
        }
        Nemesis::KillMinority => {
            let n = cfg.servers.len();
            let count = if majority { n / 2 + 1 } else { (n - 1) / 2 };
            let mut members = cfg.servers.clone();
            while members.len() > count {
                members.remove(rand::random_range(0..members.len()));
            }
            let down = if majority {
                Duration::from_millis(rand::random_range(500..1_500))
            } else {
                rest()
            };
            kill_and_restart(members, down, log, services, broken).await?;
        }
        Nemesis::Failover => {
            let old = services.output(&["master"]).await?;
            broken.killed_servers.push(old.clone());
            let new = services.output(&["failover", "kill"]).await?;
            log.log(&Action::ServersKilled {
                servers: vec![old.clone()],
            })?;
            log.log(&Action::FailedOver {
                from: old.clone(),
                to: new,
            })?;
            tokio::time::sleep(rest()).await;
            services.each("rejoin", std::slice::from_ref(&old)).await?;
            broken.killed_servers.clear();
            log.log(&Action::ServersStarted { servers: vec![old] })?;
        }
        Nemesis::ClusterFailover => {
            // The slot of every key of the lock: its hash tag, the name.
            let key = lock_redis::raw::Keys::new("").lock(&cfg.name);
            let named = services.lines(&["cluster-failover", &key]).await?;
            let [old, new] = named.as_slice() else {
                return Err(std::io::Error::other(format!(
                    "`services.sh cluster-failover` named {named:?}, not the killed master and its successor"
                )));
            };
            broken.killed_servers.push(old.clone());
            log.log(&Action::ServersKilled {
                servers: vec![old.clone()],
            })?;
            log.log(&Action::FailedOver {
                from: old.clone(),
                to: new.clone(),
            })?;
            tokio::time::sleep(rest()).await;
            services.each("rejoin", std::slice::from_ref(old)).await?;
            broken.killed_servers.clear();
            log.log(&Action::ServersStarted {
                servers: vec![old.clone()],
            })?;
        }
    }
    Ok(())
}

/// How long a killed server stays down: 1–3 s.
fn rest() -> Duration {
    Duration::from_millis(rand::random_range(1_000..3_000))
}

async fn kill_and_restart(
    servers: Vec<String>,
    down: Duration,
    log: &EventLog,
    services: &Services,
    broken: &mut Broken,
) -> std::io::Result<()> {
    if servers.is_empty() {
        return Ok(());
    }
    broken.killed_servers.extend(servers.iter().cloned());
    services.each("kill", &servers).await?;
    log.log(&Action::ServersKilled {
        servers: servers.clone(),
    })?;
    tokio::time::sleep(down).await;
    services.each("start", &servers).await?;
    broken.killed_servers.clear();
    log.log(&Action::ServersStarted { servers })
}

/// Ask the workers to stop, wait for them (an acquire may still be waiting),
/// and kill any that do not finish in time.
async fn finish(cfg: &RunConfig, log: &EventLog, fleet: &mut Fleet) -> std::io::Result<()> {
    log.log(&Action::Stopping)?;
    std::fs::write(cfg.dir.join(files::STOP), "")?;
    let limit = Instant::now() + cfg.wait + cfg.ttl * 4 + Duration::from_secs(20);
    while !fleet.children.is_empty() && Instant::now() < limit {
        tokio::time::sleep(Duration::from_millis(50)).await;
        fleet.reap(log, false)?;
    }
    let stragglers: Vec<u32> = fleet.children.keys().copied().collect();
    for pid in stragglers {
        fleet.killed.insert(pid);
        signal(pid, Signal::KILL);
        log.log(&Action::Straggler { pid })?;
    }
    while !fleet.children.is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
        fleet.reap(log, false)?;
    }
    Ok(())
}

/// Where the run's fenced register is.
fn register_path(cfg: &RunConfig) -> PathBuf {
    cfg.register
        .clone()
        .unwrap_or_else(|| cfg.dir.join(files::REGISTER))
}

/// The fenced register of permit slot `slot`, beside the run's `register`.
pub fn slot_register(register: &std::path::Path, slot: u32) -> PathBuf {
    let mut name = register.as_os_str().to_os_string();
    name.push(format!(".slot-{slot}"));
    PathBuf::from(name)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
