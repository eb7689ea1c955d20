//! A lease's validity deadline and its loss, shared by a guard, its
//! backend and the watchdog: the deadline counted from when a grant or
//! renewal was asked for, less a safety margin for clock drift; renewals
//! that move it; and the loss, sticky once known.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::loss::{LossKind, LossReason};

/// The clock-drift allowance of a TTL: 1 % of the TTL plus 2 ms, as the
/// Redlock analysis suggests. The validity deadline keeps a larger margin
/// (see [`safety_margin`]); this is its clock-drift part.
pub fn drift_allowance(ttl: Duration) -> Duration {
    drift_allowance_with(ttl, DEFAULT_DRIFT_FACTOR)
}

/// The default clock-drift factor: 1 % of the TTL.
pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;

/// The default floor of the safety margin: how late a timer may fire on a
/// loaded host (tokio timers have been seen firing up to ~190 ms late on a
/// busy 2-core machine; a margin of this size with a fault test under CPU
/// load backs the default). Set per acquisition with
/// [`LockOptions::safety_margin`](crate::LockOptions::safety_margin).
pub const DEFAULT_SAFETY_MARGIN: Duration = Duration::from_millis(100);

/// The clock-drift allowance for a given `factor` of the TTL, plus 2 ms.
/// A factor outside `0.0..1.0` is clamped into it.
pub fn drift_allowance_with(ttl: Duration, factor: f64) -> Duration {
    let factor = if factor.is_finite() {
        factor.clamp(0.0, 0.99)
    } else {
        DEFAULT_DRIFT_FACTOR
    };
    ttl.mul_f64(factor) + Duration::from_millis(2)
}

/// A lease as the whole milliseconds a server is told (`PX`, a timeout in
/// ms, an expiry time): rounded **up**, so the server never ends a lease
/// before the client's `sent + ttl` (rounding down would end it up to a
/// millisecond early, and a renewal's remaining lease is rarely whole);
/// at least 1, saturating.
///
/// ```
/// use std::time::Duration;
/// use lock_core::raw::lease_millis;
/// assert_eq!(lease_millis(Duration::from_micros(533_100)), 534);
/// assert_eq!(lease_millis(Duration::from_millis(800)), 800);
/// assert_eq!(lease_millis(Duration::ZERO), 1);
/// ```
pub fn lease_millis(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000).max(1);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// How long before the server's earliest possible expiry of a lease of
/// `ttl` the holder's validity deadline (and so `lost()`) falls: the clock
/// drift allowance (`factor` of the TTL plus 2 ms) or the timer-lateness
/// floor `margin`, whichever is larger; the floor never takes more than a
/// quarter of the TTL.
///
/// ```
/// use std::time::Duration;
/// use lock_core::raw::{DEFAULT_DRIFT_FACTOR, DEFAULT_SAFETY_MARGIN, safety_margin};
/// let ms = |n| Duration::from_millis(n);
/// // 3 s: 1 % + 2 ms = 32 ms would leave no room for a late timer.
/// assert_eq!(safety_margin(ms(3_000), DEFAULT_DRIFT_FACTOR, DEFAULT_SAFETY_MARGIN), ms(100));
/// // 60 s: the drift allowance (602 ms) is the larger.
/// assert_eq!(safety_margin(ms(60_000), DEFAULT_DRIFT_FACTOR, DEFAULT_SAFETY_MARGIN), ms(602));
/// // 200 ms: the floor is capped at a quarter of the TTL.
/// assert_eq!(safety_margin(ms(200), DEFAULT_DRIFT_FACTOR, DEFAULT_SAFETY_MARGIN), ms(50));
/// ```
pub fn safety_margin(ttl: Duration, factor: f64, margin: Duration) -> Duration {
    drift_allowance_with(ttl, factor).max(margin.min(ttl / 4))
}

