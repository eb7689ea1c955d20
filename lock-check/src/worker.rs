//! A worker process: acquires the run's lock again and again, writes to the
//! fenced register while it holds it, and logs everything it does and sees.
//!
//! In an election run (`--election`) a worker is a candidate: it
//! campaigns ([`Election::campaign`]) instead of acquiring, with a value
//! unique to the campaign, writes with its term, and proclaims new values
//! while it leads; or an observer: it logs every state
//! [`Election::observe`] gives.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use distlock::{
    Access, DistributedLock, Election, LockError, LockGuard, LockOptions, LockSet, LockSetExt, Wait,
};
use futures_util::StreamExt;
use lock_core::raw::{LeaseState, RawGuard};

use crate::clock::{instant_ns, now_ns};
use crate::event::{Event, EventLog, HoldEnd, Member};
use crate::register::FencedRegister;
use crate::sabotage::{Sabotage, SabotagedLock};

/// The run directory's file names, shared by the controller and workers.
pub mod files {
    /// The fenced register.
    pub const REGISTER: &str = "register";
    /// The pid of the worker granted most recently.
    pub const HOLDER: &str = "holder";
    /// Created by the controller when workers should finish.
    pub const STOP: &str = "stop";
    /// The controller's actions.
    pub const CONTROLLER_LOG: &str = "controller.jsonl";

    /// Worker `id`'s log.
    pub fn worker_log(id: u32) -> String {
        format!("worker-{id:04}.jsonl")
    }
}

/// What a worker needs to know.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The lock URL.
    pub url: String,
    /// Which of the run's URLs it is.
    pub group: usize,
    /// The fenced register.
    pub register: PathBuf,
    /// The one lock name of the run.
    pub name: String,
    /// The run directory.
    pub dir: PathBuf,
    /// This worker's number.
    pub id: u32,
    /// Lease TTL.
    pub ttl: Duration,
    /// How long one `acquire` may wait.
    pub wait: Duration,
    /// A deliberate defect to inject.
    pub sabotage: Option<Sabotage>,
    /// What the worker does in the run.
    pub role: Role,
    /// Take permits of a semaphore of this limit instead of the lock.
    pub permits: Option<u32>,
    /// Take sets of this many names of a pool of twice as many
    /// ([`set_pool`]) instead of the lock.
    pub set: Option<u32>,
    /// Take the reader-writer lock instead of the lock, reading with this
    /// probability and writing otherwise.
    pub rw: Option<f64>,
}

/// The pool of names a `--set K` run takes its sets from: `2K` names
/// derived from the run's name; name `i` writes to register slot `i`.
pub fn set_pool(name: &str, k: u32) -> Vec<String> {
    (0..2 * k).map(|i| format!("{name}/set-{i}")).collect()
}

/// What a worker does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Acquire the lock, write, end the hold; again and again.
    Holder,
    /// Campaign in the election of the lock's name, write with the term,
    /// proclaim values, end the leadership; again and again.
    Candidate,
    /// Observe the election of the lock's name.
    Observer,
}

/// Run until the controller creates the stop file.
pub async fn run(cfg: WorkerConfig) -> std::io::Result<()> {
    // Die with the controller, whatever happens to it.
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    let log = EventLog::create(&cfg.dir.join(files::worker_log(cfg.id)))?;
    let register = FencedRegister::open(&cfg.register);
    let stop = cfg.dir.join(files::STOP);
    let Some(locks) = connect(&cfg, &log, &stop).await? else {
        return log.log(&Event::Exiting);
    };
    let caps = locks.capabilities();
    log.log(&Event::Started {
        worker: cfg.id,
        pid: std::process::id(),
        group: cfg.group,
        url: distlock::redact_url(&cfg.url),
        backend: caps.backend.to_string(),
        grade: format!("{:?}", caps.grade),
        fencing: format!("{:?}", caps.fencing),
        crash_release: format!("{:?}", caps.crash_release),
        fair_queue: caps.fair_queue,
        sabotage: cfg.sabotage.map(|s| s.name().to_string()),
        writers_first: caps.rw_lock.map(|rw| rw.writer_preference),
        upgradeable: caps.rw_lock.map(|rw| rw.upgradeable),
    })?;
    if cfg.role == Role::Observer {
        observe(locks, &cfg, &log, &stop).await?;
        return log.log(&Event::Exiting);
    }
    let mut campaigns = 0;
    while !stop.exists() {
        campaigns += 1;
        match cfg.set {
            Some(k) => hold_set_once(&locks, &cfg, &log, k).await?,
            None => hold_once(&locks, &cfg, &log, &register, campaigns).await?,
        }
        tokio::time::sleep(Duration::from_micros(rand::random_range(0..5_000))).await;
    }
    log.log(&Event::Exiting)
}

