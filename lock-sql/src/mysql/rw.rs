//! The MySQL/MariaDB statements of the reader-writer locks (see
//! [`crate::rw`]): tables `{t}_rw` and `{t}_rw_marks` are InnoDB (row
//! locks). MariaDB shares a row with `LOCK IN SHARE MODE`, MySQL 8 with
//! `FOR SHARE`; both take it without waiting (`NOWAIT`) or probe it
//! (`SKIP LOCKED`).

use lock_core::Access;
use lock_core::raw::READER_MARK;
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, MySql};

use super::not_granted;

/// The reader-writer locks' statements, with the (validated) table name in
/// place.
pub(super) struct Statements {
    /// Create `?`'s row if missing.
    ensure: String,
    /// A live mark (at `?`) of `?` of a writer that arrived at or before
    /// `?` (name, now, arrival).
    marked: String,
    /// A live mark of a reader that arrived before it: `?` (name, now,
    /// arrival).
    marked_by_readers: String,
    /// Share `?`'s row, or fail at once.
    read: String,
    /// Hold `?`'s row alone, or fail at once.
    write: String,
    /// Put or renew a mark: name, owner, arrival, expiry.
    mark: String,
    /// Remove mark `?` of `?` (name, owner).
    unmark: String,
    /// Remove a mark for good (name, owner): a dead row (expiry 0) that a
    /// mark still on its way cannot revive.
    bury: String,
    /// Whether `?` has a row.
    exists: String,
    /// Share `?`'s row if no writer holds it (until the probe's end).
    probe_share: String,
    /// Hold `?`'s row if nobody does (until the probe's end).
    probe_alone: String,
    /// The live marks of `?`'s waiting writers (at `?`).
    marks: String,
}

/// The tables' statements, for `MySqlLock::ddl`.
pub(super) fn ddl(t: &str) -> [String; 2] {
    [
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_rw (name VARBINARY(1024) PRIMARY KEY) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_rw_marks (name VARBINARY(1024) NOT NULL, \
             owner VARCHAR(64) NOT NULL, arrival BIGINT NOT NULL, expires BIGINT NOT NULL, \
             PRIMARY KEY (name, owner)) ENGINE=InnoDB"
        ),
    ]
}

/// The clean-up of unused names' reader-writer rows (see
/// `MySqlLock::remove_unused`), in its transaction: the marks that expired
/// before `?` (waiters that crashed), then the names with no write counter
/// left and no mark, but for rows held now (then each one's row).
pub(super) fn clean_up(t: &str) -> [String; 3] {
    let (rw, marks) = (format!("{t}_rw"), format!("{t}_rw_marks"));
    [
        format!("DELETE FROM {marks} WHERE expires < ?"),
        format!(
            "SELECT name FROM {rw} r WHERE NOT EXISTS (SELECT 1 FROM {t}_counters c \
             WHERE c.name = CONCAT(CHAR(1), 'rw:', SHA2(r.name, 256))) \
             AND NOT EXISTS (SELECT 1 FROM {marks} m WHERE m.name = r.name) \
             FOR UPDATE SKIP LOCKED"
        ),
        format!("DELETE FROM {rw} WHERE name = ?"),
    ]
}

impl Statements {
    /// The statements on table `t`, in MariaDB's words (`mariadb`) or
    /// MySQL's.
    pub(super) fn new(t: &str, mariadb: bool) -> Self {
        let (rw, marks) = (format!("{t}_rw"), format!("{t}_rw_marks"));
        let share = if mariadb {
            "LOCK IN SHARE MODE"
        } else {
            "FOR SHARE"
        };
        Statements {
            ensure: format!("INSERT IGNORE INTO {rw} (name) VALUES (?)"),
            marked: format!(
                "SELECT 1 FROM {marks} WHERE name = ? AND expires > ? AND arrival <= ? \
                 AND owner NOT LIKE '{READER_MARK}%' LIMIT 1"
            ),
            marked_by_readers: format!(
                "SELECT 1 FROM {marks} WHERE name = ? AND expires > ? AND arrival < ? \
                 AND owner LIKE '{READER_MARK}%' LIMIT 1"
            ),
            read: format!("SELECT name FROM {rw} WHERE name = ? {share} NOWAIT"),
            write: format!("SELECT name FROM {rw} WHERE name = ? FOR UPDATE NOWAIT"),
            mark: format!(
                "INSERT INTO {marks} (name, owner, arrival, expires) VALUES (?, ?, ?, ?) \
                 ON DUPLICATE KEY UPDATE expires = IF(expires = 0, 0, VALUES(expires))"
            ),
            unmark: format!("DELETE FROM {marks} WHERE name = ? AND owner = ?"),
            bury: format!(
                "INSERT INTO {marks} (name, owner, arrival, expires) VALUES (?, ?, 0, 0) \
                 ON DUPLICATE KEY UPDATE expires = 0"
            ),
            exists: format!("SELECT name FROM {rw} WHERE name = ?"),
            probe_share: format!("SELECT name FROM {rw} WHERE name = ? {share} SKIP LOCKED"),
            probe_alone: format!("SELECT name FROM {rw} WHERE name = ? FOR UPDATE SKIP LOCKED"),
            marks: format!(
                "SELECT COUNT(*) FROM {marks} WHERE name = ? AND expires > ? \
                 AND owner NOT LIKE '{READER_MARK}%'"
            ),
        }
    }

