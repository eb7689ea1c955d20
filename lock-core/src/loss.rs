//! Why a held lock is known or suspected lost: what a guard's `lost()`
//! tells its user. The lease that decides it is in [`LeaseState`](crate::raw::LeaseState).

use std::fmt;

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