/// The moment, by the local monotonic clock, after which a lease granted by a
/// request sent at `sent_at` with `ttl` may already have expired on the
/// server, less the default [`safety_margin`].
pub fn validity_deadline(sent_at: Instant, ttl: Duration) -> Instant {
    sent_at
        + ttl.saturating_sub(safety_margin(
            ttl,
            DEFAULT_DRIFT_FACTOR,
            DEFAULT_SAFETY_MARGIN,
        ))
}

#[derive(Debug, Clone)]
struct LeaseSnapshot {
    deadline: Option<Instant>,
    lost: Option<LossReason>,
}

/// How a lease's validity deadline is derived from the moment its latest
/// confirmation was sent.
#[derive(Debug, Clone, Copy)]
struct Terms {
    ttl: Duration,
    drift_factor: f64,
    margin: Duration,
    /// What carries the lock cannot outlive this after a confirmation (a
    /// ZooKeeper session's timeout), whatever the TTL.
    bound: Option<Duration>,
    /// The lock delay ([`LockOptions::lock_delay`](crate::LockOptions::lock_delay)):
    /// the server's expiry is this much later than `ttl`, which the
    /// deadline counts with; every renewal asks the server for both.
    delay: Duration,
}

impl Terms {
    /// The lease length the deadline and renewals count with.
    fn effective_ttl(&self) -> Duration {
        self.bound.map_or(self.ttl, |b| self.ttl.min(b))
    }

    /// How long after the confirmation is sent the deadline falls.
    fn validity(&self) -> Duration {
        let ttl = self.effective_ttl();
        ttl.saturating_sub(self.margin())
    }

    fn margin(&self) -> Duration {
        safety_margin(self.effective_ttl(), self.drift_factor, self.margin)
    }

    fn deadline(&self, sent_at: Instant) -> Instant {
        sent_at + self.validity()
    }
}

/// How one renewal of a lease came back, as the watchdog saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RenewalOutcome {
    /// The server prolonged the lease.
    Renewed,
    /// The server no longer held the lock for us (the lock is lost).
    NotHeld,
    /// The request failed (the watchdog retries until the deadline).
    Failed,
}

impl RenewalOutcome {
    /// A short label for logs and metrics: `renewed`, `not_held`, `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            RenewalOutcome::Renewed => "renewed",
            RenewalOutcome::NotHeld => "not_held",
            RenewalOutcome::Failed => "failed",
        }
    }
}

/// Told of each renewal of a lease it observes ([`LeaseState::observe`]):
/// how layers (tracing, metrics) see what the watchdog does for a held
/// lock. Called on the watchdog's task: it must not block.
pub trait RenewalObserver: Send + Sync + 'static {
    /// One renewal came back with `outcome`.
    fn renewal(&self, outcome: RenewalOutcome);
}

/// The state shared by a guard, its backend handle and the watchdog: the
/// validity deadline (if the lock is a lease) and the loss, once known.
///
/// Loss is sticky: once set, later renewals cannot clear it.
pub struct LeaseState {
    tx: watch::Sender<LeaseSnapshot>,
    terms: Mutex<Terms>,
    observers: Mutex<Vec<Arc<dyn RenewalObserver>>>,
    /// For a lease [following](LeaseState::following) others: dropped with
    /// the lease, which ends the task that follows the parts.
    _follower: Option<tokio::sync::oneshot::Sender<()>>,
}

impl fmt::Debug for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let snapshot = self.tx.borrow();
        f.debug_struct("LeaseState")
            .field("deadline", &snapshot.deadline)
            .field("lost", &snapshot.lost)
            .field("ttl", &self.terms().ttl)
            .finish_non_exhaustive()
    }
}

impl LeaseState {
    /// State for a lease granted by a request sent at `sent_at` with `ttl`,
    /// with the default drift factor and safety margin.
    pub fn lease(sent_at: Instant, ttl: Duration) -> Self {
        Self::lease_with_drift(sent_at, ttl, DEFAULT_DRIFT_FACTOR)
    }

