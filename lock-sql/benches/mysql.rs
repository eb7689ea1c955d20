//! MySQL/MariaDB lock benchmark: distlock against the same SQL sent with
//! plain sqlx on one connection (the floor), in row and advisory mode, in
//! one run; then contended hand-offs with 8 clients.
//!
//! ```sh
//! export $(scripts/services.sh env | xargs)
//! cargo bench -p lock-sql --features mysql --bench mysql
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{DistributedLock, LockOptions, Wait};
use lock_sql::MySqlLock;
use lock_testkit::bench::{contend_on, percentiles, print_runs, us};
use sqlx::{Connection, MySqlConnection};

const SAMPLES: usize = 1_000;
const TASKS: usize = 8;
const RUN: Duration = Duration::from_secs(4);
const WORK: Duration = Duration::from_millis(1);

fn url() -> String {
    std::env::var("DISTLOCK_TEST_MYSQL_URL")
        .expect("DISTLOCK_TEST_MYSQL_URL (see scripts/services.sh env)")
}

async fn raw_row(conn: &mut MySqlConnection, name: &str) {
    sqlx::raw_sql(
        "SET SESSION innodb_lock_wait_timeout = 50, SESSION idle_transaction_timeout = 30; START TRANSACTION",
    )
    .execute(&mut *conn)
    .await
    .expect("begin");
    let row = sqlx::query("SELECT name FROM distlock_locks WHERE name = ? FOR UPDATE")
        .bind(name.as_bytes())
        .fetch_optional(&mut *conn)
        .await
        .expect("lock");
    assert!(row.is_some());
    let fence = sqlx::raw_sql("INSERT INTO distlock_locks_fence () VALUES ()")
        .execute(&mut *conn)
        .await
        .expect("fence");
    assert!(fence.last_insert_id() > 0);
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut *conn)
        .await
        .expect("end");
}

/// The hand-written row lock without a fencing token.
async fn raw_row_plain(conn: &mut MySqlConnection, name: &str) {
    sqlx::raw_sql("START TRANSACTION")
        .execute(&mut *conn)
        .await
        .expect("begin");
    let row = sqlx::query("SELECT name FROM distlock_locks WHERE name = ? FOR UPDATE")
        .bind(name.as_bytes())
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
async fn raw_advisory_plain(conn: &mut MySqlConnection, name: &str) {
    let granted: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 50)")
        .bind(name.as_bytes())
        .fetch_one(&mut *conn)
        .await
        .expect("lock");
    assert_eq!(granted, Some(1));
    let released: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
        .bind(name.as_bytes())
        .fetch_one(&mut *conn)
        .await
        .expect("unlock");
    assert_eq!(released, Some(1));
}

async fn raw_advisory(conn: &mut MySqlConnection, name: &str) {
    let granted: Option<i64> =
        sqlx::query_scalar("SELECT GET_LOCK(CONCAT('dl:', LEFT(SHA2(?, 256), 61)), ?)")
            .bind(name.as_bytes())
            .bind(50u64)
            .fetch_one(&mut *conn)
            .await
            .expect("lock");
    assert_eq!(granted, Some(1));
    let rows = sqlx::raw_sql(
        "SET SESSION wait_timeout = 30; START TRANSACTION; INSERT INTO distlock_locks_fence () VALUES (); ROLLBACK; SELECT LAST_INSERT_ID()",
    )
    .fetch_all(&mut *conn)
    .await
    .expect("fence");
    assert!(!rows.is_empty());
    let released: Option<i64> =
        sqlx::query_scalar("SELECT RELEASE_LOCK(CONCAT('dl:', LEFT(SHA2(?, 256), 61)))")
            .bind(name.as_bytes())
            .fetch_one(&mut *conn)
            .await
            .expect("unlock");
    assert_eq!(released, Some(1));
}

