//! A grant held as an open transaction on a connection of its own: a
//! semaphore's permit (its slot's row locked) or a reader-writer grant
//! (the name's row locked, shared or exclusive). Ending the transaction
//! frees it; so does the connection's end.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::LockError;
use lock_core::raw::GuardHandle;

use crate::engine::Dialect;
use crate::held::{self, Pinned};

/// One such grant: the open transaction's connection, and the key this
/// process's waiters for what it holds are woken by at its release.
pub(crate) struct TransactionHandle<D: Dialect> {
    dialect: Arc<D>,
    name: String,
    wake: String,
    conn: tokio::sync::Mutex<Pinned<D::Db>>,
}

impl<D: Dialect> TransactionHandle<D> {
    /// The grant of `name` held by the open transaction on `pinned`;
    /// its release wakes this process's waiters on `wake`.
    pub(crate) fn new(dialect: Arc<D>, name: &str, wake: String, pinned: Pinned<D::Db>) -> Self {
        TransactionHandle {
            dialect,
            name: name.to_string(),
            wake,
            conn: tokio::sync::Mutex::new(pinned),
        }
    }

    /// Close the connection (its transaction, and the grant, end with it).
    pub(crate) async fn close(&self) {
        self.conn.lock().await.close();
    }
}

#[async_trait]
impl<D: Dialect> GuardHandle for TransactionHandle<D> {
    /// End the transaction: the grant is free; this process's waiters look
    /// again at once.
    async fn release(&self) -> Result<bool, LockError> {
        let released = held::release(&self.conn, &self.name, async |conn| {
            self.dialect.end_permit(conn).await.map(|()| true)
        })
        .await;
        self.dialect.core().wakeups.wake(&self.wake);
        released
    }

    /// Touch the connection (resetting the server's idle bound) and set the
    /// bound to `ttl`: `false` if the connection, and so the grant, is
    /// gone.
    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        held::touch(&self.conn, &self.name, async |conn| {
            self.dialect.touch_permit(conn, ttl).await
        })
        .await
    }
}