    /// Like [`lease`](Self::lease), with the clock-drift allowance set to
    /// `factor` of the TTL (plus 2 ms) for this lease and its renewals.
    pub fn lease_with_drift(sent_at: Instant, ttl: Duration, factor: f64) -> Self {
        Self::with_terms(
            Some(sent_at),
            Terms {
                ttl,
                drift_factor: factor,
                margin: DEFAULT_SAFETY_MARGIN,
                bound: None,
                delay: Duration::ZERO,
            },
        )
    }

    /// State for a lease granted by a request sent at `sent_at` with the
    /// TTL, safety margin and lock delay of `opts` (a request's options,
    /// whose TTL is the server's: the lease's and the delay's, see
    /// [`Request::opts`](crate::raw::Request::opts)).
    pub fn granted(sent_at: Instant, opts: &crate::LockOptions) -> Self {
        Self::lease(sent_at, opts.ttl)
            .with_margin(opts.safety_margin)
            .delaying(opts.lock_delay)
    }

    /// A lease granted with a server TTL that includes the lock `delay`:
    /// the deadline counts with the TTL less the delay, and renewals ask
    /// the server for the delay on top of the TTL they renew with
    /// ([`server_ttl`](Self::server_ttl)). No change for `None`.
    pub fn delaying(self, delay: Option<Duration>) -> Self {
        match delay {
            Some(delay) => self.retermed(|t| {
                t.ttl = t.ttl.saturating_sub(delay);
                t.delay = delay;
            }),
            None => self,
        }
    }

    /// The lock delay this lease's server expiry carries beyond its TTL.
    pub fn lock_delay(&self) -> Duration {
        self.terms().delay
    }

    /// What to ask the server for to renew this lease for `ttl`: `ttl`
    /// and the lock delay.
    pub fn server_ttl(&self, ttl: Duration) -> Duration {
        ttl.saturating_add(self.lock_delay())
    }

    /// Set the timer-lateness floor of the safety margin (see
    /// [`safety_margin`]) for this lease and its renewals.
    pub fn with_margin(self, margin: Duration) -> Self {
        self.retermed(|t| t.margin = margin)
    }

    /// Bound the lease by what carries it: its deadline is never later
    /// than `bound` after the latest confirmation (a ZooKeeper session's
    /// timeout), and the watchdog renews within that bound.
    pub fn bounded_by(self, bound: Duration) -> Self {
        self.retermed(|t| t.bound = Some(bound))
    }

    /// The same lease under changed terms: the deadline is derived again
    /// from when its confirmation was sent (the old deadline less the old
    /// validity).
    fn retermed(self, change: impl FnOnce(&mut Terms)) -> Self {
        let old = self.terms();
        let mut terms = old;
        change(&mut terms);
        let sent_at = self.deadline().and_then(|d| d.checked_sub(old.validity()));
        Self::with_terms(sent_at, terms)
    }

    /// State for a lock without a deadline (held by a connection or session);
    /// only the backend can report it lost.
    pub fn unbounded(ttl: Duration) -> Self {
        Self::with_terms(
            None,
            Terms {
                ttl,
                drift_factor: DEFAULT_DRIFT_FACTOR,
                margin: DEFAULT_SAFETY_MARGIN,
                bound: None,
                delay: Duration::ZERO,
            },
        )
    }

    fn with_terms(sent_at: Option<Instant>, terms: Terms) -> Self {
        let (tx, _) = watch::channel(LeaseSnapshot {
            deadline: sent_at.map(|at| terms.deadline(at)),
            lost: None,
        });
        LeaseState {
            tx,
            terms: Mutex::new(terms),
            observers: Mutex::new(Vec::new()),
            _follower: None,
        }
    }

