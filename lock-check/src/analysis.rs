//! Reading a run's logs back and counting what went wrong, held to what the
//! backend's capabilities allow.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::clock::ms;
use crate::election::ElectionReport;
use crate::event::{Action, Event, HoldEnd, Stamped, read_log};
use crate::worker::files;

/// An acquire or release slower than its bound by this much is a hang.
const HANG_SLACK_NS: u64 = 10_000_000_000;
/// At most this many examples are kept per finding.
const EXAMPLES: usize = 5;

/// One grant and what its holder did with it.
#[derive(Debug, Clone)]
struct Hold {
    worker: u32,
    pid: u32,
    started: u64,
    granted: u64,
    token: Option<u64>,
    /// A permit's slot: holds contend only with holds of the same slot
    /// (`None` for a lock, where every hold contends).
    slot: Option<u32>,
    /// A reader's grant of a reader-writer lock (`--rw`): readers do not
    /// contend with each other.
    read: bool,
    /// An upgradeable reader's grant (a read, until its upgrade ends it
    /// and a write's hold begins): upgradeable readers contend with each
    /// other.
    upgradeable: bool,
    lost_on_arrival: bool,
    /// (time, validity deadline as of then).
    deadlines: Vec<(u64, Option<u64>)>,
    /// When the holder stopped holding: began to release or drop, observed
    /// the loss, or died.
    end: Option<u64>,
}

impl Hold {
    /// The deadline the holder believed in at `t` (`None`: no deadline, the
    /// lock is kept by a connection or session).
    fn deadline_at(&self, t: u64) -> Option<u64> {
        self.deadlines
            .iter()
            .take_while(|(at, _)| *at <= t)
            .last()
            .and_then(|(_, d)| *d)
    }

    fn active_at(&self, t: u64) -> bool {
        self.granted < t && self.end.is_none_or(|end| end > t)
    }

    /// Whether `other` holds what this hold holds (the lock, or the same
    /// permit slot).
    fn contends(&self, other: &Hold) -> bool {
        self.slot == other.slot
            && (!(self.read && other.read) || (self.upgradeable && other.upgradeable))
    }
}

/// A writer's acquisition in a reader-writer run, granted or not.
#[derive(Debug, Clone)]
struct WriterWait {
    pid: u32,
    worker: u32,
    started: u64,
    /// When it was granted, or when it had given up: by its wait's end
    /// (the writer leaves the queue then, before its failure is logged),
    /// or [`GIVE_UP_SLACK_NS`] before the failure was logged.
    ended: u64,
}

/// How long before a failed acquisition is logged its waiter may already
/// have left the queue (its give-back's round trip).
const GIVE_UP_SLACK_NS: u64 = 50_000_000;

/// How far behind a writer's start a reader may start and still be let in
/// ahead of it: the writer's first request, which marks it as waiting, is
/// still on its way. At a worker's first acquisition that request may
/// open the connection it goes on: on a loaded machine at the start of a
/// run, a Postgres row-mode writer's first request took over 170 ms.
const WRITER_MARK_SLACK_NS: u64 = 250_000_000;

#[derive(Debug, Clone)]
struct Write {
    hold: usize,
    seq: u64,
    at: u64,
    accepted: bool,
}

/// Counts with a few examples.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Finding {
    /// How many.
    pub count: u64,
    /// The first few, described.
    pub examples: Vec<String>,
}

impl Finding {
    pub(crate) fn add(&mut self, example: impl FnOnce() -> String) {
        self.count += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(example());
        }
    }
}

/// Writes by a holder after a later holder had been granted the lock.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Exclusion {
    /// Refused by the register (fencing worked).
    pub rejected: Finding,
    /// Accepted, but the newer holder had not written yet.
    pub harmless: Finding,
    /// Accepted after a newer holder's write: a fencing failure.
    pub fencing_failures: Finding,
}

/// What happened to the workers of one URL group.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GroupCounts {
    /// Grants to its workers.
    pub grants: u64,
    /// Its workers killed while announced as the holder.
    pub holder_kills: u64,
}

/// Earlier holders still believing in their lock when another was granted.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct InTime {
    /// The earlier holder was running.
    pub running: Finding,
    /// The earlier holder was paused (SIGSTOP) at some point since its grant.
    pub paused: Finding,
}

/// Progress.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Liveness {
    /// Longest time without a grant, from the first worker's start to the
    /// end of faults.
    pub longest_gap_ms: f64,
    /// Holders killed by the nemesis.
    pub holder_kills: u64,
    /// Longest time from a holder's SIGKILL to the next grant.
    pub kill_to_grant_max_ms: f64,
    /// Grants per worker process, fewest and most, among workers that lived
    /// through the whole run.
    pub grants_per_worker: (u64, u64),
    /// Acquires or releases that overran their bound by 10 s, and workers
    /// that did not finish when asked.
    pub hangs: Finding,
}

/// The analysis of one run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    /// The backend, as the workers' `capabilities()` name it.
    pub backend: String,
    /// Its grade.
    pub grade: String,
    /// Its fencing.
    pub fencing: String,
    /// The sabotage the workers ran with, if any.
    pub sabotage: Option<String>,
    /// The nemesis.
    pub nemesis: String,
    /// The URL, redacted.
    pub url: String,
    /// The limit of the semaphore whose permits the workers took
    /// (`--permits`); `None`: the lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    /// The size of the lock sets the workers took (`--set`), of a pool of
    /// twice as many names; each name is checked as a lock of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set: Option<u32>,
    /// Seconds of faults.
    pub duration_s: f64,
    /// Worker processes started (including respawns).
    pub workers_started: u64,
    /// Nemesis actions, by kind.
    pub actions: BTreeMap<String, u64>,
    /// Grants.
    pub grants: u64,
    /// Grants and holder kills by URL group (`"0: redis://…"`), for runs
    /// over several URLs.
    pub groups: BTreeMap<String, GroupCounts>,
    /// Register writes, and how many were accepted.
    pub writes: (u64, u64),
    /// Writes after a later grant.
    pub exclusion: Exclusion,
    /// Consecutive grants (in time order) whose tokens did not increase;
    /// grants whose own worker was paused while acquiring are left out.
    pub token_order: Finding,
    /// Writes of the newest holder refused by the register (tokens went
    /// backwards).
    pub newest_holder_rejected: Finding,
    /// Loss not signalled in time.
    pub in_time: InTime,
    /// Permits granted without a slot, or on a slot at or above the limit.
    #[serde(default)]
    pub slots_out_of_range: Finding,
    /// Permits granted while `limit` running holders of other processes
    /// still believed they held theirs (more than `limit` at once).
    #[serde(default)]
    pub over_limit: Finding,
    /// The share of reads in a reader-writer run (`--rw`); `None`: not one.
    /// Its overlaps of a writer with anyone are counted in `in_time` (a
    /// reader and a writer, or two writers, contend; two readers do not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rw: Option<f64>,
    /// Whether the backend promises writer preference (`--rw` runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writers_first: Option<bool>,
    /// Whether the backend offers upgradeable reads (`--rw` runs: half the
    /// writers then upgrade an upgradeable read instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgradeable: Option<bool>,
    /// The upgrades that went through (`--rw` runs): each ends a read's
    /// hold and begins a write's, checked as a write grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrades: Option<u64>,
    /// Read grants to readers that started after a writer that was already
    /// waiting (by more than 100 ms) and that were made while it still
    /// waited; the writer not paused meanwhile, and no server fault
    /// between the two starts (requests then reach the servers in no
    /// promised order). A failure where the backend promises writer
    /// preference.
    #[serde(default)]
    pub writer_starvation: Finding,
    /// Reads whose token is below the token of a write granted before the
    /// read was asked for (a reader carries the latest write's token).
    #[serde(default)]
    pub read_tokens: Finding,
    /// The longest a writer waited (granted or not), in ms (`--rw` runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer_wait_longest_ms: Option<f64>,
    /// The longest hold of the run, in ms (`--rw` runs), to set the
    /// writers' waits against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_longest_ms: Option<f64>,
    /// Grants whose guard was already lost when `acquire` returned, where the
    /// worker itself was not paused meanwhile.
    pub lost_on_arrival: Finding,
    /// Progress.
    pub liveness: Liveness,
    /// Acquire errors, by `LockError` kind.
    pub acquire_errors: BTreeMap<String, u64>,
    /// Release errors (and unrenewed leases whose loss never fired).
    pub release_errors: Finding,
    /// Workers that exited on their own with a failure (a panic, an I/O error).
    pub crashes: Finding,
    /// What the observers of an election run (`--election`) saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub election: Option<ElectionReport>,
    /// What exceeded the capabilities: empty if the run passes.
    pub failures: Vec<String>,
}

