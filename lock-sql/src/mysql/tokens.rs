//! MySQL/MariaDB fencing tokens without a disk flush per grant.
//!
//! A token is `(epoch << 32) | n`, as on Postgres (see
//! `postgres/tokens.rs`). The **epoch** is durable (InnoDB table
//! `{t}_epoch`, committed with the log flushed) and advances each time the
//! server lost its `MEMORY` tables: at every restart, clean or not. The
//! **counters** (`{t}_counters`: each name's latest token) and the epoch
//! they count in (`{t}_run`) are `MEMORY` tables: a grant's upsert writes no
//! redo log, so it waits for no flush. (With binary logging on, the
//! statement is logged like any other, and `sync_binlog = 1` flushes that
//! log per statement: such servers keep a flush per grant.)
//!
//! After a restart the first grant finds no epoch in `{t}_run`, draws a
//! token of epoch 0, which is never handed out, and completes it: the
//! durable epoch is advanced and written to `{t}_run`, and the name's
//! token becomes the first of the new epoch, above every token handed out
//! before. A `MEMORY` table holds at most `max_heap_table_size` bytes
//! (16 MiB by default: some 40 000 names).
//!
//! **The holder record** of a grant is written by the statement that draws
//! its token, into the counters row, when it is at most
//! [`INLINE_RECORD_BYTES`] long (an identity and a short value). A `MEMORY`
//! table stores every row at its full width, so a column wide enough for
//! the longest record (1294 bytes) would cut the names it holds by five;
//! a longer record is kept in the InnoDB table `{t}_holders` instead, with
//! its grant's token, written right after the draw (a flushed commit, for
//! such grants only), and the counters row says so ([`ELSEWHERE`]).

use lock_core::{MAX_IDENTITY_BYTES, MAX_VALUE_BYTES};
use sqlx::{AssertSqlSafe, Connection};

/// The longest holder record: its tag (4 bytes), the identity's length
/// (2), the identity, the time (8) and the value.
const MAX_RECORD_BYTES: usize = 4 + 2 + MAX_IDENTITY_BYTES + 8 + MAX_VALUE_BYTES;

/// The longest holder record kept in the counters row itself.
pub(crate) const INLINE_RECORD_BYTES: usize = 128;

/// What the counters row holds in place of a longer record, kept in
/// `{t}_holders` (never a record: records start with `dlh1`).
const ELSEWHERE: &[u8] = b"dlh>";

/// What the counters row stores for `record`.
fn inline(record: &[u8]) -> &[u8] {
    match record.len() <= INLINE_RECORD_BYTES {
        true => record,
        false => ELSEWHERE,
    }
}

// Every token, `(MAX_EPOCH << 32) | 0xFFFF_FFFF` at most, below 2^48.
const _: () = assert!(MAX_EPOCH < 1 << 16);

/// The largest epoch: tokens stay below 2^48.
const MAX_EPOCH: u64 = 0xFFFF;

/// The statements of the per-name counters.
pub(crate) struct Statements {
    /// Draw `?`'s next token: the name's counter plus one, or the first
    /// token of the counters' epoch (epoch 0 if that was lost).
    draw: String,
    /// `GET_LOCK(?, 0)` on the second argument and, if granted, the draw
    /// of the first's token, in one statement: a row changed iff granted.
    lock_and_draw: String,
    run: String,
    advance: String,
    read_epoch: String,
    record_run: String,
    raise: String,
    rebase: String,
    /// A name's latest token and holder record.
    pub(crate) latest: String,
    /// The draw of several names' tokens in one statement, a row of
    /// [`Self::draw_set_row`] per name between its head and its tail.
    draw_set_head: String,
    draw_set_row: String,
    draw_set_tail: &'static str,
    /// Several names' tokens, `?, ` per name and `)` after the head.
    read_set_head: String,
    /// Replace the counters row's record of a name's grant, if that
    /// grant's token is still the latest.
    set_inline: String,
    /// Keep a long record of a name's grant in `{t}_holders`, if that
    /// grant's token is still the latest.
    keep_long: String,
}