    /// In the grant's transaction, opened by the caller: `Some(true)` when
    /// the row is taken (the transaction stays open), `Some(false)` when a
    /// writer's mark or a holder is in the way, `None` when the name has
    /// no row; the transaction is rolled back unless taken.
    pub(super) async fn take(
        &self,
        conn: &mut PoolConnection<MySql>,
        name: &str,
        access: Access,
        (arrival, now): (i64, i64),
    ) -> Result<Option<bool>, sqlx::Error> {
        let taken = self.take_in(conn, name, access, arrival, now).await;
        if !matches!(taken, Ok(Some(true))) {
            sqlx::raw_sql("ROLLBACK").execute(&mut **conn).await?;
        }
        taken
    }

    async fn take_in(
        &self,
        conn: &mut PoolConnection<MySql>,
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
                .bind(name.as_bytes())
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
            .bind(name.as_bytes())
            .fetch_optional(&mut **conn)
            .await
        {
            Ok(row) => Ok(row.map(|_| true)),
            Err(e) if not_granted(&e) => Ok(Some(false)),
            Err(e) => Err(e),
        }
    }

    /// Create `name`'s row (committed at once, outside any transaction).
    pub(super) async fn ensure(
        &self,
        conn: &mut PoolConnection<MySql>,
        name: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(AssertSqlSafe(self.ensure.as_str()))
            .bind(name.as_bytes())
            .execute(&mut **conn)
            .await
            .map(drop)
    }

    /// See [`Dialect::mark_rw`](crate::engine::Dialect::mark_rw).
    pub(super) async fn mark(
        &self,
        conn: &mut PoolConnection<MySql>,
        name: &str,
        id: &str,
        arrival: i64,
        expires: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(AssertSqlSafe(self.mark.as_str()))
            .bind(name.as_bytes())
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
        pool: &sqlx::MySqlPool,
        name: &str,
        id: &str,
        for_good: bool,
    ) -> Result<(), sqlx::Error> {
        let sql = match for_good {
            true => &self.bury,
            false => &self.unmark,
        };
        sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(name.as_bytes())
            .bind(id)
            .execute(pool)
            .await
            .map(drop)
    }

    /// See [`Dialect::rw_state`](crate::engine::Dialect::rw_state): the row
    /// probed in a transaction of its own on `conn`, rolled back (an
    /// acquisition at that moment finds it held and looks again at its
    /// next poll).
    pub(super) async fn state(
        &self,
        conn: &mut sqlx::MySqlConnection,
        name: &str,
        now: i64,
    ) -> Result<(Option<Access>, usize), sqlx::Error> {
        let marks: i64 = sqlx::query_scalar(AssertSqlSafe(self.marks.as_str()))
            .bind(name.as_bytes())
            .bind(now)
            .fetch_one(&mut *conn)
            .await?;
        let marks = usize::try_from(marks).unwrap_or(0);
        sqlx::raw_sql("START TRANSACTION")
            .execute(&mut *conn)
            .await?;
        let probe = async {
            let exists = sqlx::query(AssertSqlSafe(self.exists.as_str()))
                .bind(name.as_bytes())
                .fetch_optional(&mut *conn)
                .await?;
            if exists.is_none() {
                return Ok(None);
            }
            let shared = sqlx::query(AssertSqlSafe(self.probe_share.as_str()))
                .bind(name.as_bytes())
                .fetch_optional(&mut *conn)
                .await?;
            if shared.is_none() {
                return Ok(Some(Access::Write));
            }
            let alone = sqlx::query(AssertSqlSafe(self.probe_alone.as_str()))
                .bind(name.as_bytes())
                .fetch_optional(&mut *conn)
                .await?;
            Ok::<_, sqlx::Error>(alone.is_none().then_some(Access::Read))
        }
        .await;
        sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await?;
        Ok((probe?, marks))
    }
}
