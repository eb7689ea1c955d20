//! The session-lock engine of the Postgres and MySQL/MariaDB backends,
//! written once: a lock is held by a server session (a row lock in an open
//! transaction, or a session advisory lock), on a connection of its own
//! (pinned) or, when granted without waiting in advisory mode, on one of a
//! few shared sessions. The engine owns the connections (the warm pool,
//! the side connection for row-mode tokens, the shared sessions), the
//! request path (a free lock on a shared session; a wait on a pinned
//! connection, where the server keeps arrival order), the guard (its lease
//! confirmed after a wait, renewal or checking by the watchdog) and the
//! handle of a pinned lock. A [`Dialect`] is what differs: its statements,
//! its error classes and idle bounds, how it finds a holder.
//!
//! **The holder record** (identity, value, since: [`HolderRecord`]) is kept
//! with fencing on, beside the name's token in the counters, written by
//! the statement that draws the token (no round trip of its own); it
//! shows in `inspect` while the name is held. A grant's value is replaced
//! (an election's `proclaim`) by an update conditioned on the grant's
//! token, then confirmed by renewing the lock on its own session: the
//! value counts only if the lock was ours throughout ([`Recorded`]).
//!
//! Both ways of taking a lock are handed the caller's [`Request`], so the
//! wait's deadline is the one set when the acquisition began: time spent on
//! the shared session's attempt and on the pool's checkout counts against
//! the wait. A shared session's attempt never jumps the server's queue: the
//! server refuses it while anyone waits.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::raw::{
    DetachedRelease, GuardHandle, HolderRecord, Kind, LeaseState, PendingGrant, RawGuard, RawLock,
    Request, Unrenewed, Wakeups, Watchdog, confirmed_lease_start, validate_name,
};
use lock_core::{
    Access, Capabilities, Fencing, LockError, LockGuard, LockInfo, RwLockInfo, SemaphoreInfo, Wait,
};
use sqlx::pool::{PoolConnection, PoolOptions};
use sqlx::{ConnectOptions, Database, Pool};
use tokio::time::Instant;

use crate::config::{SqlConfig, SqlMode, SqlUrl};
use crate::error::map_sqlx;
use crate::held::{self, Pinned, Side, Warm};
use crate::ident::Identifier;
use crate::permits::{self, Found};
use crate::rw;
use crate::shared::{MAX_ATOMIC_SET, SessionSql, SharedSessions};

/// A lock granted on a connection of its own: the connection (holding the
/// lock), the grant's token (0 without fencing) and when it was asked for.
pub(crate) type Pinning<DB> = (Pinned<DB>, u64, Instant);

/// A name's latest grant as its counter shows it: the token and the
/// stored holder record (none from a table older than the record, or while
/// the grant's draw is being completed).
pub(crate) type LatestGrant = (u64, Option<Vec<u8>>);

