//! The Postgres statements of the reader-writer locks (see [`crate::rw`]):
//! tables `{t}_rw` and `{t}_rw_marks` are `UNLOGGED` (a grant's row lock
//! and a waiting writer's mark write no WAL), which loses nothing a crash
//! would not: crash recovery empties them, but every session, and so every
//! grant and every wait, ended with the crash; the rows are made again on
//! first use.

use std::time::Duration;

use lock_core::Access;
use lock_core::raw::{READER_MARK, lease_millis};
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, Postgres};

use super::LOCK_NOT_AVAILABLE;

/// The reader-writer locks' statements, with the (validated) table name in
/// place.
#[derive(Clone)]
pub(super) struct Statements {
    /// Create `$1`'s row if missing.
    ensure: String,
    /// A live mark (at `$2`) of `$1` of a writer that arrived at or before
    /// `$3`: what keeps a reader out.
    marked: String,
    /// A live mark (at `$2`) of `$1` of a reader that arrived before `$3`:
    /// what keeps a writer out.
    marked_by_readers: String,
    /// Share `$1`'s row, or fail at once.
    read: String,
    /// Hold `$1`'s row alone, or fail at once.
    write: String,
    /// Put or renew mark `$2` of `$1`: arrival `$3`, expiry `$4`.
    mark: String,
    /// Remove mark `$2` of `$1`.
    unmark: String,
    /// Remove mark `$2` of `$1` for good: a dead row (expiry 0) that a mark
    /// still on its way cannot revive.
    bury: String,
    /// Whether `$1` has a row.
    exists: String,
    /// Share `$1`'s row if no writer holds it (for the statement only).
    probe_share: String,
    /// Hold `$1`'s row if nobody does (for the statement only).
    probe_alone: String,
    /// The live marks (at `$2`) of `$1`'s waiting writers.
    marks: String,
}

/// The tables' statements, for `PgLock::ddl`.
pub(super) fn ddl(t: &str) -> [String; 2] {
    [
        format!("CREATE UNLOGGED TABLE IF NOT EXISTS {t}_rw (name TEXT PRIMARY KEY)"),
        format!(
            "CREATE UNLOGGED TABLE IF NOT EXISTS {t}_rw_marks (name TEXT NOT NULL, \
             owner TEXT NOT NULL, arrival BIGINT NOT NULL, expires BIGINT NOT NULL, \
             PRIMARY KEY (name, owner))"
        ),
    ]
}

/// The clean-up of unused names' reader-writer rows, in its transaction
/// after the counters' (see `PgLock::remove_unused`): the marks that
/// expired before `$1` (waiters that crashed), then the rows of names with
/// no write counter left and no mark, but for rows held now.
pub(super) fn clean_up(t: &str) -> [String; 2] {
    let (rw, marks) = (format!("{t}_rw"), format!("{t}_rw_marks"));
    [
        format!("DELETE FROM {marks} WHERE expires < $1"),
        format!(
            "DELETE FROM {rw} WHERE name IN (SELECT name FROM {rw} r WHERE NOT EXISTS \
             (SELECT 1 FROM {t}_counters c WHERE c.name = \
             chr(1) || 'rw:' || encode(sha256(convert_to(r.name, 'UTF8')), 'hex')) \
             AND NOT EXISTS (SELECT 1 FROM {marks} m WHERE m.name = r.name) \
             FOR UPDATE SKIP LOCKED)"
        ),
    ]
}

impl Statements {
    pub(super) fn new(t: &str) -> Self {
        let (rw, marks) = (format!("{t}_rw"), format!("{t}_rw_marks"));
        Statements {
            ensure: format!("INSERT INTO {rw} (name) VALUES ($1) ON CONFLICT DO NOTHING"),
            marked: format!(
                "SELECT 1 FROM {marks} WHERE name = $1 AND expires > $2 AND arrival <= $3 \
                 AND owner NOT LIKE '{READER_MARK}%' LIMIT 1"
            ),
            marked_by_readers: format!(
                "SELECT 1 FROM {marks} WHERE name = $1 AND expires > $2 AND arrival < $3 \
                 AND owner LIKE '{READER_MARK}%' LIMIT 1"
            ),
            read: format!("SELECT name FROM {rw} WHERE name = $1 FOR SHARE NOWAIT"),
            write: format!("SELECT name FROM {rw} WHERE name = $1 FOR UPDATE NOWAIT"),
            mark: format!(
                "INSERT INTO {marks} (name, owner, arrival, expires) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (name, owner) DO UPDATE SET expires = EXCLUDED.expires \
                 WHERE {marks}.expires <> 0"
            ),
            unmark: format!("DELETE FROM {marks} WHERE name = $1 AND owner = $2"),
            bury: format!(
                "INSERT INTO {marks} (name, owner, arrival, expires) VALUES ($1, $2, 0, 0) \
                 ON CONFLICT (name, owner) DO UPDATE SET expires = 0"
            ),
            exists: format!("SELECT name FROM {rw} WHERE name = $1"),
            probe_share: format!("SELECT name FROM {rw} WHERE name = $1 FOR SHARE SKIP LOCKED"),
            probe_alone: format!("SELECT name FROM {rw} WHERE name = $1 FOR UPDATE SKIP LOCKED"),
            marks: format!(
                "SELECT COUNT(*) FROM {marks} WHERE name = $1 AND expires > $2 \
                 AND owner NOT LIKE '{READER_MARK}%'"
            ),
        }
    }

