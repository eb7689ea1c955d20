//! What a backend guarantees, as data, so users can choose between backends
//! (and tests can hold each backend to what it claims).

use std::time::Duration;

/// Whether a backend hands out fencing tokens, and how far they can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fencing {
    /// No fencing tokens: [`LockGuard::fencing_token`](crate::LockGuard::fencing_token) is `None`.
    None,
    /// Tokens increase strictly only while the servers keep their data (a
    /// single Redis node: a failover or restart without persistence can repeat
    /// them; Redlock: a node that restarts without its counters can).
    WhileServerKeepsData,
    /// Tokens increase strictly across all grants of a name within the
    /// backend's failure model (durable counter, consensus revision).
    Safe,
}

/// What frees the lock of a holder that crashed without releasing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CrashRelease {
    /// The lock lives in this process only: it ends with the process.
    ProcessExit,
    /// The lease's TTL expires on the server.
    Ttl,
    /// The client's session (etcd lease, ZooKeeper session) expires.
    Session,
    /// The server notices the holder's connection closed.
    Connection,
}

/// How a waiting `acquire` learns that the lock may be free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Waiting {
    /// The server (or process) notifies waiters: no polling.
    Notified,
    /// The client retries with backoff and jitter.
    Polling,
}

/// What a backend is fit for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Grade {
    /// Within one process only.
    ProcessLocal,
    /// Avoids duplicate work; may grant twice on failover or long pauses.
    Efficiency,
    /// Safe for protecting data when fencing tokens are checked.
    Correctness,
}

/// A backend's guarantees.
///
/// ```
/// use lock_core::{DistributedLock, Grade, MemoryLock};
/// let caps = MemoryLock::new().capabilities();
/// assert_eq!(caps.grade, Grade::ProcessLocal);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// The backend's name, as used in URLs (`"memory"`, `"sqlite"`, …).
    pub backend: &'static str,
    /// Efficiency- or correctness-grade.
    pub grade: Grade,
    /// Fencing tokens and their safety.
    pub fencing: Fencing,
    /// Waiters are granted the lock in arrival order.
    pub fair_queue: bool,
    /// What frees a crashed holder's lock.
    pub crash_release: CrashRelease,
    /// The lock service keeps working when one server fails.
    pub survives_server_failure: bool,
    /// Safety depends on clocks (lease expiry measured by wall or local clocks).
    pub depends_on_clocks: bool,
    /// Notification or polling for waiters.
    pub waiting: Waiting,
    /// The longest TTL the backend can store.
    pub max_ttl: Duration,
    /// The shortest lease the backend grants: shorter TTLs are rounded up
    /// to it (etcd leases are whole seconds, and the server may impose a
    /// larger minimum, which the guard's validity deadline then reflects).
    pub min_lease: Duration,
    /// The most locks one client can hold (or wait for) at once, if the
    /// backend bounds it: locks that keep a pooled connection each
    /// (Postgres and MySQL row mode) are bounded by the pool. Beyond it,
    /// acquiring fails at once with [`LockError::LimitReached`](crate::LockError::LimitReached).
    pub max_held: Option<usize>,
}