impl Report {
    /// The run is within what the backend's capabilities allow.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

struct Worker {
    id: u32,
    pid: u32,
    /// It observed an election (no grants of its own).
    observer: bool,
    events: Vec<Stamped<Event>>,
}

/// Analyse the run in `dir`.
pub fn analyse(dir: &Path) -> std::io::Result<Report> {
    let actions: Vec<Stamped<Action>> = read_log(&dir.join(files::CONTROLLER_LOG))?;
    let mut workers = Vec::new();
    for a in &actions {
        if let Action::Spawned {
            worker,
            pid,
            observer,
        } = a.event
        {
            let path = dir.join(files::worker_log(worker));
            let events = if path.exists() {
                read_log(&path)?
            } else {
                Vec::new()
            };
            workers.push(Worker {
                id: worker,
                pid,
                observer,
                events,
            });
        }
    }
    Ok(Analysis::new(&actions, &workers).report(&actions, &workers))
}

/// Per-process facts from the controller's log.
struct Analysis {
    /// pid → when the controller killed it (nemesis or straggler).
    killed_at: BTreeMap<u32, u64>,
    /// pid → when it exited.
    exited_at: BTreeMap<u32, u64>,
    /// pid → [start, end) of each SIGSTOP.
    paused: BTreeMap<u32, Vec<(u64, u64)>>,
    run_start: u64,
    stopping: u64,
    holds: Vec<Hold>,
    writes: Vec<Write>,
    writer_waits: Vec<WriterWait>,
    /// [start, end) of each server fault (servers killed or paused until
    /// started or resumed again, plus [`SERVER_FAULT_SLACK_NS`]): requests
    /// sent meanwhile reach the servers in no promised order.
    server_faults: Vec<(u64, u64)>,
}

/// How long after servers come back their clients' delayed requests may
/// still be arriving.
const SERVER_FAULT_SLACK_NS: u64 = 3_000_000_000;

impl Analysis {
    fn new(actions: &[Stamped<Action>], workers: &[Worker]) -> Self {
        let mut killed_at = BTreeMap::new();
        let mut exited_at = BTreeMap::new();
        let mut paused: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
        let mut server_faults: Vec<(u64, u64)> = Vec::new();
        let run_start = actions.first().map_or(0, |a| a.t);
        let mut stopping = actions.last().map_or(0, |a| a.t);
        for a in actions {
            match &a.event {
                Action::KilledHolder { pid } | Action::Straggler { pid } => {
                    killed_at.entry(*pid).or_insert(a.t);
                }
                Action::Exited { pid, .. } => {
                    exited_at.insert(*pid, a.t);
                }
                Action::Paused { pid } => paused.entry(*pid).or_default().push((a.t, u64::MAX)),
                Action::Continued { pid } => {
                    if let Some(last) = paused.entry(*pid).or_default().last_mut() {
                        last.1 = a.t;
                    }
                }
                Action::Stopping => stopping = a.t,
                Action::ServersKilled { .. } | Action::ServersPaused { .. } => {
                    server_faults.push((a.t, u64::MAX));
                }
                Action::ServersStarted { .. } | Action::ServersResumed { .. } => {
                    if let Some(last) = server_faults.last_mut()
                        && last.1 == u64::MAX
                    {
                        last.1 = a.t.saturating_add(SERVER_FAULT_SLACK_NS);
                    }
                }
                _ => {}
            }
        }
        let mut this = Analysis {
            killed_at,
            exited_at,
            paused,
            run_start,
            stopping,
            holds: Vec::new(),
            writes: Vec::new(),
            writer_waits: Vec::new(),
            server_faults,
        };
        for w in workers {
            this.collect(w);
        }
        this
    }

    /// When `pid` stopped running for good (killed, or exited).
    fn died_at(&self, pid: u32) -> Option<u64> {
        self.killed_at
            .get(&pid)
            .or_else(|| self.exited_at.get(&pid))
            .copied()
    }

    fn paused_within(&self, pid: u32, from: u64, to: u64) -> bool {
        self.paused
            .get(&pid)
            .is_some_and(|spans| spans.iter().any(|(s, e)| *s < to && *e > from))
    }

    fn collect(&mut self, w: &Worker) {
        // The holds of the current grant: one, or one per member of a set.
        let mut current: Vec<usize> = Vec::new();
        let died = self.died_at(w.pid);
        // The access and the wait of the acquisition under way (`--rw`
        // runs).
        let mut access: Option<&str> = None;
        let mut wait_ns = u64::MAX;
        for e in &w.events {
            if access == Some("write") {
                let ended = match &e.event {
                    Event::Granted { started, .. } => Some((*started, e.t)),
                    Event::AcquireFailed { started, .. } => Some((
                        *started,
                        e.t.saturating_sub(GIVE_UP_SLACK_NS)
                            .min(started.saturating_add(wait_ns)),
                    )),
                    _ => None,
                };
                if let Some((started, ended)) = ended {
                    self.writer_waits.push(WriterWait {
                        pid: w.pid,
                        worker: w.id,
                        started,
                        ended,
                    });
                }
            }
            match &e.event {
                Event::Acquiring {
                    access: a, wait_ms, ..
                } => {
                    access = a.as_deref();
                    wait_ns = wait_ms.saturating_mul(1_000_000);
                }
                Event::Granted {
                    started,
                    token,
                    deadline,
                    lost_on_arrival,
                    slot,
                    members,
                } => {
                    let hold = |slot: Option<u32>, token: Option<u64>| Hold {
                        worker: w.id,
                        pid: w.pid,
                        started: *started,
                        granted: e.t,
                        token,
                        slot,
                        read: matches!(access, Some("read" | "upgradeable")),
                        upgradeable: access == Some("upgradeable"),
                        lost_on_arrival: lost_on_arrival.is_some(),
                        deadlines: vec![(e.t, *deadline)],
                        end: died,
                    };
                    current.clear();
                    if members.is_empty() {
                        self.holds.push(hold(*slot, *token));
                        current.push(self.holds.len() - 1);
                    }
                    for m in members {
                        self.holds.push(hold(Some(m.slot), m.token));
                        current.push(self.holds.len() - 1);
                    }
                }
                Event::Renewed { deadline } => {
                    for &h in &current {
                        self.holds[h].deadlines.push((e.t, *deadline));
                    }
                }
                Event::Upgraded { token } => {
                    // The read ends; the write begins, on the same lease.
                    let Some(&read) = current.first() else {
                        continue;
                    };
                    let mut write = self.holds[read].clone();
                    let hold = &mut self.holds[read];
                    hold.end = Some(hold.end.map_or(e.t, |end| end.min(e.t)));
                    write.started = e.t;
                    write.granted = e.t;
                    write.token = *token;
                    write.read = false;
                    write.upgradeable = false;
                    write.lost_on_arrival = false;
                    write.deadlines = write
                        .deadlines
                        .last()
                        .map(|&(_, d)| vec![(e.t, d)])
                        .unwrap_or_default();
                    self.holds.push(write);
                    current = vec![self.holds.len() - 1];
                }
                Event::Wrote {
                    seq,
                    at,
                    accepted,
                    slot,
                    ..
                } => {
                    // A set's write names its member; otherwise the one hold.
                    let hold = current
                        .iter()
                        .copied()
                        .find(|&h| slot.is_none() || self.holds[h].slot == *slot);
                    if let Some(h) = hold {
                        self.writes.push(Write {
                            hold: h,
                            seq: *seq,
                            at: *at,
                            accepted: *accepted,
                        });
                    }
                }
                Event::LossObserved { .. } | Event::Releasing { .. } => {
                    for &h in &current {
                        let hold = &mut self.holds[h];
                        hold.end = Some(hold.end.map_or(e.t, |end| end.min(e.t)));
                    }
                }
                Event::Released { .. } => current.clear(),
                _ => {}
            }
        }
    }

