//! Leader election on any lock: a leader is the holder of the election's
//! lock, its term the grant's fencing token, its value the holder
//! record's value. Election `NAME`'s lock is `election/NAME`
//! ([`ELECTION_PREFIX`]), so an election and a plain lock of the same name
//! are apart.
//!
//! Everything a lock guarantees carries over: one leader at a time under
//! every fault the backend's capabilities cover, `lost()` before another
//! candidate can win wherever the backend makes that knowable, terms that
//! rise as fencing tokens do ([`Capabilities::fencing`](crate::Capabilities::fencing)).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::{Stream, StreamExt};
use tokio::time::Instant;

use crate::capabilities::{Fencing, Waiting};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::info::LockInfo;
use crate::lock::Changes;
use crate::loss::LossReason;
use crate::options::{LockOptions, Wait};

/// How often [`Election::observe`] reads the lock again by default, where
/// the backend does not notify observers
/// ([`Capabilities::observers`](crate::Capabilities::observers)).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Where the server notifies observers, how often [`Election::observe`]
/// reads the lock again all the same by default (a safety net: a
/// notification is never the only way a change is seen).
pub const DEFAULT_NOTIFIED_REREAD: Duration = Duration::from_secs(5);

/// The prefix of an election's lock name: election `NAME` is the lock
/// `election/NAME`, apart from the plain lock `NAME`. Operators read an
/// election as that lock (`distlock inspect election/NAME`).
pub const ELECTION_PREFIX: &str = "election/";

/// How long after a leader's lease was due to end an observer reads the
/// lock again: the least time between two such reads.
const AFTER_LEASE_END: Duration = Duration::from_millis(25);

/// One election: candidates [`campaign`](Self::campaign) for its lock,
/// anyone reads the [`leader`](Self::leader) or
/// [`observe`](Self::observe)s its changes.
///
/// It works on every backend whose capabilities give fencing tokens (the
/// term) and a holder record (the value); elsewhere a campaign answers
/// [`LockError::Unsupported`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// use std::sync::Arc;
/// use lock_core::{Election, LockOptions, MemoryLock};
/// let election = Election::new(Arc::new(MemoryLock::new()), "scheduler");
/// let leadership = election.campaign("10.0.0.7:8080", &LockOptions::new()).await?;
/// let leader = election.leader().await?.expect("a leader");
/// assert_eq!(leader.term, leadership.term());
/// assert_eq!(leader.value, b"10.0.0.7:8080");
/// tokio::select! {
///     _ = async { /* lead, passing leadership.term() to what it writes */ } => {}
///     reason = leadership.lost() => eprintln!("no longer leader: {reason}"),
/// }
/// assert!(leadership.resign().await?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    locks: Arc<dyn crate::DistributedLock>,
    name: String,
    /// Its lock: [`ELECTION_PREFIX`] and the name.
    lock: String,
    /// Set by [`Election::poll_interval`]; else the defaults.
    poll: Option<Duration>,
}

/// The leader of an election as the server records it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's term: the fencing token of its win, greater than every
    /// earlier leader's.
    pub term: u64,
    /// Who leads ([`LockOptions::identity`]).
    pub identity: String,
    /// What the leader published (its campaign's value or its latest
    /// `proclaim`).
    pub value: Vec<u8>,
    /// When the leader campaigned, by its own clock; `None` where the
    /// record was not readable.
    pub since: Option<SystemTime>,
}

impl Leader {
    /// The value as text, if it is UTF-8.
    pub fn value_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.value).ok()
    }

    /// The leader a lock's state shows, if any.
    fn from_info(info: LockInfo) -> Option<Self> {
        // Held without a term: a grant still writing its term back (a
        // Redlock grant between its majority and the token's write-back).
        // Its candidate has not won yet: no leader so far.
        let (true, Some(term)) = (info.held, info.fencing_token) else {
            return None;
        };
        Some(match info.holder {
            Some(h) => Leader {
                term,
                identity: h.identity,
                value: h.value,
                since: Some(h.since),
            },
            None => Leader {
                term,
                identity: String::new(),
                value: Vec::new(),
                since: None,
            },
        })
    }
}

/// A candidate's options: `opts` publishing `value`. An election is one
/// lock: options asking for a semaphore's permit are refused.
fn candidate_options(
    opts: &LockOptions,
    value: impl Into<Vec<u8>>,
) -> Result<LockOptions, LockError> {
    if let Some(limit) = opts.permits {
        return Err(LockError::invalid_options(format!(
            "an election has one leader: options asking for one of {limit} permits are refused"
        )));
    }
    Ok(opts.clone().value(value))
}

