//! The Postgres statements of the semaphores (see [`crate::permits`]):
//! table `{t}_permits` is `UNLOGGED` (a permit's row lock and the limit
//! write no WAL), which loses nothing a crash would not: crash recovery
//! empties it, but every session, and so every permit, ended with the
//! crash, and the rows are made again on first use.

use std::time::Duration;

use lock_core::raw::lease_millis;
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, Postgres};

use crate::permits::Found;

/// The permits' statements, with the (validated) table name in place.
#[derive(Clone)]
pub(super) struct Statements {
    /// The lowest free slot of `$1` below `$2`, locked, with its limit.
    take: String,
    /// The limit of `$1`'s rows.
    limit: String,
    /// Create `$1`'s `-1` row with limit `$2` if missing.
    create: String,
    /// Hold every row of `$1`, or fail at once.
    hold_all: String,
    /// Set the limit of every row of `$1` to `$2`.
    set: String,
    /// Create the rows of `$1`'s slots below `$2` where missing.
    fill: String,
    /// The slots of `$1` below `$2` held now (the free ones are held for
    /// the statement only, to tell them).
    held: String,
}

/// The table's statement, for `PgLock::ddl`.
pub(super) fn ddl(t: &str) -> String {
    format!(
        "CREATE UNLOGGED TABLE IF NOT EXISTS {t}_permits (name TEXT NOT NULL, slot INT NOT NULL, \
         lim INT NOT NULL, PRIMARY KEY (name, slot))"
    )
}

impl Statements {
    pub(super) fn new(t: &str) -> Self {
        let p = format!("{t}_permits");
        Statements {
            take: format!(
                "SELECT slot, lim FROM {p} WHERE name = $1 AND slot >= 0 AND slot < $2 \
                 ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED"
            ),
            limit: format!("SELECT lim FROM {p} WHERE name = $1 AND slot = -1"),
            create: format!(
                "INSERT INTO {p} (name, slot, lim) VALUES ($1, -1, $2) ON CONFLICT DO NOTHING"
            ),
            hold_all: format!("SELECT slot FROM {p} WHERE name = $1 FOR UPDATE NOWAIT"),
            set: format!("UPDATE {p} SET lim = $2 WHERE name = $1 AND lim <> $2"),
            fill: format!(
                "INSERT INTO {p} (name, slot, lim) SELECT $1, s, $2 FROM generate_series(0, $2 - 1) s \
                 ON CONFLICT DO NOTHING"
            ),
            held: format!(
                "WITH free AS (SELECT slot FROM {p} WHERE name = $1 AND slot >= 0 AND slot < $2 \
                 FOR UPDATE SKIP LOCKED) \
                 SELECT slot FROM {p} WHERE name = $1 AND slot >= 0 AND slot < $2 \
                 AND slot NOT IN (SELECT slot FROM free) ORDER BY slot"
            ),
        }
    }

    /// See [`Dialect::take_slot`](crate::engine::Dialect::take_slot); the
    /// transaction reads committed rows (each statement sees the latest
    /// limit set).
    pub(super) async fn take_slot(
        &self,
        conn: &mut PoolConnection<Postgres>,
        name: &str,
        limit: u32,
        ttl: Duration,
    ) -> Result<Found, sqlx::Error> {
        // A number only: nothing a caller controls is spliced.
        let begin = format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; \
             SET LOCAL idle_in_transaction_session_timeout = {}",
            lease_millis(ttl)
        );
        sqlx::raw_sql(AssertSqlSafe(begin))
            .execute(&mut **conn)
            .await?;
        let lim = i32_of(limit);
        let row: Option<(i32, i32)> = sqlx::query_as(AssertSqlSafe(self.take.as_str()))
            .bind(name)
            .bind(lim)
            .fetch_optional(&mut **conn)
            .await?;
        let found = match row {
            Some((slot, held)) if held == lim => {
                return Ok(Found::Slot(u32::try_from(slot).unwrap_or(0)));
            }
            Some((_, held)) => Found::OtherLimit(u32::try_from(held).unwrap_or(0)),
            None => {
                let held: Option<i32> = sqlx::query_scalar(AssertSqlSafe(self.limit.as_str()))
                    .bind(name)
                    .fetch_optional(&mut **conn)
                    .await?;
                match held {
                    None => Found::Missing,
                    Some(held) if held == lim => Found::Full,
                    Some(held) => Found::OtherLimit(u32::try_from(held).unwrap_or(0)),
                }
            }
        };
        sqlx::raw_sql("ROLLBACK").execute(&mut **conn).await?;
        Ok(found)
    }

    /// See [`Dialect::set_limit`](crate::engine::Dialect::set_limit).
    pub(super) async fn set_limit(
        &self,
        conn: &mut PoolConnection<Postgres>,
        name: &str,
        limit: u32,
    ) -> Result<bool, sqlx::Error> {
        let lim = i32_of(limit);
        sqlx::raw_sql("BEGIN ISOLATION LEVEL READ COMMITTED")
            .execute(&mut **conn)
            .await?;
        let changed = async {
            sqlx::query(AssertSqlSafe(self.create.as_str()))
                .bind(name)
                .bind(lim)
                .execute(&mut **conn)
                .await?;
            let held = sqlx::query(AssertSqlSafe(self.hold_all.as_str()))
                .bind(name)
                .fetch_all(&mut **conn)
                .await;
            match held {
                Err(sqlx::Error::Database(db))
                    if db.code().as_deref() == Some(super::LOCK_NOT_AVAILABLE) =>
                {
                    return Ok(false);
                }
                held => held?,
            };
            for sql in [&self.set, &self.fill] {
                sqlx::query(AssertSqlSafe(sql.as_str()))
                    .bind(name)
                    .bind(lim)
                    .execute(&mut **conn)
                    .await?;
            }
            Ok(true)
        }
        .await;
        let end = match changed {
            Ok(true) => "COMMIT",
            _ => "ROLLBACK",
        };
        sqlx::raw_sql(end).execute(&mut **conn).await?;
        changed
    }

    /// The limit of `name`'s rows and the slots below it held now (each
    /// free row is held for the statement only: an acquisition at that
    /// moment skips it and looks again at its next poll).
    pub(super) async fn held_slots(
        &self,
        pool: &sqlx::PgPool,
        name: &str,
    ) -> Result<Option<(u32, Vec<u32>)>, sqlx::Error> {
        let held: Option<i32> = sqlx::query_scalar(AssertSqlSafe(self.limit.as_str()))
            .bind(name)
            .fetch_optional(pool)
            .await?;
        let Some(lim) = held else {
            return Ok(None);
        };
        let held: Vec<i32> = sqlx::query_scalar(AssertSqlSafe(self.held.as_str()))
            .bind(name)
            .bind(lim)
            .fetch_all(pool)
            .await?;
        let limit = u32::try_from(lim).unwrap_or(0);
        let held = held.into_iter().filter_map(|s| u32::try_from(s).ok());
        Ok(Some((limit, held.collect())))
    }
}

/// A limit (at most [`crate::permits::MAX_LIMIT`]) as the column's type.
fn i32_of(limit: u32) -> i32 {
    i32::try_from(limit).unwrap_or(i32::MAX)
}
