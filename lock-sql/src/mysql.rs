//! MySQL 8 and MariaDB ≥ 10.6: row locks (`SELECT … FOR UPDATE` in a
//! transaction held open on a connection of its own) or `GET_LOCK`
//! advisory locks, with fencing tokens from per-name counters.
//!
//! **Row mode** (default): the lock table has one row per name
//! (`VARBINARY`, so names compare byte for byte, never by collation),
//! inserted the first time a name is used. Acquiring starts a transaction
//! with `innodb_lock_wait_timeout` from the wait (whole seconds; a wait
//! shorter than a second, or its last fraction, is done with `NOWAIT`
//! attempts and backoff) and locks the row. Releasing rolls back.
//! MariaDB's `idle_transaction_timeout` (whole seconds, from the TTL)
//! bounds a hung holder; the watchdog touches the connection every TTL/3.
//!
//! **Advisory mode** (`mode=advisory`): `GET_LOCK` on a name derived from
//! the lock name (`dl:` and 61 hex digits of its SHA-256, computed by the
//! client and sent as a bind parameter: the 64-character limit never
//! truncates two names into one; see [`advisory_key`]). A hung holder is
//! bounded by the session's `wait_timeout`. A lock granted without
//! waiting is taken on one of a few long-lived sessions shared by the
//! client's locks (`sessions`, default 2), so a client can hold
//! thousands; an acquisition that has to wait does so on a pooled
//! connection of its own (see the `shared` module).
//!
//! **Fencing tokens**: a per-name counter in the `MEMORY` table
//! `TABLE_counters`, advanced after the grant by one statement (`INSERT …
//! ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1)`): only the
//! holder advances its name's counter, so tokens strictly increase. The
//! counters count in an epoch that is durable and advanced after each
//! restart of the server (which empties `MEMORY` tables), so tokens keep
//! increasing across crashes and restarts without a flush per grant; see
//! the `tokens` module. Advisory mode advances the counter on the lock's
//! own connection; row mode, whose lock is an open transaction, on
//! another pooled connection.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::raw::{HolderRecord, Request};
use lock_core::{
    Access, Backoff, Capabilities, CrashRelease, Fencing, Grade, LockError, LockInfo, Waiting,
};
use sqlx::mysql::MySqlConnectOptions;
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, MySql};
use tokio::time::Instant;

use crate::config::{SqlConfig, SqlMode, SqlUrl};
use crate::engine::{self, Core, Dialect, LatestGrant, Pinning, SqlLock};
use crate::error::map_sqlx;
use crate::held::{Bounds, DeadBudget, Pinned};
use crate::permits::Found;
use crate::shared::{SessionSql, Tried, TriedSet};

mod permits;
mod rw;
mod tokens;

const BACKEND: &str = "mysql";

/// ER_LOCK_WAIT_TIMEOUT (also NOWAIT on MariaDB), ER_LOCK_NOWAIT (MySQL 8),
/// ER_LOCK_DEADLOCK.
const NOT_GRANTED: [u16; 3] = [1205, 3572, 1213];

/// InnoDB's longest lock wait, for "forever".
const FOREVER_SECS: u64 = 1_073_741_824;

const CAPABILITIES: Capabilities = Capabilities::new(BACKEND, Grade::Correctness)
    .with_fencing(Fencing::Safe)
    .with_crash_release(CrashRelease::Connection)
    .with_depends_on_clocks(false)
    .with_waiting(Waiting::Notified)
    .with_max_ttl(Duration::from_secs(24 * 3600))
    // Server-side timeouts are whole seconds.
    .with_min_lease(Duration::from_secs(1))
    // Set by the client from its pool size.
    .with_max_held(None);

/// Locks on MySQL 8 or MariaDB ≥ 10.6: row locks (default) or `GET_LOCK`.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{DistributedLock, LockOptions};
/// let locks = lock_sql::MySqlLock::connect("mysql://app:secret@db/app?table=app_locks").await?;
/// let guard = locks.acquire("invoice-run", &LockOptions::new()).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub type MySqlLock = SqlLock<MySqlDialect>;

/// The MySQL/MariaDB dialect of [`SqlLock`]: its statements and
/// connections.
pub struct MySqlDialect {
    core: Core<MySql, MySqlSession>,
    /// The session variable that ends a hung holder's transaction:
    /// MariaDB's `idle_transaction_timeout`, or MySQL's `wait_timeout`.
    idle_var: &'static str,
    /// The variable whose unscoped assignment (`@@name`) sets the next
    /// transaction's isolation level: MariaDB's `tx_isolation`, or MySQL's
    /// `transaction_isolation`.
    isolation_var: &'static str,
    /// Advances a name's token counter.
    tokens: Arc<TokenCounter>,
    /// On the application's pool: the statement that sets back what the
    /// lock changed in a session before its connection is put back.
    restore: Option<String>,
    /// The same for a permit's connection (whose transaction opens as a
    /// row lock's, in either mode).
    restore_permit: Option<String>,
    /// The semaphores' statements.
    permits: permits::Statements,
    /// The reader-writer locks' statements.
    rw: rw::Statements,
}

impl MySqlDialect {
    /// Put a clean connection back, first setting back the session
    /// variables the lock changed if the pool is the application's; a
    /// connection that fails that is closed.
    async fn put_back(&self, mut pinned: Pinned<MySql>) {
        if let Some(restore) = &self.restore {
            let Ok(conn) = pinned.conn(BACKEND) else {
                return;
            };
            if let Err(e) = sqlx::raw_sql(AssertSqlSafe(restore.as_str()))
                .execute(&mut **conn)
                .await
            {
                tracing::debug!(target: "distlock", backend = BACKEND, error = %e, "setting a session back failed");
                pinned.close();
                return;
            }
        }
        pinned.put_back();
    }
}

/// The per-name fencing-token counters, shared by the client's own
/// connections and its shared sessions.
struct TokenCounter {
    sql: tokens::Statements,
    /// Off (`fencing=false`): no token is drawn, and grants carry none.
    enabled: bool,
}

impl TokenCounter {
    /// Draw `name`'s next token on `conn`, with the holder `record`; only
    /// a holder of `name` calls this.
    async fn advance(
        &self,
        conn: &mut sqlx::MySqlConnection,
        name: &str,
        record: &[u8],
    ) -> Result<u64, sqlx::Error> {
        if !self.enabled {
            return Ok(0);
        }
        self.sql.draw(conn, name, record).await
    }
}

fn secs_ceil(d: Duration) -> u64 {
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
}

/// How long `force_release` looks for the connection holding a row lock
/// (queued behind it, asking the server who blocks it).
const HOLDER_SEARCH: Duration = Duration::from_secs(8);

/// How often a holder search reads InnoDB's lock tables (see `row_holder`):
/// well above the 100 ms without readers after which InnoDB renews them.
const LOCK_TABLES_SLOT: Duration = Duration::from_millis(500);

pub(crate) fn not_granted(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|e| NOT_GRANTED.contains(&e.number())),
        _ => false,
    }
}

