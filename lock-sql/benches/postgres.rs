//! Postgres lock benchmark, in interleaved blocks
//! (`lock_testkit::bench::cycles`): distlock in row and advisory mode, with
//! and without the guard's renewal, against two hand-written floors on
//! plain sqlx: the cheapest lock whose fencing token is durable (committed
//! before the grant, as distlock's is) and the lock without a token
//! (against distlock with `fencing=false`); then the ways of ending a
//! row-lock transaction (why release is a ROLLBACK); then contended
//! hand-offs with 8 clients.
//!
//! ```sh
//! export $(scripts/services.sh env | xargs)
//! cargo bench -p lock-sql --features postgres --bench postgres
//! ```

use std::sync::Arc;
use std::time::Duration;

use lock_core::{DistributedLock, LockOptions, Wait};
use lock_sql::PgLock;
use lock_testkit::bench::cycles::Cycles;
use lock_testkit::bench::{contend_on, print_handoff_round_trips, print_runs};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

/// Cycles per variant in a block, and rounds of blocks (after one to warm up).
const BLOCK: usize = 50;
const ROUNDS: usize = 20;
const RTT: &str = "round trip: SELECT 1";
const ROW_FLOOR: &str = "row floor: BEGIN; FOR UPDATE; token upsert; ROLLBACK";
const ROW: &str = "distlock row, auto-renew off";
const ROW_RENEWED: &str = "distlock row acquire + release";
const ADVISORY_FLOOR: &str = "advisory floor: lock + token upsert; unlock";
const ADVISORY: &str = "distlock advisory, auto-renew off";
const ADVISORY_RENEWED: &str = "distlock advisory acquire + release";
const ROLLBACK: &str = "row, token from the sequence, ending in ROLLBACK";
const COMMIT: &str = "row, token from the sequence, ending in COMMIT";
const COMMIT_ASYNC: &str = "the same, COMMIT, synchronous_commit=off";
const ROW_PLAIN_FLOOR: &str = "row, no token: BEGIN; FOR UPDATE; ROLLBACK";
const ROW_PLAIN: &str = "distlock row, fencing=false";
const ADVISORY_PLAIN_FLOOR: &str = "advisory, no token: lock; unlock";
const ADVISORY_PLAIN: &str = "distlock advisory, fencing=false";
const TASKS: usize = 8;
const RUN: Duration = Duration::from_secs(4);
const WORK: Duration = Duration::from_millis(1);

fn url() -> String {
    std::env::var("DISTLOCK_TEST_POSTGRES_URL")
        .expect("DISTLOCK_TEST_POSTGRES_URL (see scripts/services.sh env)")
}

