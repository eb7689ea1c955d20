//! Postgres: row locks (`SELECT … FOR UPDATE` in a transaction held open
//! on a connection of its own) or session advisory locks, with fencing
//! tokens from per-name counters in a durable epoch.
//!
//! **Row mode** (default). The lock table has one row per lock name,
//! inserted (and committed) the first time a name is used. Acquiring begins
//! a transaction on a pooled connection, with `lock_timeout` set from the
//! wait and `idle_in_transaction_session_timeout` from the TTL, and locks
//! the row `FOR UPDATE` (`NOWAIT` for a single attempt): the database does
//! the waiting, and wakes the waiters itself when the holder's transaction
//! ends. The row is not handed over, though: the waiters lock it again when
//! they wake, and a newcomer whose statement gets there first takes it, so
//! row mode does not claim a fair queue (advisory mode does). Releasing
//! ends the transaction. A crashed holder's
//! lock ends with its connection; a hung one (no statements for a TTL) is
//! ended by the server's idle-in-transaction timeout, which the watchdog
//! keeps from firing by touching the connection every TTL/3.
//!
//! **Advisory mode** (`mode=advisory`): session advisory locks on a 64-bit
//! hash of the prefixed name (`hashtextextended`, computed by the server
//! from the bind parameter). A lock granted without waiting is taken on one
//! of a few long-lived sessions shared by the client's locks (`sessions`,
//! default 2), so a client can hold thousands; an acquisition that has to
//! wait queues on a pooled connection of its own, where the server wakes
//! waiters in arrival order (see the `shared` module). Holding N locks
//! needs room in the server's lock table: `max_locks_per_transaction ×
//! max_connections` above N (a full table answers `Unavailable`).
//! Two names whose hashes collide share a lock (about one pair in 2^32
//! among 2^32 names), and the key space is shared with every other
//! advisory lock user of the database; row mode has neither caveat.
//!
//! **Fencing tokens** are a per-name counter in the `UNLOGGED` table
//! `TABLE_counters`, advanced by one upsert. In advisory mode the upsert is
//! part of the lock's own statement, which answers with the token: a grant
//! is one round trip. In row mode it follows the grant, on another pooled
//! connection (the lock is an open transaction).
//!
//! **Tokens across a server crash**, without a flush per grant: the
//! counters count in a durable epoch (`TABLE_epoch`), and a crash of the
//! server or of one of its backends, which empties every unlogged table,
//! makes the next grant advance it (one flushed commit) before its token
//! is handed out. A grant writes no WAL and waits for no flush; see the
//! `tokens` module.
//!
//! **Durability and `synchronous_commit`.** A plain release ends the lock
//! transaction with `ROLLBACK`, not `COMMIT`: the transaction wrote nothing
//! the next holder needs (the row lock lives in memory and in the tuple
//! header, and dies with the transaction either way), and an abort never
//! waits for a WAL flush. That removes the flush (1–3 ms per cycle here)
//! from the lock without touching `synchronous_commit`. Turning
//! `synchronous_commit` off on the lock connection would not be safe in
//! general: in the transaction API ([`PgLock::begin`]) the user's writes
//! commit with the release and must be as durable as the server promises.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::raw::{HolderRecord, Request, lease_millis};
use lock_core::{
    Access, Capabilities, CrashRelease, Fencing, Grade, LockError, LockInfo, LockOptions, Wait,
    Waiting,
};
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, Postgres};
use tokio::time::Instant;

use crate::config::{SqlConfig, SqlMode, SqlUrl};
use crate::engine::{self, Core, Dialect, LatestGrant, Pinning, SqlLock};
use crate::error::{connection_lost, map_sqlx};
use crate::held::{DeadBudget, NoConnection, Pinned};
use crate::ident::Identifier;
use crate::permits::Found;
use crate::shared::{SessionSql, Tried, TriedSet};

mod permits;
mod rw;
mod tokens;

const BACKEND: &str = "postgres";

/// While a statement waits for a lock, the server checks this often
/// whether the client is still connected (`client_connection_check_interval`,
/// Postgres ≥ 14, set on every connection of the client), so that a waiter
/// whose acquisition was cancelled, or whose process exited, leaves the
/// lock's queue at once instead of being granted the lock after the holder
/// and only then noticing the closed socket.
const CHECK_CLIENT: &str = "100ms";

/// SQLSTATE `55P03` lock_not_available: NOWAIT or `lock_timeout`.
pub(crate) const LOCK_NOT_AVAILABLE: &str = "55P03";

/// SQLSTATE `57014` query_canceled, "due to user request": what Postgres
/// reports when a `lock_timeout` fires just as the row lock is granted
/// (the grant clears the timeout's indicator, the cancel stays pending;
/// seen on Postgres 15). This client never cancels a statement, so on a
/// row lock's statement it means the same as `55P03`; the transaction's
/// rollback frees whatever the statement took.
const QUERY_CANCELED: &str = "57014";

/// The row lock (`row`) or advisory lock statement failed with SQLSTATE
/// `code` because the lock was not available in time.
fn not_available(code: Option<&str>, row: bool) -> bool {
    code == Some(LOCK_NOT_AVAILABLE) || (row && code == Some(QUERY_CANCELED))
}

const CAPABILITIES: Capabilities = Capabilities::new(BACKEND, Grade::Correctness)
    .with_fencing(Fencing::Safe)
    // The server grants an advisory lock to its waiters in arrival order
    // (at the release, before anyone else can ask). Row mode says `false`
    // in `raw_capabilities`.
    .with_fair_queue(true)
    .with_crash_release(CrashRelease::Connection)
    // The lock itself lives as long as its connection; only the hung
    // holder's bound (the idle timeout) and `lost()` use clocks.
    .with_depends_on_clocks(false)
    .with_waiting(Waiting::Notified)
    .with_max_ttl(Duration::from_secs(24 * 3600))
    // Set by the client from its pool size.
    .with_max_held(None);

/// Locks on Postgres: row locks (default) or advisory locks.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{DistributedLock, LockOptions};
/// let locks = lock_sql::PgLock::connect("postgres://app:secret@db/app?table=app_locks").await?;
/// let guard = locks.acquire("invoice-run", &LockOptions::new()).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub type PgLock = SqlLock<PgDialect>;

/// The Postgres dialect of [`SqlLock`]: its statements and connections.
pub struct PgDialect {
    core: Core<Postgres, PgSession>,
    sql: Statements,
    /// The semaphores' statements.
    permits: permits::Statements,
    /// The reader-writer locks' statements.
    rw: rw::Statements,
    /// The pool is the application's: its connections did not start with
    /// `client_connection_check_interval`, so an advisory wait sets it
    /// first (the server arms the check when a statement starts, so
    /// setting it inside the waiting statement would be too late).
    arm_check_before_waits: bool,
}

