//! Postgres fencing tokens without a disk flush per grant.
//!
//! A token is `(epoch << 32) | n`. The **epoch** is durable (table
//! `{t}_epoch`, written by a committed, flushed transaction) and advances
//! only after the server lost its unlogged data: after a crash of the
//! server or of one of its backend processes (the postmaster's crash
//! recovery), never at a clean restart. The **counter** lives in an
//! `UNLOGGED` table (`{t}_counters`: each name's latest token), so a grant's
//! write goes to no WAL and its commit waits for no flush; the epoch the
//! counters count in is kept beside them in another unlogged table
//! (`{t}_run`).
//!
//! Crash recovery empties every unlogged table at once. The first grant
//! afterwards finds no epoch in `{t}_run` (it draws a token of epoch 0,
//! which is never handed out) and completes it: the durable epoch is
//! advanced (a flushed commit) and written to `{t}_run`, and the name's
//! token becomes the first of the new epoch. Every token handed out before
//! the crash had a lower epoch, so tokens never go backwards, while a grant
//! in between pays no flush.
//!
//! The epoch has 16 bits, so tokens stay below 2^48 and a fencing epoch
//! (`fencing_epoch`, up to 32767, shifted by 48) still orders above them
//! within an `i64`. A name's counter that reaches 2^32 grants in one epoch
//! moves into the next epoch's range; the durable epoch is raised to it
//! first, so a crash after it still advances beyond.

// Every token, `(MAX_EPOCH << 32) | 0xFFFF_FFFF` at most, below 2^48.
const _: () = assert!(MAX_EPOCH < 1 << 16);

/// The largest epoch: tokens stay below 2^48.
const MAX_EPOCH: i64 = 0xFFFF;

/// The statements that complete a drawn token.
#[derive(Clone)]
pub(crate) struct Statements {
    /// The epoch the counters count in, if it survived.
    run: String,
    /// Advance the durable epoch (flushed) and record it for the counters.
    advance: String,
    /// Raise the durable epoch to at least `$1` (flushed).
    raise: String,
    /// Move a name's token into epoch `$2`: the first token above both.
    rebase: String,
    /// A name's latest token and holder record.
    pub(crate) latest: String,
    /// Replace the holder record (`$3`) of `$1`'s grant `$2`, if that is
    /// still its latest.
    pub(crate) set_holder: String,
}

impl Statements {
    /// On lock table `t` (a checked identifier).
    pub(crate) fn new(t: &str) -> Self {
        Statements {
            run: format!("SELECT epoch FROM {t}_run WHERE id = 1"),
            advance: format!(
                "WITH e AS (UPDATE {t}_epoch SET epoch = epoch + 1 WHERE id = 1 AND epoch < {MAX_EPOCH} \
                 RETURNING epoch) \
                 INSERT INTO {t}_run (id, epoch) SELECT 1, epoch FROM e \
                 ON CONFLICT (id) DO UPDATE SET epoch = GREATEST({t}_run.epoch, excluded.epoch) \
                 RETURNING epoch"
            ),
            raise: format!("UPDATE {t}_epoch SET epoch = GREATEST(epoch, $1) WHERE id = 1"),
            rebase: format!(
                "UPDATE {t}_counters SET token = GREATEST(token, $2::bigint << 32) + 1 \
                 WHERE name = $1 RETURNING token"
            ),
            latest: format!("SELECT token, holder FROM {t}_counters WHERE name = $1"),
            set_holder: format!(
                "UPDATE {t}_counters SET holder = $3 WHERE name = $1 AND token = $2"
            ),
        }
    }

    /// Advance the epoch within the caller's transaction `tx` (the clean-up
    /// of unused names): committed with it.
    pub(crate) async fn advance_in(&self, tx: &mut sqlx::PgConnection) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(self.advance.as_str()))
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| {
                sqlx::Error::Protocol(format!(
                    "the fencing tokens' epoch is at its limit ({MAX_EPOCH}): use a new lock table"
                ))
            })
    }

    /// The token of a grant of `name` (held on `conn`'s session, or by the
    /// caller) whose statement drew `drawn`: `drawn` itself, unless the
    /// counters had lost their epoch (a crash) or crossed into the next
    /// epoch's range, which are completed here first.
    pub(crate) async fn complete(
        &self,
        conn: &mut sqlx::PgConnection,
        name: &str,
        drawn: i64,
    ) -> Result<i64, sqlx::Error> {
        if is_complete(drawn) {
            return Ok(drawn);
        }
        if drawn >> 32 != 0 {
            // Counted across into the next epoch's range: a crash from now
            // on must advance beyond it.
            sqlx::query(sqlx::AssertSqlSafe(self.raise.as_str()))
                .bind(drawn >> 32)
                .execute(&mut *conn)
                .await?;
            return Ok(drawn);
        }
        let epoch = match sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(self.run.as_str()))
            .fetch_optional(&mut *conn)
            .await?
        {
            Some(epoch) => epoch,
            None => {
                let advanced: Option<i64> =
                    sqlx::query_scalar(sqlx::AssertSqlSafe(self.advance.as_str()))
                        .fetch_optional(&mut *conn)
                        .await?;
                tracing::info!(target: "distlock", backend = "postgres", epoch = ?advanced, "the token counters were lost (a crash): fencing epoch advanced");
                advanced.ok_or_else(|| {
                    sqlx::Error::Protocol(format!(
                        "the fencing tokens' epoch is at its limit ({MAX_EPOCH}): \
                         use a new lock table"
                    ))
                })?
            }
        };
        sqlx::query_scalar(sqlx::AssertSqlSafe(self.rebase.as_str()))
            .bind(name)
            .bind(epoch)
            .fetch_optional(&mut *conn)
            .await?
            .ok_or_else(|| sqlx::Error::Protocol("a drawn token's counter is gone".into()))
    }
}

