//! A held lock's connection, shared by the Postgres and MySQL backends:
//! pinned to the lock until it is released, and closed rather than
//! returned to the pool whenever it might still hold a lock or a half-done
//! statement (a cancelled acquire, a failure, a guard dropped mid-release).
//!
//! A clean connection goes back to a small cache of warm connections
//! ([`Warm`]) rather than to sqlx's pool, whose return path pings every
//! connection in a task of its own: a round trip and a wake-up per release.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};
use tokio::sync::Mutex;

use lock_core::LockError;

/// Connections checked out of sqlx's pool and kept for the next lock, with
/// the bounds last set on each.
type Idle<DB> = std::sync::Mutex<Vec<(PoolConnection<DB>, Option<Bounds>)>>;

/// The lock wait and idle bounds (whole seconds) a backend last set on a
/// connection's session, remembered with the connection while it stays with
/// the client, so that the next lock on it with the same bounds need not
/// set them again. `None` wherever they are not known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bounds {
    /// How long a lock statement waits.
    pub(crate) wait_secs: u64,
    /// How long the server lets the session idle.
    pub(crate) idle_secs: u64,
}

/// sqlx's pool with a cache of clean connections in front of it. Cached
/// connections are not pinged: one that died while idle fails its first
/// statement, and the backend takes another.
///
/// Every waiting acquisition and every lock held on a connection of its own
/// keeps one, so at most `limit` (the pool's size) can be out at once; one
/// more is refused at once with [`LockError::LimitReached`] rather than
/// left to wait for the pool until it times out.
pub(crate) struct Warm<DB: Database> {
    pool: Pool<DB>,
    idle: Arc<Idle<DB>>,
    limit: usize,
    out: Arc<AtomicUsize>,
}

/// Why a connection for a lock could not be had.
pub(crate) enum NoConnection {
    /// Every connection already carries a lock or a waiter.
    Limit(usize),
    /// The pool failed.
    Pool(sqlx::Error),
}

impl NoConnection {
    /// The error for a caller that was `doing` something.
    pub(crate) fn into_error(self, backend: &'static str, doing: &str) -> LockError {
        match self {
            NoConnection::Limit(limit) => LockError::LimitReached {
                backend,
                limit,
                advice: "each waiting acquisition, and each lock held on a connection of \
                         its own (row mode, or an advisory lock granted after a wait), keeps \
                         one pooled connection: raise `max_connections` in the URL (up to \
                         1000), or, in row mode, use `mode=advisory`, whose locks granted \
                         without waiting share a few sessions"
                    .to_string(),
            },
            NoConnection::Pool(e) => crate::error::map_sqlx(backend, doing, e),
        }
    }
}

impl<DB: Database> Warm<DB> {
    pub(crate) fn new(pool: Pool<DB>, limit: usize) -> Self {
        Warm {
            pool,
            idle: Arc::new(std::sync::Mutex::new(Vec::new())),
            limit,
            out: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The most connections out for locks at once.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// A connection for a lock: a cached one, or one from the pool.
    pub(crate) async fn pinned(&self) -> Result<Pinned<DB>, NoConnection> {
        let taken = self
            .out
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .is_ok();
        if !taken {
            return Err(NoConnection::Limit(self.limit));
        }
        let slot = Slot(Arc::clone(&self.out));
        let cached = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let (conn, bounds) = match cached {
            Some(cached) => cached,
            None => (self.pool.acquire().await.map_err(NoConnection::Pool)?, None),
        };
        Ok(Pinned {
            conn: Some(conn),
            bounds,
            home: Arc::downgrade(&self.idle),
            slot: Some(slot),
        })
    }

    /// Pooled connections are not pinged before use (that would cost a
    /// round trip per acquisition): one that died while idle (a server
    /// restart ends them all) fails its first statement. If `e` says so and
    /// `budget` allows, close `pinned` and put another connection in its
    /// place: `Ok`, and the caller runs its statement again. Otherwise `e`,
    /// as the error of acquiring a lock.
    pub(crate) async fn replace_if_dead(
        &self,
        pinned: &mut Pinned<DB>,
        e: sqlx::Error,
        budget: &mut DeadBudget,
        backend: &'static str,
    ) -> Result<(), LockError> {
        const DOING: &str = "acquiring a lock";
        if !crate::error::connection_lost(&e) || budget.0 == 0 {
            return Err(crate::error::map_sqlx(backend, DOING, e));
        }
        budget.0 -= 1;
        tracing::debug!(target: "distlock", backend, error = %e, "a pooled connection had died; taking another");
        pinned.close();
        *pinned = self
            .pinned()
            .await
            .map_err(|e| e.into_error(backend, DOING))?;
        Ok(())
    }

    /// The pool, for statements outside any lock (fault injection, the
    /// operator's queries), with the cached connections handed back first
    /// so that they cannot starve it.
    pub(crate) fn pool(&self) -> &Pool<DB> {
        let cached = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|e| e.into_inner()));
        drop(cached);
        &self.pool
    }
}