impl Election {
    /// The election `name` over `locks` (its lock is `election/NAME`,
    /// [`ELECTION_PREFIX`]).
    pub fn new(locks: Arc<dyn crate::DistributedLock>, name: impl Into<String>) -> Self {
        let name = name.into();
        Election {
            locks,
            lock: format!("{ELECTION_PREFIX}{name}"),
            name,
            poll: None,
        }
    }

    /// How often observers read the lock again: where the backend does not
    /// notify them, the poll interval (default [`DEFAULT_POLL_INTERVAL`]);
    /// where it does, the longest time between two reads however quiet
    /// the server (default [`DEFAULT_NOTIFIED_REREAD`]).
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll = Some(every.max(Duration::from_millis(1)));
        self
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name of the election's lock: `election/NAME`.
    pub fn lock_name(&self) -> &str {
        &self.lock
    }

    fn check_backend(&self) -> Result<(), LockError> {
        if let Err(LockError::InvalidName { reason, .. }) = crate::name::validate_name(&self.name)
            .and_then(|()| crate::name::validate_name(&self.lock))
        {
            return Err(LockError::InvalidName {
                name: self.name.chars().take(64).collect(),
                reason: format!("{reason} (an election's lock is {ELECTION_PREFIX}NAME)"),
            });
        }
        let caps = self.locks.capabilities();
        if caps.fencing == Fencing::None || !caps.holder {
            return Err(LockError::Unsupported {
                backend: caps.backend,
                operation: "leader election (it needs fencing tokens for terms and a holder record for values)",
            });
        }
        Ok(())
    }

    /// Wait (bounded by `opts.wait`) until this candidate leads, publishing
    /// `value`. Cancel-safe as `acquire` is: dropping the future leaves no
    /// candidacy behind. A win already lost when it arrives (the session
    /// died as it was granted) is never reported: the campaign goes on
    /// within the wait.
    pub async fn campaign(
        &self,
        value: impl Into<Vec<u8>>,
        opts: &LockOptions,
    ) -> Result<Leadership, LockError> {
        self.check_backend()?;
        let start = Instant::now();
        let mut opts = candidate_options(opts, value)?;
        loop {
            let guard = self.locks.acquire(&self.lock, &opts).await?;
            if guard.ensure_held().is_ok() {
                return Leadership::from_guard(guard, opts.value);
            }
            tracing::debug!(target: "distlock", election = %self.name,
                "a win was lost as it arrived; campaigning on");
            drop(guard);
            opts.wait = match opts.wait {
                Wait::UpTo(d) => match d.checked_sub(start.elapsed()) {
                    Some(left) if !left.is_zero() => Wait::UpTo(left),
                    _ => {
                        return Err(LockError::Timeout {
                            name: self.name.clone(),
                            waited: start.elapsed(),
                        });
                    }
                },
                other => other,
            };
        }
    }