    fn report(mut self, actions: &[Stamped<Action>], workers: &[Worker]) -> Report {
        // Holds in grant order; writes refer to holds by index, so renumber.
        let mut order: Vec<usize> = (0..self.holds.len()).collect();
        order.sort_by_key(|&i| self.holds[i].granted);
        let mut new_index = vec![0; order.len()];
        for (new, &old) in order.iter().enumerate() {
            new_index[old] = new;
        }
        self.holds = order.iter().map(|&i| self.holds[i].clone()).collect();
        for w in &mut self.writes {
            w.hold = new_index[w.hold];
        }
        let mut r = Report::default();
        self.header(&mut r, actions, workers);
        r.grants = self.holds.len() as u64;
        self.groups(&mut r, actions, workers);
        r.writes = (
            self.writes.len() as u64,
            self.writes.iter().filter(|w| w.accepted).count() as u64,
        );
        self.exclusion(&mut r);
        self.tokens(&mut r);
        self.over_limit(&mut r);
        self.in_time(&mut r);
        self.writers(&mut r);
        self.liveness(&mut r, actions, workers);
        self.errors(&mut r, actions, workers);
        let election = actions
            .iter()
            .any(|a| matches!(a.event, Action::RunStarted { election: true, .. }));
        if election {
            let logs = |observer: bool| -> Vec<(u32, &[Stamped<Event>])> {
                workers
                    .iter()
                    .filter(|w| w.observer == observer)
                    .map(|w| (w.id, w.events.as_slice()))
                    .collect()
            };
            r.election = Some(crate::election::analyse(&logs(false), &logs(true)));
        }
        verdict(&mut r);
        r
    }

    fn header(&self, r: &mut Report, actions: &[Stamped<Action>], workers: &[Worker]) {
        for a in actions {
            match &a.event {
                Action::RunStarted {
                    url,
                    nemesis,
                    permits,
                    set,
                    rw,
                    ..
                } => {
                    r.url.clone_from(url);
                    r.nemesis.clone_from(nemesis);
                    r.permits = *permits;
                    r.set = *set;
                    r.rw = *rw;
                }
                other => {
                    let name = serde_json::to_value(other)
                        .ok()
                        .and_then(|v| v.get("action").and_then(|a| a.as_str().map(String::from)))
                        .unwrap_or_default();
                    if !matches!(
                        other,
                        Action::Spawned { .. } | Action::Exited { .. } | Action::Stopping
                    ) {
                        *r.actions.entry(name).or_default() += 1;
                    }
                }
            }
        }
        r.duration_s = ms(self.stopping.saturating_sub(self.run_start)) / 1e3;
        r.workers_started = workers.len() as u64;
        if let Some(Event::Started {
            backend,
            grade,
            fencing,
            sabotage,
            writers_first,
            upgradeable,
            ..
        }) = workers
            .iter()
            .flat_map(|w| &w.events)
            .map(|e| &e.event)
            .find(|e| matches!(e, Event::Started { .. }))
        {
            r.backend.clone_from(backend);
            r.grade.clone_from(grade);
            r.fencing.clone_from(fencing);
            r.sabotage.clone_from(sabotage);
            r.writers_first = *writers_first;
            r.upgradeable = *upgradeable;
        }
        if r.rw.is_some() {
            let upgrades = workers
                .iter()
                .flat_map(|w| &w.events)
                .filter(|e| matches!(e.event, Event::Upgraded { .. }))
                .count();
            r.upgrades = Some(upgrades as u64);
        }
    }

    fn groups(&self, r: &mut Report, actions: &[Stamped<Action>], workers: &[Worker]) {
        let mut group_of = BTreeMap::new();
        for w in workers {
            if let Some(Event::Started { group, url, .. }) = w
                .events
                .iter()
                .map(|e| &e.event)
                .find(|e| matches!(e, Event::Started { .. }))
            {
                group_of.insert(w.pid, format!("{group}: {url}"));
            }
        }
        for key in group_of.values() {
            r.groups.entry(key.clone()).or_default();
        }
        for h in &self.holds {
            if let Some(key) = group_of.get(&h.pid) {
                r.groups.entry(key.clone()).or_default().grants += 1;
            }
        }
        for a in actions {
            if let Action::KilledHolder { pid } = a.event
                && let Some(key) = group_of.get(&pid)
            {
                r.groups.entry(key.clone()).or_default().holder_kills += 1;
            }
        }
    }

    fn describe(&self, h: &Hold) -> String {
        let slot = h.slot.map(|s| format!(" slot {s}")).unwrap_or_default();
        format!(
            "worker {} (pid {}){slot} token {:?} granted at +{:.1} ms",
            h.worker,
            h.pid,
            h.token,
            ms(h.granted.saturating_sub(self.run_start))
        )
    }

    fn exclusion(&self, r: &mut Report) {
        let mut writes = self.writes.clone();
        // Each slot's register numbers its own writes.
        writes.sort_by_key(|w| (self.holds[w.hold].slot, w.seq));
        for (i, w) in writes.iter().enumerate() {
            let mine = &self.holds[w.hold];
            // A later grant (to someone else, of what this hold holds) that
            // happened before this write.
            let Some(newer) = self.holds.iter().find(|h| {
                h.contends(mine)
                    && h.granted > mine.granted
                    && h.granted < w.at
                    && h.pid != mine.pid
            }) else {
                continue;
            };
            let at = ms(w.at.saturating_sub(self.run_start));
            let example = || {
                format!(
                    "write #{} at +{at:.1} ms by {} after {}",
                    w.seq,
                    self.describe(mine),
                    self.describe(newer)
                )
            };
            if !w.accepted {
                r.exclusion.rejected.add(example);
            } else if writes[..i].iter().any(|earlier| {
                let theirs = &self.holds[earlier.hold];
                earlier.accepted && theirs.contends(mine) && theirs.granted > mine.granted
            }) {
                r.exclusion.fencing_failures.add(example);
            } else {
                r.exclusion.harmless.add(example);
            }
        }
        for w in &writes {
            let mine = &self.holds[w.hold];
            let newest = !self
                .holds
                .iter()
                .any(|h| h.contends(mine) && h.granted > mine.granted && h.granted < w.at);
            if newest && !w.accepted {
                r.newest_holder_rejected.add(|| {
                    format!(
                        "write #{} by the newest holder, {}",
                        w.seq,
                        self.describe(mine)
                    )
                });
            }
        }
    }

