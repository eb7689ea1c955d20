//! SQLite reader-writer locks: each grant is a lease row of table
//! `{t}_rw`, one per `(name, owner)`, with its access (read or write), its
//! expiry and its holder record; a waiter has a row of its own there too,
//! a mark with its arrival and a short expiry that each of its attempts
//! renews. An acquisition is one `BEGIN IMMEDIATE` transaction. A
//! writer is granted when no live lease of the name is held; it takes its
//! token from the name's write counter (`{t}_rw_fence`), raised in the
//! same epoch as the locks' counters (`tokens`), and no live mark of a
//! reader that arrived before it is there (readers that queued before a
//! writer keep their place). A reader is granted when
//! no live writer holds and no live mark of a writer that arrived before
//! it is there; it carries the counter as it is (the latest write's
//! token). Release, extend and the value's rewrite compare the owner
//! token, as for a lock. Waiters poll (a release in this process wakes
//! them at once); a waiter that gives up removes its mark.
//!
//! An upgradeable reader's row has access 3: it is granted as a reader is,
//! and only when no other such row (3, 5 or 4) is live. Its upgrade turns
//! the row to 5 (upgrading: new readers wait, as behind a writer) while
//! other readers' rows are live, and to 4 (upgraded: a writer, the counter
//! raised) once none is, in one transaction each time; the row stays its
//! lease, so renewals and the release go on as before.

use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::{
    Arrival, Attempt, CleanUpOnDrop, HolderRecord, MARK_RENEWAL, MARK_TTL, OwnerToken,
    PendingGrant, RawGuard, RawLock, Request, Unrenewed, WaitMark, acquire_by_polling,
};
use lock_core::{Access, LockError, LockGuard, LockOptions, RwHolderInfo, RwLockInfo};
use sqlx::AssertSqlSafe;
use tokio::time::Instant;

use super::lock::{BACKEND, Inner, SqliteLock, ms, now_ms, time_left};
use crate::error::map_sqlx;
use crate::ident::Identifier;

/// The rows' `access` column: a reader's lease, a writer's, a waiting
/// writer's mark and a waiting reader's.
const READ: i64 = 0;
const WRITE: i64 = 1;
const WRITER_MARK: i64 = 2;
const READER_MARK: i64 = 6;
/// An upgradeable reader's lease, its upgrade under way, and the lease of
/// an upgraded one (a writer's).
const UPGRADEABLE: i64 = 3;
const UPGRADED: i64 = 4;
const UPGRADING: i64 = 5;

/// The reader-writer locks' statements, with the validated table name
/// filled in once.
pub(crate) struct RwStatements {
    /// The tables.
    pub(crate) create: [String; 2],
    /// Drop `?1`'s rows whose expiry passed (`?2`: now).
    expired: String,
    /// The earliest expiry of a live lease of `?1` (`?2`: now), and
    /// whether a writer (or an upgrade under way or done) holds one.
    held: String,
    /// Put or renew mark `?2` of `?1`: arrival `?3`, expiry `?4`, its
    /// access `?5` (a writer's mark or a reader's).
    mark: String,
    /// Remove mark `?2` of `?1`.
    unmark: String,
    /// Grant `?1` to owner `?2` for writing, reading, or an upgradeable
    /// read (expiry `?3`, arrival `?4`, holder record `?5`) if no live
    /// row conflicts (`?6`: now): for a writer, any holder or the mark of
    /// a reader that arrived before it; for a reader,
    /// a writer (an upgrade under way or done) or the mark of a writer
    /// that arrived at or before it; for an upgradeable reader, those or
    /// another upgradeable reader.
    grant: [String; 3],
    /// Raise `?1`'s write counter in epoch `?2`; answers it.
    raise: String,
    /// `?1`'s write counter.
    counter: String,
    /// Free owner `?2`'s lease of `?1` (`?3`: now).
    pub(crate) release: String,
    /// Extend owner `?2`'s lease of `?1` to `?3 + ?4`.
    pub(crate) extend: String,
    /// Replace the holder record (`?4`) of owner `?2`'s lease of `?1`
    /// (`?3`: now).
    pub(crate) set_holder: String,
    /// The live leases of `?1` (`?2`: now) and its live marks.
    state: String,
    /// The access of owner `?2`'s live lease of `?1` (`?3`: now).
    own_access: String,
    /// The earliest expiry of a live reader's lease of `?1` other than
    /// owner `?2`'s (`?3`: now).
    other_readers: String,
    /// Set owner `?2`'s lease of `?1` to access `?3`.
    set_access: String,
    /// Owner `?2`'s upgrade of `?1` under way gives up: back to an
    /// upgradeable read.
    give_up: String,
}