/// Log every state the election's observer stream gives until asked to
/// stop.
async fn observe(
    locks: Arc<dyn DistributedLock>,
    cfg: &WorkerConfig,
    log: &EventLog,
    stop: &Path,
) -> std::io::Result<()> {
    // Where the server notifies observers, rely on it (and its default
    // re-read), so that the notifications are what the faults test.
    let notified = locks.capabilities().observers == distlock::Waiting::Notified;
    let mut election = Election::new(locks, cfg.name.clone());
    if !notified {
        election = election.poll_interval(OBSERVER_POLL);
    }
    let mut changes = Box::pin(election.observe());
    while !stop.exists() {
        let item = tokio::select! {
            item = changes.next() => item,
            () = tokio::time::sleep(Duration::from_millis(100)) => continue,
        };
        match item {
            Some(Ok(state)) => log.log(&Event::Observed {
                term: state.as_ref().map(|l| l.term),
                value: state.map(|l| String::from_utf8_lossy(&l.value).into_owned()),
            })?,
            // The stream goes on after an error item; the analysis counts
            // the errors that were not transient.
            Some(Err(e)) => log.log(&Event::ObserveFailed {
                kind: error_kind(&e).to_string(),
                error: e.to_string(),
                transient: e.is_transient(),
            })?,
            None => return Err(std::io::Error::other("the observer stream ended")),
        }
    }
    Ok(())
}

/// How often observers read the election where the backend does not
/// notify them: often, so that short leaderships are seen.
const OBSERVER_POLL: Duration = Duration::from_millis(20);

/// Connect, retrying while the server is down (a worker respawned during a
/// server fault); `None` if asked to stop first.
async fn connect(
    cfg: &WorkerConfig,
    log: &EventLog,
    stop: &Path,
) -> std::io::Result<Option<Arc<dyn DistributedLock>>> {
    loop {
        let started = now_ns();
        match distlock::connect(&cfg.url).await {
            Ok(locks) => {
                return Ok(Some(match cfg.sabotage {
                    Some(mode) => Arc::new(SabotagedLock::new(locks, mode)),
                    None => locks,
                }));
            }
            Err(e) if e.is_transient() && !stop.exists() => {
                log.log(&failed(started, &e))?;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                log.log(&failed(started, &e))?;
                return if e.is_transient() {
                    Ok(None)
                } else {
                    Err(std::io::Error::other(e.to_string()))
                };
            }
        }
    }
}

fn failed(started: u64, e: &LockError) -> Event {
    Event::AcquireFailed {
        started,
        kind: error_kind(e).to_string(),
        error: e.to_string(),
    }
}

/// The `LockError` variant's name.
pub fn error_kind(e: &LockError) -> &'static str {
    match e {
        LockError::Timeout { .. } => "Timeout",
        LockError::Unavailable { .. } => "Unavailable",
        LockError::QuorumNotReached { .. } => "QuorumNotReached",
        LockError::NotHeld { .. } => "NotHeld",
        LockError::Lost { .. } => "Lost",
        LockError::InvalidName { .. } => "InvalidName",
        LockError::InvalidOptions { .. } => "InvalidOptions",
        LockError::InvalidUrl { .. } => "InvalidUrl",
        LockError::LimitReached { .. } => "LimitReached",
        LockError::Backend { .. } => "Backend",
        _ => "Other",
    }
}

fn pick_end() -> HoldEnd {
    match rand::random_range(0..20) {
        0..15 => HoldEnd::Release,
        15..19 => HoldEnd::Drop,
        _ => HoldEnd::Expire,
    }
}

