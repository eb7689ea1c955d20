//! Postgres lock benchmark: the session-lock body
//! (`suites/session_bench.rs`: distlock in both modes against hand-written
//! floors, then contended hand-offs) on Postgres's floors, and the ways of
//! ending a row-lock transaction (why release is a ROLLBACK).
//!
//! ```sh
//! export $(scripts/services.sh env | xargs)
//! cargo bench -p lock-sql --features postgres --bench postgres
//! ```

#[path = "suites/session_bench.rs"]
mod session_bench;

use lock_core::Access;
use lock_sql::PgLock;
use lock_testkit::bench::cycles::Cycles;
use session_bench::{Floors, PERMITS, now_ms, rw_counter};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

const ROLLBACK: &str = "row, ending in ROLLBACK";
const COMMIT: &str = "row, ending in COMMIT";
const COMMIT_ASYNC: &str = "the same, COMMIT, synchronous_commit=off";

fn url() -> String {
    std::env::var("DISTLOCK_TEST_POSTGRES_URL")
        .expect("DISTLOCK_TEST_POSTGRES_URL (see scripts/services.sh env)")
}

/// One row-lock cycle on a plain connection, ending the transaction with
/// `end` (`ROLLBACK` or `COMMIT`): what the end of the transaction costs.
async fn raw_row(conn: &mut PgConnection, name: &str, end: &str) {
    sqlx::raw_sql(
        "BEGIN; SET LOCAL lock_timeout = 0; SET LOCAL idle_in_transaction_session_timeout = 30000",
    )
    .execute(&mut *conn)
    .await
    .expect("begin");
    let token: Option<i64> = sqlx::query_scalar(
        "WITH l AS (SELECT name FROM distlock_locks WHERE name = $1 FOR UPDATE) \
         SELECT 1::bigint FROM l",
    )
    .bind(name)
    .fetch_optional(&mut *conn)
    .await
    .expect("lock");
    assert!(token.is_some());
    sqlx::raw_sql(AssertSqlSafe(end.to_string()))
        .execute(&mut *conn)
        .await
        .expect("end");
}

/// Lock `name`'s row in the open transaction on `conn`.
async fn lock_row(conn: &mut PgConnection, name: &str) {
    let row: Option<String> =
        sqlx::query_scalar("SELECT name FROM distlock_locks WHERE name = $1 FOR UPDATE")
            .bind(name)
            .fetch_optional(&mut *conn)
            .await
            .expect("lock");
    assert!(row.is_some());
}

/// The hand-written advisory lock without a fencing token.
async fn raw_advisory_plain(conn: &mut PgConnection, name: &str) {
    sqlx::query("SELECT pg_advisory_lock(hashtextextended($1, 0))")
        .bind(name)
        .execute(&mut *conn)
        .await
        .expect("lock");
    let released: bool = sqlx::query_scalar("SELECT pg_advisory_unlock(hashtextextended($1, 0))")
        .bind(name)
        .fetch_one(&mut *conn)
        .await
        .expect("unlock");
    assert!(released);
}

/// The counter's upsert a grant makes: in the unlogged counters table, in
/// the epoch the counters count in (see `lock-sql/src/postgres/tokens.rs`),
/// with the grant's holder record beside the token.
const TOKEN_UPSERT: &str = "INSERT INTO distlock_locks_counters (name, token, holder) \
     SELECT $1, (coalesce((SELECT epoch FROM distlock_locks_run WHERE id = 1), 0) << 32) | 1, $2 \
     ON CONFLICT (name) DO UPDATE SET token = distlock_locks_counters.token + 1, holder = excluded.holder \
     RETURNING token";

/// The holder record distlock writes with a grant on default options.
fn holder_record() -> Vec<u8> {
    lock_core::LockOptions::new()
        .holder_record()
        .as_bytes()
        .to_vec()
}