impl RwStatements {
    /// The grant statement for `access`.
    fn grant_for(&self, access: Access) -> &str {
        match access {
            Access::Write => &self.grant[0],
            Access::Upgradeable => &self.grant[2],
            _ => &self.grant[1],
        }
    }

    pub(crate) fn new(table: &Identifier) -> Self {
        let t = format!("{}_rw", table.as_str());
        let live = "owner = ?2 AND access IN (0, 1, 3, 4, 5) AND expires_at_ms > ?3";
        RwStatements {
            create: [
                format!(
                    "CREATE TABLE IF NOT EXISTS \"{t}\" (\
                     name TEXT NOT NULL, owner TEXT NOT NULL, access INTEGER NOT NULL, \
                     expires_at_ms INTEGER NOT NULL, arrival_ms INTEGER NOT NULL, holder BLOB, \
                     PRIMARY KEY (name, owner)) WITHOUT ROWID"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS \"{t}_fence\" (\
                     name TEXT PRIMARY KEY, fence INTEGER NOT NULL) WITHOUT ROWID"
                ),
            ],
            expired: format!("DELETE FROM \"{t}\" WHERE name = ?1 AND expires_at_ms <= ?2"),
            held: format!(
                "SELECT MIN(expires_at_ms), MAX(access IN (1, 4, 5)) \
                 FROM \"{t}\" WHERE name = ?1 AND access NOT IN (2, 6) AND expires_at_ms > ?2"
            ),
            mark: format!(
                "INSERT INTO \"{t}\" (name, owner, access, expires_at_ms, arrival_ms) \
                 VALUES (?1, ?2, ?5, ?4, ?3) \
                 ON CONFLICT(name, owner) DO UPDATE SET expires_at_ms = excluded.expires_at_ms"
            ),
            unmark: format!(
                "DELETE FROM \"{t}\" WHERE name = ?1 AND owner = ?2 AND access IN (2, 6)"
            ),
            grant: [
                (
                    WRITE,
                    "(access NOT IN (2, 6) OR (access = 6 AND arrival_ms < ?4))",
                ),
                (
                    READ,
                    "(access IN (1, 4, 5) OR (access = 2 AND arrival_ms <= ?4))",
                ),
                (
                    UPGRADEABLE,
                    "(access IN (1, 3, 4, 5) OR (access = 2 AND arrival_ms <= ?4))",
                ),
            ]
            .map(|(access, conflict)| {
                format!(
                    "INSERT INTO \"{t}\" (name, owner, access, expires_at_ms, arrival_ms, holder) \
                     SELECT ?1, ?2, {access}, ?3, ?4, ?5 WHERE NOT EXISTS (SELECT 1 FROM \"{t}\" \
                     WHERE name = ?1 AND expires_at_ms > ?6 AND {conflict})"
                )
            }),
            raise: format!(
                "INSERT INTO \"{t}_fence\" (name, fence) VALUES (?1, (?2 << 32) + 1) \
                 ON CONFLICT(name) DO UPDATE SET fence = MAX(fence, ?2 << 32) + 1 \
                 RETURNING fence"
            ),
            counter: format!("SELECT fence FROM \"{t}_fence\" WHERE name = ?1"),
            release: format!("DELETE FROM \"{t}\" WHERE name = ?1 AND {live}"),
            extend: format!(
                "UPDATE \"{t}\" SET expires_at_ms = ?3 + ?4 WHERE name = ?1 AND {live}"
            ),
            set_holder: format!("UPDATE \"{t}\" SET holder = ?4 WHERE name = ?1 AND {live}"),
            state: format!(
                "SELECT access, expires_at_ms, holder FROM \"{t}\" \
                 WHERE name = ?1 AND expires_at_ms > ?2 ORDER BY access DESC, arrival_ms"
            ),
            own_access: format!(
                "SELECT access FROM \"{t}\" WHERE name = ?1 AND owner = ?2 \
                 AND access NOT IN (2, 6) AND expires_at_ms > ?3"
            ),
            other_readers: format!(
                "SELECT MIN(expires_at_ms) FROM \"{t}\" WHERE name = ?1 AND owner <> ?2 \
                 AND access = 0 AND expires_at_ms > ?3"
            ),
            set_access: format!("UPDATE \"{t}\" SET access = ?3 WHERE name = ?1 AND owner = ?2"),
            give_up: format!(
                "UPDATE \"{t}\" SET access = 3 WHERE name = ?1 AND owner = ?2 AND access = 5"
            ),
        }
    }
}

