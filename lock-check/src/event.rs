//! What the processes of a run record: worker events and controller
//! actions, each stamped with [`now_ns`], one JSON
//! object per line in a per-process append-only file.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, Write};
use std::path::Path;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::clock::now_ns;

/// How a worker ends a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldEnd {
    /// `guard.release()`.
    Release,
    /// Dropping the guard (released in the background).
    Drop,
    /// Acquired without auto-renewal and kept until the lease runs out.
    Expire,
}

/// A lock set's member as a worker logs it ([`Event::Granted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The name's index in the run's pool (its register's slot).
    pub slot: u32,
    /// Its fencing token.
    pub token: Option<u64>,
}

/// One thing a worker did or saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The worker connected; the backend's capabilities as it reports them.
    Started {
        /// The worker's number in the run (respawned workers get new ones).
        worker: u32,
        /// Its process id.
        pid: u32,
        /// Which of the run's URLs it uses.
        #[serde(default)]
        group: usize,
        /// That URL, credentials redacted.
        #[serde(default)]
        url: String,
        /// `Capabilities::backend`.
        backend: String,
        /// `Capabilities::grade`, as `Debug` text.
        grade: String,
        /// `Capabilities::fencing`, as `Debug` text.
        fencing: String,
        /// `Capabilities::crash_release`, as `Debug` text.
        crash_release: String,
        /// `Capabilities::fair_queue`.
        fair_queue: bool,
        /// A deliberate defect the worker's backend was wrapped in, if any.
        sabotage: Option<String>,
        /// `Capabilities::rw_lock`'s writer preference, where the backend
        /// offers reader-writer locks.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        writers_first: Option<bool>,
        /// `Capabilities::rw_lock`'s upgradeable reads, where the backend
        /// offers reader-writer locks.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        upgradeable: Option<bool>,
    },
    /// `acquire` called.
    Acquiring {
        /// The wait passed to it.
        wait_ms: u64,
        /// How this hold will end if granted.
        end: HoldEnd,
        /// In an election run: the value the candidate campaigns with
        /// (unique per campaign).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<String>,
        /// In a reader-writer run (`--rw`): `"read"` or `"write"`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        access: Option<String>,
    },
    /// `acquire` returned a guard.
    Granted {
        /// When `acquire` was called.
        started: u64,
        /// The guard's fencing token.
        token: Option<u64>,
        /// The guard's validity deadline, on the shared clock.
        deadline: Option<u64>,
        /// The guard was already lost when handed over.
        lost_on_arrival: Option<String>,
        /// A permit's slot (`--permits` runs).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        slot: Option<u32>,
        /// A lock set's members (`--set` runs): each name's index in the
        /// run's pool of names and its token; the hold is one per member.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        members: Vec<Member>,
    },
    /// `acquire` failed.
    AcquireFailed {
        /// When `acquire` was called.
        started: u64,
        /// The `LockError` variant.
        kind: String,
        /// Its message.
        error: String,
    },
    /// An upgradeable read became the writer (`--rw` runs, where the
    /// backend offers upgradeable reads): the read's hold ends here, a
    /// write's begins with the new token.
    Upgraded {
        /// The write's fencing token.
        token: Option<u64>,
    },
    /// A write to the fenced register, and its answer.
    Wrote {
        /// The token written with.
        token: Option<u64>,
        /// The register's sequence number of this write.
        seq: u64,
        /// When the write happened, taken inside the register's flock.
        at: u64,
        /// The register accepted the write.
        accepted: bool,
        /// The highest token the register had accepted before.
        highest: Option<u64>,
        /// The set member whose register it was (`--set` runs).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        slot: Option<u32>,
    },
    /// A write the worker did not make, because the lock was lost or its
    /// validity deadline had passed.
    WriteSkipped {
        /// Why.
        reason: String,
    },
    /// The guard's validity deadline moved (a renewal landed).
    Renewed {
        /// The new deadline, on the shared clock.
        deadline: Option<u64>,
    },
    /// The guard's `lost()` fired.
    LossObserved {
        /// The `LossReason`.
        reason: String,
    },
    /// The worker stops holding (before the release request).
    Releasing {
        /// How.
        how: HoldEnd,
    },
    /// The hold ended.
    Released {
        /// How.
        how: HoldEnd,
        /// When the worker started ending it.
        started: u64,
        /// `release()`'s answer (still ours), for [`HoldEnd::Release`].
        still_held: Option<bool>,
        /// `release()`'s error, if it failed.
        error: Option<String>,
    },
    /// In an election run: the leader is about to publish a new value
    /// (logged before the request, so that an observer seeing it can be
    /// matched even if the answer is lost).
    Proclaiming {
        /// The leadership's term.
        term: u64,
        /// The new value (unique).
        value: String,
    },
    /// The answer to the latest [`Event::Proclaiming`].
    Proclaimed {
        /// `None` if published, else the error.
        error: Option<String>,
    },
    /// An observer's stream gave a state: the leader's term and value, or
    /// no leader.
    Observed {
        /// The leader's term.
        term: Option<u64>,
        /// Its value, as text.
        value: Option<String>,
    },
    /// An observer's stream gave an error item (it goes on reading).
    ObserveFailed {
        /// The `LockError` variant.
        kind: String,
        /// Its message.
        error: String,
        /// `LockError::is_transient`: server trouble, not a wrong answer.
        transient: bool,
    },
    /// The worker leaves after the controller asked it to stop.
    Exiting,
}