/// The cheapest hand-written row lock with a token that survives a crash:
/// the lock's transaction on `conn`, the token's upsert on `tokens` (a
/// token drawn inside the lock's transaction would be undone by its
/// ROLLBACK), then the end of the lock's transaction.
async fn fenced_row(conn: &mut PgConnection, tokens: &mut PgConnection, name: &str) {
    sqlx::raw_sql(
        "BEGIN; SET LOCAL lock_timeout = 0; SET LOCAL idle_in_transaction_session_timeout = 30000",
    )
    .execute(&mut *conn)
    .await
    .expect("begin");
    lock_row(conn, name).await;
    let token: i64 = sqlx::query_scalar(TOKEN_UPSERT)
        .bind(name)
        .bind(holder_record())
        .fetch_one(&mut *tokens)
        .await
        .expect("token");
    assert!(token > 0);
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut *conn)
        .await
        .expect("end");
}

/// The cheapest hand-written advisory lock with a token that survives a
/// crash: one autocommit statement takes the lock (with the session's
/// timeouts) and then upserts the counter (the lock feeds the row, so it
/// is held first); then the unlock.
async fn fenced_advisory(conn: &mut PgConnection, name: &str) {
    let token: i64 = sqlx::query_scalar(
        "INSERT INTO distlock_locks_counters (name, token, holder) \
         SELECT $1, (coalesce((SELECT epoch FROM distlock_locks_run WHERE id = 1), 0) << 32) | 1, $4 \
         FROM (SELECT set_config('lock_timeout', $2, false), set_config('idle_session_timeout', $3, false), \
         pg_advisory_lock(hashtextextended('distlock:' || $1, 0))) AS locked \
         ON CONFLICT (name) DO UPDATE SET token = distlock_locks_counters.token + 1, holder = excluded.holder \
         RETURNING token",
    )
    .bind(name)
    .bind("0ms")
    .bind("30000ms")
    .bind(holder_record())
    .fetch_one(&mut *conn)
    .await
    .expect("lock and token");
    assert!(token > 0);
    let _: (bool, String, String) = sqlx::query_as(
        "SELECT pg_advisory_unlock(hashtextextended('distlock:' || $1, 0)), \
         set_config('idle_session_timeout', '0', false), set_config('lock_timeout', '0', false)",
    )
    .bind(name)
    .fetch_one(&mut *conn)
    .await
    .expect("unlock");
}

/// The hand-written permit: see [`Floors::fenced_permit`].
async fn fenced_permit(conn: &mut PgConnection, tokens: &mut PgConnection, name: &str) {
    sqlx::raw_sql(
        "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL idle_in_transaction_session_timeout = 30000",
    )
    .execute(&mut *conn)
    .await
    .expect("begin");
    let (slot, lim): (i32, i32) = sqlx::query_as(
        "SELECT slot, lim FROM distlock_locks_permits WHERE name = $1 AND slot >= 0 AND slot < $2 \
         ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED",
    )
    .bind(name)
    .bind(PERMITS as i32)
    .fetch_one(&mut *conn)
    .await
    .expect("a slot");
    assert_eq!(lim, PERMITS as i32);
    let token: i64 = sqlx::query_scalar(TOKEN_UPSERT)
        .bind(format!("{name}:{slot}"))
        .bind(holder_record())
        .fetch_one(&mut *tokens)
        .await
        .expect("token");
    assert!(token > 0);
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut *conn)
        .await
        .expect("end");
}

