//! A held lock's connection, shared by the Postgres and MySQL backends:
//! pinned to the lock until it is released, and closed rather than
//! returned to the pool whenever it might still hold a lock or a half-done
//! statement (a cancelled acquire, a failure, a guard dropped mid-release).

use sqlx::Database;
use sqlx::pool::PoolConnection;
use tokio::sync::Mutex;

use lock_core::LockError;

/// A pooled connection closed on drop unless [`put_back`](Self::put_back).
pub(crate) struct Pinned<DB: Database>(Option<PoolConnection<DB>>);

impl<DB: Database> Pinned<DB> {
    pub(crate) fn new(conn: PoolConnection<DB>) -> Self {
        Pinned(Some(conn))
    }

    pub(crate) fn conn(
        &mut self,
        backend: &'static str,
    ) -> Result<&mut PoolConnection<DB>, LockError> {
        self.0.as_mut().ok_or_else(|| LockError::Backend {
            backend,
            reason: "the lock's connection is gone".into(),
            source: None,
        })
    }

    /// Back to the pool: the connection is clean.
    pub(crate) fn put_back(&mut self) {
        self.0.take();
    }
}

impl<DB: Database> Drop for Pinned<DB> {
    fn drop(&mut self) {
        if let Some(mut conn) = self.0.take() {
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
    let Some(conn) = pinned.0.as_mut() else {
        return Ok(false);
    };
    match statement(conn).await {
        Ok(ours) => {
            pinned.put_back();
            Ok(ours)
        }
        Err(e) => {
            tracing::debug!(lock, error = %e, "release found the connection broken");
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
    let Some(conn) = pinned.0.as_mut() else {
        return Ok(false);
    };
    match statement(conn).await {
        Ok(()) => Ok(true),
        Err(e) => {
            tracing::debug!(lock, error = %e, "renewal found the connection broken");
            Ok(false)
        }
    }
}