/// What a SQL server's dialect gives the engine.
#[async_trait]
pub(crate) trait Dialect: Send + Sync + 'static {
    /// The sqlx database.
    type Db: Database;
    /// The statements of a shared session.
    type Session: SessionSql;

    /// The connections and settings the engine keeps for this dialect.
    fn core(&self) -> &Core<Self::Db, Self::Session>;

    /// What the backend proves in every mode; its `backend` names it in
    /// errors.
    const CAPABILITIES: Capabilities;

    /// The backend's capabilities in its mode ([`Self::CAPABILITIES`] by
    /// default); the engine sets `max_held` and `fencing` from the pool and
    /// the settings.
    fn capabilities(&self) -> Capabilities {
        Self::CAPABILITIES
    }

    /// Lock `req.name` on a connection of its own, waiting until the
    /// request's deadline (one attempt for [`Wait::No`]), storing the
    /// holder `record` with the token (fencing on; `None` otherwise);
    /// `None` if not granted by then.
    async fn lock(
        &self,
        req: Request<'_>,
        record: Option<&HolderRecord>,
    ) -> Result<Option<Pinning<Self::Db>>, LockError>;

    /// Give back the lock `name` held on `conn`: whether it was still ours.
    async fn unlock(
        &self,
        conn: &mut PoolConnection<Self::Db>,
        name: &str,
    ) -> Result<bool, sqlx::Error>;

    /// Touch `conn` (proving the session alive) and set its idle bound to
    /// `ttl`.
    async fn touch(
        &self,
        conn: &mut PoolConnection<Self::Db>,
        ttl: Duration,
    ) -> Result<(), sqlx::Error>;

    /// The token of `name`'s latest grant (the holder's while it is held)
    /// and the holder record stored with it, if any. Fencing is on.
    async fn latest_grant(&self, name: &str) -> Result<Option<LatestGrant>, LockError>;

    /// Replace the holder record of `name`'s grant `token`, if that is
    /// still the latest grant: whether it was. Fencing is on.
    async fn set_holder(&self, name: &str, token: u64, record: &[u8]) -> Result<bool, LockError>;

    /// The server's view of `name` (a valid name): held or free, and its
    /// waiters where the server shows them; the engine adds the token.
    async fn inspect(&self, name: &str) -> Result<LockInfo, LockError>;

    /// End the session holding `name` (a valid name): whether one did.
    async fn force_release(&self, name: &str) -> Result<bool, LockError>;

    /// Open a permit's transaction on `pinned`, with the server's idle
    /// bound `ttl`, and take the lowest free slot of semaphore `name`
    /// below `limit` (see [`crate::permits`]). The transaction stays open
    /// only when a slot is found.
    async fn take_slot(
        &self,
        pinned: &mut Pinned<Self::Db>,
        name: &str,
        limit: u32,
        ttl: Duration,
    ) -> Result<Result<Found, sqlx::Error>, LockError>;

    /// In a transaction of its own on `conn`: create semaphore `name`'s
    /// rows for `limit` where missing and set every row's limit to it,
    /// holding them all (`NOWAIT`). `false`, with nothing changed, when a
    /// row is held (a permit, or another client setting the limit now).
    async fn set_limit(
        &self,
        conn: &mut PoolConnection<Self::Db>,
        name: &str,
        limit: u32,
    ) -> Result<bool, sqlx::Error>;

    /// End a permit's transaction on `conn`, freeing its slot.
    async fn end_permit(&self, conn: &mut PoolConnection<Self::Db>) -> Result<(), sqlx::Error>;

    /// Touch a permit's connection (proving it alive) and set the server's
    /// idle bound of its transaction to `ttl`.
    async fn touch_permit(
        &self,
        conn: &mut PoolConnection<Self::Db>,
        ttl: Duration,
    ) -> Result<(), sqlx::Error>;

    /// The limit of semaphore `name`'s rows and the slots below it held
    /// now; `None` when it has no rows.
    async fn held_slots(&self, name: &str) -> Result<Option<(u32, Vec<u32>)>, LockError>;

    /// Draw the next token of counter `key` on the side connection,
    /// storing the holder `record` with it (fencing on).
    async fn draw_on_side(&self, key: &str, record: &[u8]) -> Result<u64, LockError>;

    /// Give back a permit's connection that holds nothing.
    async fn put_back_permit(&self, pinned: Pinned<Self::Db>);

    /// The error of a permit's statement: a missing permits table is a
    /// configuration error naming the statement that creates it.
    fn permit_error(&self, e: sqlx::Error) -> LockError;

    /// Open a reader-writer grant's transaction on `pinned`, with the
    /// server's idle bound `ttl`, and take `name`'s row (see
    /// [`crate::rw`]) for `access` without waiting; a reader arriving at
    /// `arrival` only when no live mark (at `now`, both ms by the client's
    /// clock) of a writer that arrived at or before it is there, a writer
    /// only when no live mark of a reader that arrived before it is. The
    /// transaction stays open only when the row is taken: `true`.
    async fn take_rw(
        &self,
        pinned: &mut Pinned<Self::Db>,
        name: &str,
        access: Access,
        (arrival, now): (i64, i64),
        ttl: Duration,
    ) -> Result<Result<bool, sqlx::Error>, LockError>;

    /// Put (or renew) waiter `id`'s mark on `name`: its arrival
    /// and its expiry, ms by the client's clock; on `pinned`, the
    /// connection its refused attempt used (no transaction open), so the
    /// mark takes no other connection.
    async fn mark_rw(
        &self,
        pinned: &mut Pinned<Self::Db>,
        name: &str,
        id: &str,
        arrival: i64,
        expires: i64,
    ) -> Result<(), LockError>;

    /// Remove waiter `id`'s mark on `name`; `for_good`, as a dead row
    /// that a mark still on its way cannot revive (a wait dropped while
    /// its mark may be in flight on another connection), which
    /// `remove_unused` clears.
    async fn unmark_rw(&self, name: &str, id: &str, for_good: bool) -> Result<(), LockError>;

    /// How `name`'s row is held now (probed without waiting: `None` when
    /// free) and how many live marks of waiting writers it has (at `now`).
    async fn rw_state(&self, name: &str, now: i64) -> Result<(Option<Access>, usize), LockError>;

    /// The error of a reader-writer statement: missing tables are a
    /// configuration error naming the statements that create them.
    fn rw_error(&self, e: sqlx::Error) -> LockError;
}