    fn tokens(&self, r: &mut Report) {
        // Per slot for permits (one sequence for a lock, and for the writes
        // of a reader-writer lock).
        let mut previous: BTreeMap<Option<u32>, &Hold> = BTreeMap::new();
        for h in &self.holds {
            if h.token.is_none() || h.read || self.paused_within(h.pid, h.started, h.granted) {
                continue;
            }
            if let Some(p) = previous.get(&h.slot)
                && h.token <= p.token
            {
                r.token_order
                    .add(|| format!("{} after {}", self.describe(h), self.describe(p)));
            }
            previous.insert(h.slot, h);
        }
        if let Some(limit) = r.permits {
            for h in self
                .holds
                .iter()
                .filter(|h| h.slot.is_none_or(|s| s >= limit))
            {
                r.slots_out_of_range
                    .add(|| format!("{} of a semaphore of {limit}", self.describe(h)));
            }
        }
        for h in &self.holds {
            if h.lost_on_arrival && !self.paused_within(h.pid, h.started, h.granted) {
                r.lost_on_arrival.add(|| {
                    format!(
                        "{} after waiting {:.1} ms",
                        self.describe(h),
                        ms(h.granted - h.started)
                    )
                });
            }
        }
    }

    /// Permit grants made while `limit` running holders of other processes
    /// still believed they held theirs: more than `limit` holders at once.
    fn over_limit(&self, r: &mut Report) {
        let Some(limit) = r.permits else {
            return;
        };
        for (i, h) in self.holds.iter().enumerate() {
            let believing = self.holds[..i]
                .iter()
                .filter(|e| {
                    e.pid != h.pid
                        && e.active_at(h.granted)
                        && e.deadline_at(h.granted).is_none_or(|d| d > h.granted)
                        && !self.paused_within(e.pid, e.granted, h.granted)
                })
                .count();
            if believing >= limit as usize {
                r.over_limit.add(|| {
                    format!(
                        "{} while {believing} running holders still believed they held theirs",
                        self.describe(h)
                    )
                });
            }
        }
    }

    fn in_time(&self, r: &mut Report) {
        for (i, h) in self.holds.iter().enumerate() {
            for e in &self.holds[..i] {
                if e.pid == h.pid || !e.contends(h) || !e.active_at(h.granted) {
                    continue;
                }
                let believes = e.deadline_at(h.granted).is_none_or(|d| d > h.granted);
                if !believes {
                    continue;
                }
                let example = || {
                    let left = e
                        .deadline_at(h.granted)
                        .map(|d| format!("{:.1} ms", ms(d - h.granted)))
                        .unwrap_or_else(|| "no deadline".to_string());
                    format!(
                        "{} while {} still held it ({left} left)",
                        self.describe(h),
                        self.describe(e)
                    )
                };
                if self.paused_within(e.pid, e.granted, h.granted) {
                    r.in_time.paused.add(example);
                } else {
                    r.in_time.running.add(example);
                }
            }
        }
    }

    /// A reader-writer run's readers and writers: each read's token
    /// against the writes granted before it was asked for, readers let in
    /// ahead of a waiting writer, and the longest writer wait against the
    /// longest hold.
    fn writers(&self, r: &mut Report) {
        if r.rw.is_none() {
            return;
        }
        for read in self.holds.iter().filter(|h| h.read && h.token.is_some()) {
            if self.paused_within(read.pid, read.started, read.granted) {
                continue;
            }
            let before = self
                .holds
                .iter()
                .filter(|w| !w.read && w.granted < read.started)
                .max_by_key(|w| w.token);
            if let Some(w) = before
                && w.token > read.token
            {
                r.read_tokens.add(|| {
                    format!(
                        "read {} after write {}",
                        self.describe(read),
                        self.describe(w)
                    )
                });
            }
        }
        for wait in &self.writer_waits {
            if self.paused_within(wait.pid, wait.started, wait.ended) {
                continue;
            }
            // A server fault between the writer's start and the reader's:
            // their requests reached the servers in no promised order.
            let faulted = |from: u64, to: u64| {
                self.server_faults
                    .iter()
                    .any(|&(start, end)| start < to && end > from)
            };
            let overtook = self.holds.iter().find(|h| {
                h.read
                    && h.pid != wait.pid
                    && h.started > wait.started + WRITER_MARK_SLACK_NS
                    && h.granted < wait.ended
                    && !faulted(wait.started, h.started)
            });
            if let Some(reader) = overtook {
                r.writer_starvation.add(|| {
                    format!(
                        "reader {} while worker {} (pid {}) waited to write from +{:.1} ms to +{:.1} ms",
                        self.describe(reader),
                        wait.worker,
                        wait.pid,
                        ms(wait.started.saturating_sub(self.run_start)),
                        ms(wait.ended.saturating_sub(self.run_start))
                    )
                });
            }
        }
        r.writer_wait_longest_ms = self
            .writer_waits
            .iter()
            .map(|w| ms(w.ended.saturating_sub(w.started)))
            .reduce(f64::max);
        r.hold_longest_ms = self
            .holds
            .iter()
            .filter_map(|h| h.end.map(|end| ms(end.saturating_sub(h.granted))))
            .reduce(f64::max);
    }

    fn liveness(&self, r: &mut Report, actions: &[Stamped<Action>], workers: &[Worker]) {
        let first_start = workers
            .iter()
            .filter_map(|w| w.events.first().map(|e| e.t))
            .min()
            .unwrap_or(self.run_start);
        let mut last = first_start;
        let mut gap = 0;
        for h in self.holds.iter().filter(|h| h.granted <= self.stopping) {
            gap = gap.max(h.granted.saturating_sub(last));
            last = h.granted;
        }
        gap = gap.max(self.stopping.saturating_sub(last));
        r.liveness.longest_gap_ms = ms(gap);
        for a in actions {
            if let Action::KilledHolder { .. } = a.event {
                r.liveness.holder_kills += 1;
                let next = self
                    .holds
                    .iter()
                    .find(|h| h.granted > a.t)
                    .map_or(self.stopping, |h| h.granted);
                r.liveness.kill_to_grant_max_ms = r
                    .liveness
                    .kill_to_grant_max_ms
                    .max(ms(next.saturating_sub(a.t)));
            }
        }
        let whole_run: Vec<u64> = workers
            .iter()
            .filter(|w| {
                !w.observer
                    && !self.killed_at.contains_key(&w.pid)
                    && w.events
                        .first()
                        .is_some_and(|e| e.t <= self.run_start + 5_000_000_000)
            })
            .map(|w| self.holds.iter().filter(|h| h.pid == w.pid).count() as u64)
            .collect();
        r.liveness.grants_per_worker = (
            whole_run.iter().copied().min().unwrap_or(0),
            whole_run.iter().copied().max().unwrap_or(0),
        );
        for w in workers {
            self.hangs(r, w);
        }
        for a in actions {
            if let Action::Straggler { pid } = a.event {
                r.liveness
                    .hangs
                    .add(|| format!("pid {pid} had not finished when the run ended"));
            }
        }
    }