/// The statements, with the (validated) table name in place.
#[derive(Clone)]
struct Statements {
    insert: String,
    lock_row: String,
    lock_row_nowait: String,
    /// Wait for the advisory lock, then the grant's token: see
    /// [`Statements::new`].
    advisory: String,
    /// One attempt at the advisory lock, then the grant's token.
    advisory_try: String,
    advisory_unlock: String,
    /// Unlock on a shared session (its timeouts stay).
    advisory_unlock_shared: String,
    /// One attempt at the advisory lock on a shared session whose idle
    /// bound is already the one wanted, then the grant's token.
    advisory_try_kept: String,
    /// One attempt at a set of advisory locks on a shared session, all or
    /// none, then their tokens: see [`set_grant`].
    advisory_try_set: String,
    /// Row mode's token, drawn after the row is locked.
    draw_token: String,
    /// A drawn token completed: the epoch advanced after a crash.
    tokens: tokens::Statements,
    /// Grants draw a token (and store the holder record, the statements'
    /// last parameter).
    fencing: bool,
}

impl Statements {
    /// The statements on lock table `table`. Each advisory lock statement
    /// answers one row: NULL unless granted, else the grant's token (0
    /// without `fencing`), drawn in the same statement (see [`tokens`]), so
    /// that a grant costs one round trip. With `fencing`, the holder record
    /// is each grant statement's last parameter. A session advisory lock outlives
    /// the abort of the statement that took it, so a caller whose statement
    /// failed gives the lock back (or closes the connection).
    fn new(table: &Identifier, fencing: bool) -> Self {
        let t = table.as_str();
        let lock = |nowait: &str| {
            format!(
                "WITH l AS (SELECT name FROM {t} WHERE name = $1 FOR UPDATE{nowait}) \
                 SELECT 0::bigint FROM l"
            )
        };
        let key = "hashtextextended('distlock:' || $1, 0)";
        let drawn = tokens::DRAWN;
        // `holder`: the holder record's parameter.
        let grant = |locked: String, holder: &str| match fencing {
            true => format!(
                "WITH l AS (SELECT {locked} AS got), {} SELECT {drawn}",
                tokens::draw(t, holder)
            ),
            false => format!("SELECT CASE WHEN {locked} THEN 0::bigint END"),
        };
        Statements {
            insert: format!("INSERT INTO {t} (name) VALUES ($1) ON CONFLICT DO NOTHING"),
            lock_row: lock(""),
            lock_row_nowait: lock(" NOWAIT"),
            advisory: grant(
                format!(
                    "set_config('lock_timeout', $2, false) IS NOT NULL \
                     AND set_config('idle_session_timeout', $3, false) IS NOT NULL \
                     AND pg_advisory_lock({key}) IS NOT NULL"
                ),
                "$4",
            ),
            advisory_try: grant(
                format!(
                    "set_config('idle_session_timeout', $2, false) IS NOT NULL \
                     AND pg_try_advisory_lock({key})"
                ),
                "$3",
            ),
            draw_token: format!(
                "WITH l AS (SELECT true AS got), {} SELECT {drawn}",
                tokens::draw(t, "$2")
            ),
            advisory_unlock: format!(
                "SELECT pg_advisory_unlock({key}), set_config('idle_session_timeout', '0', false), \
                 set_config('lock_timeout', '0', false)"
            ),
            advisory_unlock_shared: format!("SELECT pg_advisory_unlock({key})"),
            advisory_try_kept: grant(format!("pg_try_advisory_lock({key})"), "$2"),
            advisory_try_set: set_grant(t, fencing),
            tokens: tokens::Statements::new(t),
            fencing,
        }
    }
}

/// The statement that takes the advisory locks of the names `$1` (a
/// `text[]`, distinct) on a shared session, all or none, in one round
/// trip, first setting the session's idle bound to `$2` unless it is NULL.
/// It answers one row: whether the set was granted, how many locks it
/// gave back, and the tokens drawn (see [`tokens::draw_set`]; zeros
/// without `fencing`, and then no holder record `$3`), in `$1`'s order.
///
/// It first looks in `pg_locks` for anyone holding or waiting for one of
/// the names' keys, and tries none when it finds one: a set refused
/// because a member is held never takes the others, even for the moment
/// of the statement. Only a grant racing the statement itself (between
/// that look and the tries) can make it take some keys; it then gives
/// them back before answering. A try never jumps a waiter (the server
/// refuses a try while anyone waits), so the set is taken only where a
/// single try of each name would have been.
fn set_grant(t: &str, fencing: bool) -> String {
    let names = "n AS (SELECT name, ord, hashtextextended('distlock:' || name, 0) AS k \
         FROM unnest($1::text[]) WITH ORDINALITY AS n(name, ord))";
    let free = "f AS MATERIALIZED (SELECT (CASE WHEN $2::text IS NULL THEN true \
         ELSE set_config('idle_session_timeout', $2, false) IS NOT NULL END) \
         AND NOT EXISTS (SELECT 1 FROM pg_locks p JOIN n \
         ON p.classid = ((n.k >> 32) & 4294967295)::oid AND p.objid = (n.k & 4294967295)::oid \
         WHERE p.locktype = 'advisory' AND p.objsubid = 1 \
         AND p.database = (SELECT oid FROM pg_database WHERE datname = current_database())) AS free)";
    let tried = "tried AS MATERIALIZED (SELECT k, pg_try_advisory_lock(k) AS took FROM n \
         WHERE (SELECT free FROM f))";
    let got = "l AS MATERIALIZED (SELECT coalesce((SELECT free FROM f) \
         AND (SELECT bool_and(took) FROM tried), false) AS got)";
    let undone = "undone AS MATERIALIZED (SELECT count(pg_advisory_unlock(k)) AS n FROM tried \
         WHERE took AND NOT (SELECT got FROM l))";
    let head = format!("WITH {names}, {free}, {tried}, {got}, {undone}");
    let answer = "(SELECT got FROM l), (SELECT n FROM undone)";
    match fencing {
        true => format!(
            "{head}, {} SELECT {answer}, {}",
            tokens::draw_set(t, "$3"),
            tokens::DRAWN_SET
        ),
        false => format!(
            "{head} SELECT {answer}, ARRAY(SELECT 0::bigint FROM n WHERE (SELECT got FROM l) ORDER BY ord)"
        ),
    }
}