/// The connections and settings of a session-lock backend.
pub(crate) struct Core<DB: Database, S: SessionSql> {
    /// Connections for waits and for locks not on shared sessions.
    pub(crate) pool: Warm<DB>,
    /// Advances row-mode tokens while the lock's transaction stays open.
    pub(crate) side: Side<DB>,
    /// Advisory mode: the sessions carrying locks granted without waiting.
    pub(crate) shared: SharedSessions<S>,
    pub(crate) mode: SqlMode,
    pub(crate) table: Identifier,
    /// The server, safe to show.
    pub(crate) display: String,
    /// Wakes this process's waiters for a permit when one is given back.
    pub(crate) wakeups: Wakeups,
    /// Off (`fencing=false`): no token is drawn, and grants carry none.
    pub(crate) fencing: bool,
}

impl<DB: Database, S: SessionSql<Conn = DB::Connection>> Core<DB, S> {
    /// The engine's state on `pool`, with shared sessions of `session`
    /// (advisory mode only) and a side connection, all opened with
    /// `options`.
    pub(crate) fn new(
        backend: &'static str,
        pool: Pool<DB>,
        options: <DB::Connection as sqlx::Connection>::Options,
        session: S,
        config: SqlConfig,
        display: String,
    ) -> Self {
        let limit = pool.options().get_max_connections() as usize;
        let sessions = match config.mode {
            SqlMode::Advisory => config.sessions,
            SqlMode::Row => 0,
        };
        Core {
            pool: Warm::new(pool, limit),
            shared: SharedSessions::new(backend, session, options.clone(), sessions),
            side: Side::new(options),
            mode: config.mode,
            table: config.table,
            display,
            fencing: config.fencing,
            wakeups: Wakeups::new(),
        }
    }
}

/// The client's connect options from a parsed URL's client part. A
/// waiting acquisition is a slow statement by design: sqlx's statement log
/// (a warning for every wait over a second) is off; distlock's own tracing
/// reports lock events.
pub(crate) fn client_options<DB: Database>(
    backend: &'static str,
    parsed: &SqlUrl,
) -> Result<<DB::Connection as sqlx::Connection>::Options, LockError> {
    <DB::Connection as sqlx::Connection>::Options::from_str(&parsed.client_url)
        .map(ConnectOptions::disable_statement_logging)
        .map_err(|e| LockError::InvalidUrl {
            url: parsed.display.clone(),
            reason: format!("rejected by the {backend} client: {e}"),
        })
}

/// The connect options of an application's pool, for the connections the
/// lock opens itself (shared sessions, the side connection), with sqlx's
/// statement log off as in [`client_options`].
pub(crate) fn options_of_pool<DB: Database>(
    pool: &Pool<DB>,
) -> <DB::Connection as sqlx::Connection>::Options {
    (*pool.connect_options())
        .clone()
        .disable_statement_logging()
}

/// How a lock on an application's pool shows its server.
pub(crate) fn app_pool(backend: &str) -> String {
    format!("{backend} (the application's pool)")
}