    fn hangs(&self, r: &mut Report, w: &Worker) {
        let mut acquiring: Option<(u64, u64)> = None;
        for e in &w.events {
            match &e.event {
                Event::Acquiring { wait_ms, .. } => acquiring = Some((e.t, *wait_ms)),
                Event::Granted { started, .. } | Event::AcquireFailed { started, .. } => {
                    if let Some((s, wait_ms)) = acquiring.take() {
                        let took = e.t.saturating_sub(*started);
                        if took > wait_ms * 1_000_000 + HANG_SLACK_NS
                            && !self.paused_within(w.pid, s, e.t)
                        {
                            r.liveness.hangs.add(|| {
                                format!(
                                    "worker {} acquire took {:.0} ms with a {wait_ms} ms wait",
                                    w.id,
                                    ms(took)
                                )
                            });
                        }
                    }
                }
                Event::Released {
                    how: HoldEnd::Release,
                    started,
                    ..
                } => {
                    let took = e.t.saturating_sub(*started);
                    if took > HANG_SLACK_NS && !self.paused_within(w.pid, *started, e.t) {
                        r.liveness
                            .hangs
                            .add(|| format!("worker {} release took {:.0} ms", w.id, ms(took)));
                    }
                }
                _ => {}
            }
        }
    }

    fn errors(&self, r: &mut Report, actions: &[Stamped<Action>], workers: &[Worker]) {
        for e in workers.iter().flat_map(|w| &w.events) {
            match &e.event {
                Event::AcquireFailed { kind, .. } => {
                    *r.acquire_errors.entry(kind.clone()).or_default() += 1;
                }
                Event::Released {
                    error: Some(error), ..
                } => r.release_errors.add(|| error.clone()),
                _ => {}
            }
        }
        for a in actions {
            if let Action::Exited {
                worker,
                code,
                signal,
                by_controller: false,
                ..
            } = &a.event
                && *code != Some(0)
            {
                r.crashes.add(|| {
                    format!("worker {worker} exited with code {code:?}, signal {signal:?}")
                });
            }
        }
    }
}

/// Fill `failures`: what exceeds the capabilities the workers reported.
fn verdict(r: &mut Report) {
    let safe = r.fencing == "Safe";
    let correctness = r.grade == "Correctness";
    if r.backend.is_empty() {
        r.failures.push("no worker connected to the backend".into());
    }
    if r.grants == 0 {
        r.failures.push("no grant during the whole run".into());
    }
    // (whether the capabilities promise it, how often it happened, what).
    let broken = [
        (
            safe,
            r.exclusion.fencing_failures.count,
            "writes accepted after a newer holder's write, with fencing Safe",
        ),
        (
            safe,
            r.token_order.count,
            "grants whose token did not increase, with fencing Safe",
        ),
        (
            safe,
            r.newest_holder_rejected.count,
            "writes of the newest holder refused (tokens went backwards), with fencing Safe",
        ),
        (
            correctness,
            r.in_time.running.count,
            "grants while a running earlier holder still believed it held the lock, on a \
             correctness-grade backend",
        ),
        (
            correctness,
            r.lost_on_arrival.count,
            "grants already lost on arrival, on a correctness-grade backend",
        ),
        (
            true,
            r.slots_out_of_range.count,
            "permits without a slot or on a slot at or above the limit",
        ),
        (
            correctness,
            r.over_limit.count,
            "permits granted while the limit's worth of running holders still believed they \
             held theirs, on a correctness-grade backend",
        ),
        (
            r.writers_first == Some(true),
            r.writer_starvation.count,
            "readers let in ahead of a writer that was already waiting, where the backend \
             promises writer preference",
        ),
        (
            safe,
            r.read_tokens.count,
            "reads carrying a token below an earlier write's, with fencing Safe",
        ),
        (true, r.liveness.hangs.count, "hangs"),
        (true, r.crashes.count, "workers crashed"),
    ];
    if let Some(e) = &r.election {
        // `observe` promises both on every backend.
        if e.terms_backwards.count > 0 {
            r.failures.push(format!(
                "{} observed terms lower than one seen before",
                e.terms_backwards.count
            ));
        }
        if e.unpublished.count > 0 {
            r.failures.push(format!(
                "{} observed states no leader published",
                e.unpublished.count
            ));
        }
        if e.observe_errors_not_transient.count > 0 {
            r.failures.push(format!(
                "{} observer errors that were not transient",
                e.observe_errors_not_transient.count
            ));
        }
        if e.observers == 0 || e.observations == 0 {
            r.failures.push("no observer logged a state".into());
        }
    }
    for (promised, count, what) in broken {
        if promised && count > 0 {
            r.failures.push(format!("{count} {what}"));
        }
    }
}

fn finding(f: &mut fmt::Formatter<'_>, label: &str, finding: &Finding) -> fmt::Result {
    writeln!(f, "  {label:<58} {}", finding.count)?;
    for e in &finding.examples {
        writeln!(f, "      e.g. {e}")?;
    }
    Ok(())
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "lock-check: {}{} ({}, fencing {}) under {}{} for {:.1} s — {}",
            self.backend,
            self.permits
                .map(|n| format!(", permits of {n}"))
                .or_else(|| self
                    .set
                    .map(|k| format!(", sets of {k} of {} names", 2 * k)))
                .or_else(|| self
                    .rw
                    .map(|share| format!(", reader-writer lock, {:.0} % reads", share * 100.0)))
                .unwrap_or_default(),
            self.grade,
            self.fencing,
            self.nemesis,
            self.sabotage
                .as_ref()
                .map(|s| format!(", sabotage {s}"))
                .unwrap_or_default(),
            self.duration_s,
            if self.passed() { "PASS" } else { "FAIL" }
        )?;
        writeln!(f, "  url {}", self.url)?;
        writeln!(
            f,
            "  workers started {}, grants {}, writes {} ({} accepted), nemesis actions {:?}",
            self.workers_started, self.grants, self.writes.0, self.writes.1, self.actions
        )?;
        if self.groups.len() > 1 {
            for (group, counts) in &self.groups {
                writeln!(
                    f,
                    "  group {group}: grants {}, holder kills {}",
                    counts.grants, counts.holder_kills
                )?;
            }
        }
        writeln!(f, "exclusion (writes after a later grant)")?;
        finding(f, "refused by the register", &self.exclusion.rejected)?;
        finding(
            f,
            "accepted, newer holder had not written",
            &self.exclusion.harmless,
        )?;
        finding(
            f,
            "accepted after a newer holder's write (fencing failure)",
            &self.exclusion.fencing_failures,
        )?;
        writeln!(f, "fencing tokens")?;
        finding(f, "grants whose token did not increase", &self.token_order)?;
        finding(
            f,
            "newest holder's writes refused",
            &self.newest_holder_rejected,
        )?;
        writeln!(f, "loss signalled in time")?;
        finding(
            f,
            "earlier holder running, still believing",
            &self.in_time.running,
        )?;
        finding(
            f,
            "earlier holder paused, still believing",
            &self.in_time.paused,
        )?;
        finding(f, "grants already lost on arrival", &self.lost_on_arrival)?;
        if self.permits.is_some() {
            finding(
                f,
                "permits without a slot below the limit",
                &self.slots_out_of_range,
            )?;
            finding(
                f,
                "permits beyond the limit (running holders)",
                &self.over_limit,
            )?;
        }
        if let Some(share) = self.rw {
            writeln!(
                f,
                "readers and writers ({:.0} % reads; writer preference {})",
                share * 100.0,
                self.writers_first.map_or("unknown", |w| if w {
                    "promised"
                } else {
                    "not promised"
                })
            )?;
            finding(
                f,
                "readers let in ahead of a waiting writer",
                &self.writer_starvation,
            )?;
            finding(f, "reads below an earlier write's token", &self.read_tokens)?;
            if self.upgradeable == Some(true) {
                writeln!(
                    f,
                    "  upgrades of an upgradeable read {}",
                    self.upgrades.unwrap_or(0)
                )?;
            }
            writeln!(
                f,
                "  longest writer wait {:.0} ms; longest hold {:.0} ms",
                self.writer_wait_longest_ms.unwrap_or(0.0),
                self.hold_longest_ms.unwrap_or(0.0)
            )?;
        }
        writeln!(f, "liveness")?;
        writeln!(
            f,
            "  longest time without a grant {:.0} ms; holder kills {}, kill to next grant ≤ {:.0} ms; grants per worker {}–{}",
            self.liveness.longest_gap_ms,
            self.liveness.holder_kills,
            self.liveness.kill_to_grant_max_ms,
            self.liveness.grants_per_worker.0,
            self.liveness.grants_per_worker.1
        )?;
        finding(f, "hangs", &self.liveness.hangs)?;
        writeln!(f, "errors")?;
        writeln!(f, "  acquire errors by kind {:?}", self.acquire_errors)?;
        finding(f, "release errors", &self.release_errors)?;
        finding(f, "worker crashes", &self.crashes)?;
        if let Some(e) = &self.election {
            writeln!(f, "election (what the observers saw)")?;
            writeln!(
                f,
                "  observers {}, states seen {}, terms seen {} of {} granted, proclaims {} ({} published), observe errors {:?}",
                e.observers,
                e.observations,
                e.terms_seen.0,
                e.terms_seen.1,
                e.proclaims.0,
                e.proclaims.1,
                e.observe_errors
            )?;
            finding(f, "terms going back", &e.terms_backwards)?;
            finding(f, "states no leader published", &e.unpublished)?;
            finding(
                f,
                "observer errors not transient",
                &e.observe_errors_not_transient,
            )?;
        }
        if self.passed() {
            writeln!(f, "verdict: PASS (within what the capabilities allow)")
        } else {
            writeln!(f, "verdict: FAIL")?;
            for failure in &self.failures {
                writeln!(f, "  - {failure}")?;
            }
            Ok(())
        }
    }
}