impl SqlLock<PgDialect> {
    /// Connect to `postgres://user:pass@host[:port]/db` with options
    /// `table` (default `distlock_locks`), `mode=row|advisory`,
    /// `max_connections` (default 32; each waiter, and each held lock but
    /// those on shared sessions, uses one), `sessions` (advisory mode: the
    /// shared sessions, default 2; 0 puts every lock on a connection of its
    /// own), `connect_timeout_ms` and `fencing` (`false`: no fencing tokens,
    /// and no token write per grant; see [`SqlConfig::fencing`]), plus
    /// sqlx's own (`sslmode`, …).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let parsed = SqlUrl::parse(url, &["postgres", "postgresql"])?;
        let options = engine::client_options::<Postgres>(BACKEND, &parsed)?
            .options([("client_connection_check_interval", CHECK_CLIENT)]);
        let pool = engine::connect_pool(BACKEND, &parsed, options.clone()).await?;
        Self::from_pool(pool, options, parsed.config(), parsed.display, false).await
    }

    /// A lock on a pool the application already has, with `config` in
    /// place of a URL's options: `PgLock::with_pool(pool, SqlConfig::default())`.
    /// See [`SqlLock`] for how it uses the pool. The lock sets `lock_timeout`,
    /// `idle_session_timeout` and `client_connection_check_interval` on the
    /// connections it uses and puts back what it changed for the session
    /// (advisory mode); the pool's slow-statement log, if on, reports long
    /// lock waits. Invalid settings are [`LockError::InvalidOptions`].
    pub async fn with_pool(pool: sqlx::PgPool, config: SqlConfig) -> Result<Self, LockError> {
        config.validate()?;
        let options = engine::options_of_pool(&pool)
            .options([("client_connection_check_interval", CHECK_CLIENT)]);
        Self::from_pool(pool, options, config, engine::app_pool(BACKEND), true).await
    }

    async fn from_pool(
        pool: sqlx::PgPool,
        options: PgConnectOptions,
        config: SqlConfig,
        display: String,
        arm_check_before_waits: bool,
    ) -> Result<Self, LockError> {
        let undefined_table = |e: &sqlx::Error| matches!(e, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some(UNDEFINED_TABLE | UNDEFINED_COLUMN)));
        engine::prepare_schema(
            BACKEND,
            &pool,
            &config,
            engine::Schema {
                ddl: Self::ddl(&config),
                upgrade: tokens::upgrade(config.table.as_str()),
                more_tables: &[],
                ddl_fn: "PgLock::ddl",
            },
            undefined_table,
        )
        .await?;
        let sql = Statements::new(&config.table, config.fencing);
        let session = PgSession { sql: sql.clone() };
        Ok(SqlLock::new(PgDialect {
            permits: permits::Statements::new(config.table.as_str()),
            rw: rw::Statements::new(config.table.as_str()),
            core: Core::new(BACKEND, pool, options, session, config, display),
            sql,
            arm_check_before_waits,
        }))
    }

    /// How many acquisitions of `name` wait on the server: sessions waiting
    /// for its advisory lock, or for its row (behind the holder's
    /// transaction or the row's tuple lock).
    pub async fn queued(&self, name: &str) -> Result<usize, LockError> {
        self.dialect().queued(name).await
    }

    /// The statements that create the lock's tables for `config` (run at
    /// start-up unless [`SqlConfig::create_schema`] is off; all are `IF NOT
    /// EXISTS`): the lock table (a row per name, for row mode), the durable
    /// epoch of the fencing tokens, and the unlogged tables of the counters
    /// and the epoch they count in; last, the unlogged table of the
    /// semaphores' permits (rows per name and slot) and the two unlogged
    /// tables of the reader-writer locks (a row per name, the waiting
    /// writers' marks), which the start-up checks do not ask for: without
    /// them every lock works, and a request for a permit or a reader-writer
    /// grant is refused with `InvalidOptions` naming the statements. The
    /// lock's role needs `SELECT`, `INSERT`, `UPDATE` and `DELETE` on the
    /// seven tables.
    ///
    /// ```
    /// let ddl = lock_sql::PgLock::ddl(&lock_sql::SqlConfig::default());
    /// assert!(ddl[0].starts_with("CREATE TABLE IF NOT EXISTS distlock_locks "));
    /// ```
    pub fn ddl(config: &SqlConfig) -> Vec<String> {
        let t = config.table.as_str();
        let mut ddl = vec![format!(
            "CREATE TABLE IF NOT EXISTS {t} (name TEXT PRIMARY KEY, created_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )];
        ddl.extend(tokens::ddl(t));
        ddl.push(permits::ddl(t));
        ddl.extend(rw::ddl(t));
        ddl
    }

    /// Remove what the lock keeps per name for the names nobody was granted
    /// for `unused_for` (their token counters, the rows of the lock table
    /// that row mode locks and of `TABLE_rw` that reader-writer locks hold,
    /// but for rows held now, and the marks of waiting writers that
    /// expired that long ago, as a crashed waiter's do): the tables
    /// otherwise grow with every name ever locked. Returns how many names'
    /// counters were removed. Tokens still never go backwards: the epoch
    /// the counters count in is advanced in the same transaction (one
    /// flushed commit), so a removed name's next token is above its last.
    /// Run it now and then (daily, say) from one client.
    pub async fn remove_unused(&self, unused_for: Duration) -> Result<u64, LockError> {
        let dialect = self.dialect();
        let t = dialect.core.table.as_str();
        let secs = unused_for.as_secs_f64();
        let failed = |e| map_sqlx(BACKEND, "removing unused names", e);
        let mut tx = dialect.core.pool.pool().begin().await.map_err(failed)?;
        let removed = sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM {t}_counters WHERE used_at < now() - make_interval(secs => $1)"
        )))
        .bind(secs)
        .execute(&mut *tx)
        .await
        .map_err(failed)?
        .rows_affected();
        if removed > 0 {
            dialect
                .sql
                .tokens
                .advance_in(&mut tx)
                .await
                .map_err(failed)?;
        }
        sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM {t} WHERE name IN (SELECT name FROM {t} l \
             WHERE created_at < now() - make_interval(secs => $1) \
             AND NOT EXISTS (SELECT 1 FROM {t}_counters c WHERE c.name = l.name) \
             FOR UPDATE SKIP LOCKED)"
        )))
        .bind(secs)
        .execute(&mut *tx)
        .await
        .map_err(failed)?;
        let [dead_marks, rw_rows] = rw::clean_up(t);
        sqlx::query(AssertSqlSafe(dead_marks))
            .bind(crate::rw::marks_unused_before(unused_for))
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
        sqlx::query(AssertSqlSafe(rw_rows))
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
        tx.commit().await.map_err(failed)?;
        tracing::debug!(target: "distlock", backend = BACKEND, removed, "removed unused names");
        Ok(removed)
    }
}