    fn terms(&self) -> Terms {
        *self.terms.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The TTL the lease was last granted or renewed with.
    pub fn ttl(&self) -> Duration {
        self.terms().ttl
    }

    /// How far ahead of the server's earliest possible expiry the deadline
    /// falls: the [`safety_margin`] of this lease's terms.
    pub fn safety_margin(&self) -> Duration {
        self.terms().margin()
    }

    /// How often the watchdog renews this lease: a third of its TTL, or of
    /// the bound of what carries it, whichever is shorter.
    pub fn renewal_period(&self) -> Duration {
        self.terms().effective_ttl() / 3
    }

    /// When the watchdog first renews (or checks) a lease registered at
    /// `now`: a [`renewal_period`](Self::renewal_period) later, or halfway
    /// to the validity deadline if that is sooner (a grant whose request
    /// took most of its TTL arrives with little validity left).
    pub fn first_renewal(&self, now: Instant) -> Instant {
        let period = self.renewal_period();
        match self.deadline() {
            Some(d) => now + period.min(d.saturating_duration_since(now) / 2),
            None => now + period,
        }
    }

    /// The current validity deadline, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.tx.borrow().deadline
    }

    /// Record a successful renewal sent at `sent_at` for `ttl`: the deadline
    /// becomes `sent_at + ttl −` the [`safety_margin`] (earlier, if the new
    /// TTL is shorter; never later than the bound of what carries the lock).
    /// Has no effect once the lock is lost.
    pub fn renewed(&self, sent_at: Instant, ttl: Duration) {
        let terms = {
            let mut terms = self.terms.lock().unwrap_or_else(|e| e.into_inner());
            terms.ttl = ttl;
            *terms
        };
        self.tx.send_if_modified(|s| {
            if s.lost.is_some() {
                return false;
            }
            let deadline = terms.deadline(sent_at);
            // Never revive a lease whose deadline passed already.
            if s.deadline.is_some_and(|d| d <= Instant::now()) {
                s.lost = Some(LossReason::DeadlinePassed);
                return true;
            }
            s.deadline = Some(deadline);
            true
        });
    }

    /// Tell `observer` of every later renewal of this lease.
    pub fn observe(&self, observer: Arc<dyn RenewalObserver>) {
        self.observers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(observer);
    }

    /// Record a renewal's outcome with the lease's observers (the
    /// watchdog calls this for every renewal it makes).
    pub fn note_renewal(&self, outcome: RenewalOutcome) {
        let observers = self.observers.lock().unwrap_or_else(|e| e.into_inner());
        for o in observers.iter() {
            o.renewal(outcome);
        }
    }

    /// Mark the lock lost. The first reason wins, except that a confirmed
    /// loss replaces a suspected one.
    pub fn mark_lost(&self, reason: LossReason) {
        self.tx.send_if_modified(|s| match &s.lost {
            None => {
                s.lost = Some(reason);
                true
            }
            Some(old)
                if old.kind() == LossKind::Suspected && reason.kind() == LossKind::Confirmed =>
            {
                s.lost = Some(reason);
                true
            }
            Some(_) => false,
        });
    }

    /// The loss, if the lock is known or suspected lost right now (including
    /// a validity deadline that has passed).
    pub fn lost_now(&self) -> Option<LossReason> {
        let s = self.tx.borrow();
        if let Some(l) = &s.lost {
            return Some(l.clone());
        }
        match s.deadline {
            Some(d) if d <= Instant::now() => Some(LossReason::DeadlinePassed),
            _ => None,
        }
    }

