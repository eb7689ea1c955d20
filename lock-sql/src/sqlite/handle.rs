//! The guard's handle on a SQLite lease: release and extend, each through
//! the client's batch of writes (a permit's, one statement each); the
//! holder record's value replaced by owner.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::LockError;
use lock_core::raw::{DetachedRelease, GuardHandle, HolderRecord};
use sqlx::{AssertSqlSafe, Connection, SqliteConnection};

use super::batch::{Extension, Held};
use super::lock::{BACKEND, Inner, now_ms};
use super::permits::wake_key;
use super::rw::wake_key as rw_wake_key;
use crate::error::map_sqlx;

/// One grant's handle: the lease row's name and owner token, released and
/// extended through the client's batches.
pub(crate) struct SqliteHandle {
    pub(crate) inner: Arc<Inner>,
    pub(crate) name: String,
    /// The owner token, as stored in the row.
    pub(crate) owner_hex: String,
    /// The holder record written with the grant.
    pub(crate) record: HolderRecord,
    /// A permit's slot (a row of the permits table); `None` for a lock.
    pub(crate) slot: Option<u32>,
    /// A reader-writer lock's lease (a row of the `_rw` table).
    pub(crate) rw: bool,
    /// An upgradeable read's lease (of the `_rw` table).
    pub(crate) upgradeable: bool,
}

#[async_trait]
impl GuardHandle for SqliteHandle {
    async fn release(&self) -> Result<bool, LockError> {
        if self.rw {
            let _turn = self.inner.gate.urgent().await;
            let done = sqlx::query(AssertSqlSafe(self.inner.rw.release.as_str()))
                .bind(&self.name)
                .bind(&self.owner_hex)
                .bind(now_ms())
                .execute(&self.inner.pool)
                .await
                .map_err(|e| map_sqlx(BACKEND, "releasing a reader-writer lock", e))?;
            let released = done.rows_affected() == 1;
            if released {
                self.inner.wakeups.wake(&rw_wake_key(&self.name));
            }
            return Ok(released);
        }
        if let Some(slot) = self.slot {
            let _turn = self.inner.gate.urgent().await;
            let done = sqlx::query(AssertSqlSafe(self.inner.permits.release.as_str()))
                .bind(&self.name)
                .bind(i64::from(slot))
                .bind(&self.owner_hex)
                .bind(now_ms())
                .execute(&self.inner.pool)
                .await
                .map_err(|e| map_sqlx(BACKEND, "releasing a permit", e))?;
            let released = done.rows_affected() == 1;
            if released {
                self.inner.wakeups.wake(&wake_key(&self.name));
            }
            return Ok(released);
        }
        let released = self.inner.releases.call(self.held()).await?;
        if released {
            self.inner.wakeups.wake(&self.name);
        }
        Ok(released)
    }

    /// The lease freed on a connection of its own, opened with the pool's
    /// options (the file, its busy timeout).
    fn detached_release(&self) -> Option<DetachedRelease> {
        let options = self.inner.pool.connect_options();
        let (slot, rw) = (self.slot, self.rw);
        let sql = match slot {
            _ if rw => self.inner.rw.release.clone(),
            Some(_) => self.inner.permits.release.clone(),
            None => self.inner.sql.release_one.clone(),
        };
        let (name, owner) = (self.name.clone(), self.owner_hex.clone());
        let wakeups = self.inner.wakeups.clone();
        Some(Box::pin(async move {
            let failed = |e| map_sqlx(BACKEND, "releasing a lock at shutdown", e);
            let mut conn = SqliteConnection::connect_with(&options)
                .await
                .map_err(failed)?;
            let mut query = sqlx::query(AssertSqlSafe(sql)).bind(&name);
            if let Some(slot) = slot {
                query = query.bind(i64::from(slot));
            }
            let done = query
                .bind(&owner)
                .bind(now_ms())
                .execute(&mut conn)
                .await
                .map_err(failed)?;
            let _ = conn.close().await;
            let released = done.rows_affected() == 1;
            if released {
                match slot {
                    _ if rw => wakeups.wake(&rw_wake_key(&name)),
                    Some(_) => wakeups.wake(&wake_key(&name)),
                    None => wakeups.wake(&name),
                }
            }
            Ok(released)
        }))
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        if self.rw {
            let _turn = self.inner.gate.urgent().await;
            let done = sqlx::query(AssertSqlSafe(self.inner.rw.extend.as_str()))
                .bind(&self.name)
                .bind(&self.owner_hex)
                .bind(now_ms())
                .bind(super::lock::ms(ttl))
                .execute(&self.inner.pool)
                .await
                .map_err(|e| map_sqlx(BACKEND, "extending a reader-writer lock", e))?;
            return Ok(done.rows_affected() == 1);
        }
        if let Some(slot) = self.slot {
            let _turn = self.inner.gate.urgent().await;
            let done = sqlx::query(AssertSqlSafe(self.inner.permits.extend.as_str()))
                .bind(&self.name)
                .bind(i64::from(slot))
                .bind(&self.owner_hex)
                .bind(now_ms())
                .bind(super::lock::ms(ttl))
                .execute(&self.inner.pool)
                .await
                .map_err(|e| map_sqlx(BACKEND, "extending a permit", e))?;
            return Ok(done.rows_affected() == 1);
        }
        let held = self.held();
        self.inner.extends.call(Extension { held, ttl }).await
    }

    async fn upgrade(
        &self,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Option<u64>, LockError> {
        if !self.upgradeable {
            return Err(LockError::invalid_options(
                "only an upgradeable read can be upgraded",
            ));
        }
        super::rw::upgrade(&self.inner, &self.name, &self.owner_hex, deadline).await
    }

    /// Rewrite the row's holder record while the lease is ours and live
    /// (one statement, this process's writers taking turns as for a grant).
    async fn set_value(&self, value: &[u8]) -> Result<bool, LockError> {
        let record = self.record.with_value(value);
        let _turn = self.inner.gate.acquisition().await;
        if self.rw {
            let done = sqlx::query(AssertSqlSafe(self.inner.rw.set_holder.as_str()))
                .bind(&self.name)
                .bind(&self.owner_hex)
                .bind(now_ms())
                .bind(record.as_bytes())
                .execute(&self.inner.pool)
                .await
                .map_err(|e| map_sqlx(BACKEND, "replacing a holder's value", e))?;
            return Ok(done.rows_affected() == 1);
        }
        if let Some(slot) = self.slot {
            let done = sqlx::query(AssertSqlSafe(self.inner.permits.set_holder.as_str()))
                .bind(&self.name)
                .bind(i64::from(slot))
                .bind(&self.owner_hex)
                .bind(now_ms())
                .bind(record.as_bytes())
                .execute(&self.inner.pool)
                .await
                .map_err(|e| map_sqlx(BACKEND, "replacing a holder's value", e))?;
            return Ok(done.rows_affected() == 1);
        }
        let done = sqlx::query(AssertSqlSafe(self.inner.sql.set_holder.as_str()))
            .bind(&self.name)
            .bind(&self.owner_hex)
            .bind(record.as_bytes())
            .bind(now_ms())
            .execute(&self.inner.pool)
            .await
            .map_err(|e| map_sqlx(BACKEND, "replacing a holder's value", e))?;
        Ok(done.rows_affected() == 1)
    }
}

impl SqliteHandle {
    pub(crate) fn held(&self) -> Held {
        Held {
            name: self.name.clone(),
            owner_hex: self.owner_hex.clone(),
        }
    }
}