/// One acquire (or campaign), hold and end; `n` counts this worker's
/// attempts (it makes campaign values unique).
async fn hold_once(
    locks: &Arc<dyn DistributedLock>,
    cfg: &WorkerConfig,
    log: &EventLog,
    register: &FencedRegister,
    n: u64,
) -> std::io::Result<()> {
    let end = pick_end();
    let mut opts = LockOptions::new()
        .ttl(cfg.ttl)
        .wait(Wait::UpTo(cfg.wait))
        .auto_renew(end != HoldEnd::Expire);
    if let Some(limit) = cfg.permits {
        opts = opts.permits(limit);
    }
    // Where the backend offers upgradeable reads, half the writers take an
    // upgradeable read first and upgrade it.
    let upgrades = locks
        .capabilities()
        .rw_lock
        .is_some_and(|rw| rw.upgradeable);
    let access = cfg.rw.map(|share| {
        if rand::random_bool(share) {
            Access::Read
        } else if upgrades && rand::random_bool(0.5) {
            Access::Upgradeable
        } else {
            Access::Write
        }
    });
    if let Some(access) = access {
        opts = opts.access(access);
    }
    let started = now_ns();
    let value = (cfg.role == Role::Candidate).then(|| format!("w{}/{n}", cfg.id));
    log.log(&Event::Acquiring {
        wait_ms: u64::try_from(cfg.wait.as_millis()).unwrap_or(u64::MAX),
        end,
        value: value.clone(),
        access: access.map(|a| a.as_str().to_string()),
    })?;
    let acquired = match &value {
        Some(value) => Election::new(Arc::clone(locks), cfg.name.clone())
            .campaign(value.as_bytes(), &opts)
            .await
            .map(distlock::Leadership::into_guard),
        None => locks.acquire(&cfg.name, &opts).await,
    };
    let mut guard = match acquired {
        Ok(guard) => guard,
        Err(e) => {
            log.log(&failed(started, &e))?;
            if !matches!(e, LockError::Timeout { .. }) {
                tokio::time::sleep(Duration::from_millis(rand::random_range(50..150))).await;
            }
            return Ok(());
        }
    };
    log.log(&Event::Granted {
        started,
        token: guard.fencing_token(),
        deadline: guard.validity_deadline().map(|d| instant_ns(d.into_std())),
        lost_on_arrival: guard.is_lost().map(|r| r.to_string()),
        slot: guard.slot(),
        members: Vec::new(),
    })?;
    announce_holder(&cfg.dir)?;
    // A permit writes to its slot's register: the resource is partitioned
    // by slot, and each part fences by its own highest token.
    let slot_register = guard
        .slot()
        .map(|slot| FencedRegister::open(&crate::controller::slot_register(&cfg.register, slot)));
    let register = slot_register.as_ref().unwrap_or(register);
    let watcher = tokio::spawn(watch(vec![Arc::clone(guard.lease())], log.clone()));
    // One hold in ten lasts 1.2–2 × TTL, so renewals run under the faults
    // and waiters wait longer than a lease.
    let length =
        (rand::random_range(0..10) == 0).then(|| cfg.ttl.mul_f64(rand::random_range(1.2..2.0)));
    // A reader holds without writing: what it reads was written under the
    // token it carries.
    let result = match access {
        Some(Access::Read) => {
            read_hold(&guard, length).await;
            Ok(())
        }
        Some(Access::Upgradeable) => {
            // Read a little, then become the writer and write as one.
            read_hold(&guard, None).await;
            match guard.upgrade(Wait::UpTo(cfg.wait)).await {
                Ok(()) => {
                    log.log(&Event::Upgraded {
                        token: guard.fencing_token(),
                    })?;
                    hold(&guard, length, log, register, None).await
                }
                Err(e) => {
                    tracing::debug!(target: "distlock", error = %e.report(), "upgrade failed");
                    Ok(())
                }
            }
        }
        _ => hold(&guard, length, log, register, value.as_deref()).await,
    };
    let ended = end_hold(guard, end, cfg.ttl, log).await;
    watcher.abort();
    result.and(ended)
}