/// SQLSTATE of a missing table.
const UNDEFINED_TABLE: &str = "42P01";

/// SQLSTATE of a missing column (a table from before the column).
const UNDEFINED_COLUMN: &str = "42703";

impl PgDialect {
    /// The server process (pid) whose session holds `name`.
    async fn holder_pid(&self, name: &str) -> Result<Option<i32>, LockError> {
        match self.core.mode {
            SqlMode::Row => self.row_holder(name).await,
            SqlMode::Advisory => sqlx::query_scalar(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
                 AND ((classid::bigint << 32) | objid::bigint) = hashtextextended('distlock:' || $1, 0) LIMIT 1",
            )
            .bind(name)
            .fetch_optional(self.core.pool.pool())
            .await
            .map_err(|e| map_sqlx(BACKEND, "finding a lock's holder", e)),
        }
    }

    /// How many acquisitions of `name` wait on the server.
    async fn queued(&self, name: &str) -> Result<usize, LockError> {
        let sql = match self.core.mode {
            SqlMode::Advisory => "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
                 AND NOT granted AND ((classid::bigint << 32) | objid::bigint) = \
                 hashtextextended('distlock:' || $1, 0)"
                .to_string(),
            SqlMode::Row => {
                let t = self.core.table.as_str();
                format!(
                    "WITH r AS (SELECT (ctid::text::point)[0]::int AS page, \
                     (ctid::text::point)[1]::int AS tup, xmax::text AS xid FROM {t} WHERE name = $1) \
                     SELECT count(DISTINCT l.pid) FROM pg_locks l, r WHERE NOT l.granted AND \
                     ((l.locktype = 'tuple' AND l.relation = '{t}'::regclass \
                     AND l.page = r.page AND l.tuple = r.tup) \
                     OR (l.locktype = 'transactionid' AND l.transactionid::text = r.xid))"
                )
            }
        };
        let waiting: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(name)
            .fetch_one(self.core.pool.pool())
            .await
            .map_err(|e| map_sqlx(BACKEND, "counting a lock's waiters", e))?;
        Ok(usize::try_from(waiting).unwrap_or(0))
    }

    /// The backend pid whose transaction holds `name`'s row lock.
    async fn row_holder(&self, name: &str) -> Result<Option<i32>, LockError> {
        // The row's xmax is the locking transaction; pg_locks maps it to a pid.
        let pid: Option<i32> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT l.pid FROM {} t JOIN pg_locks l ON l.locktype = 'transactionid' \
             AND l.transactionid::text = t.xmax::text AND l.mode = 'ExclusiveLock' \
             WHERE t.name = $1 LIMIT 1",
            self.core.table.as_str()
        )))
        .bind(name)
        .fetch_optional(self.core.pool.pool())
        .await
        .map_err(|e| map_sqlx(BACKEND, "finding a lock's holder", e))?;
        Ok(pid)
    }

    /// The token of a row-mode grant, drawn on the client's side
    /// connection (the lock is an open transaction) by the same statement
    /// an advisory grant runs (see [`tokens`]), with the holder `record`.
    /// Only a holder of `name` draws it, so tokens strictly increase.
    async fn draw_row_token(&self, name: &str, record: &[u8]) -> Result<i64, LockError> {
        if !self.core.fencing {
            return Ok(0);
        }
        let (sql, tokens) = (self.sql.draw_token.as_str(), &self.sql.tokens);
        self.core
            .side
            .run(async |conn| {
                let drawn = advance_token(sql, conn, name, record).await?;
                tokens.complete(conn, name, drawn).await
            })
            .await
            .map_err(|e| map_sqlx(BACKEND, "drawing a fencing token", e))
    }
}

/// The longest `lock_timeout` Postgres accepts: a 32-bit millisecond count
/// (about 24.8 days).
const MAX_LOCK_TIMEOUT_MS: u128 = i32::MAX as u128;

/// The `lock_timeout` of the next attempt: `None` for a single attempt
/// (`NOWAIT`), `Some(0)` (no timeout) to wait forever, else what is left
/// of the wait, at most [`MAX_LOCK_TIMEOUT_MS`]: a longer wait goes on in
/// slices.
fn wait_slice_ms(wait: Wait, deadline: Option<Instant>) -> Option<u128> {
    match (wait, deadline) {
        (Wait::No, _) => None,
        (_, None) => Some(0),
        (_, Some(d)) => Some(
            d.saturating_duration_since(Instant::now())
                .as_millis()
                .clamp(1, MAX_LOCK_TIMEOUT_MS),
        ),
    }
}

