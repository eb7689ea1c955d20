//! Postgres lock benchmark: distlock against the same SQL sent with plain
//! sqlx on one connection (the floor), in row and advisory mode, in one run;
//! then the ways of ending a row-lock transaction (why release is a
//! ROLLBACK); then contended hand-offs with 8 clients.
//!
//! ```sh
//! export $(scripts/services.sh env | xargs)
//! cargo bench -p lock-sql --features postgres --bench postgres
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{DistributedLock, LockOptions, Wait};
use lock_sql::PgLock;
use lock_testkit::bench::{contend_on, percentiles, print_runs, us};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

const SAMPLES: usize = 1_000;
const TASKS: usize = 8;
const RUN: Duration = Duration::from_secs(4);
const WORK: Duration = Duration::from_millis(1);

fn url() -> String {
    std::env::var("DISTLOCK_TEST_POSTGRES_URL")
        .expect("DISTLOCK_TEST_POSTGRES_URL (see scripts/services.sh env)")
}

/// One row-lock cycle on a plain connection, ending the transaction with
/// `end` (`ROLLBACK` or `COMMIT`).
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

/// The hand-written row lock without a fencing token.
async fn raw_row_plain(conn: &mut PgConnection, name: &str) {
    sqlx::raw_sql("BEGIN")
        .execute(&mut *conn)
        .await
        .expect("begin");
    let row: Option<String> =
        sqlx::query_scalar("SELECT name FROM distlock_locks WHERE name = $1 FOR UPDATE")
            .bind(name)
            .fetch_optional(&mut *conn)
            .await
            .expect("lock");
    assert!(row.is_some());
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

async fn raw_advisory(conn: &mut PgConnection, name: &str) {
    let token: Option<i64> = sqlx::query_scalar(
        "SELECT CASE WHEN set_config('lock_timeout', $2, false) IS NOT NULL \
         AND set_config('idle_session_timeout', $3, false) IS NOT NULL \
         AND pg_advisory_lock(hashtextextended('distlock:' || $1, 0)) IS NOT NULL \
         THEN nextval('distlock_locks_fence') END",
    )
    .bind(name)
    .bind("0ms")
    .bind("30000ms")
    .fetch_one(&mut *conn)
    .await
    .expect("lock");
    assert!(token.is_some());
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
    let mut async_conn = PgConnection::connect(&url()).await.expect("connection");
    sqlx::raw_sql("SET synchronous_commit = off")
        .execute(&mut async_conn)
        .await
        .expect("session setting");

    let mut samples: [Vec<Duration>; 11] = Default::default();
    for i in 0..SAMPLES + SAMPLES / 10 {
        let keep = i >= SAMPLES / 10; // the first tenth warms up
        let mut row_sample = [Duration::ZERO; 11];
        let t = Instant::now();
        let _: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut conn)
            .await
            .expect("ping");
        row_sample[0] = t.elapsed();

        let t = Instant::now();
        raw_row(&mut conn, "bench/raw", "ROLLBACK").await;
        row_sample[1] = t.elapsed();

        let t = Instant::now();
        let g = row.acquire("bench/row", &opts).await.expect("acquire");
        assert!(g.release().await.expect("release"));
        row_sample[2] = t.elapsed();

        let t = Instant::now();
        raw_advisory(&mut conn, "bench/raw").await;
        row_sample[3] = t.elapsed();

        let t = Instant::now();
        let g = advisory
            .acquire("bench/advisory", &opts)
            .await
            .expect("acquire");
        assert!(g.release().await.expect("release"));
        row_sample[4] = t.elapsed();

        let t = Instant::now();
        raw_row(&mut conn, "bench/raw", "COMMIT").await;
        row_sample[5] = t.elapsed();

        let t = Instant::now();
        raw_row(&mut async_conn, "bench/raw", "COMMIT").await;
        row_sample[6] = t.elapsed();

        let t = Instant::now();
        raw_row_plain(&mut conn, "bench/raw").await;
        row_sample[7] = t.elapsed();

        let t = Instant::now();
        let g = row_plain
            .acquire("bench/row-plain", &opts)
            .await
            .expect("acquire");
        assert!(g.release().await.expect("release"));
        row_sample[8] = t.elapsed();

        let t = Instant::now();
        raw_advisory_plain(&mut conn, "bench/raw-plain").await;
        row_sample[9] = t.elapsed();

        let t = Instant::now();
        let g = advisory_plain
            .acquire("bench/advisory-plain", &opts)
            .await
            .expect("acquire");
        assert!(g.release().await.expect("release"));
        row_sample[10] = t.elapsed();

        if keep {
            for (v, d) in samples.iter_mut().zip(row_sample) {
                v.push(d);
            }
        }
    }
    let [
        ping,
        raw_row_p,
        ours_row,
        raw_adv,
        ours_adv,
        commit,
        commit_async,
        plain_row_p,
        ours_row_plain,
        plain_adv,
        ours_adv_plain,
    ] = samples.map(percentiles);
    println!("uncontended cycle (p50 / p99, µs)");
    for (what, (p50, p99)) in [
        ("SELECT 1 round trip", ping),
        ("row floor: BEGIN; FOR UPDATE; ROLLBACK (sqlx)", raw_row_p),
        ("distlock row acquire + release", ours_row),
        ("advisory floor: lock; unlock (sqlx)", raw_adv),
        ("distlock advisory acquire + release", ours_adv),
        ("row cycle ending in COMMIT", commit),
        ("row cycle, COMMIT, synchronous_commit=off", commit_async),
        ("row, no token: BEGIN; FOR UPDATE; ROLLBACK", plain_row_p),
        ("distlock row, fencing=false", ours_row_plain),
        ("advisory, no token: lock; unlock", plain_adv),
        ("distlock advisory, fencing=false", ours_adv_plain),
    ] {
        println!("  {what:<46} {:>8.1} / {:>8.1}", us(p50), us(p99));
    }
    let ratio =
        |a: (Duration, Duration), b: (Duration, Duration)| a.0.as_secs_f64() / b.0.as_secs_f64();
    println!(
        "  row / floor: {:.3}x   advisory / floor: {:.3}x   COMMIT / ROLLBACK: {:.2}x   (p50)",
        ratio(ours_row, raw_row_p),
        ratio(ours_adv, raw_adv),
        ratio(commit, raw_row_p)
    );
    println!(
        "  fencing=false, against the hand-written lock without a token: row {:.3}x   advisory {:.3}x   (p50)",
        ratio(ours_row_plain, plain_row_p),
        ratio(ours_adv_plain, plain_adv)
    );

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
    }
}