/// Whether a drawn token can be handed out as it is: its epoch survived
/// and its counter did not just cross into the next epoch's range.
pub(crate) fn is_complete(token: i64) -> bool {
    token >> 32 != 0 && token & 0xFFFF_FFFF != 0
}

/// The common table expressions that draw a token for `$1` when the CTE
/// `l` says `got`; [`DRAWN`] is the token they drew. The name's counter
/// plus one (`u`, the usual case), or, for a name not seen since the
/// counters were last emptied (`t`), the first token of the counters'
/// epoch, epoch 0 if that was lost too. The epoch is read `FOR SHARE`, only
/// on that second path: it then follows a concurrent advance to its
/// committed epoch, which the statement's snapshot may predate (the
/// clean-up of unused names advances the epoch as it deletes their
/// counters). Every draw stamps `used_at` and stores the grant's holder
/// record, the parameter `holder` (`$N`).
pub(crate) fn draw(t: &str, holder: &str) -> String {
    format!(
        "u AS (UPDATE {t}_counters SET token = token + 1, used_at = now(), holder = {holder}::bytea \
         WHERE name = $1 AND (SELECT got FROM l) RETURNING token), \
         t AS (INSERT INTO {t}_counters (name, token, used_at, holder) \
         SELECT $1, (coalesce((SELECT epoch FROM {t}_run WHERE id = 1 FOR SHARE), 0) << 32) | 1, now(), {holder}::bytea \
         FROM l WHERE l.got AND NOT EXISTS (SELECT 1 FROM u) \
         ON CONFLICT (name) DO UPDATE SET token = {t}_counters.token + 1, used_at = now(), \
         holder = excluded.holder RETURNING token)"
    )
}

/// The token [`draw`]'s expressions drew (NULL if `l` did not say `got`).
pub(crate) const DRAWN: &str = "coalesce((SELECT token FROM u), (SELECT token FROM t))";

/// [`draw`] for a set: the common table expressions that draw a token for
/// every name of the CTE `n` (`name`, `ord`) when the CTE `l` says `got`,
/// in one statement; [`DRAWN_SET`] is the array of their tokens in `n`'s
/// order. Each name's token as [`draw`] draws it.
pub(crate) fn draw_set(t: &str, holder: &str) -> String {
    format!(
        "u AS (UPDATE {t}_counters c SET token = c.token + 1, used_at = now(), holder = {holder}::bytea \
         FROM n WHERE c.name = n.name AND (SELECT got FROM l) RETURNING c.name, c.token), \
         t AS (INSERT INTO {t}_counters (name, token, used_at, holder) \
         SELECT n.name, (coalesce((SELECT epoch FROM {t}_run WHERE id = 1 FOR SHARE), 0) << 32) | 1, now(), {holder}::bytea \
         FROM n WHERE (SELECT got FROM l) AND n.name NOT IN (SELECT name FROM u) \
         ON CONFLICT (name) DO UPDATE SET token = {t}_counters.token + 1, used_at = now(), \
         holder = excluded.holder RETURNING name, token)"
    )
}

/// The tokens [`draw_set`]'s expressions drew, in `n`'s order (empty if
/// `l` did not say `got`).
pub(crate) const DRAWN_SET: &str = "ARRAY(SELECT d.token FROM n JOIN \
     (SELECT name, token FROM u UNION ALL SELECT name, token FROM t) d USING (name) ORDER BY n.ord)";

/// The tables the tokens need, on lock table `t`.
pub(crate) fn ddl(t: &str) -> [String; 4] {
    [
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_epoch (id INT PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL)"
        ),
        format!("INSERT INTO {t}_epoch (id, epoch) VALUES (1, 0) ON CONFLICT DO NOTHING"),
        format!(
            "CREATE UNLOGGED TABLE IF NOT EXISTS {t}_run (id INT PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL)"
        ),
        format!(
            "CREATE UNLOGGED TABLE IF NOT EXISTS {t}_counters (name TEXT PRIMARY KEY, token BIGINT NOT NULL, \
             used_at TIMESTAMPTZ NOT NULL DEFAULT now(), holder BYTEA)"
        ),
    ]
}

/// What brings the tables of an earlier version up to date: the counters'
/// holder column.
pub(crate) fn upgrade(t: &str) -> Vec<String> {
    vec![format!(
        "ALTER TABLE {t}_counters ADD COLUMN IF NOT EXISTS holder BYTEA"
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_complete_with_an_epoch_and_a_counter() {
        assert!(is_complete((1 << 32) | 1));
        assert!(is_complete((MAX_EPOCH << 32) | 0xFFFF_FFFF));
        assert!(!is_complete(1), "epoch 0: the counters lost theirs");
        assert!(!is_complete(7 << 32), "crossed into epoch 7's range");
    }
}
