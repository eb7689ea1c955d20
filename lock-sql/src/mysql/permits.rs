//! The MySQL/MariaDB statements of the semaphores (see
//! [`crate::permits`]): table `{t}_permits` is InnoDB (row locks), read
//! committed (a permit's transaction opens as a row lock's does).

use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, MySql};

use super::not_granted;
use crate::permits::Found;

/// The permits' statements, with the (validated) table name in place.
pub(super) struct Statements {
    /// The lowest free slot of `?` below `?`, locked, with its limit.
    take: String,
    /// The limit of `?`'s rows.
    limit: String,
    /// Create `?`'s `-1` row with limit `?` if missing.
    create: String,
    /// Hold every row of `?`, or fail at once.
    hold_all: String,
    /// Set the limit of every row of `?` to `?` (limit first).
    set: String,
    /// Create the rows of `?`'s slots below `?` with limit `?` where
    /// missing (name, limit, limit).
    fill: String,
    /// The free slots of `?` below `?`.
    free: String,
}

/// The table's statement, for `MySqlLock::ddl`.
pub(super) fn ddl(t: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {t}_permits (name VARBINARY(1024) NOT NULL, slot INT NOT NULL, \
         lim INT NOT NULL, PRIMARY KEY (name, slot)) ENGINE=InnoDB"
    )
}

/// The numbers 0 to 1999, without a recursive query (whose depth MySQL
/// bounds at 1000 by default).
const NUMBERS: &str = "(SELECT a.n + 10 * b.n + 100 * c.n + 1000 * d.n AS n FROM \
     (SELECT 0 AS n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 \
      UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) a, \
     (SELECT 0 AS n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 \
      UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) b, \
     (SELECT 0 AS n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 \
      UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) c, \
     (SELECT 0 AS n UNION ALL SELECT 1) d) numbers";

// The largest limit fits the numbers.
const _: () = assert!(crate::permits::MAX_LIMIT <= 2000);

impl Statements {
    pub(super) fn new(t: &str) -> Self {
        let p = format!("{t}_permits");
        Statements {
            take: format!(
                "SELECT slot, lim FROM {p} WHERE name = ? AND slot >= 0 AND slot < ? \
                 ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED"
            ),
            limit: format!("SELECT lim FROM {p} WHERE name = ? AND slot = -1"),
            create: format!("INSERT IGNORE INTO {p} (name, slot, lim) VALUES (?, -1, ?)"),
            hold_all: format!("SELECT slot FROM {p} WHERE name = ? FOR UPDATE NOWAIT"),
            set: format!("UPDATE {p} SET lim = ? WHERE name = ? AND lim <> ?"),
            fill: format!(
                "INSERT IGNORE INTO {p} (name, slot, lim) SELECT ?, n, ? FROM {NUMBERS} WHERE n < ?"
            ),
            free: format!(
                "SELECT slot FROM {p} WHERE name = ? AND slot >= 0 AND slot < ? \
                 FOR UPDATE SKIP LOCKED"
            ),
        }
    }

    /// In the permit's transaction, opened by the caller: see
    /// [`Dialect::take_slot`](crate::engine::Dialect::take_slot).
    pub(super) async fn take_slot(
        &self,
        conn: &mut PoolConnection<MySql>,
        name: &str,
        limit: u32,
    ) -> Result<Found, sqlx::Error> {
        let row: Option<(i32, i32)> = sqlx::query_as(AssertSqlSafe(self.take.as_str()))
            .bind(name.as_bytes())
            .bind(limit)
            .fetch_optional(&mut **conn)
            .await?;
        let found = match row {
            Some((slot, held)) if u32::try_from(held) == Ok(limit) => {
                return Ok(Found::Slot(u32::try_from(slot).unwrap_or(0)));
            }
            Some((_, held)) => Found::OtherLimit(u32::try_from(held).unwrap_or(0)),
            None => {
                let held: Option<i32> = sqlx::query_scalar(AssertSqlSafe(self.limit.as_str()))
                    .bind(name.as_bytes())
                    .fetch_optional(&mut **conn)
                    .await?;
                match held.map(u32::try_from) {
                    None => Found::Missing,
                    Some(Ok(held)) if held == limit => Found::Full,
                    Some(held) => Found::OtherLimit(held.unwrap_or(0)),
                }
            }
        };
        sqlx::raw_sql("ROLLBACK").execute(&mut **conn).await?;
        Ok(found)
    }

    /// See [`Dialect::set_limit`](crate::engine::Dialect::set_limit); the
    /// caller's session reads committed rows and waits for a row at most
    /// a second (a changer holding it).
    pub(super) async fn set_limit(
        &self,
        conn: &mut PoolConnection<MySql>,
        name: &str,
        limit: u32,
    ) -> Result<bool, sqlx::Error> {
        sqlx::raw_sql("START TRANSACTION")
            .execute(&mut **conn)
            .await?;
        let changed = async {
            sqlx::query(AssertSqlSafe(self.create.as_str()))
                .bind(name.as_bytes())
                .bind(limit)
                .execute(&mut **conn)
                .await?;
            sqlx::query(AssertSqlSafe(self.hold_all.as_str()))
                .bind(name.as_bytes())
                .fetch_all(&mut **conn)
                .await?;
            sqlx::query(AssertSqlSafe(self.set.as_str()))
                .bind(limit)
                .bind(name.as_bytes())
                .bind(limit)
                .execute(&mut **conn)
                .await?;
            sqlx::query(AssertSqlSafe(self.fill.as_str()))
                .bind(name.as_bytes())
                .bind(limit)
                .bind(limit)
                .execute(&mut **conn)
                .await?;
            Ok::<_, sqlx::Error>(())
        }
        .await;
        let end = match changed {
            Ok(()) => "COMMIT",
            Err(_) => "ROLLBACK",
        };
        sqlx::raw_sql(end).execute(&mut **conn).await?;
        match changed {
            Ok(()) => Ok(true),
            // Held: a permit, or another client setting a limit.
            Err(e) if not_granted(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The limit of `name`'s rows and the slots below it held now, read in
    /// a transaction of its own on `conn` (each free row is held until its
    /// end: an acquisition at that moment skips it and looks again at its
    /// next poll).
    pub(super) async fn held_slots(
        &self,
        conn: &mut sqlx::MySqlConnection,
        name: &str,
    ) -> Result<Option<(u32, Vec<u32>)>, sqlx::Error> {
        let held: Option<i32> = sqlx::query_scalar(AssertSqlSafe(self.limit.as_str()))
            .bind(name.as_bytes())
            .fetch_optional(&mut *conn)
            .await?;
        let Some(limit) = held.and_then(|l| u32::try_from(l).ok()) else {
            return Ok(None);
        };
        sqlx::raw_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
            .execute(&mut *conn)
            .await?;
        let free: Result<Vec<i32>, _> = sqlx::query_scalar(AssertSqlSafe(self.free.as_str()))
            .bind(name.as_bytes())
            .bind(limit)
            .fetch_all(&mut *conn)
            .await;
        sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await?;
        let free = free?;
        let held = (0..limit)
            .filter(|slot| !free.iter().any(|&f| u32::try_from(f) == Ok(*slot)))
            .collect();
        Ok(Some((limit, held)))
    }
}