impl SqlLock<MySqlDialect> {
    /// Connect to `mysql://user:pass@host[:port]/db` (or `mariadb://`) with
    /// options `table` (default `distlock_locks`), `mode=row|advisory`,
    /// `max_connections` (default 32; each waiter, and each held lock but
    /// those on shared sessions, uses one), `sessions` (advisory mode: the
    /// shared sessions, default 2; 0 puts every lock on a connection of its
    /// own), `connect_timeout_ms` and `fencing` (`false`: no fencing tokens,
    /// and no token write per grant; see [`SqlConfig::fencing`]), plus
    /// sqlx's own (`ssl-mode`, …).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let mut parsed = SqlUrl::parse(url, &["mysql", "mariadb"])?;
        if let Some(rest) = parsed.client_url.strip_prefix("mariadb://") {
            parsed.client_url = format!("mysql://{rest}");
        }
        let options = engine::client_options::<MySql>(BACKEND, &parsed)?;
        let pool = engine::connect_pool(BACKEND, &parsed, options.clone()).await?;
        Self::from_pool(pool, options, parsed.config(), parsed.display, false).await
    }

    /// A lock on a pool the application already has, with `config` in
    /// place of a URL's options: `MySqlLock::with_pool(pool, SqlConfig::default())`.
    /// See [`SqlLock`] for how it uses the pool. The lock sets
    /// `innodb_lock_wait_timeout`,
    /// the idle bound (`idle_transaction_timeout` on MariaDB, `wait_timeout`)
    /// on the connections it uses and sets them back to the server's
    /// defaults before a connection leaves it; the pool's slow-statement
    /// log, if on, reports long lock waits. Invalid settings are
    /// [`LockError::InvalidOptions`].
    pub async fn with_pool(pool: sqlx::MySqlPool, config: SqlConfig) -> Result<Self, LockError> {
        config.validate()?;
        let options = engine::options_of_pool(&pool);
        Self::from_pool(pool, options, config, engine::app_pool(BACKEND), true).await
    }

    async fn from_pool(
        pool: sqlx::MySqlPool,
        options: MySqlConnectOptions,
        config: SqlConfig,
        display: String,
        restore_sessions: bool,
    ) -> Result<Self, LockError> {
        let no_such_table = |e: &sqlx::Error| match e {
            sqlx::Error::Database(db) => db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|e| matches!(e.number(), NO_SUCH_TABLE | BAD_FIELD)),
            _ => false,
        };
        engine::prepare_schema(
            BACKEND,
            &pool,
            &config,
            engine::Schema {
                ddl: Self::ddl(&config),
                upgrade: tokens::upgrade(config.table.as_str()),
                more_tables: &["_holders"],
                ddl_fn: "MySqlLock::ddl",
            },
            no_such_table,
        )
        .await?;
        let t = config.table.as_str().to_string();
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&pool)
            .await
            .map_err(|e| map_sqlx(BACKEND, "reading the server version", e))?;
        let mariadb = version.contains("MariaDB");
        let (idle_var, isolation_var) = if mariadb {
            ("idle_transaction_timeout", "tx_isolation")
        } else {
            ("wait_timeout", "transaction_isolation")
        };
        let tokens = Arc::new(TokenCounter {
            sql: tokens::Statements::new(&t),
            enabled: config.fencing,
        });
        let session = MySqlSession {
            tokens: Arc::clone(&tokens),
        };
        let restore_row =
            format!("SET SESSION innodb_lock_wait_timeout = DEFAULT, SESSION {idle_var} = DEFAULT");
        let restore = restore_sessions.then(|| match config.mode {
            SqlMode::Row => restore_row.clone(),
            SqlMode::Advisory => "SET SESSION wait_timeout = DEFAULT".to_string(),
        });
        let restore_permit = restore_sessions.then_some(restore_row);
        Ok(SqlLock::new(MySqlDialect {
            core: Core::new(BACKEND, pool, options, session, config, display),
            tokens,
            idle_var,
            isolation_var,
            restore,
            restore_permit,
            permits: permits::Statements::new(&t),
            rw: rw::Statements::new(&t, mariadb),
        }))
    }
}

impl SqlLock<MySqlDialect> {
    /// The statements that create the lock's tables for `config` (run at
    /// start-up unless [`SqlConfig::create_schema`] is off; all are `IF NOT
    /// EXISTS` or `INSERT IGNORE`): the lock table (a row per name, for row
    /// mode), the durable epoch of the fencing tokens (InnoDB), the
    /// `MEMORY` tables of the counters (with short holder records) and the
    /// epoch they count in, and the holder records too long for the
    /// counters' row (InnoDB); last, the table of the semaphores' permits
    /// (InnoDB, rows per name and slot) and the two tables of the
    /// reader-writer locks (InnoDB: a row per name, the waiting writers'
    /// marks), which the start-up checks do not ask for: without them
    /// every lock works, and a request for a permit or a reader-writer
    /// grant is refused with `InvalidOptions` naming the statements. The
    /// lock's account needs `SELECT`, `INSERT`, `UPDATE` and `DELETE` on
    /// the eight tables.
    ///
    /// ```
    /// let ddl = lock_sql::MySqlLock::ddl(&lock_sql::SqlConfig::default());
    /// assert!(ddl[0].starts_with("CREATE TABLE IF NOT EXISTS distlock_locks "));
    /// ```
    pub fn ddl(config: &SqlConfig) -> Vec<String> {
        let t = config.table.as_str();
        let mut ddl = vec![format!(
            "CREATE TABLE IF NOT EXISTS {t} (name VARBINARY(1024) PRIMARY KEY) ENGINE=InnoDB"
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
    /// the counters count in is advanced first (one flushed commit), so a
    /// removed name's next token is above its last. Run it now and then
    /// (daily, say) from one client.
    pub async fn remove_unused(&self, unused_for: Duration) -> Result<u64, LockError> {
        let dialect = self.dialect();
        let t = dialect.core.table.as_str();
        let micros = u64::try_from(unused_for.as_micros()).unwrap_or(u64::MAX);
        let failed = |e| map_sqlx(BACKEND, "removing unused names", e);
        let pool = dialect.core.pool.pool();
        let mut conn = pool.acquire().await.map_err(failed)?;
        let stale: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {t}_counters WHERE used_at < NOW(6) - INTERVAL ? MICROSECOND"
        )))
        .bind(micros)
        .fetch_one(&mut *conn)
        .await
        .map_err(failed)?;
        let mut removed = 0;
        if stale > 0 {
            // The counters are MEMORY tables, read as they are now (no
            // snapshot): once the new epoch is recorded, a name drawn after
            // its counter is gone starts above it.
            dialect
                .tokens
                .sql
                .advance(&mut conn)
                .await
                .map_err(failed)?;
            removed = sqlx::query(AssertSqlSafe(format!(
                "DELETE FROM {t}_counters WHERE used_at < NOW(6) - INTERVAL ? MICROSECOND"
            )))
            .bind(micros)
            .execute(&mut *conn)
            .await
            .map_err(failed)?
            .rows_affected();
        }
        // Long holder records of grants that are no longer any name's
        // latest (a removed name's, or one replaced since).
        sqlx::query(AssertSqlSafe(format!(
            "DELETE h FROM {t}_holders h LEFT JOIN {t}_counters c \
             ON c.name = h.name AND c.token = h.token WHERE c.name IS NULL"
        )))
        .execute(&mut *conn)
        .await
        .map_err(failed)?;
        let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(failed)?;
        let names: Vec<Vec<u8>> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT name FROM {t} WHERE name NOT IN (SELECT name FROM {t}_counters) \
             FOR UPDATE SKIP LOCKED"
        )))
        .fetch_all(&mut *tx)
        .await
        .map_err(failed)?;
        for name in names {
            sqlx::query(AssertSqlSafe(format!("DELETE FROM {t} WHERE name = ?")))
                .bind(name)
                .execute(&mut *tx)
                .await
                .map_err(failed)?;
        }
        let [dead_marks, rw_names, rw_row] = rw::clean_up(t);
        sqlx::query(AssertSqlSafe(dead_marks))
            .bind(crate::rw::marks_unused_before(unused_for))
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
        let names: Vec<Vec<u8>> = sqlx::query_scalar(AssertSqlSafe(rw_names))
            .fetch_all(&mut *tx)
            .await
            .map_err(failed)?;
        for name in names {
            sqlx::query(AssertSqlSafe(rw_row.as_str()))
                .bind(name)
                .execute(&mut *tx)
                .await
                .map_err(failed)?;
        }
        tx.commit().await.map_err(failed)?;
        tracing::debug!(target: "distlock", backend = BACKEND, removed, "removed unused names");
        Ok(removed)
    }
}