    /// See [`Dialect::take_rw`](crate::engine::Dialect::take_rw): the
    /// transaction reads committed rows; a name without a row gets one
    /// (committed at once) and is tried again.
    pub(super) async fn take(
        &self,
        conn: &mut PoolConnection<Postgres>,
        name: &str,
        access: Access,
        (arrival, now): (i64, i64),
        ttl: Duration,
    ) -> Result<bool, sqlx::Error> {
        // A number only: nothing a caller controls is spliced.
        let begin = format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; \
             SET LOCAL idle_in_transaction_session_timeout = {}",
            lease_millis(ttl)
        );
        for made in [false, true] {
            sqlx::raw_sql(AssertSqlSafe(begin.as_str()))
                .execute(&mut **conn)
                .await?;
            let taken = self.take_in(conn, name, access, arrival, now).await;
            if !matches!(taken, Ok(Some(true))) {
                sqlx::raw_sql("ROLLBACK").execute(&mut **conn).await?;
            }
            match taken? {
                Some(taken) => return Ok(taken),
                None if !made => {
                    sqlx::query(AssertSqlSafe(self.ensure.as_str()))
                        .bind(name)
                        .execute(&mut **conn)
                        .await?;
                }
                None => return Ok(false),
            }
        }
        Ok(false)
    }

    /// In the open transaction: `Some(true)` when the row is taken,
    /// `Some(false)` when a writer's mark or a holder is in the way, `None`
    /// when the name has no row.
    async fn take_in(
        &self,
        conn: &mut PoolConnection<Postgres>,
        name: &str,
        access: Access,
        arrival: i64,
        now: i64,
    ) -> Result<Option<bool>, sqlx::Error> {
        // A reader waits behind an earlier waiting writer, a writer
        // behind an earlier waiting reader.
        let marked = match access {
            Access::Write => &self.marked_by_readers,
            _ => &self.marked,
        };
        {
            let marked = sqlx::query(AssertSqlSafe(marked.as_str()))
                .bind(name)
                .bind(now)
                .bind(arrival)
                .fetch_optional(&mut **conn)
                .await?;
            if marked.is_some() {
                return Ok(Some(false));
            }
        }
        let sql = match access {
            Access::Write => &self.write,
            _ => &self.read,
        };
        match sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(name)
            .fetch_optional(&mut **conn)
            .await
        {
            Ok(row) => Ok(row.map(|_| true)),
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                Ok(Some(false))
            }
            Err(e) => Err(e),
        }
    }

    /// See [`Dialect::mark_rw`](crate::engine::Dialect::mark_rw).
    pub(super) async fn mark(
        &self,
        conn: &mut PoolConnection<Postgres>,
        name: &str,
        id: &str,
        arrival: i64,
        expires: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(AssertSqlSafe(self.mark.as_str()))
            .bind(name)
            .bind(id)
            .bind(arrival)
            .bind(expires)
            .execute(&mut **conn)
            .await
            .map(drop)
    }

    /// See [`Dialect::unmark_rw`](crate::engine::Dialect::unmark_rw).
    pub(super) async fn unmark(
        &self,
        pool: &sqlx::PgPool,
        name: &str,
        id: &str,
        for_good: bool,
    ) -> Result<(), sqlx::Error> {
        let sql = match for_good {
            true => &self.bury,
            false => &self.unmark,
        };
        sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(name)
            .bind(id)
            .execute(pool)
            .await
            .map(drop)
    }

    /// See [`Dialect::rw_state`](crate::engine::Dialect::rw_state): the row
    /// probed in a transaction of its own, rolled back (an acquisition at
    /// that moment finds it held and looks again at its next poll).
    pub(super) async fn state(
        &self,
        pool: &sqlx::PgPool,
        name: &str,
        now: i64,
    ) -> Result<(Option<Access>, usize), sqlx::Error> {
        let marks: i64 = sqlx::query_scalar(AssertSqlSafe(self.marks.as_str()))
            .bind(name)
            .bind(now)
            .fetch_one(pool)
            .await?;
        let marks = usize::try_from(marks).unwrap_or(0);
        let mut tx = pool.begin().await?;
        let probe = async {
            let exists = sqlx::query(AssertSqlSafe(self.exists.as_str()))
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
            if exists.is_none() {
                return Ok(None);
            }
            let shared = sqlx::query(AssertSqlSafe(self.probe_share.as_str()))
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
            if shared.is_none() {
                return Ok(Some(Access::Write));
            }
            let alone = sqlx::query(AssertSqlSafe(self.probe_alone.as_str()))
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
            Ok::<_, sqlx::Error>(alone.is_none().then_some(Access::Read))
        }
        .await;
        tx.rollback().await?;
        Ok((probe?, marks))
    }
}