impl Statements {
    /// On lock table `t` (a checked identifier).
    pub(crate) fn new(t: &str) -> Self {
        Statements {
            draw: format!(
                "INSERT INTO {t}_counters (name, token, holder) VALUES \
                 (?, LAST_INSERT_ID((COALESCE((SELECT epoch FROM {t}_run WHERE id = 1), 0) << 32) | 1), ?) \
                 ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), used_at = NOW(6), \
                 holder = VALUES(holder)"
            ),
            lock_and_draw: format!(
                "INSERT INTO {t}_counters (name, token, holder) \
                 SELECT ?, LAST_INSERT_ID((COALESCE((SELECT epoch FROM {t}_run WHERE id = 1), 0) << 32) | 1), ? \
                 FROM (SELECT GET_LOCK(?, 0) AS got) AS l WHERE l.got = 1 \
                 ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), used_at = NOW(6), \
                 holder = VALUES(holder)"
            ),
            run: format!("SELECT epoch FROM {t}_run WHERE id = 1"),
            advance: format!(
                "UPDATE {t}_epoch SET epoch = epoch + 1 WHERE id = 1 AND epoch < {MAX_EPOCH}"
            ),
            read_epoch: format!("SELECT epoch FROM {t}_epoch WHERE id = 1"),
            record_run: format!(
                "INSERT INTO {t}_run (id, epoch) VALUES (1, ?) \
                 ON DUPLICATE KEY UPDATE epoch = GREATEST(epoch, VALUES(epoch))"
            ),
            raise: format!("UPDATE {t}_epoch SET epoch = GREATEST(epoch, ?) WHERE id = 1"),
            rebase: format!(
                "UPDATE {t}_counters SET token = LAST_INSERT_ID(GREATEST(token, CAST(? AS UNSIGNED) << 32) + 1) \
                 WHERE name = ?"
            ),
            latest: format!(
                "SELECT CAST(c.token AS SIGNED), CASE WHEN c.holder = ? THEN h.holder ELSE c.holder END \
                 FROM {t}_counters c LEFT JOIN {t}_holders h ON h.name = c.name AND h.token = c.token \
                 WHERE c.name = ?"
            ),
            draw_set_head: format!("INSERT INTO {t}_counters (name, token, holder) VALUES "),
            draw_set_row: format!(
                "(?, (COALESCE((SELECT epoch FROM {t}_run WHERE id = 1), 0) << 32) | 1, ?)"
            ),
            draw_set_tail: " ON DUPLICATE KEY UPDATE token = token + 1, used_at = NOW(6), \
                 holder = VALUES(holder)",
            read_set_head: format!("SELECT name, token FROM {t}_counters WHERE name IN ("),
            set_inline: format!("UPDATE {t}_counters SET holder = ? WHERE name = ? AND token = ?"),
            keep_long: format!(
                "INSERT INTO {t}_holders (name, token, holder) \
                 SELECT name, token, ? FROM {t}_counters WHERE name = ? AND token = ? \
                 ON DUPLICATE KEY UPDATE token = VALUES(token), holder = VALUES(holder)"
            ),
        }
    }

    /// The token of a grant of `name`, held by the caller: drawn (the
    /// holder `record` stored with it), and completed if the counters had
    /// lost their epoch (a restart) or crossed into the next epoch's range.
    pub(crate) async fn draw(
        &self,
        conn: &mut sqlx::MySqlConnection,
        name: &str,
        record: &[u8],
    ) -> Result<u64, sqlx::Error> {
        let drawn = sqlx::query(AssertSqlSafe(self.draw.as_str()))
            .bind(name.as_bytes())
            .bind(inline(record))
            .execute(&mut *conn)
            .await?
            .last_insert_id();
        let token = self.complete(conn, name, drawn).await?;
        self.keep_if_long(conn, name, token, record).await?;
        Ok(token)
    }