/// The pool of a URL's client: its size and connect timeout from the URL;
/// connections are not pinged before use (a dead one fails its first
/// statement and is replaced).
pub(crate) async fn connect_pool<DB: Database>(
    backend: &'static str,
    parsed: &SqlUrl,
    options: <DB::Connection as sqlx::Connection>::Options,
) -> Result<Pool<DB>, LockError> {
    let doing = format!("connecting to {}", parsed.display);
    // One connection first, on its own: sqlx's pool tries a refused
    // connection again until its timeout and then reports only that, and
    // the pool's first connection should meet a server known to answer.
    let first = tokio::time::timeout(
        parsed.connect_timeout,
        sqlx::ConnectOptions::connect(&options),
    )
    .await
    .map_err(|_| LockError::Unavailable {
        backend,
        reason: format!(
            "{doing}: no answer within the connect timeout ({:?})",
            parsed.connect_timeout
        ),
        source: None,
    })?
    .map_err(|e| refused_to_connect(backend, parsed, &doing, e))?;
    // Closed, not dropped, so the server logs no lost client; the pool
    // connects anew.
    if let Err(e) = sqlx::Connection::close(first).await {
        tracing::debug!(target: "distlock", backend, error = %e, "closing the first connection");
    }
    PoolOptions::<DB>::new()
        .max_connections(parsed.max_connections)
        .acquire_timeout(parsed.connect_timeout)
        .test_before_acquire(false)
        .connect_with(options)
        .await
        .map_err(|e| map_sqlx(backend, &doing, e))
}

/// A failed first connection as the caller can act on it: credentials or
/// a database the server refuses (SQLSTATE class 28, or 3D000) are the
/// URL's to fix, and say so; the rest as [`map_sqlx`] sorts it.
fn refused_to_connect(
    backend: &'static str,
    parsed: &SqlUrl,
    doing: &str,
    e: sqlx::Error,
) -> LockError {
    match &e {
        sqlx::Error::Database(db)
            if db
                .code()
                .is_some_and(|c| c.starts_with("28") || c == "3D000") =>
        {
            LockError::InvalidUrl {
                url: parsed.display.clone(),
                reason: format!(
                    "the server refused the connection: {} (check the user, password and database)",
                    db.message()
                ),
            }
        }
        _ => map_sqlx(backend, doing, e),
    }
}

/// A dialect's schema, as [`prepare_schema`] sets it up.
pub(crate) struct Schema<'a> {
    /// The statements that create the tables (all `IF NOT EXISTS`).
    pub(crate) ddl: Vec<String>,
    /// The statements that bring an earlier version's tables up to date.
    pub(crate) upgrade: Vec<String>,
    /// The tables checked besides the four every dialect has: suffixes of
    /// the lock table's name.
    pub(crate) more_tables: &'a [&'a str],
    /// The public function that returns `ddl`, named in errors.
    pub(crate) ddl_fn: &'a str,
}