/// The hand-written reader-writer lock: see [`Floors::rw`].
async fn fenced_rw(conn: &mut PgConnection, tokens: &mut PgConnection, name: &str, access: Access) {
    sqlx::raw_sql(
        "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL idle_in_transaction_session_timeout = 30000",
    )
    .execute(&mut *conn)
    .await
    .expect("begin");
    let now = now_ms();
    let counter = rw_counter(name);
    let token: i64 = if access == Access::Read {
        let marked: Option<i32> = sqlx::query_scalar(
            "SELECT 1 FROM distlock_locks_rw_marks WHERE name = $1 AND expires > $2 AND arrival <= $2 LIMIT 1",
        )
        .bind(name)
        .bind(now)
        .fetch_optional(&mut *conn)
        .await
        .expect("marks");
        assert!(marked.is_none());
        let row =
            sqlx::query("SELECT name FROM distlock_locks_rw WHERE name = $1 FOR SHARE NOWAIT")
                .bind(name)
                .fetch_optional(&mut *conn)
                .await
                .expect("share");
        assert!(row.is_some());
        sqlx::query_scalar("SELECT token FROM distlock_locks_counters WHERE name = $1")
            .bind(&counter)
            .fetch_one(&mut *tokens)
            .await
            .expect("latest token")
    } else {
        let row =
            sqlx::query("SELECT name FROM distlock_locks_rw WHERE name = $1 FOR UPDATE NOWAIT")
                .bind(name)
                .fetch_optional(&mut *conn)
                .await
                .expect("hold");
        assert!(row.is_some());
        sqlx::query_scalar(TOKEN_UPSERT)
            .bind(&counter)
            .bind(holder_record())
            .fetch_one(&mut *tokens)
            .await
            .expect("token")
    };
    assert!(token > 0);
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut *conn)
        .await
        .expect("end");
}

/// Postgres's floors on plain connections.
struct PgFloors {
    conn: PgConnection,
    /// The row floor's tokens are committed here, outside the lock's
    /// transaction.
    tokens: PgConnection,
    /// A session with `synchronous_commit = off`.
    async_conn: PgConnection,
}

impl Floors for PgFloors {
    async fn ping(&mut self) {
        let _: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut self.conn)
            .await
            .expect("ping");
    }

    async fn fenced_row(&mut self, name: &str) {
        fenced_row(&mut self.conn, &mut self.tokens, name).await
    }

    async fn fenced_advisory(&mut self, name: &str) {
        fenced_advisory(&mut self.conn, name).await
    }

    async fn row_plain(&mut self, name: &str) {
        let mut tx = self.conn.begin().await.expect("begin");
        lock_row(&mut tx, name).await;
        tx.rollback().await.expect("end");
    }

    async fn advisory_plain(&mut self, name: &str) {
        raw_advisory_plain(&mut self.conn, name).await
    }

    async fn fenced_permit(&mut self, name: &str) {
        fenced_permit(&mut self.conn, &mut self.tokens, name).await
    }

    async fn rw(&mut self, name: &str, access: Access) {
        fenced_rw(&mut self.conn, &mut self.tokens, name, access).await
    }

    async fn more(&mut self, m: &mut Cycles) {
        m.measure(ROLLBACK, async |_| {
            raw_row(&mut self.conn, "bench/raw", "ROLLBACK").await
        })
        .await;
        m.measure(COMMIT, async |_| {
            raw_row(&mut self.conn, "bench/raw", "COMMIT").await
        })
        .await;
        m.measure(COMMIT_ASYNC, async |_| {
            raw_row(&mut self.async_conn, "bench/raw", "COMMIT").await
        })
        .await;
    }

    fn more_comparisons(&self) -> &'static [(&'static str, &'static str)] {
        // The row lock a user writes ends its transaction with COMMIT.
        &[
            (COMMIT, ROLLBACK),
            (session_bench::ROW, COMMIT),
            (session_bench::ROW_RENEWED, COMMIT),
        ]
    }
}

#[tokio::main]
async fn main() {
    let connect = async || PgConnection::connect(&url()).await.expect("connection");
    let mut async_conn = connect().await;
    sqlx::raw_sql("SET synchronous_commit = off")
        .execute(&mut async_conn)
        .await
        .expect("session setting");
    let mut floors = PgFloors {
        conn: connect().await,
        tokens: connect().await,
        async_conn,
    };
    session_bench::run(
        &url(),
        async |url| PgLock::connect(url).await.expect("distlock"),
        &mut floors,
    )
    .await;
}