    /// One attempt: `Ok(None)` when another candidate leads.
    pub async fn try_campaign(
        &self,
        value: impl Into<Vec<u8>>,
        opts: &LockOptions,
    ) -> Result<Option<Leadership>, LockError> {
        self.check_backend()?;
        let opts = candidate_options(opts, value)?;
        match self.locks.try_acquire(&self.lock, &opts).await? {
            Some(guard) if guard.ensure_held().is_ok() => {
                Leadership::from_guard(guard, opts.value).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The current leader, or `None`. A snapshot: it may change at once.
    pub async fn leader(&self) -> Result<Option<Leader>, LockError> {
        Ok(self.read().await?.0)
    }

    /// The current leader and, where the backend shows it, the time left
    /// on the lock's lease.
    async fn read(&self) -> Result<(Option<Leader>, Option<Duration>), LockError> {
        self.check_backend()?;
        let info = self.locks.inspect(&self.lock).await?;
        let left = info.expires_in.filter(|_| info.held);
        Ok((Leader::from_info(info), left))
    }

    /// The election's changes: first the current state, then every new
    /// leader, new value and end of a leadership (`None`), in term order
    /// (a term never goes back). It never ends by itself: a failed read is
    /// an `Err` item, and the stream goes on reading. Where the backend
    /// notifies observers ([`Capabilities::observers`](crate::Capabilities::observers)),
    /// each notification is followed by a read, and so is the end of the
    /// lease a read showed (a lease that runs out may end a leadership
    /// without a notification); elsewhere the lock is read every poll
    /// interval, and a leadership shorter than it may go unseen (also where
    /// notified, changes closer together than one read are seen as their
    /// last state).
    pub fn observe(
        &self,
    ) -> impl Stream<Item = Result<Option<Leader>, LockError>> + Send + 'static {
        let state = Observing {
            notified: self.locks.capabilities().observers == Waiting::Notified,
            election: self.clone(),
            last: None,
            floor: 0,
            read_now: true,
            changes: None,
            lease_end: None,
        };
        futures_util::stream::unfold(state, |mut s| async move {
            let item = s.next_change().await;
            Some((item, s))
        })
    }

    /// Lead once, in the style of Curator's `LeaderSelector`: campaign,
    /// then run `work(term)` while leader. If the leadership is lost first,
    /// `work` is dropped (cancelled) and the outcome is [`Led::Lost`]; when
    /// `work` finishes, the leadership is resigned and its output returned.
    pub async fn lead<F, Fut, T>(
        &self,
        value: impl Into<Vec<u8>>,
        opts: &LockOptions,
        work: F,
    ) -> Result<Led<T>, LockError>
    where
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = T>,
    {
        let leadership = self.campaign(value, opts).await?;
        let outcome = tokio::select! {
            biased;
            reason = leadership.lost() => Led::Lost { term: leadership.term(), reason },
            out = work(leadership.term()) => Led::Finished(out),
        };
        match outcome {
            Led::Finished(out) => {
                if let Err(e) = leadership.resign().await {
                    tracing::warn!(target: "distlock", election = %self.name, error = %e.report(),
                        "resigning after the work finished failed; the lease ends it");
                }
                Ok(Led::Finished(out))
            }
            lost => Ok(lost),
        }
    }

    /// Lead until `work` finishes: campaign, run `work(term)` while
    /// leader, and after a loss campaign again and run it anew with the
    /// new term. Errors of a campaign (a timeout of `opts.wait`, a backend
    /// error) end it.
    pub async fn lead_until_done<F, Fut, T>(
        &self,
        value: impl Into<Vec<u8>> + Clone,
        opts: &LockOptions,
        mut work: F,
    ) -> Result<T, LockError>
    where
        F: FnMut(u64) -> Fut,
        Fut: Future<Output = T>,
    {
        loop {
            match self.lead(value.clone(), opts, &mut work).await? {
                Led::Finished(out) => return Ok(out),
                Led::Lost { term, reason } => {
                    tracing::info!(target: "distlock", election = %self.name, term, %reason,
                        "leadership lost; campaigning again");
                }
            }
        }
    }
}

/// How one [`Election::lead`] ended.
#[derive(Debug)]
pub enum Led<T> {
    /// The work finished while leader (and the leadership was resigned).
    Finished(T),
    /// The leadership was lost first; the work was cancelled.
    Lost {
        /// The term that was lost.
        term: u64,
        /// Why.
        reason: LossReason,
    },
}

/// An observer's position in the election's history.
struct Observing {
    election: Election,
    /// The last state reported: the leader's term and value, or `None`.
    last: Option<Option<(u64, Vec<u8>)>>,
    /// The lowest term a read may show: the last term reported, or one
    /// above it once that leadership was seen to end. A read below it is
    /// stale: a server that shows the lock held before the new grant's
    /// term is written (Postgres row mode, MySQL: one round trip) still
    /// shows the term and holder of the grant before.
    floor: u64,
    /// Read without waiting: the first read.
    read_now: bool,
    /// The backend notifies observers (until it says it cannot).
    notified: bool,
    /// The server's notifications, while subscribed.
    changes: Option<Changes>,
    /// When the lease of the last read's holder is due to end (plus
    /// [`AFTER_LEASE_END`]), where the backend shows it: a read then sees
    /// whether it was renewed or ran out.
    lease_end: Option<Instant>,
}

impl Observing {
    async fn next_change(&mut self) -> Result<Option<Leader>, LockError> {
        loop {
            if !std::mem::take(&mut self.read_now) {
                self.wait().await?;
            }
            let (now, left) = self.election.read().await?;
            self.lease_end = left.map(|left| Instant::now() + left + AFTER_LEASE_END);
            if let Some(l) = &now
                && l.term < self.floor
            {
                tracing::debug!(target: "distlock", election = %self.election.name,
                    term = l.term, floor = self.floor, "a stale read of an ended term; skipped");
                continue;
            }
            let key = now.as_ref().map(|l| (l.term, l.value.clone()));
            if self.last.as_ref() != Some(&key) {
                self.floor = match (&now, &self.last) {
                    (Some(l), _) => l.term,
                    // The leadership reported last has ended.
                    (None, Some(Some((term, _)))) => term.saturating_add(1),
                    (None, _) => self.floor,
                };
                self.last = Some(key);
                return Ok(now);
            }
        }
    }

    /// Wait for the next reason to read the lock: a notification (or a
    /// new subscription, which may have missed one), the re-read
    /// interval, or the poll interval where the backend does not notify.
    async fn wait(&mut self) -> Result<(), LockError> {
        let election = &self.election;
        if self.notified && self.changes.is_none() {
            match election.locks.changes(&election.lock).await {
                Ok(Some(changes)) => {
                    self.changes = Some(changes);
                    return Ok(());
                }
                Ok(None) => self.notified = false,
                Err(e) => {
                    // Asked again at the next call, after a pause.
                    tokio::time::sleep(election.poll.unwrap_or(DEFAULT_POLL_INTERVAL)).await;
                    return Err(e);
                }
            }
        }
        let Some(changes) = &mut self.changes else {
            tokio::time::sleep(election.poll.unwrap_or(DEFAULT_POLL_INTERVAL)).await;
            return Ok(());
        };
        let reread = election.poll.unwrap_or(DEFAULT_NOTIFIED_REREAD);
        let next_read = match self.lease_end {
            Some(end) => end.min(Instant::now() + reread),
            None => Instant::now() + reread,
        };
        tokio::select! {
            item = changes.next() => match item {
                Some(Ok(())) => Ok(()),
                Some(Err(e)) => {
                    self.changes = None;
                    Err(e)
                }
                None => {
                    self.changes = None;
                    Ok(())
                }
            },
            () = tokio::time::sleep_until(next_read) => Ok(()),
        }
    }
}

/// Leadership of an election, won by [`Election::campaign`]: the lock's
/// guard, with its term and value. Dropping it resigns in the background,
/// as dropping a guard releases.
#[must_use = "a leadership dropped at once resigns at once: bind it for as long as it leads"]
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
    term: u64,
    value: Vec<u8>,
}

impl Leadership {
    fn from_guard(guard: LockGuard, value: Vec<u8>) -> Result<Self, LockError> {
        let Some(term) = guard.fencing_token() else {
            return Err(LockError::Unsupported {
                backend: guard.capabilities().backend,
                operation: "leader election without fencing tokens (they are the terms)",
            });
        };
        Ok(Leadership { guard, term, value })
    }