#[async_trait]
impl Dialect for PgDialect {
    type Db = Postgres;
    type Session = PgSession;
    const CAPABILITIES: Capabilities = CAPABILITIES;

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
            // A row lock is not handed over: at the holder's commit its
            // waiters wake and lock the row again, and a newcomer whose
            // `SELECT … FOR UPDATE` arrives first finds the row free and
            // takes it without queueing (seen as a releaser overtaking a
            // waiter under load).
            .with_fair_queue(self.core.mode == SqlMode::Advisory)
    }

    fn core(&self) -> &Core<Postgres, PgSession> {
        &self.core
    }

    /// Lock `req.name` on a connection of its own: the connection (inside
    /// the lock transaction, in row mode), the token and when it was asked.
    /// `Ok(None)`: held by someone else (a single attempt), or the wait ran
    /// out at the request's deadline (`Timeout` is made by the caller).
    async fn lock(
        &self,
        req: Request<'_>,
        record: Option<&HolderRecord>,
    ) -> Result<Option<Pinning<Postgres>>, LockError> {
        let (name, opts, deadline) = (req.name, req.opts, req.deadline);
        let core = &self.core;
        let failed = |e| map_sqlx(BACKEND, "acquiring a lock", e);
        let taken = |e: NoConnection| e.into_error(BACKEND, "acquiring a lock");
        let mut pinned = core.pool.pinned().await.map_err(taken)?;
        let ttl_ms = lease_millis(opts.ttl);
        // The record is the grant statement's last parameter with fencing
        // on, and is not sent without.
        let record = record.map(HolderRecord::as_bytes);
        let sent_at = Instant::now();
        let mut dead = DeadBudget::new();
        loop {
            let wait_ms = wait_slice_ms(opts.wait, deadline);
            // The statement that prepares the lock's: the row lock's
            // transaction (numbers only: nothing a caller controls is
            // spliced), or the client check of a session that will wait.
            let prepare = match (core.mode, wait_ms) {
                (SqlMode::Row, _) => Some(format!(
                    "BEGIN; SET LOCAL lock_timeout = {}; SET LOCAL idle_in_transaction_session_timeout = {ttl_ms}; \
                     SET LOCAL client_connection_check_interval = '{CHECK_CLIENT}'",
                    wait_ms.unwrap_or(0)
                )),
                (SqlMode::Advisory, Some(_)) if self.arm_check_before_waits => Some(format!(
                    "SET client_connection_check_interval = '{CHECK_CLIENT}'"
                )),
                (SqlMode::Advisory, _) => None,
            };
            let conn = pinned.conn(BACKEND)?;
            if let Some(prepare) = prepare
                && let Err(e) = sqlx::raw_sql(AssertSqlSafe(prepare))
                    .execute(&mut **conn)
                    .await
            {
                let pool = &core.pool;
                pool.replace_if_dead(&mut pinned, e, &mut dead, BACKEND)
                    .await?;
                continue;
            }
            let token: Result<Option<Option<i64>>, sqlx::Error> = match (core.mode, wait_ms) {
                (SqlMode::Row, _) => {
                    let sql = if wait_ms.is_some() {
                        &self.sql.lock_row
                    } else {
                        &self.sql.lock_row_nowait
                    };
                    sqlx::query_scalar(AssertSqlSafe(sql.as_str()))
                        .bind(name)
                        .fetch_optional(&mut **conn)
                        .await
                        .map(|row| row.map(Some))
                }
                (SqlMode::Advisory, Some(wait)) => {
                    let lock = sqlx::query_scalar(AssertSqlSafe(self.sql.advisory.as_str()))
                        .bind(name)
                        .bind(format!("{wait}ms"))
                        .bind(format!("{ttl_ms}ms"));
                    committed_answer(with_record(lock, record), conn).await
                }
                (SqlMode::Advisory, None) => {
                    let lock = sqlx::query_scalar(AssertSqlSafe(self.sql.advisory_try.as_str()))
                        .bind(name)
                        .bind(format!("{ttl_ms}ms"));
                    committed_answer(with_record(lock, record), conn).await
                }
            };
            match token {
                Ok(Some(Some(granted))) => {
                    // An advisory lock statement answers with the token;
                    // a row lock's is drawn now. A failure closes the
                    // connection, and the lock goes with it.
                    let token = match core.mode {
                        SqlMode::Advisory if core.fencing => self
                            .sql
                            .tokens
                            .complete(conn, name, granted)
                            .await
                            .map_err(|e| map_sqlx(BACKEND, "drawing a fencing token", e))?,
                        SqlMode::Advisory => granted,
                        SqlMode::Row => {
                            self.draw_row_token(name, record.unwrap_or_default())
                                .await?
                        }
                    };
                    let token = u64::try_from(token).map_err(|_| LockError::Backend {
                        backend: BACKEND,
                        reason: format!("the server answered a negative fencing token {token}"),
                        source: None,
                    })?;
                    return Ok(Some((pinned, token, sent_at)));
                }
                // Advisory: not granted (try). Row: no row yet — create it
                // (committed, outside any lock) and try again.
                Ok(Some(None)) => {
                    pinned.put_back();
                    return Ok(None);
                }
                Ok(None) if core.mode == SqlMode::Row => {
                    sqlx::raw_sql("ROLLBACK")
                        .execute(&mut **conn)
                        .await
                        .map_err(failed)?;
                    sqlx::query(AssertSqlSafe(self.sql.insert.as_str()))
                        .bind(name)
                        .execute(&mut **conn)
                        .await
                        .map_err(failed)?;
                }
                Ok(None) => return Ok(None),
                Err(sqlx::Error::Database(db))
                    if not_available(db.code().as_deref(), core.mode == SqlMode::Row) =>
                {
                    if core.mode == SqlMode::Row {
                        sqlx::raw_sql("ROLLBACK")
                            .execute(&mut **conn)
                            .await
                            .map_err(failed)?;
                    }
                    // A wait longer than one `lock_timeout` goes on in
                    // the next slice (`None`: a single attempt).
                    if wait_ms.is_some() && deadline.is_none_or(|d| Instant::now() < d) {
                        continue;
                    }
                    pinned.put_back();
                    return Ok(None);
                }
                Err(e) if core.mode == SqlMode::Advisory && connection_lost(&e) => {
                    let pool = &core.pool;
                    pool.replace_if_dead(&mut pinned, e, &mut dead, BACKEND)
                        .await?;
                }
                Err(e) if core.mode == SqlMode::Advisory && !connection_lost(&e) => {
                    // The statement may have taken the lock before it
                    // failed (its token's write refused), and a session's
                    // advisory lock outlives the statement's abort: give
                    // it back before answering, so that it is free then.
                    let unlocked: Result<bool, _> =
                        sqlx::query_scalar(AssertSqlSafe(self.sql.advisory_unlock.as_str()))
                            .bind(name)
                            .fetch_one(&mut **conn)
                            .await;
                    match unlocked {
                        Ok(_) => pinned.put_back(),
                        Err(_) => pinned.close(),
                    }
                    return Err(failed(e));
                }
                Err(e) => return Err(failed(e)),
            }
        }
    }

    async fn unlock(
        &self,
        conn: &mut PoolConnection<Postgres>,
        name: &str,
    ) -> Result<bool, sqlx::Error> {
        match self.core.mode {
            // Nothing to keep: an abort frees the row lock without a WAL flush.
            SqlMode::Row => sqlx::raw_sql("ROLLBACK")
                .execute(&mut **conn)
                .await
                .map(|_| true),
            SqlMode::Advisory => {
                sqlx::query_scalar(AssertSqlSafe(self.sql.advisory_unlock.as_str()))
                    .bind(name)
                    .fetch_one(&mut **conn)
                    .await
            }
        }
    }

    async fn touch(
        &self,
        conn: &mut PoolConnection<Postgres>,
        ttl: Duration,
    ) -> Result<(), sqlx::Error> {
        // A number only: nothing a caller controls is spliced.
        let ms = lease_millis(ttl);
        let touch = match self.core.mode {
            SqlMode::Row => format!("SET LOCAL idle_in_transaction_session_timeout = {ms}"),
            SqlMode::Advisory => format!("SET idle_session_timeout = {ms}"),
        };
        sqlx::raw_sql(AssertSqlSafe(touch))
            .execute(&mut **conn)
            .await
            .map(|_| ())
    }

    /// Held when a session holds `name`'s advisory lock or row lock (the
    /// server's lock table says so); the waiters are the sessions waiting
    /// in the server's lock queue. The lock lasts as long as the holder's session,
    /// so no lease time is reported.
    async fn inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        let info = match self.holder_pid(name).await? {
            Some(_) => LockInfo::held(),
            None => LockInfo::free(),
        };
        Ok(info.with_waiters(Some(self.queued(name).await?)))
    }

    /// The token of `name`'s latest grant (the holder's while it is held)
    /// and its holder record. A token still to be completed (the first
    /// grant after a crash) is none yet.
    async fn latest_grant(&self, name: &str) -> Result<Option<LatestGrant>, LockError> {
        let latest: Option<(i64, Option<Vec<u8>>)> =
            sqlx::query_as(AssertSqlSafe(self.sql.tokens.latest.as_str()))
                .bind(name)
                .fetch_optional(self.core.pool.pool())
                .await
                .map_err(|e| map_sqlx(BACKEND, "reading a lock's token", e))?;
        Ok(latest
            .filter(|&(t, _)| tokens::is_complete(t))
            .and_then(|(t, record)| Some((u64::try_from(t).ok()?, record))))
    }

    async fn set_holder(&self, name: &str, token: u64, record: &[u8]) -> Result<bool, LockError> {
        let token = i64::try_from(token).map_err(|_| LockError::Backend {
            backend: BACKEND,
            reason: format!("a fencing token {token} beyond the server's range"),
            source: None,
        })?;
        let done = sqlx::query(AssertSqlSafe(self.sql.tokens.set_holder.as_str()))
            .bind(name)
            .bind(token)
            .bind(record)
            .execute(self.core.pool.pool())
            .await
            .map_err(|e| map_sqlx(BACKEND, "replacing a holder's value", e))?;
        Ok(done.rows_affected() == 1)
    }

    /// End the server session holding `name` (`pg_terminate_backend`) and
    /// wait (up to 10 s) until it is gone, so that the lock is free when
    /// this returns; the next waiter is granted it by the server. The
    /// holder's `lost()` fires, and so do those of the other locks that
    /// session carried (advisory locks granted without waiting share a few
    /// sessions per client).
    async fn force_release(&self, name: &str) -> Result<bool, LockError> {
        let Some(pid) = self.holder_pid(name).await? else {
            return Ok(false);
        };
        let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 10000)")
            .bind(pid)
            .fetch_one(self.core.pool.pool())
            .await
            .map_err(|e| map_sqlx(BACKEND, "terminating the holder's session", e))?;
        Ok(ended)
    }

    async fn take_slot(
        &self,
        pinned: &mut Pinned<Postgres>,
        name: &str,
        limit: u32,
        ttl: Duration,
    ) -> Result<Result<Found, sqlx::Error>, LockError> {
        let conn = pinned.conn(BACKEND)?;
        Ok(self.permits.take_slot(conn, name, limit, ttl).await)
    }

    async fn set_limit(
        &self,
        conn: &mut PoolConnection<Postgres>,
        name: &str,
        limit: u32,
    ) -> Result<bool, sqlx::Error> {
        self.permits.set_limit(conn, name, limit).await
    }

    /// An abort: the row lock is freed without a WAL flush.
    async fn end_permit(&self, conn: &mut PoolConnection<Postgres>) -> Result<(), sqlx::Error> {
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut **conn)
            .await
            .map(|_| ())
    }

    async fn touch_permit(
        &self,
        conn: &mut PoolConnection<Postgres>,
        ttl: Duration,
    ) -> Result<(), sqlx::Error> {
        // A number only: nothing a caller controls is spliced.
        let touch = format!(
            "SET LOCAL idle_in_transaction_session_timeout = {}",
            lease_millis(ttl)
        );
        sqlx::raw_sql(AssertSqlSafe(touch))
            .execute(&mut **conn)
            .await
            .map(|_| ())
    }

    async fn held_slots(&self, name: &str) -> Result<Option<(u32, Vec<u32>)>, LockError> {
        self.permits
            .held_slots(self.core.pool.pool(), name)
            .await
            .map_err(|e| self.permit_error(e))
    }

    async fn draw_on_side(&self, key: &str, record: &[u8]) -> Result<u64, LockError> {
        let token = self.draw_row_token(key, record).await?;
        u64::try_from(token).map_err(|_| LockError::Backend {
            backend: BACKEND,
            reason: format!("the server answered a negative fencing token {token}"),
            source: None,
        })
    }

    async fn put_back_permit(&self, mut pinned: Pinned<Postgres>) {
        pinned.put_back();
    }

    async fn take_rw(
        &self,
        pinned: &mut Pinned<Postgres>,
        name: &str,
        access: Access,
        times: (i64, i64),
        ttl: Duration,
    ) -> Result<Result<bool, sqlx::Error>, LockError> {
        let conn = pinned.conn(BACKEND)?;
        Ok(self.rw.take(conn, name, access, times, ttl).await)
    }

    async fn mark_rw(
        &self,
        pinned: &mut Pinned<Postgres>,
        name: &str,
        id: &str,
        arrival: i64,
        expires: i64,
    ) -> Result<(), LockError> {
        let conn = pinned.conn(BACKEND)?;
        self.rw
            .mark(conn, name, id, arrival, expires)
            .await
            .map_err(|e| self.rw_error(e))
    }

    async fn unmark_rw(&self, name: &str, id: &str, for_good: bool) -> Result<(), LockError> {
        self.rw
            .unmark(self.core.pool.pool(), name, id, for_good)
            .await
            .map_err(|e| self.rw_error(e))
    }

    async fn rw_state(&self, name: &str, now: i64) -> Result<(Option<Access>, usize), LockError> {
        self.rw
            .state(self.core.pool.pool(), name, now)
            .await
            .map_err(|e| self.rw_error(e))
    }

    fn rw_error(&self, e: sqlx::Error) -> LockError {
        match &e {
            sqlx::Error::Database(db) if db.code().as_deref() == Some(UNDEFINED_TABLE) => {
                LockError::invalid_options(format!(
                    "the reader-writer locks' tables are missing ({e}): create them with the \
                     last two statements of PgLock::ddl: {}",
                    rw::ddl(self.core.table.as_str()).join("; ")
                ))
            }
            _ => map_sqlx(BACKEND, "acquiring a reader-writer lock", e),
        }
    }

    fn permit_error(&self, e: sqlx::Error) -> LockError {
        match &e {
            sqlx::Error::Database(db) if db.code().as_deref() == Some(UNDEFINED_TABLE) => {
                LockError::invalid_options(format!(
                    "the semaphores' table is missing ({e}): create it with the last statement \
                     of PgLock::ddl: {}",
                    permits::ddl(self.core.table.as_str())
                ))
            }
            _ => map_sqlx(BACKEND, "acquiring a permit", e),
        }
    }
}