/// One lock set of `k` names of the pool, picked at random and named in a
/// random order: acquired, each member's register written with its own
/// token 1–3 times, and ended as a lock's hold is.
async fn hold_set_once(
    locks: &Arc<dyn DistributedLock>,
    cfg: &WorkerConfig,
    log: &EventLog,
    k: u32,
) -> std::io::Result<()> {
    let end = pick_end();
    let opts = LockOptions::new()
        .ttl(cfg.ttl)
        .wait(Wait::UpTo(cfg.wait))
        .auto_renew(end != HoldEnd::Expire);
    let pool = set_pool(&cfg.name, k);
    let mut picked: Vec<u32> = (0..2 * k).collect();
    // A random k of the pool, in a random order.
    for i in (1..picked.len()).rev() {
        picked.swap(i, rand::random_range(0..=i));
    }
    picked.truncate(k as usize);
    let names: Vec<&str> = picked.iter().map(|&i| pool[i as usize].as_str()).collect();
    let started = now_ns();
    log.log(&Event::Acquiring {
        wait_ms: u64::try_from(cfg.wait.as_millis()).unwrap_or(u64::MAX),
        end,
        value: None,
        access: None,
    })?;
    let set = match locks.acquire_all(&names, &opts).await {
        Ok(set) => set,
        Err(e) => {
            log.log(&failed(started, &e))?;
            if !matches!(e, LockError::Timeout { .. }) {
                tokio::time::sleep(Duration::from_millis(rand::random_range(50..150))).await;
            }
            return Ok(());
        }
    };
    let slot_of = |name: &str| pool.iter().position(|n| n == name).map(|i| i as u32);
    let members: Vec<(u32, &LockGuard)> = set
        .guards()
        .iter()
        .filter_map(|g| slot_of(g.name()).map(|slot| (slot, g)))
        .collect();
    log.log(&Event::Granted {
        started,
        token: None,
        deadline: set.validity_deadline().map(|d| instant_ns(d.into_std())),
        lost_on_arrival: set.is_lost().map(|l| l.to_string()),
        slot: None,
        members: members
            .iter()
            .map(|&(slot, g)| Member {
                slot,
                token: g.fencing_token(),
            })
            .collect(),
    })?;
    announce_holder(&cfg.dir)?;
    let leases = set.guards().iter().map(|g| Arc::clone(g.lease()));
    let watcher = tokio::spawn(watch(leases.collect(), log.clone()));
    let length =
        (rand::random_range(0..10) == 0).then(|| cfg.ttl.mul_f64(rand::random_range(1.2..2.0)));
    let result = hold_set(&set, &members, length, log, cfg).await;
    let ended = end_hold(set, end, cfg.ttl, log).await;
    watcher.abort();
    result.and(ended)
}

/// 1–3 rounds of writes, one to each member's register with that
/// member's token, each round checked against the whole set first.
async fn hold_set(
    set: &LockSet,
    members: &[(u32, &LockGuard)],
    length: Option<Duration>,
    log: &EventLog,
    cfg: &WorkerConfig,
) -> std::io::Result<()> {
    let rounds = rand::random_range(1..=3);
    let pause = match length {
        Some(length) => length / rounds,
        None => Duration::from_micros(rand::random_range(500..3_000)),
    };
    for _ in 0..rounds {
        for &(slot, guard) in members {
            // A member lost, or the set's validity deadline passed.
            if let Err(e) = set.ensure_held() {
                return log.log(&Event::WriteSkipped {
                    reason: e.to_string(),
                });
            }
            let register =
                FencedRegister::open(&crate::controller::slot_register(&cfg.register, slot));
            let out = register.write(guard.fencing_token())?;
            log.log(&Event::Wrote {
                token: guard.fencing_token(),
                seq: out.seq,
                at: out.at,
                accepted: out.accepted,
                highest: out.highest,
                slot: Some(slot),
            })?;
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = set.lost() => return Ok(()),
        }
    }
    Ok(())
}

/// A reader's hold: a few milliseconds, or `length`, cut short by `lost()`.
async fn read_hold(guard: &LockGuard, length: Option<Duration>) {
    let pause = length.unwrap_or_else(|| Duration::from_micros(rand::random_range(500..6_000)));
    tokio::select! {
        () = tokio::time::sleep(pause) => {}
        _ = guard.lost() => {}
    }
}

/// Tell the controller who holds the lock now (for its holder nemeses).
fn announce_holder(dir: &Path) -> std::io::Result<()> {
    let tmp = dir.join(format!(
        "{}.{}",
        crate::worker::files::HOLDER,
        std::process::id()
    ));
    std::fs::write(&tmp, format!("{}\n", std::process::id()))?;
    std::fs::rename(&tmp, dir.join(files::HOLDER))
}