/// The lock's tables on `pool`, as `config` says: created from `ddl` (its
/// statements all `IF NOT EXISTS`) unless `create_schema` is off, then
/// checked (with `create_schema`, one query first finds every table
/// there and skips the statements); tables of an earlier version that
/// fail the check are brought
/// up to date by `upgrade` (statements that fail harmlessly where another
/// client did it first) and checked again. With fencing, the tables
/// checked are the lock table, `_epoch`, `_run`, `_counters` and those of
/// `more_tables` (suffixes of the lock table's name). Tables or columns that are missing (`missing` tells the
/// server's error) are a configuration error naming the statements (`ddl_fn`, the public
/// function that returns them) and why creating them failed, if it did.
pub(crate) async fn prepare_schema<DB: Database>(
    backend: &'static str,
    pool: &Pool<DB>,
    config: &SqlConfig,
    schema: Schema<'_>,
    missing: impl Fn(&sqlx::Error) -> bool,
) -> Result<(), LockError>
where
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments: sqlx::IntoArguments<DB>,
{
    let Schema {
        ddl,
        upgrade,
        more_tables,
        ddl_fn,
    } = schema;
    let t = config.table.as_str();
    let more: String = more_tables
        .iter()
        .map(|suffix| format!(", {t}{suffix}"))
        .collect();
    // The usual case, every table there from an earlier start: one query
    // (it fails where a table or column is missing, and finds no row
    // without the epoch's), not a round trip per statement.
    if config.create_schema {
        let complete = format!(
            "SELECT id FROM {t}_epoch WHERE id = 1 AND NOT EXISTS (SELECT 1 FROM {t}, {t}_run, \
             {t}_counters, {t}_permits, {t}_rw, {t}_rw_marks{more} WHERE {t}_counters.holder IS NULL LIMIT 0)"
        );
        if let Ok(Some(_)) = sqlx::query(sqlx::AssertSqlSafe(complete))
            .fetch_optional(pool)
            .await
        {
            return Ok(());
        }
    }
    let mut failed_ddl = None;
    let mut run = async |statements: &[String]| {
        for statement in statements {
            if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(statement.clone()))
                .execute(pool)
                .await
            {
                // Two clients creating the tables at once may race; the
                // loser's error is harmless if the tables are there now.
                tracing::debug!(target: "distlock", backend, error = %e, "creating the lock's tables");
                failed_ddl.get_or_insert(e);
            }
        }
    };
    if config.create_schema {
        run(&ddl).await;
    }
    // With fencing, the counters' holder column too.
    let check = match config.fencing {
        true => format!(
            "SELECT 1 FROM {t}, {t}_epoch, {t}_run, {t}_counters{more} WHERE {t}_counters.holder IS NULL LIMIT 0"
        ),
        false => format!("SELECT 1 FROM {t} LIMIT 0"),
    };
    let check_now = async || {
        sqlx::query(sqlx::AssertSqlSafe(check.as_str()))
            .execute(pool)
            .await
    };
    let mut check = check_now().await;
    // Tables of an earlier version are brought up to date only when they
    // need it: an `ALTER TABLE` waits for every statement on the table (a
    // waiting lock statement among them) and holds up those after it.
    if config.create_schema
        && let Err(e) = &check
        && missing(e)
    {
        run(&upgrade).await;
        check = check_now().await;
    }
    match check {
        Ok(_) => Ok(()),
        Err(e) if missing(&e) => {
            let why = match (&failed_ddl, config.create_schema) {
                (Some(created), _) => format!("creating them failed: {created}"),
                (None, false) => "create_schema is off".to_string(),
                (None, true) => "they were created, then dropped".to_string(),
            };
            Err(LockError::invalid_options(format!(
                "the lock's tables are missing or out of date ({e}; {why}): create them with the statements \
                 of {ddl_fn}: {}; or bring tables of an earlier version up to date with: {}",
                ddl.join("; "),
                upgrade.join("; ")
            )))
        }
        Err(e) => Err(map_sqlx(backend, "checking the lock's tables", e)),
    }
}

/// Locks held by the sessions of a SQL server, in the dialect `D`: see
/// [`PgLock`](crate::PgLock) and [`MySqlLock`](crate::MySqlLock), its two
/// instances, for their URLs and modes.
///
/// **On an application's pool** (`with_pool`: its own credentials, TLS and
/// connection settings), row locks and waiting acquisitions take
/// connections from the pool and keep them while they hold or wait (so
/// size the pool for them: `capabilities().max_held` is its size in row
/// mode); advisory locks granted without waiting go on `config.sessions`
/// connections of the lock's own, opened with the pool's connect options,
/// as do fencing tokens drawn in row mode.
pub struct SqlLock<D> {
    dialect: Arc<D>,
    watchdog: Watchdog,
}

impl<D> Clone for SqlLock<D> {
    fn clone(&self) -> Self {
        SqlLock {
            dialect: Arc::clone(&self.dialect),
            watchdog: self.watchdog.clone(),
        }
    }
}

impl<D> SqlLock<D> {
    pub(crate) fn new(dialect: D) -> Self {
        SqlLock {
            dialect: Arc::new(dialect),
            watchdog: Watchdog::new(),
        }
    }

    /// The dialect, with its connections.
    pub(crate) fn dialect(&self) -> &D {
        &self.dialect
    }