/// The key this process's wake-ups use for reader-writer lock `name`
/// (apart from the lock and the semaphore of that name).
pub(crate) fn wake_key(name: &str) -> String {
    format!("\u{0}rw\u{0}{name}")
}

impl SqliteLock {
    /// One attempt at `access` to `name`, as a newcomer arriving at
    /// `arrival` or as the waiter `mark`.
    async fn attempt_rw(
        &self,
        name: &str,
        opts: &LockOptions,
        access: Access,
        arrival: Arrival,
        mark: Option<&WaitMark>,
    ) -> Result<Attempt, LockError> {
        let inner = &self.inner;
        let sql = &inner.rw;
        let owner = OwnerToken::random();
        let record = opts.holder_record();
        let bytes = record.as_bytes().to_vec();
        let mut handle = self.handle(name, owner, record);
        handle.rw = true;
        handle.upgradeable = access == Access::Upgradeable;
        let owner_hex = handle.owner_hex.clone();
        let arrival = mark.map_or(arrival, |m| m.arrival()).millis_i64();
        let sent_at = Instant::now();
        let now = now_ms();
        let failed = |e| map_sqlx(BACKEND, "acquiring a reader-writer lock", e);
        let turn = inner.gate.acquisition().await;
        let mut tx = inner
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(failed)?;
        // The grant, if nothing conflicts: one statement on the way in.
        let granted = sqlx::query(AssertSqlSafe(sql.grant_for(access)))
            .bind(name)
            .bind(&owner_hex)
            .bind(now.saturating_add(ms(opts.ttl)))
            .bind(arrival)
            .bind(bytes)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(failed)?
            .rows_affected()
            == 1;
        if !granted {
            // Refused: clear the rows whose lease ran out, and learn how
            // long the blocking lease lasts.
            sqlx::query(AssertSqlSafe(sql.expired.as_str()))
                .bind(name)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(failed)?;
            let (earliest, writing): (Option<i64>, Option<i64>) =
                sqlx::query_as(AssertSqlSafe(sql.held.as_str()))
                    .bind(name)
                    .bind(now)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(failed)?;
            // Held by a writer (a writer waits for every holder): until its
            // lease ends; else behind a mark or an upgradeable reader.
            let left = match access {
                Access::Write => earliest.map(|e| time_left(e, now)),
                _ if writing == Some(1) => earliest.map(|e| time_left(e, now)),
                _ => None,
            };
            if let Some(m) = mark {
                m.placing();
                sqlx::query(AssertSqlSafe(sql.mark.as_str()))
                    .bind(name)
                    .bind(m.id())
                    .bind(arrival)
                    .bind(now.saturating_add(ms(MARK_TTL)))
                    .bind(match m.is_reader() {
                        true => READER_MARK,
                        false => WRITER_MARK,
                    })
                    .execute(&mut *tx)
                    .await
                    .map_err(failed)?;
            }
            tx.commit().await.map_err(failed)?;
            drop(turn);
            // A waiter comes back before its mark lapses.
            let left = match mark {
                Some(_) => Some(left.map_or(MARK_RENEWAL, |l| l.min(MARK_RENEWAL))),
                None => left,
            };
            return Ok(Attempt::Held { expires_in: left });
        }
        if let Some(m) = mark.filter(|m| m.may_be_placed()) {
            sqlx::query(AssertSqlSafe(sql.unmark.as_str()))
                .bind(name)
                .bind(m.id())
                .execute(&mut *tx)
                .await
                .map_err(failed)?;
        }
        let fence: i64 = match access {
            Access::Write => sqlx::query_scalar(AssertSqlSafe(sql.raise.as_str()))
                .bind(name)
                .bind(inner.epoch.current())
                .fetch_one(&mut *tx)
                .await
                .map_err(failed)?,
            _ => sqlx::query_scalar(AssertSqlSafe(sql.counter.as_str()))
                .bind(name)
                .fetch_optional(&mut *tx)
                .await
                .map_err(failed)?
                .unwrap_or(0),
        };
        let pending = PendingGrant::new(Arc::new(handle));
        tx.commit().await.map_err(failed)?;
        drop(turn);
        if let Some(m) = mark {
            m.removed();
        }
        if access == Access::Write {
            inner.epoch.cover(&inner.pool, fence).await?;
        }
        let (handle, lease) = match pending.grant_in_time(BACKEND, name, sent_at, opts).await {
            Ok(granted) => granted,
            Err(too_late) => return Ok(Attempt::TooLate(too_late)),
        };
        let token = u64::try_from(fence).ok().filter(|_| inner.fencing);
        let guard = LockGuard::new(name, token, self.raw_capabilities(), lease, handle)
            .with_access(Some(access));
        Ok(Attempt::Acquired(guard.kept_by(
            &self.watchdog,
            opts,
            Unrenewed::Left,
        )))
    }