/// One row-lock cycle on a plain connection with a token from the sequence
/// (not durable: it is not committed), ending the transaction with `end`
/// (`ROLLBACK` or `COMMIT`): what the end of the transaction costs.
async fn raw_row(conn: &mut PgConnection, name: &str, end: &str) {
    sqlx::raw_sql(
        "BEGIN; SET LOCAL lock_timeout = 0; SET LOCAL idle_in_transaction_session_timeout = 30000",
    )
    .execute(&mut *conn)
    .await
    .expect("begin");
    let token: Option<i64> = sqlx::query_scalar(
        "WITH l AS (SELECT name FROM distlock_locks WHERE name = $1 FOR UPDATE) \
         SELECT nextval('distlock_locks_fence') FROM l",
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

/// The hand-written row lock without a fencing token.
async fn raw_row_plain(conn: &mut PgConnection, name: &str) {
    sqlx::raw_sql("BEGIN")
        .execute(&mut *conn)
        .await
        .expect("begin");
    lock_row(conn, name).await;
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut *conn)
        .await
        .expect("end");
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

/// The counter's upsert distlock commits for each grant (its first value
/// from the sequence).
const TOKEN_UPSERT: &str = "INSERT INTO distlock_locks_tokens (name, token) \
     VALUES ($1, nextval('distlock_locks_fence')) \
     ON CONFLICT (name) DO UPDATE SET token = distlock_locks_tokens.token + 1 RETURNING token";

/// The cheapest hand-written row lock with a durable fencing token: the
/// lock's transaction on `conn`, the token's committed upsert on `tokens`
/// (a token drawn inside the lock's transaction is not durable before it
/// ends), then the end of the lock's transaction.
async fn durable_row(conn: &mut PgConnection, tokens: &mut PgConnection, name: &str) {
    sqlx::raw_sql(
        "BEGIN; SET LOCAL lock_timeout = 0; SET LOCAL idle_in_transaction_session_timeout = 30000",
    )
    .execute(&mut *conn)
    .await
    .expect("begin");
    lock_row(conn, name).await;
    let token: i64 = sqlx::query_scalar(TOKEN_UPSERT)
        .bind(name)
        .fetch_one(&mut *tokens)
        .await
        .expect("token");
    assert!(token > 0);
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut *conn)
        .await
        .expect("end");
}

/// The cheapest hand-written advisory lock with a durable fencing token:
/// one autocommit statement takes the lock (with the session's timeouts)
/// and then upserts the counter (the lock feeds the row, so it is held
/// first), so the token is committed when the reply comes; then the unlock.
async fn durable_advisory(conn: &mut PgConnection, name: &str) {
    let token: i64 = sqlx::query_scalar(
        "INSERT INTO distlock_locks_tokens (name, token) \
         SELECT $1, nextval('distlock_locks_fence') FROM (SELECT \
         set_config('lock_timeout', $2, false), set_config('idle_session_timeout', $3, false), \
         pg_advisory_lock(hashtextextended('distlock:' || $1, 0))) AS locked \
         ON CONFLICT (name) DO UPDATE SET token = distlock_locks_tokens.token + 1 RETURNING token",
    )
    .bind(name)
    .bind("0ms")
    .bind("30000ms")
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

#[tokio::main]
async fn main() {
    let row = PgLock::connect(&url()).await.expect("distlock row");
    let advisory = PgLock::connect(&format!("{}?mode=advisory", url()))
        .await
        .expect("distlock advisory");
    let row_plain = PgLock::connect(&format!("{}?fencing=false", url()))
        .await
        .expect("distlock row without fencing");
    let advisory_plain = PgLock::connect(&format!("{}?mode=advisory&fencing=false", url()))
        .await
        .expect("distlock advisory without fencing");
    let opts = LockOptions::new().auto_renew(false).wait(Wait::Forever);
    // Create the rows the raw cycles lock.
    for name in ["bench/raw", "bench/row", "bench/row-plain"] {
        row.acquire(name, &opts)
            .await
            .expect("warm")
            .release()
            .await
            .expect("release");
    }
    let mut conn = PgConnection::connect(&url()).await.expect("connection");
    let mut tokens = PgConnection::connect(&url()).await.expect("connection");
    let mut async_conn = PgConnection::connect(&url()).await.expect("connection");
    sqlx::raw_sql("SET synchronous_commit = off")
        .execute(&mut async_conn)
        .await
        .expect("session setting");

    let renewed = LockOptions::new().wait(Wait::Forever);
    let distlock = [
        (ROW, &row, "bench/row", &opts),
        (ROW_RENEWED, &row, "bench/row", &renewed),
        (ADVISORY, &advisory, "bench/advisory", &opts),
        (ADVISORY_RENEWED, &advisory, "bench/advisory", &renewed),
        (ROW_PLAIN, &row_plain, "bench/row-plain", &opts),
        (
            ADVISORY_PLAIN,
            &advisory_plain,
            "bench/advisory-plain",
            &opts,
        ),
    ];
    let mut m = Cycles::new("postgres", BLOCK);
    for round in 0..=ROUNDS {
        m.warm_up(round == 0);
        m.measure(RTT, async |_| {
            let _: i32 = sqlx::query_scalar("SELECT 1")
                .fetch_one(&mut conn)
                .await
                .expect("ping");
        })
        .await;
        m.measure(ROW_FLOOR, async |_| {
            durable_row(&mut conn, &mut tokens, "bench/raw").await
        })
        .await;
        m.measure(ADVISORY_FLOOR, async |_| {
            durable_advisory(&mut conn, "bench/raw").await
        })
        .await;
        m.measure(ROLLBACK, async |_| {
            raw_row(&mut conn, "bench/raw", "ROLLBACK").await
        })
        .await;
        m.measure(COMMIT, async |_| {
            raw_row(&mut conn, "bench/raw", "COMMIT").await
        })
        .await;
        m.measure(COMMIT_ASYNC, async |_| {
            raw_row(&mut async_conn, "bench/raw", "COMMIT").await
        })
        .await;
        m.measure(ROW_PLAIN_FLOOR, async |_| {
            raw_row_plain(&mut conn, "bench/raw").await
        })
        .await;
        m.measure(ADVISORY_PLAIN_FLOOR, async |_| {
            raw_advisory_plain(&mut conn, "bench/raw-plain").await
        })
        .await;
        for (label, lock, name, opts) in distlock {
            m.measure_lock(label, lock, name, opts).await;
        }
    }
    m.print();
    for (ours, floor) in [
        (ROW, ROW_FLOOR),
        (ROW_RENEWED, ROW_FLOOR),
        (ADVISORY, ADVISORY_FLOOR),
        (ADVISORY_RENEWED, ADVISORY_FLOOR),
        (ROW, ROW_PLAIN_FLOOR),
        (ADVISORY, ADVISORY_PLAIN_FLOOR),
        (ROW_PLAIN, ROW_PLAIN_FLOOR),
        (ADVISORY_PLAIN, ADVISORY_PLAIN_FLOOR),
        (COMMIT, ROLLBACK),
    ] {
        m.compare(ours, floor);
    }

    for (mode, base) in [
        ("row", url()),
        ("advisory", format!("{}?mode=advisory", url())),
    ] {
        let mut clients = Vec::new();
        for _ in 0..TASKS {
            clients
                .push(Arc::new(PgLock::connect(&base).await.expect("client"))
                    as Arc<dyn DistributedLock>);
        }
        let o = LockOptions::new()
            .auto_renew(false)
            .wait_timeout(Duration::from_secs(30));
        let run = contend_on(clients, "bench/contended", o, WORK, Duration::ZERO, RUN).await;
        print_runs(
            &format!(
                "{TASKS} tasks, a client each, {mode} mode; 1 ms of work inside, re-acquire at once"
            ),
            RUN,
            &[("distlock", &run)],
        );
        if let Some(rtt) = m.figures(RTT) {
            print_handoff_round_trips(&[("distlock", &run)], rtt.wall.0);
        }
    }
}