impl SqlLock<PgDialect> {
    /// Lock `name` and hand over the lock's own transaction (row mode):
    /// statements run on [`PgLockedTransaction::conn`] commit atomically with
    /// the release, so the protected write and the lock cannot diverge.
    /// Dropping it (or [`rollback`](PgLockedTransaction::rollback)) undoes
    /// the writes and frees the lock; so does a server that ends the session
    /// after the TTL without a statement (a hung holder).
    ///
    /// ```no_run
    /// # async fn demo(locks: lock_sql::PgLock) -> Result<(), Box<dyn std::error::Error>> {
    /// use lock_core::LockOptions;
    /// let mut tx = locks.begin("account/42", &LockOptions::new()).await?;
    /// sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 42")
    ///     .execute(tx.conn()?)
    ///     .await?;
    /// tx.commit().await?; // the write and the release, at once
    /// # Ok(()) }
    /// ```
    pub async fn begin(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<PgLockedTransaction, LockError> {
        let dialect = self.dialect();
        if dialect.core.mode != SqlMode::Row {
            return Err(LockError::invalid_options(
                "the lock's transaction exists in row mode only (mode=row)",
            ));
        }
        let req = Request::checked(name, opts, &CAPABILITIES)?;
        let record = engine::holder_record(&dialect.core, req);
        match dialect.lock(req, record.as_ref()).await? {
            Some((conn, token, _)) => Ok(PgLockedTransaction {
                name: name.to_string(),
                token: dialect.core.fencing.then_some(token),
                conn,
            }),
            None => Err(req.timeout()),
        }
    }
}

/// A held row lock whose transaction is open for the caller's statements;
/// see [`PgLock::begin`].
pub struct PgLockedTransaction {
    name: String,
    token: Option<u64>,
    conn: Pinned<Postgres>,
}

impl PgLockedTransaction {
    /// The lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fencing token of this grant (`None` with `fencing=false`).
    pub fn fencing_token(&self) -> Option<u64> {
        self.token
    }