/// ER_NO_SUCH_TABLE.
const NO_SUCH_TABLE: u16 = 1146;

/// ER_BAD_FIELD_ERROR: a missing column (a table from before it).
const BAD_FIELD: u16 = 1054;

impl MySqlDialect {
    /// The server connection holding `name`.
    async fn holder_id(&self, name: &str) -> Result<Option<u64>, LockError> {
        match self.core.mode {
            SqlMode::Advisory => Ok(
                sqlx::query_scalar::<_, Option<i64>>("SELECT IS_USED_LOCK(?)")
                    .bind(advisory_key(name))
                    .fetch_one(self.core.pool.pool())
                    .await
                    .map_err(|e| map_sqlx(BACKEND, "finding a lock's holder", e))?
                    .and_then(|id| u64::try_from(id).ok()),
            ),
            SqlMode::Row => self.row_holder(name).await,
        }
    }

    /// Whether `name` is held, without queueing: `IS_USED_LOCK`, or a
    /// `NOWAIT` row lock in a transaction that is rolled back at once (a
    /// free row is locked for that moment).
    async fn is_held(&self, name: &str) -> Result<bool, LockError> {
        if self.core.mode == SqlMode::Advisory {
            return Ok(self.holder_id(name).await?.is_some());
        }
        let failed = |e| map_sqlx(BACKEND, "reading whether a lock is held", e);
        let mut tx = self.core.pool.pool().begin().await.map_err(failed)?;
        let probe = sqlx::query(AssertSqlSafe(format!(
            "SELECT name FROM {} WHERE name = ? FOR UPDATE NOWAIT",
            self.core.table.as_str()
        )))
        .bind(name.as_bytes())
        .execute(&mut *tx)
        .await;
        let held = match probe {
            Ok(_) => false,
            Err(e) if not_granted(&e) => true,
            Err(e) => return Err(failed(e)),
        };
        tx.rollback().await.map_err(failed)?;
        Ok(held)
    }