    /// The dialect, shared.
    pub(crate) fn dialect_arc(&self) -> &Arc<D> {
        &self.dialect
    }
}

/// One attempt on a shared session (advisory mode).
async fn on_shared<D: Dialect>(
    lock: &SqlLock<D>,
    req: Request<'_>,
) -> Result<Option<LockGuard>, LockError> {
    let sent_at = Instant::now();
    let core = lock.dialect.core();
    let record = holder_record(core, req);
    let bytes = record.as_ref().map_or(&[][..], HolderRecord::as_bytes);
    match core.shared.try_lock(req.name, bytes, req.opts.ttl).await? {
        Some((handle, token)) => guard(
            lock,
            req,
            handle,
            (token, sent_at),
            record,
            Kept::lock(req.name),
        )
        .await
        .map(Some),
        None => Ok(None),
    }
}

/// One attempt at a set of locks on a shared session (advisory mode), all
/// or none in one request ([`SharedSessions::try_lock_set`]).
async fn on_shared_set<D: Dialect>(
    lock: &SqlLock<D>,
    reqs: &[Request<'_>],
) -> Result<Option<Vec<LockGuard>>, LockError> {
    let Some(&first) = reqs.first() else {
        return Ok(Some(Vec::new()));
    };
    let sent_at = Instant::now();
    let core = lock.dialect.core();
    let record = holder_record(core, first);
    let bytes = record.as_ref().map_or(&[][..], HolderRecord::as_bytes);
    let names: Vec<&str> = reqs.iter().map(|r| r.name).collect();
    let Some(granted) = core
        .shared
        .try_lock_set(&names, bytes, first.opts.ttl)
        .await?
    else {
        return Ok(None);
    };
    // Each member is given back if this future ends (an error, or the
    // caller's cancellation) before its guard is made: the guards made by
    // then release their members as they drop.
    let granted: Vec<(PendingGrant, u64)> = granted
        .into_iter()
        .map(|(handle, token)| (PendingGrant::new(handle), token))
        .collect();
    let mut guards = Vec::with_capacity(granted.len());
    for (&req, (pending, token)) in reqs.iter().zip(granted) {
        let made = guard(
            lock,
            req,
            pending.disarm(),
            (token, sent_at),
            record.clone(),
            Kept::lock(req.name),
        )
        .await?;
        guards.push(made);
    }
    Ok(Some(guards))
}

/// On a connection of its own, waiting until `req`'s deadline (a single
/// attempt for [`Wait::No`]).
async fn on_pinned<D: Dialect>(
    lock: &SqlLock<D>,
    req: Request<'_>,
) -> Result<Option<LockGuard>, LockError> {
    let record = holder_record(lock.dialect.core(), req);
    let Some((pinned, token, sent_at)) = lock.dialect.lock(req, record.as_ref()).await? else {
        return Ok(None);
    };
    let handle = Arc::new(SqlHandle {
        dialect: Arc::clone(&lock.dialect),
        name: req.name.to_string(),
        conn: tokio::sync::Mutex::new(pinned),
    });
    guard(
        lock,
        req,
        handle,
        (token, sent_at),
        record,
        Kept::lock(req.name),
    )
    .await
    .map(Some)
}

/// The holder record a grant of `req` stores, made once per request: with
/// fencing on only (it lives beside the token).
pub(crate) fn holder_record<DB: Database, S: SessionSql>(
    core: &Core<DB, S>,
    req: Request<'_>,
) -> Option<HolderRecord> {
    core.fencing.then(|| req.opts.holder_record())
}

/// Where a grant's token and holder record are kept, and the slot it
/// holds: a lock's under its name; a permit's under its slot's counter
/// ([`permits::counter_key`]).
pub(crate) struct Kept<'a> {
    /// The name of the counter the grant drew its token from.
    pub(crate) counter: &'a str,
    /// A permit's slot; `None` for a lock.
    pub(crate) slot: Option<u32>,
}

impl<'a> Kept<'a> {
    /// A lock's: under its own name.
    pub(crate) fn lock(name: &'a str) -> Self {
        Kept {
            counter: name,
            slot: None,
        }
    }
}