    /// The connection, inside the lock's transaction: run statements here.
    pub fn conn(&mut self) -> Result<&mut sqlx::PgConnection, LockError> {
        Ok(&mut **self.conn.conn(BACKEND)?)
    }

    /// Commit the caller's writes and release the lock, atomically. If the
    /// commit fails, neither happened (the server rolls back and frees the
    /// lock when the connection closes).
    pub async fn commit(mut self) -> Result<(), LockError> {
        sqlx::raw_sql("COMMIT")
            .execute(&mut **self.conn.conn(BACKEND)?)
            .await
            .map_err(|e| map_sqlx(BACKEND, "committing the lock's transaction", e))?;
        self.conn.put_back();
        Ok(())
    }

    /// Undo the caller's writes and release the lock.
    pub async fn rollback(mut self) -> Result<(), LockError> {
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut **self.conn.conn(BACKEND)?)
            .await
            .map_err(|e| map_sqlx(BACKEND, "rolling back the lock's transaction", e))?;
        self.conn.put_back();
        Ok(())
    }
}

impl fmt::Debug for PgLockedTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgLockedTransaction")
            .field("name", &self.name)
            .field("fencing_token", &self.token)
            .finish_non_exhaustive()
    }
}

/// Postgres advisory locks on a shared session.
pub(crate) struct PgSession {
    sql: Statements,
}

#[async_trait]
impl SessionSql for PgSession {
    type Conn = sqlx::PgConnection;

    async fn unlock(&self, conn: &mut Self::Conn, name: &str) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar(AssertSqlSafe(self.sql.advisory_unlock_shared.as_str()))
            .bind(name)
            .fetch_one(conn)
            .await
    }

    async fn keep(&self, conn: &mut Self::Conn, idle: Duration) -> Result<(), sqlx::Error> {
        // A number only: nothing a caller controls is spliced.
        let touch = format!("SET idle_session_timeout = {}", lease_millis(idle));
        sqlx::raw_sql(AssertSqlSafe(touch)).execute(conn).await?;
        Ok(())
    }

    #[cfg(test)]
    async fn idle_bound(&self, conn: &mut Self::Conn) -> Result<Duration, sqlx::Error> {
        let millis: i64 = sqlx::query_scalar(
            "SELECT setting::bigint FROM pg_settings WHERE name = 'idle_session_timeout'",
        )
        .fetch_one(conn)
        .await?;
        Ok(Duration::from_millis(millis.unsigned_abs()))
    }

    async fn try_lock_set(
        &self,
        conn: &mut Self::Conn,
        names: &[&str],
        record: &[u8],
        idle: Option<Duration>,
    ) -> TriedSet {
        let idle = idle.map(|idle| format!("{}ms", lease_millis(idle)));
        let set = sqlx::query_as::<_, (Option<bool>, i64, Vec<i64>)>(AssertSqlSafe(
            self.sql.advisory_try_set.as_str(),
        ))
        .bind(names.to_vec())
        .bind(idle);
        let set = match self.sql.fencing {
            true => set.bind(record),
            false => set,
        };
        // Every row read: the answer counts once the commit is done.
        let Some((got, _, drawn)) = set.fetch_all(&mut *conn).await?.into_iter().next() else {
            return Err(sqlx::Error::Protocol(
                "a lock set statement returned no row".into(),
            ));
        };
        if got != Some(true) {
            return Ok(None);
        }
        let mut tokens = Vec::with_capacity(drawn.len());
        for (name, drawn) in names.iter().zip(drawn) {
            let token = match self.sql.fencing {
                true => self.sql.tokens.complete(conn, name, drawn).await?,
                false => 0,
            };
            tokens.push(
                u64::try_from(token).map_err(|_| {
                    sqlx::Error::Protocol(format!("a negative fencing token {token}"))
                })?,
            );
        }
        Ok(Some(tokens))
    }

    async fn try_lock(
        &self,
        conn: &mut Self::Conn,
        name: &str,
        record: &[u8],
        idle: Option<Duration>,
    ) -> Tried {
        let record = self.sql.fencing.then_some(record);
        let answer = match idle {
            None => {
                let lock = sqlx::query_scalar(AssertSqlSafe(self.sql.advisory_try_kept.as_str()))
                    .bind(name);
                committed_answer(with_record(lock, record), conn).await?
            }
            Some(idle) => {
                let lock = sqlx::query_scalar(AssertSqlSafe(self.sql.advisory_try.as_str()))
                    .bind(name)
                    .bind(format!("{}ms", lease_millis(idle)));
                committed_answer(with_record(lock, record), conn).await?
            }
        };
        match answer {
            Some(Some(0)) => Ok(Some(0)),
            Some(Some(drawn)) => {
                let token = self.sql.tokens.complete(conn, name, drawn).await?;
                u64::try_from(token)
                    .map(Some)
                    .map_err(|_| sqlx::Error::Protocol(format!("a negative fencing token {token}")))
            }
            Some(None) => Ok(None),
            None => Err(sqlx::Error::Protocol(
                "an advisory lock statement returned no row".into(),
            )),
        }
    }
}