    /// Kill the server connection `id` (`what` it is, for the error) and
    /// wait (up to 10 s) until it is gone: `KILL` only marks a connection,
    /// which then rolls back its transaction, giving up its locks, and
    /// leaves the process list last.
    async fn end_connection(&self, id: u64, what: &str) -> Result<(), LockError> {
        let pool = self.core.pool.pool();
        sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {id}")))
            .execute(pool)
            .await
            .map_err(|e| map_sqlx(BACKEND, &format!("killing {what}"), e))?;
        let start = Instant::now();
        loop {
            let alive: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?",
            )
            .bind(id)
            .fetch_one(pool)
            .await
            .map_err(|e| map_sqlx(BACKEND, &format!("waiting for {what} to end"), e))?;
            if alive == 0 {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(10) {
                return Err(LockError::Unavailable {
                    backend: BACKEND,
                    reason: format!("{what} was killed but had not ended after 10 s"),
                    source: None,
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The connection holding `name`'s row lock, found by queueing behind
    /// it for a moment and asking InnoDB who blocks us. The probe
    /// leaves the queue before this returns.
    async fn row_holder(&self, name: &str) -> Result<Option<u64>, LockError> {
        let failed = |e| map_sqlx(BACKEND, "finding a lock's holder", e);
        let mut probe = self
            .core
            .pool
            .pinned()
            .await
            .map_err(|e| e.into_error(BACKEND, "finding a lock's holder"))?;
        let conn = probe.conn(BACKEND)?;
        let me: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(&mut **conn)
            .await
            .map_err(failed)?;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "SET SESSION innodb_lock_wait_timeout = {}; START TRANSACTION",
            HOLDER_SEARCH.as_secs() + 2
        )))
        .execute(&mut **conn)
        .await
        .map_err(failed)?;
        let lock = format!(
            "SELECT name FROM {} WHERE name = ? FOR UPDATE",
            self.core.table.as_str()
        );
        let waiting = sqlx::query(AssertSqlSafe(lock))
            .bind(name.as_bytes())
            .execute(&mut **conn);
        let unidentified = || LockError::Unavailable {
            backend: BACKEND,
            reason: format!(
                "`{name}` is held but its holder could not be identified in time \
                 (information_schema.innodb_trx read more often than every 100 ms \
                 by another client keeps InnoDB's snapshot of lock waits stale)"
            ),
            source: None,
        };
        // InnoDB's information_schema lock tables are a snapshot that is
        // renewed only when nobody has read it for 100 ms: a search asking
        // more often than that, or beside other searches that do, would see
        // a snapshot older than its own wait for as long as it asked. So
        // every search asks only at the start of each `LOCK_TABLES_SLOT` of
        // the server's clock: questions from all clients fall together and
        // the snapshot is renewed between them.
        let ask = async {
            let start = Instant::now();
            let server_micros: i64 =
                sqlx::query_scalar("SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)")
                    .fetch_one(self.core.pool.pool())
                    .await
                    .map_err(failed)?;
            let read_at = Instant::now();
            let slot = LOCK_TABLES_SLOT.as_micros() as i64;
            loop {
                let now = server_micros + read_at.elapsed().as_micros() as i64;
                let until_slot = Duration::from_micros((slot - now.rem_euclid(slot)) as u64);
                if start.elapsed() + until_slot > HOLDER_SEARCH {
                    return Err(unidentified());
                }
                tokio::time::sleep(until_slot).await;
                let holder: Option<i64> = sqlx::query_scalar(
                    "SELECT CAST(b.trx_mysql_thread_id AS SIGNED) FROM information_schema.innodb_lock_waits w \
                     JOIN information_schema.innodb_trx b ON b.trx_id = w.blocking_trx_id \
                     AND b.trx_state <> 'LOCK WAIT' \
                     JOIN information_schema.innodb_trx r ON r.trx_id = w.requesting_trx_id \
                     WHERE r.trx_mysql_thread_id = ? LIMIT 1",
                )
                .bind(me)
                .fetch_optional(self.core.pool.pool())
                .await
                .map_err(failed)?;
                if let Some(id) = holder {
                    return Ok(u64::try_from(id).ok());
                }
            }
        };
        let (found, still_waiting) = tokio::select! {
            done = waiting => (match done {
                // Granted at once: nobody holds it.
                Ok(_) => Ok(None),
                // Our wait ran out behind a holder we did not find.
                Err(e) if not_granted(&e) => Err(unidentified()),
                Err(e) => Err(failed(e)),
            }, false),
            holder = ask => (holder, true),
        };
        // `probe` is closed on drop, ending its transaction. But a probe
        // whose statement still waits for the row is not told: the server
        // does not notice a closed client during a lock wait, and would
        // hand the probe the lock once the holder is gone, ahead of the
        // waiters and newcomers it was freed for. So it is ended first.
        drop(probe);
        if still_waiting {
            self.end_connection(me, "the holder search's probe").await?;
        }
        found
    }

    async fn acquire_conn(&self) -> Result<Pinned<MySql>, LockError> {
        self.core
            .pool
            .pinned()
            .await
            .map_err(|e| e.into_error(BACKEND, "acquiring a lock"))
    }

    /// One row-lock attempt; the transaction stays open on success and is
    /// rolled back otherwise. `wait_secs: None` means NOWAIT.
    async fn lock_row(
        &self,
        pinned: &mut Pinned<MySql>,
        name: &str,
        wait_secs: Option<u64>,
        ttl_secs: u64,
    ) -> Result<Result<bool, sqlx::Error>, LockError> {
        let bounds = Bounds {
            wait_secs: wait_secs.unwrap_or(1),
            idle_secs: ttl_secs,
        };
        let app_pool = self.restore.is_some();
        let (isolation, idle) = (self.isolation_var, self.idle_var);
        let begin = row_begin(isolation, idle, app_pool, pinned.bounds, bounds);
        // After a first transaction with these bounds (the name's row was
        // missing and has been made): the bounds are set.
        let again = || row_begin(isolation, idle, app_pool, Some(bounds), bounds);
        // Unknown until the SET has been answered.
        pinned.bounds = None;
        let remember = (!app_pool).then_some(bounds);
        let conn = pinned.conn(BACKEND)?;
        let outcome = self.lock_row_on(conn, name, wait_secs, begin, again).await;
        if outcome.is_ok() {
            pinned.bounds = remember;
        }
        Ok(outcome)
    }

    /// [`lock_row`](Self::lock_row) on `conn`, opening the transaction with
    /// `begin`, and with `again()` after a first one.
    async fn lock_row_on(
        &self,
        conn: &mut PoolConnection<MySql>,
        name: &str,
        wait_secs: Option<u64>,
        begin: String,
        again: impl Fn() -> String,
    ) -> Result<bool, sqlx::Error> {
        let t = self.core.table.as_str();
        let select = format!(
            "SELECT name FROM {t} WHERE name = ? FOR UPDATE{}",
            if wait_secs.is_some() { "" } else { " NOWAIT" }
        );
        let mut begin = begin;
        loop {
            sqlx::raw_sql(AssertSqlSafe(std::mem::take(&mut begin)))
                .execute(&mut **conn)
                .await?;
            match sqlx::query(AssertSqlSafe(select.clone()))
                .bind(name.as_bytes())
                .fetch_optional(&mut **conn)
                .await
            {
                Ok(Some(_)) => break,
                Ok(None) => {
                    // First use of this name: create its row (committed,
                    // outside any lock) and try again.
                    sqlx::raw_sql("ROLLBACK").execute(&mut **conn).await?;
                    begin = again();
                    match sqlx::query(AssertSqlSafe(format!(
                        "INSERT IGNORE INTO {t} (name) VALUES (?)"
                    )))
                    .bind(name.as_bytes())
                    .execute(&mut **conn)
                    .await
                    {
                        // A concurrent creator's insert was in the way;
                        // the row is there or about to be: look again.
                        Err(e) if not_granted(&e) => {}
                        other => {
                            other?;
                        }
                    }
                }
                Err(e) if not_granted(&e) => {
                    sqlx::raw_sql("ROLLBACK").execute(&mut **conn).await?;
                    return Ok(false);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// The token of a grant just made on `pinned`: advanced on the lock's
    /// own connection (advisory mode) or, since a row lock is an open
    /// transaction whose writes must not wait for its end, on the client's
    /// side connection.
    async fn token_for(
        &self,
        pinned: &mut Pinned<MySql>,
        name: &str,
        record: &[u8],
    ) -> Result<u64, LockError> {
        if !self.tokens.enabled {
            return Ok(0);
        }
        let failed = |e| map_sqlx(BACKEND, "drawing a fencing token", e);
        match self.core.mode {
            SqlMode::Advisory => self
                .tokens
                .advance(&mut **pinned.conn(BACKEND)?, name, record)
                .await
                .map_err(failed),
            SqlMode::Row => self
                .core
                .side
                .run(async |conn| self.tokens.advance(conn, name, record).await)
                .await
                .map_err(failed),
        }
    }

    /// One `GET_LOCK` attempt waiting `wait_secs`; on success the token.
    async fn lock_advisory(
        &self,
        conn: &mut PoolConnection<MySql>,
        name: &str,
        wait_secs: u64,
        ttl_secs: u64,
    ) -> Result<bool, sqlx::Error> {
        let granted: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, ?)")
            .bind(advisory_key(name))
            .bind(wait_secs.min(FOREVER_SECS))
            .fetch_one(&mut **conn)
            .await?;
        if granted != Some(1) {
            return Ok(false);
        }
        sqlx::raw_sql(AssertSqlSafe(format!(
            "SET SESSION wait_timeout = {ttl_secs}"
        )))
        .execute(&mut **conn)
        .await?;
        Ok(true)
    }
}

#[async_trait]
impl Dialect for MySqlDialect {
    type Db = MySql;
    type Session = MySqlSession;
    const CAPABILITIES: Capabilities = CAPABILITIES;

    fn core(&self) -> &Core<MySql, MySqlSession> {
        &self.core
    }

    /// Lock `req.name` on a connection of its own: the connection, the
    /// token and when it was asked; `None` if not granted by the request's
    /// deadline.
    async fn lock(
        &self,
        req: Request<'_>,
        record: Option<&HolderRecord>,
    ) -> Result<Option<Pinning<MySql>>, LockError> {
        let (name, opts, deadline) = (req.name, req.opts, req.deadline);
        let mut pinned = self.acquire_conn().await?;
        let ttl = secs_ceil(opts.ttl);
        let backoff = Backoff::default();
        let mut dead = DeadBudget::new();
        let mut tries = 0;
        loop {
            // Whole seconds of waiting left, if any; else a NOWAIT attempt.
            let wait_secs = match deadline {
                None => Some(FOREVER_SECS),
                Some(d) => {
                    Some(d.saturating_duration_since(Instant::now()).as_secs()).filter(|&s| s >= 1)
                }
            };
            let sent_at = Instant::now();
            let outcome = match self.core.mode {
                SqlMode::Row => self.lock_row(&mut pinned, name, wait_secs, ttl).await?,
                SqlMode::Advisory => {
                    self.lock_advisory(pinned.conn(BACKEND)?, name, wait_secs.unwrap_or(0), ttl)
                        .await
                }
            };
            match outcome {
                Ok(true) => {
                    let record = record.map_or(&[][..], HolderRecord::as_bytes);
                    let token = self.token_for(&mut pinned, name, record).await?;
                    return Ok(Some((pinned, token, sent_at)));
                }
                Ok(false) => {}
                Err(e) => {
                    let pool = &self.core.pool;
                    pool.replace_if_dead(&mut pinned, e, &mut dead, BACKEND)
                        .await?;
                    continue;
                }
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                self.put_back(pinned).await;
                return Ok(None);
            }
            // Less than a second left: NOWAIT attempts with backoff.
            let mut until = now + backoff.delay(tries);
            if let Some(d) = deadline {
                until = until.min(d);
            }
            tokio::time::sleep_until(until).await;
            tries += 1;
        }
    }

    async fn unlock(
        &self,
        conn: &mut PoolConnection<MySql>,
        name: &str,
    ) -> Result<bool, sqlx::Error> {
        let ours = match self.core.mode {
            SqlMode::Row => sqlx::raw_sql("ROLLBACK")
                .execute(&mut **conn)
                .await
                .map(|_| true)?,
            SqlMode::Advisory => sqlx::query_scalar::<_, Option<i64>>("SELECT RELEASE_LOCK(?)")
                .bind(advisory_key(name))
                .fetch_one(&mut **conn)
                .await
                .map(|released| released == Some(1))?,
        };
        // Released either way; a connection that fails this is broken,
        // and is replaced when its next statement fails.
        if let Some(restore) = self.restore.as_deref()
            && let Err(e) = sqlx::raw_sql(AssertSqlSafe(restore))
                .execute(&mut **conn)
                .await
        {
            tracing::debug!(target: "distlock", backend = BACKEND, error = %e, "setting a session back failed");
        }
        Ok(ours)
    }

    async fn touch(
        &self,
        conn: &mut PoolConnection<MySql>,
        ttl: Duration,
    ) -> Result<(), sqlx::Error> {
        let secs = secs_ceil(ttl);
        // A number only: nothing a caller controls is spliced.
        let touch = match self.core.mode {
            SqlMode::Row => format!("SET SESSION {} = {secs}", self.idle_var),
            SqlMode::Advisory => format!("SET SESSION wait_timeout = {secs}"),
        };
        sqlx::raw_sql(AssertSqlSafe(touch))
            .execute(&mut **conn)
            .await
            .map(|_| ())
    }

    /// The token of `name`'s latest grant (the holder's while it is held)
    /// and its holder record. A token still to be completed (the first
    /// grant after a restart) is none yet.
    async fn latest_grant(&self, name: &str) -> Result<Option<LatestGrant>, LockError> {
        let latest = (self.tokens.sql)
            .latest(self.core.pool.pool(), name)
            .await
            .map_err(|e| map_sqlx(BACKEND, "reading a lock's token", e))?;
        Ok(latest
            .and_then(|(t, record)| Some((u64::try_from(t).ok()?, record)))
            .filter(|&(t, _)| tokens::is_complete(t)))
    }

    async fn set_holder(&self, name: &str, token: u64, record: &[u8]) -> Result<bool, LockError> {
        let failed = |e| map_sqlx(BACKEND, "replacing a holder's value", e);
        let mut conn = self.core.pool.pool().acquire().await.map_err(failed)?;
        (self.tokens.sql)
            .set_holder(&mut conn, name, token, record)
            .await
            .map_err(failed)
    }

    /// Held when a connection holds `name` (`IS_USED_LOCK`, or a `NOWAIT`
    /// probe of the row that is refused). The server does not show who waits
    /// for a user lock, and the lock lasts as long as the holder's
    /// connection, so neither the waiters nor a lease time are reported.
    async fn inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        Ok(match self.is_held(name).await? {
            true => LockInfo::held(),
            false => LockInfo::free(),
        })
    }

    /// Kill the server connection holding `name` and wait (up to 10 s)
    /// until it is gone, so that the lock is free when this returns; the
    /// next waiter is granted it by the server. The holder's `lost()`
    /// fires, and so do those of the other locks that connection carried
    /// (advisory locks granted without waiting share a few connections per
    /// client).
    async fn force_release(&self, name: &str) -> Result<bool, LockError> {
        let Some(id) = self.holder_id(name).await? else {
            return Ok(false);
        };
        self.end_connection(id, &format!("the connection holding `{name}`"))
            .await?;
        Ok(true)
    }

    /// The transaction opens as a row lock's does (read committed, the
    /// idle bound `ttl`), in either mode.
    async fn take_slot(
        &self,
        pinned: &mut Pinned<MySql>,
        name: &str,
        limit: u32,
        ttl: Duration,
    ) -> Result<Result<Found, sqlx::Error>, LockError> {
        let bounds = Bounds {
            wait_secs: 1,
            idle_secs: secs_ceil(ttl),
        };
        let app_pool = self.restore.is_some();
        let begin = row_begin(
            self.isolation_var,
            self.idle_var,
            app_pool,
            pinned.bounds,
            bounds,
        );
        // Unknown until the SET has been answered.
        pinned.bounds = None;
        let conn = pinned.conn(BACKEND)?;
        if let Err(e) = sqlx::raw_sql(AssertSqlSafe(begin))
            .execute(&mut **conn)
            .await
        {
            return Ok(Err(e));
        }
        let found = self.permits.take_slot(conn, name, limit).await;
        if found.is_ok() && !app_pool {
            pinned.bounds = Some(bounds);
        }
        Ok(found)
    }

    async fn set_limit(
        &self,
        conn: &mut PoolConnection<MySql>,
        name: &str,
        limit: u32,
    ) -> Result<bool, sqlx::Error> {
        self.permits.set_limit(conn, name, limit).await
    }

    async fn end_permit(&self, conn: &mut PoolConnection<MySql>) -> Result<(), sqlx::Error> {
        sqlx::raw_sql("ROLLBACK").execute(&mut **conn).await?;
        // Released either way; a connection that fails this is broken,
        // and is replaced when its next statement fails.
        if let Some(restore) = self.restore_permit.as_deref()
            && let Err(e) = sqlx::raw_sql(AssertSqlSafe(restore))
                .execute(&mut **conn)
                .await
        {
            tracing::debug!(target: "distlock", backend = BACKEND, error = %e, "setting a session back failed");
        }
        Ok(())
    }

    async fn touch_permit(
        &self,
        conn: &mut PoolConnection<MySql>,
        ttl: Duration,
    ) -> Result<(), sqlx::Error> {
        // A number only: nothing a caller controls is spliced.
        let touch = format!("SET SESSION {} = {}", self.idle_var, secs_ceil(ttl));
        sqlx::raw_sql(AssertSqlSafe(touch))
            .execute(&mut **conn)
            .await
            .map(|_| ())
    }

    async fn held_slots(&self, name: &str) -> Result<Option<(u32, Vec<u32>)>, LockError> {
        let failed = |e| self.permit_error(e);
        let mut conn = self.core.pool.pool().acquire().await.map_err(failed)?;
        let held = self.permits.held_slots(&mut conn, name).await;
        if held.is_err() {
            // It may hold half a transaction.
            conn.close_on_drop();
        }
        held.map_err(failed)
    }

    async fn draw_on_side(&self, key: &str, record: &[u8]) -> Result<u64, LockError> {
        self.core
            .side
            .run(async |conn| self.tokens.advance(conn, key, record).await)
            .await
            .map_err(|e| map_sqlx(BACKEND, "drawing a fencing token", e))
    }

    async fn put_back_permit(&self, pinned: Pinned<MySql>) {
        let mut pinned = pinned;
        if let Some(restore) = &self.restore_permit {
            let Ok(conn) = pinned.conn(BACKEND) else {
                return;
            };
            if sqlx::raw_sql(AssertSqlSafe(restore.as_str()))
                .execute(&mut **conn)
                .await
                .is_err()
            {
                pinned.close();
                return;
            }
        }
        pinned.put_back();
    }

    async fn take_rw(
        &self,
        pinned: &mut Pinned<MySql>,
        name: &str,
        access: Access,
        times: (i64, i64),
        ttl: Duration,
    ) -> Result<Result<bool, sqlx::Error>, LockError> {
        let bounds = Bounds {
            wait_secs: 1,
            idle_secs: secs_ceil(ttl),
        };
        let app_pool = self.restore.is_some();
        for made in [false, true] {
            let begin = row_begin(
                self.isolation_var,
                self.idle_var,
                app_pool,
                pinned.bounds,
                bounds,
            );
            // Unknown until the SET has been answered.
            pinned.bounds = None;
            let taken = {
                let conn = pinned.conn(BACKEND)?;
                match sqlx::raw_sql(AssertSqlSafe(begin))
                    .execute(&mut **conn)
                    .await
                {
                    Ok(_) => self.rw.take(conn, name, access, times).await,
                    Err(e) => Err(e),
                }
            };
            if taken.is_ok() && !app_pool {
                pinned.bounds = Some(bounds);
            }
            match taken {
                Ok(Some(taken)) => return Ok(Ok(taken)),
                // The name's first grant: its row is made (committed at
                // once) and the row taken again.
                Ok(None) if !made => {
                    let conn = pinned.conn(BACKEND)?;
                    if let Err(e) = self.rw.ensure(conn, name).await {
                        return Ok(Err(e));
                    }
                }
                Ok(None) => return Ok(Ok(false)),
                Err(e) => return Ok(Err(e)),
            }
        }
        Ok(Ok(false))
    }

    async fn mark_rw(
        &self,
        pinned: &mut Pinned<MySql>,
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
        let failed = |e| self.rw_error(e);
        let mut conn = self.core.pool.pool().acquire().await.map_err(failed)?;
        let state = self.rw.state(&mut conn, name, now).await;
        if state.is_err() {
            // It may hold half a transaction.
            conn.close_on_drop();
        }
        state.map_err(failed)
    }

    fn rw_error(&self, e: sqlx::Error) -> LockError {
        let missing = match &e {
            sqlx::Error::Database(db) => db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|e| e.number() == NO_SUCH_TABLE),
            _ => false,
        };
        if missing {
            return LockError::invalid_options(format!(
                "the reader-writer locks' tables are missing ({e}): create them with the last \
                 two statements of MySqlLock::ddl: {}",
                rw::ddl(self.core.table.as_str()).join("; ")
            ));
        }
        map_sqlx(BACKEND, "acquiring a reader-writer lock", e)
    }

    fn permit_error(&self, e: sqlx::Error) -> LockError {
        let missing = match &e {
            sqlx::Error::Database(db) => db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|e| e.number() == NO_SUCH_TABLE),
            _ => false,
        };
        if missing {
            return LockError::invalid_options(format!(
                "the semaphores' table is missing ({e}): create it with the last statement \
                 of MySqlLock::ddl: {}",
                permits::ddl(self.core.table.as_str())
            ));
        }
        map_sqlx(BACKEND, "acquiring a permit", e)
    }
}

/// The statement that opens a row lock's transaction with `bounds` on a
/// session whose bounds are `set` (if known); `isolation` and `idle` are
/// the server's variables for the isolation level and the idle bound.
/// Numbers only: nothing a caller controls is spliced. READ COMMITTED:
/// looking for a row that does not exist yet takes no gap lock, so a
/// concurrent first use of another name, or of this one, never waits on
/// it. On the client's own pool that is the session's level, set with the
/// bounds when they change, and a session whose bounds are already right
/// only starts the transaction. On the application's pool (`app_pool`) the
/// level is set for the next transaction only (the isolation variable
/// assigned without a scope, `@@name`), with the bounds, each time.
fn row_begin(
    isolation: &str,
    idle: &str,
    app_pool: bool,
    set: Option<Bounds>,
    bounds: Bounds,
) -> String {
    let Bounds {
        wait_secs,
        idle_secs,
    } = bounds;
    if app_pool {
        format!(
            "SET @@{isolation} = 'READ-COMMITTED', SESSION innodb_lock_wait_timeout = \
             {wait_secs}, SESSION {idle} = {idle_secs}; START TRANSACTION"
        )
    } else if set == Some(bounds) {
        "START TRANSACTION".to_string()
    } else {
        format!(
            "SET SESSION {isolation} = 'READ-COMMITTED', SESSION innodb_lock_wait_timeout = \
             {wait_secs}, SESSION {idle} = {idle_secs}; START TRANSACTION"
        )
    }
}

/// `GET_LOCK` on a shared session.
pub(crate) struct MySqlSession {
    tokens: Arc<TokenCounter>,
}

#[async_trait]
impl SessionSql for MySqlSession {
    type Conn = sqlx::MySqlConnection;

    async fn try_lock(
        &self,
        conn: &mut Self::Conn,
        name: &str,
        record: &[u8],
        idle: Option<Duration>,
    ) -> Tried {
        if let Some(idle) = idle {
            self.keep(conn, idle).await?;
        }
        if self.tokens.enabled {
            // The lock and its token in one statement (an upsert fed by
            // `GET_LOCK`, whose answer is the insert id); a failure after
            // the grant leaves the lock to the caller.
            return self
                .tokens
                .sql
                .try_lock_and_draw(conn, name, &advisory_key(name), record)
                .await;
        }
        let granted: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
            .bind(advisory_key(name))
            .fetch_one(&mut *conn)
            .await?;
        Ok((granted == Some(1)).then_some(0))
    }

    /// One statement takes every name's `GET_LOCK`, all or none (see
    /// [`set_statement`]); then the tokens are drawn for all of them in
    /// two more ([`tokens::Statements::draw_set`]).
    async fn try_lock_set(
        &self,
        conn: &mut Self::Conn,
        names: &[&str],
        record: &[u8],
        idle: Option<Duration>,
    ) -> TriedSet {
        if let Some(idle) = idle {
            self.keep(conn, idle).await?;
        }
        let keys: Vec<String> = names.iter().map(|name| advisory_key(name)).collect();
        let mut set =
            sqlx::query_scalar::<_, Option<i64>>(AssertSqlSafe(set_statement(keys.len())));
        // The keys are looked at, taken, and (if one was taken by someone
        // else meanwhile) given back.
        for _ in 0..3 {
            for key in &keys {
                set = set.bind(key.as_str());
            }
        }
        if set.fetch_one(&mut *conn).await? != Some(1) {
            return Ok(None);
        }
        if !self.tokens.enabled {
            return Ok(Some(vec![0; names.len()]));
        }
        self.tokens
            .sql
            .draw_set(conn, names, record)
            .await
            .map(Some)
    }

    async fn unlock(&self, conn: &mut Self::Conn, name: &str) -> Result<bool, sqlx::Error> {
        let released: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
            .bind(advisory_key(name))
            .fetch_one(&mut *conn)
            .await?;
        Ok(released == Some(1))
    }

    async fn keep(&self, conn: &mut Self::Conn, idle: Duration) -> Result<(), sqlx::Error> {
        // A number only: nothing a caller controls is spliced.
        let secs = secs_ceil(idle);
        sqlx::raw_sql(AssertSqlSafe(format!("SET SESSION wait_timeout = {secs}")))
            .execute(conn)
            .await?;
        Ok(())
    }

    #[cfg(test)]
    async fn idle_bound(&self, conn: &mut Self::Conn) -> Result<Duration, sqlx::Error> {
        let secs: u64 = sqlx::query_scalar("SELECT @@SESSION.wait_timeout")
            .fetch_one(conn)
            .await?;
        Ok(Duration::from_secs(secs))
    }
}

/// The server's name for advisory lock `name`: `dl:` and the first 61 hex
/// digits of its SHA-256, so any name fits `GET_LOCK`'s 64 characters and
/// no two names are cut to one. The same name as the server's
/// `CONCAT('dl:', LEFT(SHA2(name, 256), 61))`, computed here so that the
/// server runs no hash per statement.
/// The statement that takes `count` advisory keys (bound three times over,
/// in the same order) on a shared session, all or none, in one round trip:
/// 1 when every one was taken. It first asks `IS_FREE_LOCK` of each, and
/// tries none when one is held: a set refused because a member is held
/// never takes the others, even for the moment of the statement. Only a
/// grant racing the statement itself (between that look and the tries)
/// can make it take some keys; it then gives them back (a `RELEASE_LOCK`
/// of a key held by another session does nothing) and answers below 0.
fn set_statement(count: usize) -> String {
    let each = |call: &str| vec![call; count].join(" + ");
    let free = vec!["COALESCE(IS_FREE_LOCK(?), 0) = 1"; count].join(" AND ");
    format!(
        "SELECT CASE WHEN {free} THEN \
         CASE WHEN {} = {count} THEN 1 ELSE -1 - ({}) END \
         ELSE 0 END",
        each("COALESCE(GET_LOCK(?, 0), 0)"),
        each("COALESCE(RELEASE_LOCK(?), 0)"),
    )
}

fn advisory_key(name: &str) -> String {
    use sha2::Digest;

    // Twice per lock (`GET_LOCK`, `RELEASE_LOCK`), so without `fmt`. The
    // 32 bytes fill the 64 digits exactly: the encoding cannot fail.
    let mut digits = [0u8; 64];
    let _ = hex::encode_to_slice(sha2::Sha256::digest(name.as_bytes()), &mut digits);
    let mut key = String::with_capacity(64);
    key.push_str("dl:");
    key.push_str(std::str::from_utf8(&digits[..61]).unwrap_or_default());
    key
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::task::Poll;
    use std::time::Duration;

    use lock_core::{DistributedLock, LockOptions, Wait};
    use sqlx::AssertSqlSafe;

    use super::MySqlLock;

    fn url() -> String {
        std::env::var("DISTLOCK_TEST_MYSQL_URL")
            .expect("DISTLOCK_TEST_MYSQL_URL (scripts/services.sh env)")
    }

    async fn advisory() -> MySqlLock {
        MySqlLock::connect(&format!("{}?mode=advisory&sessions=1", url()))
            .await
            .expect("connect")
    }

    /// The client's advisory key is the one the server computed for
    /// earlier versions, so clients of both exclude each other: short,
    /// long, non-ASCII and binary-looking names.
    #[tokio::test]
    async fn advisory_keys_are_the_servers_sha2_names() {
        let pool = sqlx::MySqlPool::connect(&url()).await.expect("connect");
        let long = "n".repeat(300);
        for name in [
            "a",
            "jobs/nightly report",
            long.as_str(),
            "名前/über",
            "\u{0}x",
        ] {
            let server: String = sqlx::query_scalar("SELECT CONCAT('dl:', LEFT(SHA2(?, 256), 61))")
                .bind(name.as_bytes())
                .fetch_one(&pool)
                .await
                .expect("the server's name");
            assert_eq!(super::advisory_key(name), server, "{name:?}");
            assert_eq!(server.len(), 64, "{name:?}");
        }
    }

    /// A shared session sets `wait_timeout` only when a lock's lease asks
    /// for another, and keeps it when its last lock is given back.
    #[tokio::test]
    async fn a_shared_session_sets_its_wait_timeout_only_when_it_changes() {
        advisory()
            .await
            .dialect()
            .core
            .shared
            .check_idle_bound_set_only_when_it_changes()
            .await;
    }

    /// The isolation level and id of connection `thread`'s open InnoDB
    /// transaction, once the server's snapshot of its transactions (renewed
    /// only when nobody has read it for 100 ms) shows one other than `not`.
    async fn transaction_of(lock: &MySqlLock, thread: u64, not: Option<&str>) -> (String, String) {
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let row: Option<(String, String)> = sqlx::query_as(
                "SELECT trx_isolation_level, CAST(trx_id AS CHAR) \
                 FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = ?",
            )
            .bind(thread)
            .fetch_optional(lock.dialect().core.pool.pool())
            .await
            .expect("reading innodb_trx");
            if let Some((level, id)) = row
                && Some(id.as_str()) != not
            {
                return (level, id);
            }
        }
        panic!("connection {thread}'s transaction never showed in innodb_trx");
    }

    /// The connection holding `name`'s row lock, and its transaction's
    /// isolation level and id.
    async fn holder_transaction(lock: &MySqlLock, name: &str) -> (u64, String, String) {
        let holder = lock
            .dialect()
            .row_holder(name)
            .await
            .expect("searching the holder")
            .expect("held");
        let (level, id) = transaction_of(lock, holder, None).await;
        (holder, level, id)
    }

    /// A row lock's transaction runs at READ COMMITTED (looking for a
    /// name's missing row takes no gap lock), also the next one on the same
    /// connection, whose bounds were set already and which only starts its
    /// transaction. On the application's pool, the level holds for the
    /// lock's own transaction only: the connection's next transaction is
    /// back at the session's level. (One test: searches for a holder from
    /// tests running side by side would keep InnoDB's snapshot stale.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn row_locks_run_at_read_committed() {
        let lock = MySqlLock::connect(&url()).await.expect("connect");
        let name = format!("isolation/{:?}", std::time::SystemTime::now());
        let opts = LockOptions::new().ttl(Duration::from_secs(30));
        let mut holders = Vec::new();
        for _ in 0..2 {
            let g = lock.acquire(&name, &opts).await.expect("acquire");
            let (holder, level, _) = holder_transaction(&lock, &name).await;
            assert_eq!(level, "READ COMMITTED");
            holders.push(holder);
            assert!(g.release().await.expect("release"));
        }
        assert_eq!(holders[0], holders[1], "the lock's connection was cached");

        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(5)
            .connect(&url())
            .await
            .expect("the application's pool");
        let lock = MySqlLock::with_pool(pool, crate::SqlConfig::default())
            .await
            .expect("connect");
        let name = format!("isolation/app/{:?}", std::time::SystemTime::now());
        let g = lock
            .acquire(&name, &LockOptions::new().ttl(Duration::from_secs(30)))
            .await
            .expect("acquire");
        let (holder, level, id) = holder_transaction(&lock, &name).await;
        assert_eq!(level, "READ COMMITTED");
        assert!(g.release().await.expect("release"));

        // The same connection, back from the lock's cache.
        let mut pinned = lock
            .dialect()
            .core
            .pool
            .pinned()
            .await
            .ok()
            .expect("a connection");
        let conn = pinned.conn(super::BACKEND).expect("open");
        let thread: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(&mut **conn)
            .await
            .expect("connection id");
        assert_eq!(thread, holder, "the lock's connection was cached");
        let session: String = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT @@SESSION.{}",
            lock.dialect().isolation_var
        )))
        .fetch_one(&mut **conn)
        .await
        .expect("session level");
        assert_ne!(
            session, "READ-COMMITTED",
            "the session's own level is the server's default"
        );
        sqlx::raw_sql("START TRANSACTION")
            .execute(&mut **conn)
            .await
            .expect("a plain transaction");
        sqlx::query(AssertSqlSafe(format!(
            "SELECT name FROM {} WHERE name = ? FOR UPDATE",
            lock.dialect().core.table.as_str()
        )))
        .bind(name.as_bytes())
        .fetch_one(&mut **conn)
        .await
        .expect("the name's row, locked again");
        let (next, _) = transaction_of(&lock, holder, Some(&id)).await;
        assert_eq!(next, session.replace('-', " "));
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut **conn)
            .await
            .expect("rollback");
        pinned.put_back();
    }

    /// A connection keeps the bounds last set on it only where they are
    /// the request's own: a row lock on a connection whose wait or idle
    /// bound differs, or is unknown, sets them again; on the application's
    /// pool everything is set for each transaction.
    #[test]
    fn a_row_lock_sets_bounds_unless_they_are_the_sessions_already() {
        use super::{Bounds, row_begin};
        let b = |wait_secs, idle_secs| Bounds {
            wait_secs,
            idle_secs,
        };
        let begin =
            |app_pool, set, bounds| row_begin("tx_isolation", "idle_var", app_pool, set, bounds);
        let full = "SET SESSION tx_isolation = 'READ-COMMITTED', SESSION \
                    innodb_lock_wait_timeout = 7, SESSION idle_var = 30; START TRANSACTION";
        assert_eq!(begin(false, None, b(7, 30)), full);
        assert_eq!(begin(false, Some(b(1, 30)), b(7, 30)), full);
        assert_eq!(begin(false, Some(b(7, 10)), b(7, 30)), full);
        assert_eq!(begin(false, Some(b(7, 30)), b(7, 30)), "START TRANSACTION");
        let app = "SET @@tx_isolation = 'READ-COMMITTED', SESSION \
                   innodb_lock_wait_timeout = 7, SESSION idle_var = 30; START TRANSACTION";
        assert_eq!(begin(true, Some(b(7, 30)), b(7, 30)), app);
        assert_eq!(begin(true, None, b(7, 30)), app);
    }

    /// A grant on a shared session whose caller was cancelled after the
    /// session answered, but before the answer was read, goes back to the
    /// session at once, not when its minute-long lease runs out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_grant_nobody_claims_is_given_back_at_once() {
        let (a, b) = (advisory().await, advisory().await);
        let name = format!("unclaimed/{:?}", std::time::SystemTime::now());
        let grant = a
            .dialect()
            .core
            .shared
            .grant_unclaimed(&name, Duration::from_secs(60))
            .await
            .expect("granted on a's session");
        drop(grant);
        let g = b
            .acquire(
                &name,
                &LockOptions::new()
                    .ttl(Duration::from_secs(10))
                    .wait(Wait::UpTo(Duration::from_secs(3))),
            )
            .await
            .expect("free once the unclaimed grant is dropped");
        assert!(g.release().await.expect("release"));
    }

    /// An acquisition on a shared session dropped while its statement is
    /// on its way (polled once, still pending, then dropped) leaves the
    /// session's connection whole and the lock free: the statement runs to
    /// its end on the runtime, and its grant goes back. An attempt the
    /// server answered within that one poll is released and tried again
    /// under another name.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_acquisition_dropped_mid_statement_leaves_the_lock_free() {
        let (a, b) = (advisory().await, advisory().await);
        let stamp = format!("{:?}", std::time::SystemTime::now());
        let quick = LockOptions::new()
            .ttl(Duration::from_secs(10))
            .wait(Wait::UpTo(Duration::from_secs(3)));
        // Open a's session, so the next attempt sends its statement at once.
        let warm = a
            .acquire(&format!("warm/{stamp}"), &quick)
            .await
            .expect("warm");
        assert!(warm.release().await.expect("release"));
        let mut dropped = 0;
        for i in 0..50 {
            let name = format!("dropped/{stamp}/{i}");
            let mut attempt = Box::pin(a.dialect().core.shared.try_lock(
                &name,
                b"",
                Duration::from_secs(60),
            ));
            let first = std::future::poll_fn(|cx| Poll::Ready(attempt.as_mut().poll(cx))).await;
            if let Poll::Ready(answered) = first {
                let (handle, _) = answered.expect("try_lock").expect("free");
                assert!(handle.release().await.expect("release"));
                continue;
            }
            drop(attempt);
            dropped += 1;
            let g = b
                .acquire(&name, &quick)
                .await
                .expect("free once the dropped attempt's statement has ended");
            assert!(g.release().await.expect("release"));
            if dropped == 3 {
                break;
            }
        }
        assert!(dropped > 0, "no attempt was still pending after one poll");
        // a's session carries on.
        let again = a
            .acquire(&format!("again/{stamp}"), &quick)
            .await
            .expect("a's session is whole");
        assert!(again.release().await.expect("release"));
    }

    /// A waiter's mark whose write lands after the wait's removal sent for
    /// good (a wait dropped while the mark was on its way on another
    /// connection) stays dead: it holds nobody back.
    #[tokio::test]
    async fn a_mark_landing_after_its_removal_for_good_stays_dead() {
        let pool = sqlx::MySqlPool::connect(&url()).await.expect("connect");
        let t = crate::config::SqlConfig::default().table;
        for ddl in super::rw::ddl(t.as_str()) {
            sqlx::raw_sql(AssertSqlSafe(ddl))
                .execute(&pool)
                .await
                .expect("the marks' table");
        }
        let rw = super::rw::Statements::new(t.as_str(), false);
        let name = format!("late-mark/{:016x}", rand::random::<u64>());
        let now = crate::rw::now_ms();
        rw.unmark(&pool, &name, "beef", true)
            .await
            .expect("removed for good");
        let mut conn = pool.acquire().await.expect("a connection");
        rw.mark(&mut conn, &name, "beef", now, now + 1500)
            .await
            .expect("the late mark");
        let (_, marks) = rw.state(&mut conn, &name, now).await.expect("state");
        assert_eq!(
            marks, 0,
            "a mark landing after its removal came back to life"
        );
    }
}