    /// The tokens of grants of `names` (distinct, every one held by the
    /// caller), in order, each as [`draw`](Self::draw) draws one: all
    /// counters advanced in one statement (the holder `record` stored with
    /// each), then read in one more. Nobody else draws for a name while
    /// the caller holds it, so the read sees the draw.
    pub(crate) async fn draw_set(
        &self,
        conn: &mut sqlx::MySqlConnection,
        names: &[&str],
        record: &[u8],
    ) -> Result<Vec<u64>, sqlx::Error> {
        let rows = vec![self.draw_set_row.as_str(); names.len()].join(", ");
        let draw = format!("{}{rows}{}", self.draw_set_head, self.draw_set_tail);
        let mut query = sqlx::query(AssertSqlSafe(draw));
        for name in names {
            query = query.bind(name.as_bytes()).bind(inline(record));
        }
        query.execute(&mut *conn).await?;
        let read = format!(
            "{}{})",
            self.read_set_head,
            vec!["?"; names.len()].join(", ")
        );
        let mut query = sqlx::query_as::<_, (Vec<u8>, u64)>(AssertSqlSafe(read));
        for name in names {
            query = query.bind(name.as_bytes());
        }
        let drawn: std::collections::HashMap<Vec<u8>, u64> =
            query.fetch_all(&mut *conn).await?.into_iter().collect();
        let mut tokens = Vec::with_capacity(names.len());
        for name in names {
            let Some(&token) = drawn.get(name.as_bytes()) else {
                return Err(sqlx::Error::Protocol(
                    "a drawn token's counter is gone".into(),
                ));
            };
            let token = self.complete(conn, name, token).await?;
            self.keep_if_long(conn, name, token, record).await?;
            tokens.push(token);
        }
        Ok(tokens)
    }

    /// `name`'s latest token and its holder record, if any.
    pub(crate) async fn latest<'c, E: sqlx::MySqlExecutor<'c>>(
        &self,
        conn: E,
        name: &str,
    ) -> Result<Option<(i64, Option<Vec<u8>>)>, sqlx::Error> {
        sqlx::query_as(AssertSqlSafe(self.latest.as_str()))
            .bind(ELSEWHERE)
            .bind(name.as_bytes())
            .fetch_optional(conn)
            .await
    }

