//! Why a held lock is known or suspected lost, and the shared lease state a
//! guard, its backend and the watchdog use to say so.

use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// How certain a loss is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LossKind {
    /// The lock may still be ours, but we cannot prove it (a session is
    /// disconnected, a renewal could not reach the server). Act as if lost:
    /// stop writing to the protected resource.
    Suspected,
    /// The lock is certainly no longer ours.
    Confirmed,
}

/// Why [`LockGuard::lost`](crate::LockGuard::lost) fired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossReason {
    /// The validity deadline (start + TTL − drift allowance) passed without a
    /// successful renewal: the server may have expired the lock already.
    DeadlinePassed,
    /// A renewal or check found the lock gone or owned by someone else.
    TakenOver,
    /// The connection or session that held the lock failed.
    ConnectionLost {
        /// Whether the lock is suspected or known to be gone.
        kind: LossKind,
        /// What the backend observed.
        detail: String,
    },
}

impl LossReason {
    /// Whether this loss is certain or only suspected.
    pub fn kind(&self) -> LossKind {
        match self {
            LossReason::DeadlinePassed => LossKind::Suspected,
            LossReason::TakenOver => LossKind::Confirmed,
            LossReason::ConnectionLost { kind, .. } => *kind,
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::DeadlinePassed => {
                f.write_str("validity deadline passed without a successful renewal")
            }
            LossReason::TakenOver => f.write_str("the lock is gone or owned by someone else"),
            LossReason::ConnectionLost { kind, detail } => {
                write!(f, "connection lost ({kind:?}): {detail}")
            }
        }
    }
}

/// The clock-drift allowance subtracted from a TTL to get the validity
/// deadline: 1 % of the TTL plus 2 ms, as the Redlock analysis suggests.
pub fn drift_allowance(ttl: Duration) -> Duration {
    drift_allowance_with(ttl, DEFAULT_DRIFT_FACTOR)
}

/// The default clock-drift factor: 1 % of the TTL.
pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;

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

/// The moment, by the local monotonic clock, after which a lease granted by a
/// request sent at `sent_at` with `ttl` may already have expired on the server.
pub fn validity_deadline(sent_at: Instant, ttl: Duration) -> Instant {
    validity_deadline_with(sent_at, ttl, DEFAULT_DRIFT_FACTOR)
}

fn validity_deadline_with(sent_at: Instant, ttl: Duration, factor: f64) -> Instant {
    sent_at + ttl.saturating_sub(drift_allowance_with(ttl, factor))
}

#[derive(Debug, Clone)]
struct LeaseSnapshot {
    deadline: Option<Instant>,
    lost: Option<LossReason>,
}

/// The state shared by a guard, its backend handle and the watchdog: the
/// validity deadline (if the lock is a lease) and the loss, once known.
///
/// Loss is sticky: once set, later renewals cannot clear it.
#[derive(Debug)]
pub struct LeaseState {
    tx: watch::Sender<LeaseSnapshot>,
    ttl: Mutex<Duration>,
    drift_factor: f64,
}

impl LeaseState {
    /// State for a lease granted by a request sent at `sent_at` with `ttl`.
    pub fn lease(sent_at: Instant, ttl: Duration) -> Self {
        Self::lease_with_drift(sent_at, ttl, DEFAULT_DRIFT_FACTOR)
    }

    /// Like [`lease`](Self::lease), with the clock-drift allowance set to
    /// `factor` of the TTL (plus 2 ms) for this lease and its renewals.
    pub fn lease_with_drift(sent_at: Instant, ttl: Duration, factor: f64) -> Self {
        let mut state = Self::new(Some(validity_deadline_with(sent_at, ttl, factor)), ttl);
        state.drift_factor = factor;
        state
    }

    /// State for a lock without a deadline (held by a connection or session);
    /// only the backend can report it lost.
    pub fn unbounded(ttl: Duration) -> Self {
        Self::new(None, ttl)
    }

    fn new(deadline: Option<Instant>, ttl: Duration) -> Self {
        let (tx, _) = watch::channel(LeaseSnapshot {
            deadline,
            lost: None,
        });
        LeaseState {
            tx,
            ttl: Mutex::new(ttl),
            drift_factor: DEFAULT_DRIFT_FACTOR,
        }
    }

    /// The TTL the lease was last granted or renewed with.
    pub fn ttl(&self) -> Duration {
        *self.ttl.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current validity deadline, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.tx.borrow().deadline
    }

    /// Record a successful renewal sent at `sent_at` for `ttl`: the deadline
    /// becomes `sent_at + ttl − drift` (earlier, if the new TTL is shorter).
    /// Has no effect once the lock is lost.
    pub fn renewed(&self, sent_at: Instant, ttl: Duration) {
        *self.ttl.lock().unwrap_or_else(|e| e.into_inner()) = ttl;
        self.tx.send_if_modified(|s| {
            if s.lost.is_some() {
                return false;
            }
            let deadline = validity_deadline_with(sent_at, ttl, self.drift_factor);
            // Never revive a lease whose deadline passed already.
            if s.deadline.is_some_and(|d| d <= Instant::now()) {
                s.lost = Some(LossReason::DeadlinePassed);
                return true;
            }
            s.deadline = Some(deadline);
            true
        });
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