    /// One attempt without waiting.
    pub(crate) async fn try_rw(
        &self,
        req: Request<'_>,
        access: Access,
    ) -> Result<Option<LockGuard>, LockError> {
        self.attempt_rw(req.name, req.opts, access, Arrival::now(), None)
            .await?
            .into_guard()
    }

    /// Wait for `access`, polling; a release in this process wakes the
    /// wait at once. The waiter marks itself at its first refusal and
    /// renews the mark at each attempt.
    pub(crate) async fn wait_for_rw(
        &self,
        req: Request<'_>,
        access: Access,
    ) -> Result<Option<LockGuard>, LockError> {
        let (name, opts) = (req.name, req.opts);
        let wake = self.inner.wakeups.subscribe(&wake_key(name));
        let arrival = Arrival::now();
        let mark = {
            let (inner, name) = (Arc::clone(&self.inner), name.to_string());
            WaitMark::new(
                access,
                arrival,
                Arc::new(move |id| {
                    let (inner, name) = (Arc::clone(&inner), name.clone());
                    Box::pin(async move {
                        let _turn = inner.gate.urgent().await;
                        sqlx::query(AssertSqlSafe(inner.rw.unmark.as_str()))
                            .bind(&name)
                            .bind(&id)
                            .execute(&inner.pool)
                            .await
                            .map(|_| ())
                            .map_err(|e| map_sqlx(BACKEND, "removing a waiter's mark", e))
                    })
                }),
            )
        };
        acquire_by_polling(req, Some(wake), |_| {
            self.attempt_rw(name, opts, access, arrival, Some(&mark))
        })
        .await
    }

    /// The live leases of `name`, its write counter and its waiters.
    pub(crate) async fn inspect_rw_lock(&self, name: &str) -> Result<RwLockInfo, LockError> {
        let now = now_ms();
        let failed = |e| map_sqlx(BACKEND, "reading a reader-writer lock", e);
        let rows: Vec<(i64, i64, Option<Vec<u8>>)> =
            sqlx::query_as(AssertSqlSafe(self.inner.rw.state.as_str()))
                .bind(name)
                .bind(now)
                .fetch_all(&self.inner.pool)
                .await
                .map_err(failed)?;
        let fence: Option<i64> = sqlx::query_scalar(AssertSqlSafe(self.inner.rw.counter.as_str()))
            .bind(name)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(failed)?;
        let token = u64::try_from(fence.unwrap_or(0))
            .ok()
            .filter(|_| self.inner.fencing);
        let mut holders = Vec::new();
        let (mut marks, mut readers_waiting) = (0, 0);
        for (access, expires_at, record) in rows {
            let access = match access {
                WRITE | UPGRADED => Access::Write,
                READ => Access::Read,
                UPGRADEABLE => Access::Upgradeable,
                UPGRADING => {
                    // Waits to write.
                    marks += 1;
                    Access::Upgradeable
                }
                READER_MARK => {
                    readers_waiting += 1;
                    continue;
                }
                _ => {
                    marks += 1;
                    continue;
                }
            };
            let holder = record
                .filter(|r| !r.is_empty())
                .map(|r| HolderRecord::decode_for(BACKEND, name, &r))
                .transpose()?;
            holders.push(
                RwHolderInfo::new(access)
                    .with_fencing_token(token)
                    .with_expires_in(Some(time_left(expires_at, now)))
                    .with_holder(holder),
            );
        }
        Ok(RwLockInfo::held(holders)
            .with_fencing_token(token)
            .with_waiting(Some(marks), Some(readers_waiting)))
    }
}

/// Why one look of an upgrade did not upgrade.
enum Look {
    /// Upgraded: the new write token.
    Upgraded(i64),
    /// Other readers hold; the earliest of their leases ends in this long.
    Readers(Duration),
}