    /// Replace the holder record of `name`'s grant `token` with `record`,
    /// if that grant is still the latest: whether it was. A long record is
    /// kept first, then the counters row points to it.
    pub(crate) async fn set_holder(
        &self,
        conn: &mut sqlx::MySqlConnection,
        name: &str,
        token: u64,
        record: &[u8],
    ) -> Result<bool, sqlx::Error> {
        if !self.keep_if_long(conn, name, token, record).await? {
            return Ok(false);
        }
        let done = sqlx::query(AssertSqlSafe(self.set_inline.as_str()))
            .bind(inline(record))
            .bind(name.as_bytes())
            .bind(token)
            .execute(&mut *conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Keep `record` in `{t}_holders` if it is too long for the counters
    /// row: whether `token` is still `name`'s latest (`true` for a short
    /// record, which is not looked at).
    async fn keep_if_long(
        &self,
        conn: &mut sqlx::MySqlConnection,
        name: &str,
        token: u64,
        record: &[u8],
    ) -> Result<bool, sqlx::Error> {
        if record.len() <= INLINE_RECORD_BYTES {
            return Ok(true);
        }
        let done = sqlx::query(AssertSqlSafe(self.keep_long.as_str()))
            .bind(record)
            .bind(name.as_bytes())
            .bind(token)
            .execute(&mut *conn)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// One attempt at the advisory lock `key` (`GET_LOCK(key, 0)`) and, if
    /// granted, `name`'s token (the holder `record` stored with it), in one
    /// round trip: `None` if not granted. On an error the lock may be held:
    /// the caller gives it back.
    pub(crate) async fn try_lock_and_draw(
        &self,
        conn: &mut sqlx::MySqlConnection,
        name: &str,
        key: &str,
        record: &[u8],
    ) -> Result<Option<u64>, sqlx::Error> {
        let done = sqlx::query(AssertSqlSafe(self.lock_and_draw.as_str()))
            .bind(name.as_bytes())
            .bind(inline(record))
            .bind(key)
            .execute(&mut *conn)
            .await?;
        if done.rows_affected() == 0 {
            return Ok(None);
        }
        let drawn = done.last_insert_id();
        let token = self.complete(conn, name, drawn).await?;
        self.keep_if_long(conn, name, token, record).await?;
        Ok(Some(token))
    }

    /// The token of a grant of `name` whose draw gave `drawn`: `drawn`
    /// itself, unless the counters had lost their epoch or crossed into
    /// the next epoch's range, which are completed here first.
    async fn complete(
        &self,
        conn: &mut sqlx::MySqlConnection,
        name: &str,
        drawn: u64,
    ) -> Result<u64, sqlx::Error> {
        if is_complete(drawn) {
            return Ok(drawn);
        }
        if drawn >> 32 != 0 {
            // Counted across into the next epoch's range: a restart from
            // now on must advance beyond it.
            sqlx::query(AssertSqlSafe(self.raise.as_str()))
                .bind(drawn >> 32)
                .execute(&mut *conn)
                .await?;
            return Ok(drawn);
        }
        let run: Option<u64> = sqlx::query_scalar(AssertSqlSafe(self.run.as_str()))
            .fetch_optional(&mut *conn)
            .await?;
        let epoch = match run {
            Some(epoch) => epoch,
            None => self.advance(conn).await?,
        };
        let rebased = sqlx::query(AssertSqlSafe(self.rebase.as_str()))
            .bind(epoch)
            .bind(name.as_bytes())
            .execute(&mut *conn)
            .await?;
        if rebased.rows_affected() != 1 {
            return Err(sqlx::Error::Protocol(
                "a drawn token's counter is gone".into(),
            ));
        }
        Ok(rebased.last_insert_id())
    }

    /// Advance the durable epoch (committed, the log flushed) and record it
    /// for the counters: the new epoch.
    pub(crate) async fn advance(
        &self,
        conn: &mut sqlx::MySqlConnection,
    ) -> Result<u64, sqlx::Error> {
        let mut tx = conn.begin().await?;
        let advanced = sqlx::query(AssertSqlSafe(self.advance.as_str()))
            .execute(&mut *tx)
            .await?;
        if advanced.rows_affected() != 1 {
            return Err(sqlx::Error::Protocol(format!(
                "the fencing tokens' epoch is at its limit ({MAX_EPOCH}): use a new lock table"
            )));
        }
        let epoch: u64 = sqlx::query_scalar(AssertSqlSafe(self.read_epoch.as_str()))
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        sqlx::query(AssertSqlSafe(self.record_run.as_str()))
            .bind(epoch)
            .execute(&mut *conn)
            .await?;
        tracing::info!(target: "distlock", backend = "mysql", epoch, "the token counters were lost (a restart): fencing epoch advanced");
        Ok(epoch)
    }
}

/// Whether a drawn token can be handed out as it is: its epoch survived
/// and its counter did not just cross into the next epoch's range.
pub(crate) fn is_complete(token: u64) -> bool {
    token >> 32 != 0 && token & 0xFFFF_FFFF != 0
}

/// The tables the tokens and holder records need, on lock table `t`.
pub(crate) fn ddl(t: &str) -> [String; 5] {
    [
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_epoch (id INT PRIMARY KEY, epoch BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"
        ),
        format!("INSERT IGNORE INTO {t}_epoch (id, epoch) VALUES (1, 0)"),
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_run (id INT PRIMARY KEY, epoch BIGINT UNSIGNED NOT NULL) ENGINE=MEMORY"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_counters (name VARBINARY(256) PRIMARY KEY, \
             token BIGINT UNSIGNED NOT NULL, used_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
             holder VARBINARY({INLINE_RECORD_BYTES})) ENGINE=MEMORY"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_holders (name VARBINARY(256) PRIMARY KEY, \
             token BIGINT UNSIGNED NOT NULL, holder VARBINARY({MAX_RECORD_BYTES}) NOT NULL) ENGINE=InnoDB"
        ),
    ]
}

/// What brings the tables of an earlier version up to date: the counters'
/// holder column (MySQL has no `ADD COLUMN IF NOT EXISTS`: the statement
/// fails harmlessly where the column is there).
pub(crate) fn upgrade(t: &str) -> Vec<String> {
    vec![format!(
        "ALTER TABLE {t}_counters ADD COLUMN holder VARBINARY({INLINE_RECORD_BYTES})"
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_holder_record_fits_its_column() {
        let record = lock_core::raw::HolderRecord::new(
            &"i".repeat(MAX_IDENTITY_BYTES),
            &[7; MAX_VALUE_BYTES],
        );
        assert_eq!(record.as_bytes().len(), MAX_RECORD_BYTES);
        assert_eq!(inline(record.as_bytes()), ELSEWHERE);
        let short = lock_core::raw::HolderRecord::new("api-2", b"10.0.0.5:8080");
        assert_eq!(inline(short.as_bytes()), short.as_bytes());
        assert!(lock_core::raw::HolderRecord::from_stored(ELSEWHERE).is_none());
    }

    #[test]
    fn a_token_is_complete_with_an_epoch_and_a_counter() {
        assert!(is_complete((1 << 32) | 1));
        assert!(!is_complete(1), "epoch 0: the counters lost theirs");
        assert!(!is_complete(3 << 32), "crossed into epoch 3's range");
    }
}