/// Wrap a grant in a guard. The server's idle timeout counts from the end
/// of the granting statement, so a grant that waited is confirmed by one
/// more statement before its lease is counted. Unrenewed, the lock is
/// still checked: it ends with its connection (a server crash), which the
/// holder must learn of before its deadline.
pub(crate) async fn guard<D: Dialect>(
    lock: &SqlLock<D>,
    req: Request<'_>,
    handle: Arc<dyn GuardHandle>,
    (token, sent_at): (u64, Instant),
    record: Option<HolderRecord>,
    kept: Kept<'_>,
) -> Result<LockGuard, LockError> {
    let (name, opts) = (req.name, req.opts);
    let fencing = lock.dialect.core().fencing;
    let handle: Arc<dyn GuardHandle> = match record {
        Some(record) => Arc::new(Recorded {
            inner: handle,
            dialect: Arc::clone(&lock.dialect),
            counter: kept.counter.to_string(),
            token,
            record,
            ttl: Mutex::new(opts.ttl),
        }),
        None => handle,
    };
    let pending = PendingGrant::new(handle);
    let start =
        confirmed_lease_start(&pending, sent_at, opts.ttl, D::CAPABILITIES.backend, name).await?;
    let lease = Arc::new(LeaseState::granted(start, opts));
    let token = fencing.then_some(token);
    let guard = LockGuard::new(
        name,
        token,
        lock.raw_capabilities(),
        lease,
        pending.disarm(),
    )
    .with_slot(kept.slot);
    Ok(guard.kept_by(&lock.watchdog, opts, Unrenewed::Watched))
}

#[async_trait]
impl<D: Dialect> RawLock for SqlLock<D> {
    /// One attempt, without waiting: on a shared session when sessions are
    /// shared, else on a connection of its own.
    async fn attempt_once(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        // The reader-writer and permit attempts are boxed: their futures
        // are several times a lock's, and this future (boxed by the trait,
        // so copied whole into its box on every call) is as large as its
        // largest branch.
        match req.kind() {
            Kind::Rw(access) => {
                return Box::pin(rw::attempt(
                    self,
                    req,
                    access,
                    lock_core::raw::Arrival::now(),
                    None,
                ))
                .await?
                .into_guard();
            }
            Kind::Permit(limit) => {
                return Box::pin(permits::attempt(self, req, limit))
                    .await?
                    .into_guard();
            }
            Kind::Lock => {}
        }
        let opts = req.opts.clone().wait(Wait::No);
        let once = Request {
            opts: &opts,
            deadline: Some(req.start),
            ..req
        };
        if self.dialect.core().shared.enabled() {
            on_shared(self, once).await
        } else {
            on_pinned(self, once).await
        }
    }

    /// The whole set in one statement on a shared session (advisory mode
    /// with shared sessions: [`Capabilities::atomic_sets`] says so).
    async fn attempt_set_once(
        &self,
        reqs: &[Request<'_>],
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        if !self.dialect.core().shared.enabled() {
            return Err(LockError::Unsupported {
                backend: D::CAPABILITIES.backend,
                operation: "atomic lock sets in row mode",
            });
        }
        on_shared_set(self, reqs).await
    }

    /// Free now: taken on a shared session. Held: waited for on a
    /// connection of its own.
    async fn wait(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        // Boxed, as in `attempt_once`.
        match req.kind() {
            Kind::Rw(access) => return Box::pin(rw::wait(self, req, access)).await,
            Kind::Permit(limit) => return Box::pin(permits::wait(self, req, limit)).await,
            Kind::Lock => {}
        }
        if self.dialect.core().shared.enabled()
            && let Some(guard) = on_shared(self, req).await?
        {
            return Ok(Some(guard));
        }
        on_pinned(self, req).await
    }

    fn raw_capabilities(&self) -> Capabilities {
        let core = self.dialect.core();
        let caps = self.dialect.capabilities();
        caps
            // Locks on shared sessions are bounded by the server's lock
            // table only.
            .with_max_held((!core.shared.enabled()).then(|| core.pool.limit()))
            .with_fencing(if core.fencing {
                caps.fencing
            } else {
                Fencing::None
            })
            // The holder record lives beside the token.
            .with_holder(core.fencing)
            // A set in one statement on a shared session.
            .with_atomic_sets(if core.shared.enabled() {
                MAX_ATOMIC_SET
            } else {
                0
            })
            .with_semaphore(Some(permits::SEMAPHORE))
            .with_rw_lock(Some(rw::RW))
    }

    async fn raw_inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        validate_name(name)?;
        let info = self.dialect.inspect(name).await?;
        if !info.held || !self.dialect.core().fencing {
            return Ok(info);
        }
        let Some((token, record)) = self.dialect.latest_grant(name).await? else {
            return Ok(info);
        };
        let holder = record
            .filter(|r| !r.is_empty())
            .map(|r| HolderRecord::decode_for(D::CAPABILITIES.backend, name, &r))
            .transpose()?;
        Ok(info.with_fencing_token(Some(token)).with_holder(holder))
    }