#[tokio::main]
async fn main() {
    let row = MySqlLock::connect(&url()).await.expect("distlock row");
    let advisory = MySqlLock::connect(&format!("{}?mode=advisory", url()))
        .await
        .expect("distlock advisory");
    let row_plain = MySqlLock::connect(&format!("{}?fencing=false", url()))
        .await
        .expect("distlock row without fencing");
    let advisory_plain = MySqlLock::connect(&format!("{}?mode=advisory&fencing=false", url()))
        .await
        .expect("distlock advisory without fencing");
    let opts = LockOptions::new().auto_renew(false).wait(Wait::Forever);
    for name in ["bench/raw", "bench/row", "bench/row-plain"] {
        row.acquire(name, &opts)
            .await
            .expect("warm")
            .release()
            .await
            .expect("release");
    }
    let mut conn = MySqlConnection::connect(&url()).await.expect("connection");
    let mut samples: [Vec<Duration>; 9] = Default::default();
    for i in 0..SAMPLES + SAMPLES / 10 {
        let keep = i >= SAMPLES / 10;
        let mut sample = [Duration::ZERO; 9];
        let t = Instant::now();
        let _: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut conn)
            .await
            .expect("ping");
        sample[0] = t.elapsed();
        let t = Instant::now();
        raw_row(&mut conn, "bench/raw").await;
        sample[1] = t.elapsed();
        let t = Instant::now();
        let g = row.acquire("bench/row", &opts).await.expect("acquire");
        assert!(g.release().await.expect("release"));
        sample[2] = t.elapsed();
        let t = Instant::now();
        raw_advisory(&mut conn, "bench/raw").await;
        sample[3] = t.elapsed();
        let t = Instant::now();
        let g = advisory
            .acquire("bench/advisory", &opts)
            .await
            .expect("acquire");
        assert!(g.release().await.expect("release"));
        sample[4] = t.elapsed();
        let t = Instant::now();
        raw_row_plain(&mut conn, "bench/raw").await;
        sample[5] = t.elapsed();
        let t = Instant::now();
        let g = row_plain
            .acquire("bench/row-plain", &opts)
            .await
            .expect("acquire");
        assert!(g.release().await.expect("release"));
        sample[6] = t.elapsed();
        let t = Instant::now();
        raw_advisory_plain(&mut conn, "bench/raw-plain").await;
        sample[7] = t.elapsed();
        let t = Instant::now();
        let g = advisory_plain
            .acquire("bench/advisory-plain", &opts)
            .await
            .expect("acquire");
        assert!(g.release().await.expect("release"));
        sample[8] = t.elapsed();
        if keep {
            for (v, d) in samples.iter_mut().zip(sample) {
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
        plain_row_p,
        ours_row_plain,
        plain_adv,
        ours_adv_plain,
    ] = samples.map(percentiles);
    println!("uncontended cycle (p50 / p99, µs)");
    for (what, (p50, p99)) in [
        ("SELECT 1 round trip", ping),
        ("row floor: BEGIN; FOR UPDATE; fence; ROLLBACK", raw_row_p),
        ("distlock row acquire + release", ours_row),
        ("advisory floor: GET_LOCK; fence; RELEASE_LOCK", raw_adv),
        ("distlock advisory acquire + release", ours_adv),
        ("row, no token: BEGIN; FOR UPDATE; ROLLBACK", plain_row_p),
        ("distlock row, fencing=false", ours_row_plain),
        ("advisory, no token: GET_LOCK; RELEASE_LOCK", plain_adv),
        ("distlock advisory, fencing=false", ours_adv_plain),
    ] {
        println!("  {what:<46} {:>8.1} / {:>8.1}", us(p50), us(p99));
    }
    let ratio =
        |a: (Duration, Duration), b: (Duration, Duration)| a.0.as_secs_f64() / b.0.as_secs_f64();
    println!(
        "  row / floor: {:.3}x   advisory / floor: {:.3}x   (p50)",
        ratio(ours_row, raw_row_p),
        ratio(ours_adv, raw_adv)
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
            clients.push(Arc::new(MySqlLock::connect(&base).await.expect("client"))
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