/// A Markdown table of several runs' reports, one row per run.
pub fn table(runs: &[(String, Report)]) -> String {
    let mut out = String::from(
        "| run | backend | nemesis | s | grants | faults | refused | harmless | fencing failures | token order | newest refused | in time: running / paused | lost on arrival | longest gap (ms) | hangs | acquire errors | observers: terms back / unpublished | reader-writer: low reads / readers ahead of a waiting writer / longest writer wait ÷ longest hold (ms) / upgrades | verdict |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (label, r) in runs {
        let faults: u64 = r.actions.values().sum();
        let errors: Vec<String> = r
            .acquire_errors
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        out.push_str(&format!(
            "| {label} | {} ({}, {}) | {} | {:.0} | {} | {faults} | {} | {} | {} | {} | {} | {} / {} | {} | {:.0} | {} | {} | {} | {} | {} |\n",
            r.backend,
            r.grade,
            r.fencing,
            r.nemesis,
            r.duration_s,
            r.grants,
            r.exclusion.rejected.count,
            r.exclusion.harmless.count,
            r.exclusion.fencing_failures.count,
            r.token_order.count,
            r.newest_holder_rejected.count,
            r.in_time.running.count,
            r.in_time.paused.count,
            r.lost_on_arrival.count,
            r.liveness.longest_gap_ms,
            r.liveness.hangs.count,
            if errors.is_empty() { "–".to_string() } else { errors.join(", ") },
            r.election.as_ref().map_or_else(
                || "–".to_string(),
                |e| format!("{} / {}", e.terms_backwards.count, e.unpublished.count)
            ),
            rw_cell(r),
            if r.passed() { "pass" } else { "**FAIL**" },
        ));
    }
    out
}