    /// The name's row probed, the latest write's token and the waiting
    /// writers' marks (see [`crate::rw`]).
    async fn raw_inspect_rw(&self, name: &str) -> Result<RwLockInfo, LockError> {
        rw::inspect(self, name).await
    }

    /// The slots whose rows are locked (see [`crate::permits`]).
    async fn raw_inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        validate_name(name)?;
        permits::inspect(self, name).await
    }

    async fn raw_force_release(&self, name: &str) -> Result<bool, LockError> {
        validate_name(name)?;
        self.dialect.force_release(name).await
    }
}

impl<D: Dialect> fmt::Debug for SqlLock<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let core = self.dialect.core();
        f.debug_struct("SqlLock")
            .field("backend", &D::CAPABILITIES.backend)
            .field("server", &core.display)
            .field("mode", &core.mode)
            .field("table", &core.table.as_str())
            .finish_non_exhaustive()
    }
}

/// A lock held on a connection of its own: inside the lock's transaction
/// (row mode) or holding the advisory lock.
struct SqlHandle<D: Dialect> {
    dialect: Arc<D>,
    name: String,
    conn: tokio::sync::Mutex<Pinned<D::Db>>,
}

#[async_trait]
impl<D: Dialect> GuardHandle for SqlHandle<D> {
    async fn release(&self) -> Result<bool, LockError> {
        held::release(&self.conn, &self.name, async |conn| {
            self.dialect.unlock(conn, &self.name).await
        })
        .await
    }

    /// Touch the connection (resetting the server's idle timeout) and set
    /// the timeout to `ttl`. `false` if the connection (and so the lock) is
    /// gone.
    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        held::touch(&self.conn, &self.name, async |conn| {
            self.dialect.touch(conn, ttl).await
        })
        .await
    }
}

/// A grant's handle with its holder record (fencing on): releases and
/// renewals go to the lock's own handle; `set_value` rewrites the record
/// by the grant's token, then renews the lock on its session, so a value
/// is reported set only if the lock was ours from the grant through the
/// write.
struct Recorded<D: Dialect> {
    inner: Arc<dyn GuardHandle>,
    dialect: Arc<D>,
    /// The counter the grant's token and record are kept under.
    counter: String,
    token: u64,
    record: HolderRecord,
    /// The lease of the latest renewal: the confirmation renews with it, so
    /// the server's bound never falls below the client's deadline.
    ttl: Mutex<Duration>,
}

#[async_trait]
impl<D: Dialect> GuardHandle for Recorded<D> {
    async fn release(&self) -> Result<bool, LockError> {
        self.inner.release().await
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        *self.ttl.lock().unwrap_or_else(|e| e.into_inner()) = ttl;
        self.inner.extend(ttl).await
    }

    async fn set_value(&self, value: &[u8]) -> Result<bool, LockError> {
        let record = self.record.with_value(value);
        let written = self
            .dialect
            .set_holder(&self.counter, self.token, record.as_bytes())
            .await?;
        if !written {
            return Ok(false);
        }
        let ttl = *self.ttl.lock().unwrap_or_else(|e| e.into_inner());
        self.inner.extend(ttl).await
    }

    fn detached_release(&self) -> Option<DetachedRelease> {
        self.inner.detached_release()
    }
}
