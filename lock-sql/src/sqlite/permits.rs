//! SQLite semaphores: a permit is a lease row of table `{t}_permits`, one
//! per `(name, slot)`, with the lease table's columns and the limit its
//! holder asked with. An acquisition is one transaction: a live permit of
//! the name held with another limit refuses it; else one statement takes
//! the lowest slot below the limit that no live lease holds (inserting its
//! row, or taking over a free or expired one) and bumps the slot's fencing
//! counter, in the same epoch as the locks' (`tokens`). Release, extend and
//! the value's rewrite compare the owner token, as for a lock. Waiters poll
//! (a release in this process wakes them at once) and take no tickets: the
//! order among waiters for a permit is not promised.

use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::{
    Attempt, OwnerToken, PendingGrant, RawGuard, RawLock, Request, Unrenewed, acquire_by_polling,
    limit_mismatch,
};
use lock_core::{LockError, LockGuard, LockOptions, PermitInfo, SemaphoreInfo};
use sqlx::AssertSqlSafe;
use tokio::time::Instant;

use super::lock::{BACKEND, SqliteLock, ms, now_ms, time_left};
use crate::error::map_sqlx;
use crate::ident::Identifier;

/// The largest semaphore limit (the slots are counted by a recursive
/// query).
pub(crate) const MAX_LIMIT: u32 = 1024;

/// The permits' statements, with the validated table name filled in once.
pub(crate) struct PermitStatements {
    pub(crate) create: String,
    /// A live permit of `?1` held with another limit than `?3` (`?2`: now).
    other_limit: String,
    /// Take the lowest free slot of `?1` below `?3`: owner `?4`, expiry
    /// `?5`, holder record `?6`, epoch `?7` (`?2`: now); answers the slot
    /// and its token.
    acquire: String,
    /// The live permits of `?1` (`?2`: now).
    held: String,
    /// The earliest expiry of a live permit of `?1` (`?2`: now).
    next_expiry: String,
    /// Free slot `?2` of `?1` if owner `?3` still holds it (`?4`: now).
    pub(crate) release: String,
    /// Extend slot `?2` of `?1` to `?4 + ?5` if owner `?3` still holds it.
    pub(crate) extend: String,
    /// Replace the holder record (`?5`) of slot `?2` of `?1` while owner
    /// `?3` holds it (`?4`: now).
    pub(crate) set_holder: String,
}

impl PermitStatements {
    pub(crate) fn new(table: &Identifier) -> Self {
        let t = format!("{}_permits", table.as_str());
        PermitStatements {
            create: format!(
                "CREATE TABLE IF NOT EXISTS \"{t}\" (\
                 name TEXT NOT NULL, slot INTEGER NOT NULL, owner TEXT, \
                 fence INTEGER NOT NULL DEFAULT 0, expires_at_ms INTEGER NOT NULL DEFAULT 0, \
                 lim INTEGER NOT NULL DEFAULT 0, holder BLOB, \
                 PRIMARY KEY (name, slot)) WITHOUT ROWID"
            ),
            other_limit: format!(
                "SELECT lim FROM \"{t}\" WHERE name = ?1 AND owner IS NOT NULL \
                 AND expires_at_ms > ?2 AND lim <> ?3 LIMIT 1"
            ),
            acquire: format!(
                "WITH RECURSIVE s(slot) AS (SELECT 0 UNION ALL SELECT slot + 1 FROM s WHERE slot + 1 < ?3), \
                 free AS (SELECT s.slot FROM s WHERE NOT EXISTS (\
                 SELECT 1 FROM \"{t}\" p WHERE p.name = ?1 AND p.slot = s.slot \
                 AND p.owner IS NOT NULL AND p.expires_at_ms > ?2) ORDER BY s.slot LIMIT 1) \
                 INSERT INTO \"{t}\" (name, slot, owner, fence, expires_at_ms, lim, holder) \
                 SELECT ?1, slot, ?4, (?7 << 32) + 1, ?5, ?3, ?6 FROM free WHERE true \
                 ON CONFLICT(name, slot) DO UPDATE SET owner = excluded.owner, \
                 fence = MAX(fence, ?7 << 32) + 1, expires_at_ms = excluded.expires_at_ms, \
                 lim = excluded.lim, holder = excluded.holder \
                 RETURNING slot, fence"
            ),
            held: format!(
                "SELECT slot, fence, expires_at_ms, holder, lim FROM \"{t}\" \
                 WHERE name = ?1 AND owner IS NOT NULL AND expires_at_ms > ?2 ORDER BY slot"
            ),
            next_expiry: format!(
                "SELECT MIN(expires_at_ms) FROM \"{t}\" \
                 WHERE name = ?1 AND owner IS NOT NULL AND expires_at_ms > ?2"
            ),
            release: format!(
                "UPDATE \"{t}\" SET owner = NULL, expires_at_ms = 0 \
                 WHERE name = ?1 AND slot = ?2 AND owner = ?3 AND expires_at_ms > ?4"
            ),
            extend: format!(
                "UPDATE \"{t}\" SET expires_at_ms = ?4 + ?5 \
                 WHERE name = ?1 AND slot = ?2 AND owner = ?3 AND expires_at_ms > ?4"
            ),
            set_holder: format!(
                "UPDATE \"{t}\" SET holder = ?5 \
                 WHERE name = ?1 AND slot = ?2 AND owner = ?3 AND expires_at_ms > ?4"
            ),
        }
    }
}