/// What the controller did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// The run began.
    RunStarted {
        /// The lock URL, credentials redacted.
        url: String,
        /// The nemesis.
        nemesis: String,
        /// Concurrent workers.
        workers: u32,
        /// The lease TTL.
        ttl_ms: u64,
        /// The acquire wait.
        wait_ms: u64,
        /// How long faults were injected.
        duration_ms: u64,
        /// The workers were candidates of an election (`--election`), with
        /// observer processes beside them.
        #[serde(default)]
        election: bool,
        /// Observer processes (election runs).
        #[serde(default)]
        observers: u32,
        /// The workers took permits of a semaphore of this limit
        /// (`--permits`) instead of the lock.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        permits: Option<u32>,
        /// The workers took sets of this many names (`--set`) of a pool of
        /// twice as many instead of the lock.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        set: Option<u32>,
        /// The workers took a reader-writer lock (`--rw`), reading with
        /// this share of their acquisitions and writing with the rest.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rw: Option<f64>,
    },
    /// A worker process was started.
    Spawned {
        /// Its number.
        worker: u32,
        /// Its process id.
        pid: u32,
        /// It observes the election instead of campaigning.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        observer: bool,
    },
    /// A worker process ended.
    Exited {
        /// Its number.
        worker: u32,
        /// Its process id.
        pid: u32,
        /// Exit code, if it exited.
        code: Option<i32>,
        /// Signal, if one ended it.
        signal: Option<i32>,
        /// The controller ended it (a nemesis kill, or a straggler at the end).
        by_controller: bool,
    },
    /// A worker believed to hold the lock was sent SIGKILL.
    KilledHolder {
        /// Its process id.
        pid: u32,
    },
    /// A worker believed to hold the lock was sent SIGSTOP.
    Paused {
        /// Its process id.
        pid: u32,
    },
    /// A paused worker was sent SIGCONT.
    Continued {
        /// Its process id.
        pid: u32,
    },
    /// Servers were killed (SIGKILL).
    ServersKilled {
        /// Their names in `scripts/services.sh`.
        servers: Vec<String>,
    },
    /// The Sentinels (or the cluster) promoted a replica after the master
    /// was killed.
    FailedOver {
        /// The killed master's name in `scripts/services.sh`.
        from: String,
        /// The promoted replica's.
        to: String,
    },
    /// Servers were started again.
    ServersStarted {
        /// Their names.
        servers: Vec<String>,
    },
    /// Servers were paused (SIGSTOP).
    ServersPaused {
        /// Their names.
        servers: Vec<String>,
    },
    /// Paused servers were resumed.
    ServersResumed {
        /// Their names.
        servers: Vec<String>,
    },
    /// A nemesis step failed (a server would not start, say).
    NemesisFailed {
        /// What went wrong.
        error: String,
    },
    /// Faults stop; workers were asked to finish.
    Stopping,
    /// A worker had not finished in time and was killed.
    Straggler {
        /// Its process id.
        pid: u32,
    },
}

/// A record as stored: a timestamp and the event's fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stamped<E> {
    /// When, on the shared clock.
    pub t: u64,
    /// What.
    #[serde(flatten)]
    pub event: E,
}

/// An append-only JSON-lines file. Each record is one `write(2)` to a file
/// opened with `O_APPEND`, unbuffered, so a process killed at any point
/// leaves every record it logged, and nothing half-written before them.
#[derive(Debug, Clone)]
pub struct EventLog {
    file: Arc<File>,
}

impl EventLog {
    /// Open (creating) `path` for appending.
    pub fn create(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(EventLog {
            file: Arc::new(file),
        })
    }

    /// Append `event`, stamped now.
    pub fn log<E: Serialize>(&self, event: &E) -> io::Result<()> {
        self.log_at(now_ns(), event)
    }

    /// Append `event` with the timestamp `t`.
    pub fn log_at<E: Serialize>(&self, t: u64, event: &E) -> io::Result<()> {
        let mut line = serde_json::to_string(&Stamped { t, event })?;
        line.push('\n');
        (&*self.file).write_all(line.as_bytes())
    }
}

/// Read a JSON-lines log. A last line cut short (the process was killed
/// inside its write) is ignored; any other unreadable line is an error.
pub fn read_log<E: DeserializeOwned>(path: &Path) -> io::Result<Vec<Stamped<E>>> {
    let lines: Vec<String> = io::BufReader::new(File::open(path)?)
        .lines()
        .collect::<Result<_, _>>()?;
    let mut records = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(record) => records.push(record),
            Err(_) if i + 1 == lines.len() => {}
            Err(e) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}:{}: {e}", path.display(), i + 1),
                ));
            }
        }
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_a_torn_last_line_is_ignored() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("w.jsonl");
        let log = EventLog::create(&path)?;
        let event = Event::Granted {
            started: 1,
            token: Some(7),
            deadline: None,
            lost_on_arrival: None,
            slot: None,
            members: Vec::new(),
        };
        log.log_at(5, &event)?;
        OpenOptions::new()
            .append(true)
            .open(&path)?
            .write_all(b"{\"t\":9,\"ev")?;
        let back: Vec<Stamped<Event>> = read_log(&path)?;
        assert_eq!(back, vec![Stamped { t: 5, event }]);
        Ok(())
    }
}