    /// The term: the fencing token of this win, greater than every earlier
    /// leader's. Pass it to what the leader writes, which refuses lower ones.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// The value this leader published last.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        let lock = self.guard.name();
        lock.strip_prefix(ELECTION_PREFIX).unwrap_or(lock)
    }

    /// Replace the published value while still leader: observers see the
    /// new one. Refused with [`LockError::NotHeld`] or [`LockError::Lost`]
    /// once the leadership is gone (and `lost()` fires).
    pub async fn proclaim(&mut self, value: impl Into<Vec<u8>>) -> Result<(), LockError> {
        let value = value.into();
        self.guard.set_value(&value).await?;
        self.value = value;
        Ok(())
    }

    /// Resolves when the leadership is known or suspected lost, before
    /// another candidate can win wherever the backend makes that knowable
    /// (as [`LockGuard::lost`]).
    pub async fn lost(&self) -> LossReason {
        self.guard.lost().await
    }

    /// The loss, if the leadership is known or suspected lost now.
    pub fn is_lost(&self) -> Option<LossReason> {
        self.guard.is_lost()
    }

    /// `Ok` while still leader by the local clock ([`LockGuard::ensure_held`]):
    /// the check before each act of leadership.
    pub fn ensure_leader(&self) -> Result<(), LockError> {
        self.guard.ensure_held()
    }

    /// Hand over at once: `Ok(true)` if this candidate was still leader.
    pub async fn resign(self) -> Result<bool, LockError> {
        self.guard.release().await
    }

    /// The lock's guard underneath.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// The guard, leaving the election's view of it.
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }
}