/// One of the `limit` connections out for locks, counted until dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How many dead pooled connections one acquisition replaces
/// ([`Warm::replace_if_dead`]) before it reports the failure: a pool's
/// worth after a restart would take as many attempts, so past a few the
/// server is more likely down than restarted.
pub(crate) struct DeadBudget(u32);

impl DeadBudget {
    pub(crate) fn new() -> Self {
        DeadBudget(8)
    }
}

/// A pooled connection closed on drop unless [`put_back`](Self::put_back).
pub(crate) struct Pinned<DB: Database> {
    conn: Option<PoolConnection<DB>>,
    /// The bounds set on the connection's session, if known; kept with it
    /// in the cache.
    pub(crate) bounds: Option<Bounds>,
    /// The cache a clean connection goes back to.
    home: Weak<Idle<DB>>,
    /// Counted as out until the lock's connection is given up.
    slot: Option<Slot>,
}

impl<DB: Database> Pinned<DB> {
    pub(crate) fn conn(
        &mut self,
        backend: &'static str,
    ) -> Result<&mut PoolConnection<DB>, LockError> {
        self.conn.as_mut().ok_or_else(|| LockError::Backend {
            backend,
            reason: "the lock's connection is gone".into(),
            source: None,
        })
    }

    /// Back to the cache (or the pool, if the client is gone): the
    /// connection is clean.
    pub(crate) fn put_back(&mut self) {
        if let Some(conn) = self.conn.take()
            && let Some(home) = self.home.upgrade()
        {
            home.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((conn, self.bounds));
        }
        self.slot = None;
    }

    /// Close the connection now (it may hold a lock or half a statement)
    /// and give up its place among the connections out.
    pub(crate) fn close(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            conn.close_on_drop();
        }
        self.slot = None;
    }
}

impl<DB: Database> Drop for Pinned<DB> {
    fn drop(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            conn.close_on_drop();
        }
    }
}

/// Release through `statement` (its answer: whether the lock was still
/// ours). A connection that fails it is gone, and the lock with it: `false`.
pub(crate) async fn release<DB: Database>(
    held: &Mutex<Pinned<DB>>,
    lock: &str,
    statement: impl AsyncFnOnce(&mut PoolConnection<DB>) -> Result<bool, sqlx::Error>,
) -> Result<bool, LockError> {
    let mut pinned = held.lock().await;
    let Some(conn) = pinned.conn.as_mut() else {
        return Ok(false);
    };
    match statement(conn).await {
        Ok(ours) => {
            pinned.put_back();
            Ok(ours)
        }
        Err(e) => {
            tracing::debug!(target: "distlock", lock, error = %e, "release found the connection broken");
            Ok(false)
        }
    }
}

/// Renew through `statement` (touching the connection resets the server's
/// idle timeout): `false` if the connection, and so the lock, is gone.
pub(crate) async fn touch<DB: Database>(
    held: &Mutex<Pinned<DB>>,
    lock: &str,
    statement: impl AsyncFnOnce(&mut PoolConnection<DB>) -> Result<(), sqlx::Error>,
) -> Result<bool, LockError> {
    let mut pinned = held.lock().await;
    // A renewal may move a bound.
    pinned.bounds = None;
    let Some(conn) = pinned.conn.as_mut() else {
        return Ok(false);
    };
    match statement(conn).await {
        Ok(()) => Ok(true),
        Err(e) => {
            tracing::debug!(target: "distlock", lock, error = %e, "renewal found the connection broken");
            Ok(false)
        }
    }
}

/// A connection of the client's own, outside the pool, for the short
/// committed statements that a row lock's open transaction cannot make
/// itself (advancing a fencing token). Taking one from the pool instead
/// would need a second pooled connection for every acquisition. Opened on
/// first use, and again after a failure; statements on it take turns.
pub(crate) struct Side<DB: Database> {
    options: <DB::Connection as sqlx::Connection>::Options,
    conn: Mutex<Option<DB::Connection>>,
}

impl<DB: Database> Side<DB> {
    pub(crate) fn new(options: <DB::Connection as sqlx::Connection>::Options) -> Self {
        Side {
            options,
            conn: Mutex::new(None),
        }
    }

    /// Run `statement` on the side connection (opening it if needed); a
    /// failure, or this future dropped before the answer, closes it, and
    /// the next call opens another.
    pub(crate) async fn run<T>(
        &self,
        statement: impl AsyncFnOnce(&mut DB::Connection) -> Result<T, sqlx::Error>,
    ) -> Result<T, sqlx::Error> {
        use sqlx::ConnectOptions;
        let mut slot = self.conn.lock().await;
        // Out of the slot while the statement runs: if this future is
        // dropped mid-statement, the connection (with half an exchange on
        // it) is dropped too, never reused.
        let mut conn = match slot.take() {
            Some(conn) => conn,
            None => self.options.connect().await?,
        };
        let outcome = statement(&mut conn).await;
        if outcome.is_ok() {
            *slot = Some(conn);
        }
        outcome
    }
}