/// A live permit's row: slot, token, expiry (Unix ms), holder record,
/// limit.
type PermitRow = (i64, i64, i64, Option<Vec<u8>>, i64);

/// The key this process's wake-ups use for semaphore `name` (apart from
/// the lock of that name).
pub(crate) fn wake_key(name: &str) -> String {
    format!("\u{0}permits\u{0}{name}")
}

impl SqliteLock {
    /// One attempt at a permit of `name` among `limit`.
    pub(crate) async fn attempt_permit(
        &self,
        name: &str,
        opts: &LockOptions,
        limit: u32,
    ) -> Result<Attempt, LockError> {
        let inner = &self.inner;
        let sql = &inner.permits;
        let owner = OwnerToken::random();
        let record = opts.holder_record();
        let bytes = record.as_bytes().to_vec();
        let mut handle = self.handle(name, owner, record);
        let owner_hex = handle.owner_hex.clone();
        let sent_at = Instant::now();
        let now = now_ms();
        let failed = |e| map_sqlx(BACKEND, "acquiring a permit", e);
        let turn = inner.gate.acquisition().await;
        let mut tx = inner
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(failed)?;
        let other: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql.other_limit.as_str()))
            .bind(name)
            .bind(now)
            .bind(i64::from(limit))
            .fetch_optional(&mut *tx)
            .await
            .map_err(failed)?;
        if let Some(held) = other {
            tx.rollback().await.map_err(failed)?;
            return Err(limit_mismatch(
                name,
                limit,
                u32::try_from(held).unwrap_or(u32::MAX),
            ));
        }
        let granted: Option<(i64, i64)> = sqlx::query_as(AssertSqlSafe(sql.acquire.as_str()))
            .bind(name)
            .bind(now)
            .bind(i64::from(limit))
            .bind(&owner_hex)
            .bind(now.saturating_add(ms(opts.ttl)))
            .bind(bytes)
            .bind(inner.epoch.current())
            .fetch_optional(&mut *tx)
            .await
            .map_err(failed)?;
        let Some((slot, fence)) = granted else {
            tx.rollback().await.map_err(failed)?;
            drop(turn);
            let expires_in = self.next_permit_expiry(name).await?;
            return Ok(Attempt::Held { expires_in });
        };
        let slot = u32::try_from(slot).map_err(|_| LockError::Backend {
            backend: BACKEND,
            reason: format!("permit slot of {name:?} out of range ({slot})"),
            source: None,
        })?;
        handle.slot = Some(slot);
        let pending = PendingGrant::new(Arc::new(handle));
        tx.commit().await.map_err(failed)?;
        drop(turn);
        inner.epoch.cover(&inner.pool, fence).await?;
        let (handle, lease) = match pending.grant_in_time(BACKEND, name, sent_at, opts).await {
            Ok(granted) => granted,
            Err(too_late) => return Ok(Attempt::TooLate(too_late)),
        };
        let token = u64::try_from(fence).ok().filter(|_| inner.fencing);
        let guard = LockGuard::new(name, token, self.raw_capabilities(), lease, handle)
            .with_slot(Some(slot));
        Ok(Attempt::Acquired(guard.kept_by(
            &self.watchdog,
            opts,
            Unrenewed::Left,
        )))
    }

    /// Wait for a permit, polling; a release in this process wakes the
    /// wait at once.
    pub(crate) async fn wait_for_permit(
        &self,
        req: Request<'_>,
        limit: u32,
    ) -> Result<Option<LockGuard>, LockError> {
        let (name, opts) = (req.name, req.opts);
        let wake = self.inner.wakeups.subscribe(&wake_key(name));
        acquire_by_polling(req, Some(wake), |_| self.attempt_permit(name, opts, limit)).await
    }

    /// How long until the first live permit of `name` expires.
    async fn next_permit_expiry(&self, name: &str) -> Result<Option<Duration>, LockError> {
        let now = now_ms();
        let earliest: Option<i64> =
            sqlx::query_scalar(AssertSqlSafe(self.inner.permits.next_expiry.as_str()))
                .bind(name)
                .bind(now)
                .fetch_one(&self.inner.pool)
                .await
                .map_err(|e| map_sqlx(BACKEND, "reading a semaphore", e))?;
        Ok(earliest.map(|e| time_left(e, now)))
    }

    /// The live permits of `name`.
    pub(crate) async fn inspect_permits(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        let now = now_ms();
        let rows: Vec<PermitRow> = sqlx::query_as(AssertSqlSafe(self.inner.permits.held.as_str()))
            .bind(name)
            .bind(now)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| map_sqlx(BACKEND, "reading a semaphore", e))?;
        let Some(limit) = rows.first().map(|r| r.4) else {
            return Ok(SemaphoreInfo::free());
        };
        let mut permits = Vec::with_capacity(rows.len());
        for (slot, fence, expires_at, record, _) in rows {
            let holder = record
                .filter(|r| !r.is_empty())
                .map(|r| lock_core::raw::HolderRecord::decode_for(BACKEND, name, &r))
                .transpose()?;
            permits.push(
                PermitInfo::new(u32::try_from(slot).unwrap_or(u32::MAX))
                    .with_fencing_token(u64::try_from(fence).ok().filter(|_| self.inner.fencing))
                    .with_expires_in(Some(time_left(expires_at, now)))
                    .with_holder(holder),
            );
        }
        Ok(SemaphoreInfo::held(
            u32::try_from(limit).unwrap_or(u32::MAX),
            permits,
        ))
    }
}