impl Inner {
    /// One look of owner `owner_hex`'s upgrade of `name`, in one `BEGIN
    /// IMMEDIATE` transaction: upgraded (again, for a lease already
    /// upgraded), or marked as upgrading while other readers hold.
    /// [`LockError::NotHeld`] if the lease is not a live upgradeable read.
    async fn upgrade_look(&self, name: &str, owner_hex: &str) -> Result<Look, LockError> {
        let sql = &self.rw;
        let failed = |e| map_sqlx(BACKEND, "upgrading a reader-writer lock", e);
        let now = now_ms();
        let turn = self.gate.acquisition().await;
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(failed)?;
        let own: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql.own_access.as_str()))
            .bind(name)
            .bind(owner_hex)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .map_err(failed)?;
        match own {
            Some(UPGRADEABLE | UPGRADING) => {}
            Some(UPGRADED) => {
                let fence: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql.counter.as_str()))
                    .bind(name)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(failed)?;
                return Ok(Look::Upgraded(fence.unwrap_or(0)));
            }
            _ => {
                return Err(LockError::NotHeld {
                    name: name.to_string(),
                });
            }
        }
        let readers: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql.other_readers.as_str()))
            .bind(name)
            .bind(owner_hex)
            .bind(now)
            .fetch_one(&mut *tx)
            .await
            .map_err(failed)?;
        let (access, fence) = match readers {
            Some(_) => (UPGRADING, None),
            None => {
                let fence: i64 = sqlx::query_scalar(AssertSqlSafe(sql.raise.as_str()))
                    .bind(name)
                    .bind(self.epoch.current())
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(failed)?;
                (UPGRADED, Some(fence))
            }
        };
        sqlx::query(AssertSqlSafe(sql.set_access.as_str()))
            .bind(name)
            .bind(owner_hex)
            .bind(access)
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
        tx.commit().await.map_err(failed)?;
        drop(turn);
        match (fence, readers) {
            (Some(fence), _) => {
                self.epoch.cover(&self.pool, fence).await?;
                Ok(Look::Upgraded(fence))
            }
            (None, earliest) => Ok(Look::Readers(time_left(earliest.unwrap_or(now), now))),
        }
    }

    /// Owner `owner_hex`'s upgrade of `name` gives up: readers come in
    /// again (woken in this process).
    async fn give_up_upgrade(&self, name: &str, owner_hex: &str) -> Result<(), LockError> {
        let _turn = self.gate.urgent().await;
        sqlx::query(AssertSqlSafe(self.rw.give_up.as_str()))
            .bind(name)
            .bind(owner_hex)
            .execute(&self.pool)
            .await
            .map_err(|e| map_sqlx(BACKEND, "giving up an upgrade", e))?;
        self.wakeups.wake(&wake_key(name));
        Ok(())
    }
}

/// The upgrade of owner `owner_hex`'s upgradeable read of `name`: looks
/// until no other reader holds, polling (a release in this process wakes
/// it at once, as a waiter), until `deadline`.
pub(crate) async fn upgrade(
    inner: &Arc<Inner>,
    name: &str,
    owner_hex: &str,
    deadline: Option<Instant>,
) -> Result<Option<u64>, LockError> {
    let started = Instant::now();
    let wake = inner.wakeups.subscribe(&wake_key(name));
    // Leaving without upgrading (the deadline, a cancellation, an error)
    // lets readers in again.
    let mut give_up = CleanUpOnDrop::new({
        let (inner, name, owner) = (Arc::clone(inner), name.to_string(), owner_hex.to_string());
        async move {
            if let Err(e) = inner.give_up_upgrade(&name, &owner).await {
                tracing::debug!(target: "distlock", error = %e.report(), "an upgrade that gave up could not let readers in again; they come in once its lease or its release ends it");
            }
        }
    });
    let mut pause = Duration::from_millis(2);
    loop {
        let left = match inner.upgrade_look(name, owner_hex).await {
            Ok(Look::Upgraded(fence)) => {
                give_up.disarm();
                return Ok(u64::try_from(fence).ok().filter(|_| inner.fencing));
            }
            Ok(Look::Readers(left)) => left,
            Err(e @ LockError::NotHeld { .. }) => {
                give_up.disarm();
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(LockError::Timeout {
                name: name.to_string(),
                waited: started.elapsed(),
            });
        }
        let mut until = now + pause.min(left + Duration::from_millis(1));
        if let Some(d) = deadline {
            until = until.min(d);
        }
        let _ = tokio::time::timeout_at(until, wake.notified()).await;
        pause = (pause * 2).min(Duration::from_millis(25));
    }
}
