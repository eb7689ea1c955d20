//! What a backend guarantees, as data, so users can choose between backends
//! (and tests can hold each backend to what it claims).

use std::time::Duration;

use crate::rw_lock::RwLockCapabilities;

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
#[non_exhaustive]
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
    /// A grant records its holder (identity and value) on the server:
    /// [`inspect`](crate::DistributedLock::inspect) returns it and a holder
    /// can replace its value ([`LockGuard::set_value`](crate::LockGuard::set_value),
    /// an election's `proclaim`). Elections need it.
    pub holder: bool,
    /// How an election's observers learn of a change: notified by the
    /// server, or by reading the lock again every poll interval.
    pub observers: Waiting,
    /// The backend's semaphores ([`Semaphore`](crate::Semaphore)), if it
    /// offers them: a permit is then a lock on one of a name's slots, and
    /// everything above holds for it per slot (its fencing token rises
    /// per slot); this says what differs.
    pub semaphore: Option<SemaphoreCapabilities>,
    /// [`LockOptions::lock_delay`](crate::LockOptions::lock_delay) is
    /// offered: the server keeps a lock whose holder failed closed for the
    /// delay after its lease ends (a backend whose leases are server-side
    /// expiries that every renewal resets).
    pub lock_delay: bool,
    /// [`LockOptions::hold_at_least`](crate::LockOptions::hold_at_least)
    /// is offered: a release within the hold leaves the lock taken on the
    /// server until it ends, without the holder (a backend whose renewal
    /// sets the server's expiry to exactly the TTL asked, shorter or
    /// longer).
    pub hold_at_least: bool,
    /// The most names a lock set takes in one request, all or none, on
    /// the server ([`DistributedLock::try_acquire_set`](crate::DistributedLock::try_acquire_set)):
    /// nobody ever sees part of such a set held, and a set refused because
    /// one name is held takes no other name, not even for a moment. `0`:
    /// sets are taken name by name in their order
    /// ([`LockSetExt`](crate::LockSetExt)), and so are larger sets.
    pub atomic_sets: usize,
    /// The backend's reader-writer locks ([`RwLockExt`](crate::RwLockExt)),
    /// if it offers them: a read or write grant is then a lock, and
    /// everything above holds for it; this says what differs.
    pub rw_lock: Option<RwLockCapabilities>,
}

/// What a backend's semaphores guarantee beyond what its
/// [`Capabilities`] say of every grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreCapabilities {
    /// The largest limit (permits of one name) the backend takes.
    pub max_limit: u32,
    /// Waiters for a permit are served in arrival order.
    pub fair_queue: bool,
    /// How a waiter for a permit learns that one was given back.
    pub waiting: Waiting,
}

impl SemaphoreCapabilities {
    /// Semaphores of up to `max_limit` permits, unfair, polled.
    pub const fn new(max_limit: u32) -> Self {
        SemaphoreCapabilities {
            max_limit,
            fair_queue: false,
            waiting: Waiting::Polling,
        }
    }

    /// With [`fair_queue`](Self::fair_queue).
    pub const fn with_fair_queue(mut self, fair_queue: bool) -> Self {
        self.fair_queue = fair_queue;
        self
    }

    /// With [`waiting`](Self::waiting).
    pub const fn with_waiting(mut self, waiting: Waiting) -> Self {
        self.waiting = waiting;
        self
    }
}

impl Capabilities {
    /// Backend `backend`, of `grade`, claiming nothing else: no fencing
    /// tokens, no fair queue, a crashed holder's lock freed by its TTL, no
    /// survival of a server failure, safety that depends on clocks,
    /// polling waiters, TTLs from [`MIN_TTL`](crate::MIN_TTL) to 30 days,
    /// no bound on held locks, no holder record, polling observers, no
    /// semaphores, no lock delay or hold, no reader-writer locks. A backend adds what its tests prove with the
    /// `with_*` methods (all `const`, for a backend's `const`).
    pub const fn new(backend: &'static str, grade: Grade) -> Self {
        Capabilities {
            backend,
            grade,
            fencing: Fencing::None,
            fair_queue: false,
            crash_release: CrashRelease::Ttl,
            survives_server_failure: false,
            depends_on_clocks: true,
            waiting: Waiting::Polling,
            max_ttl: Duration::from_secs(30 * 86_400),
            min_lease: crate::options::MIN_TTL,
            max_held: None,
            holder: false,
            observers: Waiting::Polling,
            semaphore: None,
            lock_delay: false,
            hold_at_least: false,
            atomic_sets: 0,
            rw_lock: None,
        }
    }

    /// With [`fencing`](Self::fencing).
    pub const fn with_fencing(mut self, fencing: Fencing) -> Self {
        self.fencing = fencing;
        self
    }

    /// With [`fair_queue`](Self::fair_queue).
    pub const fn with_fair_queue(mut self, fair_queue: bool) -> Self {
        self.fair_queue = fair_queue;
        self
    }

    /// With [`crash_release`](Self::crash_release).
    pub const fn with_crash_release(mut self, crash_release: CrashRelease) -> Self {
        self.crash_release = crash_release;
        self
    }

    /// With [`survives_server_failure`](Self::survives_server_failure).
    pub const fn with_survives_server_failure(mut self, survives: bool) -> Self {
        self.survives_server_failure = survives;
        self
    }

    /// With [`depends_on_clocks`](Self::depends_on_clocks).
    pub const fn with_depends_on_clocks(mut self, depends: bool) -> Self {
        self.depends_on_clocks = depends;
        self
    }

    /// With [`waiting`](Self::waiting).
    pub const fn with_waiting(mut self, waiting: Waiting) -> Self {
        self.waiting = waiting;
        self
    }

    /// With [`max_ttl`](Self::max_ttl).
    pub const fn with_max_ttl(mut self, max_ttl: Duration) -> Self {
        self.max_ttl = max_ttl;
        self
    }

    /// With [`min_lease`](Self::min_lease).
    pub const fn with_min_lease(mut self, min_lease: Duration) -> Self {
        self.min_lease = min_lease;
        self
    }

    /// With [`holder`](Self::holder).
    pub const fn with_holder(mut self, holder: bool) -> Self {
        self.holder = holder;
        self
    }

    /// With [`observers`](Self::observers).
    pub const fn with_observers(mut self, observers: Waiting) -> Self {
        self.observers = observers;
        self
    }

    /// With [`lock_delay`](Self::lock_delay).
    pub const fn with_lock_delay(mut self, offered: bool) -> Self {
        self.lock_delay = offered;
        self
    }

    /// With [`hold_at_least`](Self::hold_at_least).
    pub const fn with_hold_at_least(mut self, offered: bool) -> Self {
        self.hold_at_least = offered;
        self
    }

    /// With [`semaphore`](Self::semaphore).
    pub const fn with_semaphore(mut self, semaphore: Option<SemaphoreCapabilities>) -> Self {
        self.semaphore = semaphore;
        self
    }

    /// With [`max_held`](Self::max_held).
    pub const fn with_max_held(mut self, max_held: Option<usize>) -> Self {
        self.max_held = max_held;
        self
    }

    /// With [`rw_lock`](Self::rw_lock).
    pub const fn with_rw_lock(mut self, rw_lock: Option<RwLockCapabilities>) -> Self {
        self.rw_lock = rw_lock;
        self
    }

    /// With [`atomic_sets`](Self::atomic_sets).
    pub const fn with_atomic_sets(mut self, names: usize) -> Self {
        self.atomic_sets = names;
        self
    }
}