/// Log renewals (the earliest deadline of `leases`: a lock's one, or a
/// set's members') and the first loss as they happen.
async fn watch(leases: Vec<Arc<LeaseState>>, log: EventLog) {
    let earliest = || leases.iter().filter_map(|l| l.deadline()).min();
    let mut deadline = earliest();
    let lost = futures_util::future::select_all(leases.iter().map(|l| Box::pin(l.lost())));
    tokio::pin!(lost);
    loop {
        tokio::select! {
            (reason, _, _) = &mut lost => {
                let _ = log.log(&Event::LossObserved { reason: reason.to_string() });
                return;
            }
            () = tokio::time::sleep(Duration::from_millis(5)) => {
                let now = earliest();
                if now != deadline {
                    deadline = now;
                    let _ = log.log(&Event::Renewed {
                        deadline: now.map(|d| instant_ns(d.into_std())),
                    });
                }
            }
        }
    }
}

/// 1–5 writes to the register, each checked against the guard first, with
/// `lost()` watched in between; spread over `length` if given, else a few
/// milliseconds apart. A leader (`campaign` is its campaign's value)
/// proclaims a new value after one write in three.
async fn hold(
    guard: &LockGuard,
    length: Option<Duration>,
    log: &EventLog,
    register: &FencedRegister,
    campaign: Option<&str>,
) -> std::io::Result<()> {
    let writes = rand::random_range(1..=5);
    let mut proclaims = 0;
    let pause = |n: u32| match length {
        Some(length) => length / n,
        None => Duration::from_micros(rand::random_range(500..3_000)),
    };
    for _ in 0..writes {
        // Lost, or the validity deadline passed (`DeadlinePassed`).
        if let Some(reason) = guard.is_lost() {
            return log.log(&Event::WriteSkipped {
                reason: reason.to_string(),
            });
        }
        let out = register.write(guard.fencing_token())?;
        log.log(&Event::Wrote {
            token: guard.fencing_token(),
            seq: out.seq,
            at: out.at,
            accepted: out.accepted,
            highest: out.highest,
            slot: None,
        })?;
        if let (Some(campaign), Some(term)) = (campaign, guard.fencing_token())
            && rand::random_range(0..3) == 0
        {
            proclaims += 1;
            let value = format!("{campaign}/p{proclaims}");
            log.log(&Event::Proclaiming {
                term,
                value: value.clone(),
            })?;
            let answer = guard.set_value(value.as_bytes()).await;
            log.log(&Event::Proclaimed {
                error: answer.err().map(|e| e.to_string()),
            })?;
        }
        tokio::select! {
            () = tokio::time::sleep(pause(writes)) => {}
            _ = guard.lost() => return Ok(()),
        }
    }
    Ok(())
}

async fn end_hold(
    held: impl Held,
    how: HoldEnd,
    ttl: Duration,
    log: &EventLog,
) -> std::io::Result<()> {
    let started = now_ns();
    let (still_held, error) = match how {
        HoldEnd::Release => {
            log.log(&Event::Releasing { how })?;
            match held.release().await {
                Ok(held) => (Some(held), None),
                Err(e) => (None, Some(e.to_string())),
            }
        }
        HoldEnd::Drop => {
            log.log(&Event::Releasing { how })?;
            drop(held);
            (None, None)
        }
        HoldEnd::Expire => {
            // Keep the guard, unrenewed, until it says the lease is over;
            // dropping it then frees what the server still keeps (a
            // connection-held lock) at once.
            let limit = ttl * 3 + Duration::from_secs(10);
            let error = tokio::time::timeout(limit, held.lost())
                .await
                .err()
                .map(|_| format!("lost() did not fire within {limit:?} of an unrenewed lease"));
            log.log(&Event::Releasing { how })?;
            drop(held);
            (None, error)
        }
    };
    log.log(&Event::Released {
        how,
        started,
        still_held,
        error,
    })
}

/// What a worker holds: a lock's guard or a set.
trait Held: Send {
    /// Give it back: whether it was all still ours.
    async fn release(self) -> Result<bool, LockError>;
    /// Resolves when it is (or part of it is) lost.
    async fn lost(&self);
}

impl Held for LockGuard {
    async fn release(self) -> Result<bool, LockError> {
        LockGuard::release(self).await
    }

    async fn lost(&self) {
        LockGuard::lost(self).await;
    }
}

impl Held for LockSet {
    async fn release(self) -> Result<bool, LockError> {
        LockSet::release(self).await
    }

    async fn lost(&self) {
        LockSet::lost(self).await;
    }
}

impl Role {
    /// The name `--role` takes.
    pub fn name(self) -> &'static str {
        match self {
            Role::Holder => "holder",
            Role::Candidate => "candidate",
            Role::Observer => "observer",
        }
    }
}