/// A grant statement's query with the holder record bound as its last
/// parameter, if one is sent (fencing on).
type GrantQuery<'q> =
    sqlx::query::QueryScalar<'q, Postgres, Option<i64>, <Postgres as sqlx::Database>::Arguments>;

/// `query` with `record` bound as its last parameter, if given.
fn with_record<'q>(query: GrantQuery<'q>, record: Option<&'q [u8]>) -> GrantQuery<'q> {
    match record {
        Some(record) => query.bind(record),
        None => query,
    }
}

/// The first row of the answer to `query` on `conn`. Every row is read,
/// so the answer is taken only once the statement's commit is done (a
/// token is never handed out that a failed commit could hand out again).
async fn committed_answer(
    query: GrantQuery<'_>,
    conn: &mut sqlx::PgConnection,
) -> Result<Option<Option<i64>>, sqlx::Error> {
    Ok(query.fetch_all(conn).await?.into_iter().next())
}

/// Advance `name`'s token counter with the statement `sql` on `conn`: the
/// new token. All rows are read, so the answer is taken only once the
/// commit is done.
async fn advance_token(
    sql: &str,
    conn: &mut sqlx::PgConnection,
    name: &str,
    record: &[u8],
) -> Result<i64, sqlx::Error> {
    let rows: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(name)
        .bind(record)
        .fetch_all(conn)
        .await?;
    rows.first()
        .copied()
        .ok_or_else(|| sqlx::Error::Protocol("drawing a fencing token returned no row".into()))
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use sqlx::postgres::PgConnectOptions;

    use super::{PgSession, Statements, not_available};
    use crate::config::SqlConfig;
    use crate::shared::SharedSessions;

    /// A row lock's wait that Postgres ends with "canceling statement due
    /// to user request" (its `lock_timeout` racing the grant) is a lock
    /// not available, as `lock_timeout` itself is; on an advisory lock,
    /// which outlives the statement's abort, it is not (that path gives
    /// the lock back first).
    #[test]
    fn a_cancelled_row_lock_wait_is_a_lock_not_available() {
        assert!(not_available(Some("55P03"), true));
        assert!(not_available(Some("55P03"), false));
        assert!(not_available(Some("57014"), true));
        assert!(!not_available(Some("57014"), false));
        assert!(!not_available(Some("40P01"), true));
        assert!(!not_available(None, true));
    }

    /// A shared session sets its idle bound only when a lock asks for
    /// another, and keeps it when its last lock is given back.
    #[tokio::test]
    async fn a_shared_session_sets_its_idle_bound_only_when_it_changes() {
        let url = std::env::var("DISTLOCK_TEST_POSTGRES_URL")
            .expect("DISTLOCK_TEST_POSTGRES_URL (scripts/services.sh env)");
        let sessions = SharedSessions::new(
            "postgres",
            PgSession {
                sql: Statements::new(&SqlConfig::default().table, false),
            },
            PgConnectOptions::from_str(&url).expect("the test server's URL"),
            1,
        );
        sessions.check_idle_bound_set_only_when_it_changes().await;
    }

    /// A bound of a fraction of a millisecond more than whole ones (what a
    /// watchdog's check asks: the lease's time left) is rounded up, never
    /// down: the server must not end the lock before the client's
    /// `sent + ttl`. (Rounded down, a lock checked by the watchdog ended
    /// up to a millisecond early, and the conformance case
    /// `abandoned_lock_expires` saw a grant after 799.96 ms of an 800 ms
    /// lease.)
    #[tokio::test]
    async fn a_session_bound_is_rounded_up_to_whole_milliseconds() {
        use sqlx::Connection;
        use std::time::Duration;

        use crate::shared::SessionSql;
        let url = std::env::var("DISTLOCK_TEST_POSTGRES_URL")
            .expect("DISTLOCK_TEST_POSTGRES_URL (scripts/services.sh env)");
        let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
        let session = PgSession {
            sql: Statements::new(&SqlConfig::default().table, false),
        };
        let asked = Duration::from_micros(533_100);
        session.keep(&mut conn, asked).await.expect("keep");
        let bound = session.idle_bound(&mut conn).await.expect("read the bound");
        assert_eq!(bound, Duration::from_millis(534), "asked for {asked:?}");
    }

    /// A waiter's mark whose write lands after the wait's removal sent for
    /// good (a wait dropped while the mark was on its way on another
    /// connection) stays dead: it holds nobody back.
    #[tokio::test]
    async fn a_mark_landing_after_its_removal_for_good_stays_dead() {
        let url = std::env::var("DISTLOCK_TEST_POSTGRES_URL")
            .expect("DISTLOCK_TEST_POSTGRES_URL (scripts/services.sh env)");
        let pool = sqlx::PgPool::connect(&url).await.expect("connect");
        let t = SqlConfig::default().table;
        for ddl in super::rw::ddl(t.as_str()) {
            sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
                .execute(&pool)
                .await
                .expect("the marks' table");
        }
        let rw = super::rw::Statements::new(t.as_str());
        let name = format!("late-mark/{:016x}", rand::random::<u64>());
        let now = crate::rw::now_ms();
        rw.unmark(&pool, &name, "beef", true)
            .await
            .expect("removed for good");
        let mut conn = pool.acquire().await.expect("a connection");
        rw.mark(&mut conn, &name, "beef", now, now + 1500)
            .await
            .expect("the late mark");
        let (_, marks) = rw.state(&pool, &name, now).await.expect("state");
        assert_eq!(
            marks, 0,
            "a mark landing after its removal came back to life"
        );
    }
}