    /// A lease held only while every one of `parts` is: its deadline is the
    /// earliest of theirs (a part without a deadline does not bound it), it
    /// follows their renewals, and it is lost with the first part's loss,
    /// for the same reason. A lock made of locks on several services (a
    /// migration holding the old and the new backend's lock) builds its
    /// guard on it. A task follows the parts until the lease is lost or
    /// dropped.
    pub fn following(parts: Vec<Arc<LeaseState>>) -> Arc<LeaseState> {
        let ttl = parts.iter().map(|p| p.ttl()).min().unwrap_or_default();
        let (stop, mut dropped) = tokio::sync::oneshot::channel();
        let combined = Arc::new(LeaseState {
            _follower: Some(stop),
            ..LeaseState::unbounded(ttl)
        });
        // Subscribe before reading the parts, so no change falls between.
        let mut receivers: Vec<_> = parts.iter().map(|p| p.tx.subscribe()).collect();
        if !combined.follow_once(&parts) {
            return combined;
        }
        let weak = Arc::downgrade(&combined);
        tokio::spawn(async move {
            loop {
                let changed = futures_util::future::select_all(
                    receivers.iter_mut().map(|rx| Box::pin(rx.changed())),
                );
                let result = tokio::select! {
                    (result, _, _) = changed => result,
                    _ = &mut dropped => return,
                };
                let Some(combined) = weak.upgrade() else {
                    return;
                };
                if result.is_err() || !combined.follow_once(&parts) {
                    return;
                }
            }
        });
        combined
    }

    /// Take the parts' earliest deadline and first loss; `false` once lost.
    fn follow_once(&self, parts: &[Arc<LeaseState>]) -> bool {
        if let Some(reason) = parts.iter().find_map(|p| p.tx.borrow().lost.clone()) {
            self.mark_lost(reason);
            return false;
        }
        let deadline = parts.iter().filter_map(|p| p.deadline()).min();
        self.tx.send_if_modified(|s| {
            if s.lost.is_some() || s.deadline == deadline {
                return false;
            }
            s.deadline = deadline;
            true
        });
        let terms = parts
            .iter()
            .map(|p| p.terms())
            .min_by_key(|t| t.effective_ttl());
        if let Some(terms) = terms {
            *self.terms.lock().unwrap_or_else(|e| e.into_inner()) = terms;
        }
        true
    }

    /// Wait until the lock is known or suspected lost. Fires at the validity
    /// deadline unless a renewal moved it first. Cancel-safe; needs no task.
    pub async fn lost(&self) -> LossReason {
        let mut rx = self.tx.subscribe();
        loop {
            let (deadline, lost) = {
                let s = rx.borrow_and_update();
                (s.deadline, s.lost.clone())
            };
            if let Some(l) = lost {
                return l;
            }
            match deadline {
                Some(d) => {
                    tokio::select! {
                        changed = rx.changed() => {
                            if changed.is_err() {
                                // Cannot happen while `self` is borrowed; treat as lost.
                                return LossReason::DeadlinePassed;
                            }
                        }
                        _ = tokio::time::sleep_until(d) => {
                            if self.deadline() == Some(d) {
                                self.mark_lost(LossReason::DeadlinePassed);
                            }
                        }
                    }
                }
                None => {
                    if rx.changed().await.is_err() {
                        return LossReason::DeadlinePassed;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_following_lease_takes_the_earliest_deadline_and_the_first_loss() {
        let now = Instant::now();
        let a = Arc::new(LeaseState::lease(now, Duration::from_secs(10)));
        let b = Arc::new(LeaseState::lease(now, Duration::from_secs(20)));
        let both = LeaseState::following(vec![Arc::clone(&a), Arc::clone(&b)]);
        assert_eq!(both.deadline(), a.deadline());
        // A renewal of the earlier part moves the combined deadline.
        a.renewed(now + Duration::from_secs(15), Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(both.deadline(), b.deadline());
        assert!(both.lost_now().is_none());
        b.mark_lost(LossReason::TakenOver);
        let reason = tokio::time::timeout(Duration::from_secs(1), both.lost())
            .await
            .expect("the combined lease is lost with a part");
        assert_eq!(reason, LossReason::TakenOver);
        // A part without a deadline does not bound the combined one.
        let c = Arc::new(LeaseState::unbounded(Duration::from_secs(5)));
        let d = Arc::new(LeaseState::lease(now, Duration::from_secs(5)));
        let mixed = LeaseState::following(vec![c, Arc::clone(&d)]);
        assert_eq!(mixed.deadline(), d.deadline());
    }
}