/// The reader-writer figures of a `--rw` run for [`table`]: reads below an
/// earlier write's token, readers let in ahead of a waiting writer, the
/// longest writer wait against the longest hold, and the upgrades where
/// the backend offers them; "–" for other runs.
fn rw_cell(r: &Report) -> String {
    if r.rw.is_none() {
        return "–".to_string();
    }
    let ms = |v: Option<f64>| v.map_or_else(|| "–".to_string(), |v| format!("{v:.0}"));
    let upgrades = match (r.upgradeable, r.upgrades) {
        (Some(true), Some(n)) => n.to_string(),
        _ => "–".to_string(),
    };
    format!(
        "{} / {} / {} ÷ {} / {upgrades}",
        r.read_tokens.count,
        r.writer_starvation.count,
        ms(r.writer_wait_longest_ms),
        ms(r.hold_longest_ms),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventLog;

    const S: u64 = 1_000_000_000;

    fn started(worker: u32, pid: u32) -> Event {
        Event::Started {
            worker,
            pid,
            group: 0,
            url: "test://".into(),
            backend: "test".into(),
            grade: "Correctness".into(),
            fencing: "Safe".into(),
            crash_release: "Ttl".into(),
            fair_queue: false,
            sabotage: None,
            writers_first: Some(true),
            upgradeable: None,
        }
    }

    fn granted(token: u64, deadline: u64) -> Event {
        Event::Granted {
            started: 0,
            token: Some(token),
            deadline: Some(deadline),
            lost_on_arrival: None,
            slot: None,
            members: Vec::new(),
        }
    }

    fn wrote(token: u64, seq: u64, at: u64, accepted: bool) -> Event {
        Event::Wrote {
            token: Some(token),
            seq,
            at,
            accepted,
            highest: None,
            slot: None,
        }
    }

    /// Worker 0 (pid 100) holds token 1 until 10 s, but worker 1 (pid 101)
    /// is granted token 2 at 5 s and writes; worker 0 writes after it.
    fn history(dir: &Path, accepted_late_write: bool, pause: bool) -> std::io::Result<Report> {
        history_of(dir, accepted_late_write, pause, None)
    }

    /// [`history`], as permits of a semaphore of `limit` on `slots`
    /// (worker 0's, worker 1's) if given.
    fn history_of(
        dir: &Path,
        accepted_late_write: bool,
        pause: bool,
        permits: Option<(u32, [u32; 2])>,
    ) -> std::io::Result<Report> {
        let slots = permits.map(|(_, slots)| slots);
        let on = |worker: usize, event: Event| match (event, slots) {
            (
                Event::Granted {
                    started,
                    token,
                    deadline,
                    lost_on_arrival,
                    ..
                },
                Some(slots),
            ) => Event::Granted {
                started,
                token,
                deadline,
                lost_on_arrival,
                slot: Some(slots[worker]),
                members: Vec::new(),
            },
            (event, _) => event,
        };
        let c = EventLog::create(&dir.join(files::CONTROLLER_LOG))?;
        c.log_at(
            0,
            &Action::RunStarted {
                url: "test://".into(),
                nemesis: "none".into(),
                workers: 2,
                ttl_ms: 10_000,
                wait_ms: 5_000,
                duration_ms: 20_000,
                election: false,
                observers: 0,
                permits: permits.map(|(limit, _)| limit),
                set: None,
                rw: None,
            },
        )?;
        c.log_at(
            1,
            &Action::Spawned {
                worker: 0,
                pid: 100,
                observer: false,
            },
        )?;
        c.log_at(
            2,
            &Action::Spawned {
                worker: 1,
                pid: 101,
                observer: false,
            },
        )?;
        if pause {
            c.log_at(3 * S, &Action::Paused { pid: 100 })?;
            c.log_at(7 * S, &Action::Continued { pid: 100 })?;
        }
        c.log_at(20 * S, &Action::Stopping)?;
        let w0 = EventLog::create(&dir.join(files::worker_log(0)))?;
        w0.log_at(10, &started(0, 100))?;
        w0.log_at(S, &on(0, granted(1, 10 * S)))?;
        w0.log_at(S + 1, &wrote(1, 1, S + 1, true))?;
        w0.log_at(8 * S, &wrote(1, 3, 8 * S, accepted_late_write))?;
        w0.log_at(
            9 * S,
            &Event::Releasing {
                how: HoldEnd::Release,
            },
        )?;
        let w1 = EventLog::create(&dir.join(files::worker_log(1)))?;
        w1.log_at(10, &started(1, 101))?;
        w1.log_at(5 * S, &on(1, granted(2, 15 * S)))?;
        w1.log_at(6 * S, &wrote(2, 2, 6 * S, true))?;
        w1.log_at(
            7 * S,
            &Event::Releasing {
                how: HoldEnd::Release,
            },
        )?;
        analyse(dir)
    }

    #[test]
    fn an_overlapping_holder_is_found_and_its_late_write_classified() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let r = history(dir.path(), false, false)?;
        assert_eq!(r.grants, 2);
        assert_eq!(r.in_time.running.count, 1);
        assert_eq!(r.in_time.paused.count, 0);
        assert_eq!(r.exclusion.rejected.count, 1);
        assert_eq!(r.exclusion.fencing_failures.count, 0);
        assert_eq!(r.token_order.count, 0);
        assert!(!r.passed(), "{r}");

        let dir = tempfile::tempdir()?;
        let r = history(dir.path(), true, true)?;
        assert_eq!(r.in_time.running.count, 0);
        assert_eq!(r.in_time.paused.count, 1);
        assert_eq!(r.exclusion.fencing_failures.count, 1);
        assert!(!r.passed(), "{r}");
        Ok(())
    }

    /// The same history as permits: on two slots, the overlap is what a
    /// semaphore of two allows; on one slot it is caught as for a lock;
    /// with a limit of one it is a grant beyond the limit; a slot at the
    /// limit is caught too.
    #[test]
    fn permits_contend_per_slot() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let r = history_of(dir.path(), true, false, Some((2, [0, 1])))?;
        assert_eq!(r.permits, Some(2));
        assert_eq!(r.in_time.running.count, 0, "{r}");
        assert_eq!(r.exclusion.fencing_failures.count, 0, "{r}");
        assert_eq!(r.exclusion.harmless.count, 0, "{r}");
        assert!(r.passed(), "{r}");

        let dir = tempfile::tempdir()?;
        let r = history_of(dir.path(), false, false, Some((2, [1, 1])))?;
        assert_eq!(r.in_time.running.count, 1, "{r}");
        assert_eq!(r.exclusion.rejected.count, 1, "{r}");
        assert!(!r.passed(), "{r}");
        assert_eq!(
            r.over_limit.count, 0,
            "one holder believing of a limit of 2: {r}"
        );

        let dir = tempfile::tempdir()?;
        let r = history_of(dir.path(), true, false, Some((1, [0, 0])))?;
        assert_eq!(r.over_limit.count, 1, "{r}");
        assert!(!r.passed(), "{r}");

        let dir = tempfile::tempdir()?;
        let r = history_of(dir.path(), true, false, Some((2, [0, 2])))?;
        assert_eq!(r.slots_out_of_range.count, 1, "{r}");
        assert!(!r.passed(), "{r}");
        Ok(())
    }

    /// Lock sets: worker 0 holds names 0 and 1 (tokens 1, 1) until 10 s;
    /// worker 1 is granted names 1 and 2 (tokens 2, 1) at 5 s and writes
    /// name 1; worker 0 writes names 0 and 1 after it: only name 1's late
    /// write is an overlap (refused by its register), name 0's is fine.
    #[test]
    fn set_members_contend_per_name() -> std::io::Result<()> {
        use crate::event::Member;
        let dir = tempfile::tempdir()?;
        let dir = dir.path();
        let set = |members: &[(u32, u64)], deadline: u64| Event::Granted {
            started: 0,
            token: None,
            deadline: Some(deadline),
            lost_on_arrival: None,
            slot: None,
            members: members
                .iter()
                .map(|&(slot, token)| Member {
                    slot,
                    token: Some(token),
                })
                .collect(),
        };
        let wrote_on = |slot: u32, token: u64, seq: u64, at: u64, accepted: bool| Event::Wrote {
            token: Some(token),
            seq,
            at,
            accepted,
            highest: None,
            slot: Some(slot),
        };
        let c = EventLog::create(&dir.join(files::CONTROLLER_LOG))?;
        c.log_at(
            0,
            &Action::RunStarted {
                url: "test://".into(),
                nemesis: "none".into(),
                workers: 2,
                ttl_ms: 10_000,
                wait_ms: 5_000,
                duration_ms: 20_000,
                election: false,
                observers: 0,
                permits: None,
                set: Some(2),
                rw: None,
            },
        )?;
        for (worker, pid) in [(0, 100), (1, 101)] {
            c.log_at(
                1 + u64::from(worker),
                &Action::Spawned {
                    worker,
                    pid,
                    observer: false,
                },
            )?;
        }
        c.log_at(20 * S, &Action::Stopping)?;
        let w0 = EventLog::create(&dir.join(files::worker_log(0)))?;
        w0.log_at(10, &started(0, 100))?;
        w0.log_at(S, &set(&[(0, 1), (1, 1)], 10 * S))?;
        w0.log_at(8 * S, &wrote_on(0, 1, 1, 8 * S, true))?;
        w0.log_at(8 * S + 1, &wrote_on(1, 1, 2, 8 * S + 1, false))?;
        let release = Event::Releasing {
            how: HoldEnd::Release,
        };
        w0.log_at(9 * S, &release)?;
        let w1 = EventLog::create(&dir.join(files::worker_log(1)))?;
        w1.log_at(10, &started(1, 101))?;
        w1.log_at(5 * S, &set(&[(1, 2), (2, 1)], 15 * S))?;
        w1.log_at(6 * S, &wrote_on(1, 2, 1, 6 * S, true))?;
        w1.log_at(7 * S, &release)?;
        let r = analyse(dir)?;
        assert_eq!(r.set, Some(2));
        assert_eq!(r.grants, 4, "a hold per member: {r}");
        assert_eq!(r.exclusion.rejected.count, 1, "{r}");
        assert_eq!(r.in_time.running.count, 1, "{r}");
        assert_eq!(r.token_order.count, 0, "{r}");
        assert!(!r.passed(), "{r}");
        Ok(())
    }

    /// A reader-writer run: worker 0 reads from 1 s to 9 s and worker 1
    /// from 2 s to 3 s (together); worker 2 asks to write at 2.5 s and is
    /// granted at `written`; worker 3 asks to read at 4 s, after the
    /// writer, and is let in at 5 s while the writer still waits.
    fn rw_history(dir: &Path, written: u64, server_fault: bool) -> std::io::Result<Report> {
        let c = EventLog::create(&dir.join(files::CONTROLLER_LOG))?;
        c.log_at(
            0,
            &Action::RunStarted {
                url: "test://".into(),
                nemesis: "none".into(),
                workers: 4,
                ttl_ms: 10_000,
                wait_ms: 10_000,
                duration_ms: 20_000,
                election: false,
                observers: 0,
                permits: None,
                set: None,
                rw: Some(0.5),
            },
        )?;
        // (access, asked, granted, token, released)
        let holds = [
            ("read", S / 2, S, 1, 9 * S),
            ("read", 2 * S, 2 * S, 1, 3 * S),
            ("write", 5 * S / 2, written, 2, written + S / 2),
            ("read", 4 * S, 5 * S, 1, 6 * S),
        ];
        for (worker, &(access, asked, granted, token, released)) in holds.iter().enumerate() {
            let (worker, pid) = (worker as u32, 100 + worker as u32);
            c.log_at(
                1 + u64::from(worker),
                &Action::Spawned {
                    worker,
                    pid,
                    observer: false,
                },
            )?;
            let w = EventLog::create(&dir.join(files::worker_log(worker)))?;
            w.log_at(10, &started(worker, pid))?;
            w.log_at(
                asked,
                &Event::Acquiring {
                    wait_ms: 10_000,
                    end: HoldEnd::Release,
                    value: None,
                    access: Some(access.into()),
                },
            )?;
            w.log_at(
                granted,
                &Event::Granted {
                    started: asked,
                    token: Some(token),
                    deadline: Some(released + 5 * S),
                    lost_on_arrival: None,
                    slot: None,
                    members: Vec::new(),
                },
            )?;
            w.log_at(
                released,
                &Event::Releasing {
                    how: HoldEnd::Release,
                },
            )?;
        }
        if server_fault {
            let servers = vec!["zk".to_string()];
            c.log_at(
                3 * S,
                &Action::ServersKilled {
                    servers: servers.clone(),
                },
            )?;
            c.log_at(7 * S / 2, &Action::ServersStarted { servers })?;
        }
        c.log_at(20 * S, &Action::Stopping)?;
        analyse(dir)
    }

    /// A reader-writer run with an upgrade: worker 0 takes an upgradeable
    /// read at 1 s (token 1), upgrades at 3 s (token 2) and releases at
    /// 4 s; worker 1 reads from 1.5 s to 2.5 s; worker 2 reads from
    /// `read_at` for half a second. With `second`, worker 3 takes another
    /// upgradeable read from 2 s to 2.2 s.
    fn upgrade_history(dir: &Path, read_at: u64, second: bool) -> std::io::Result<Report> {
        let c = EventLog::create(&dir.join(files::CONTROLLER_LOG))?;
        c.log_at(
            0,
            &Action::RunStarted {
                url: "test://".into(),
                nemesis: "none".into(),
                workers: 4,
                ttl_ms: 10_000,
                wait_ms: 10_000,
                duration_ms: 20_000,
                election: false,
                observers: 0,
                permits: None,
                set: None,
                rw: Some(0.5),
            },
        )?;
        // (access, granted, token, upgraded, released)
        let mut holds = vec![
            ("upgradeable", S, 1, Some((3 * S, 2)), 4 * S),
            ("read", 3 * S / 2, 1, None, 5 * S / 2),
            ("read", read_at, 2, None, read_at + S / 2),
        ];
        if second {
            holds.push(("upgradeable", 2 * S, 1, None, 22 * S / 10));
        }
        for (worker, &(access, granted, token, upgraded, released)) in holds.iter().enumerate() {
            let (worker, pid) = (worker as u32, 100 + worker as u32);
            c.log_at(
                1 + u64::from(worker),
                &Action::Spawned {
                    worker,
                    pid,
                    observer: false,
                },
            )?;
            let w = EventLog::create(&dir.join(files::worker_log(worker)))?;
            w.log_at(10, &started(worker, pid))?;
            w.log_at(
                granted - 1,
                &Event::Acquiring {
                    wait_ms: 10_000,
                    end: HoldEnd::Release,
                    value: None,
                    access: Some(access.into()),
                },
            )?;
            w.log_at(
                granted,
                &Event::Granted {
                    started: granted - 1,
                    token: Some(token),
                    deadline: Some(released + 5 * S),
                    lost_on_arrival: None,
                    slot: None,
                    members: Vec::new(),
                },
            )?;
            if let Some((at, token)) = upgraded {
                w.log_at(at, &Event::Upgraded { token: Some(token) })?;
            }
            w.log_at(
                released,
                &Event::Releasing {
                    how: HoldEnd::Release,
                },
            )?;
        }
        c.log_at(20 * S, &Action::Stopping)?;
        analyse(dir)
    }

    /// An upgradeable read shares with readers until its upgrade; from the
    /// upgrade on it is a write with its new token, and a reader beside it
    /// is an overlap; two upgradeable readers at once are one too.
    #[test]
    fn an_upgrade_ends_a_read_and_begins_a_write() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let r = upgrade_history(dir.path(), 9 * S / 2, false)?;
        assert_eq!(r.grants, 4, "the upgrade is a hold of its own: {r}");
        assert_eq!(r.in_time.running.count, 0, "{r}");
        assert_eq!(r.token_order.count, 0, "{r}");
        assert_eq!(r.read_tokens.count, 0, "{r}");
        assert!(r.passed(), "{r}");

        let dir = tempfile::tempdir()?;
        let r = upgrade_history(dir.path(), 7 * S / 2, false)?;
        assert!(
            r.in_time.running.count >= 1,
            "a reader beside the upgraded writer: {r}"
        );
        assert!(!r.passed(), "{r}");

        let dir = tempfile::tempdir()?;
        let r = upgrade_history(dir.path(), 9 * S / 2, true)?;
        assert!(
            r.in_time.running.count >= 1,
            "two upgradeable readers at once: {r}"
        );
        assert!(!r.passed(), "{r}");
        Ok(())
    }

    /// Readers together are no overlap; a reader let in ahead of a writer
    /// already waiting is, where writer preference is promised; a writer
    /// granted beside a running reader is an overlap.
    #[test]
    fn readers_share_writers_contend_and_readers_ahead_of_a_writer_are_found() -> std::io::Result<()>
    {
        let dir = tempfile::tempdir()?;
        let r = rw_history(dir.path(), 19 * S / 2, false)?;
        assert_eq!(r.rw, Some(0.5));
        assert_eq!(r.grants, 4, "{r}");
        assert_eq!(r.in_time.running.count, 0, "readers share: {r}");
        assert_eq!(r.token_order.count, 0, "{r}");
        assert_eq!(r.read_tokens.count, 0, "{r}");
        assert_eq!(r.writer_starvation.count, 1, "{r}");
        assert!(
            r.writer_wait_longest_ms.is_some_and(|w| w >= 7_000.0),
            "{r}"
        );
        assert!(!r.passed(), "{r}");

        let dir = tempfile::tempdir()?;
        let r = rw_history(dir.path(), 5 * S / 2 + 1, false)?;
        assert!(r.in_time.running.count >= 1, "a writer beside readers: {r}");
        assert_eq!(r.writer_starvation.count, 0, "{r}");
        assert!(
            r.read_tokens.count >= 1,
            "a read after write 2 carried 1: {r}"
        );
        assert!(!r.passed(), "{r}");

        // A server killed between the writer's ask and the reader's: their
        // requests reached it in no promised order.
        let dir = tempfile::tempdir()?;
        let r = rw_history(dir.path(), 19 * S / 2, true)?;
        assert_eq!(r.writer_starvation.count, 0, "{r}");
        Ok(())
    }

    /// The table shows a reader-writer run's figures in a column of their
    /// own, and "–" there for other runs.
    #[test]
    fn the_table_shows_the_reader_writer_figures() {
        let mut rw = Report {
            rw: Some(0.5),
            upgradeable: Some(true),
            upgrades: Some(3),
            writer_wait_longest_ms: Some(812.4),
            hold_longest_ms: Some(2400.0),
            ..Report::default()
        };
        rw.writer_starvation.count = 2;
        let table = table(&[
            ("rw-x".to_string(), rw),
            ("x".to_string(), Report::default()),
        ]);
        let rows: Vec<&str> = table.lines().collect();
        let columns = |row: &str| row.split(" | ").count();
        assert_eq!(columns(rows[0]), columns(rows[2]), "{table}");
        assert!(rows[2].contains("| 0 / 2 / 812 ÷ 2400 / 3 |"), "{table}");
        assert!(
            rows[3].contains("| – | – | pass |") || rows[3].contains("| – | – | **FAIL** |"),
            "{table}"
        );
    }
}
