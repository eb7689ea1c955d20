//! MySQL/MariaDB lock benchmark, in interleaved blocks
//! (`lock_testkit::bench::cycles`): distlock in row and advisory mode, with
//! and without the guard's renewal, against two hand-written floors on
//! plain sqlx: the cheapest lock whose fencing token is durable (committed
//! before the grant, as distlock's is) and the lock without a token
//! (against distlock with `fencing=false`); then contended hand-offs with 8
//! clients.
//!
//! ```sh
//! export $(scripts/services.sh env | xargs)
//! cargo bench -p lock-sql --features mysql --bench mysql
//! ```

use std::sync::Arc;
use std::time::Duration;

use lock_core::{DistributedLock, LockOptions, Wait};
use lock_sql::MySqlLock;
use lock_testkit::bench::cycles::Cycles;
use lock_testkit::bench::{contend_on, print_handoff_round_trips, print_runs};
use sqlx::{Connection, MySqlConnection};

/// Cycles per variant in a block, and rounds of blocks (after one to warm up).
const BLOCK: usize = 50;
const ROUNDS: usize = 20;
const RTT: &str = "round trip: SELECT 1";
const ROW_FLOOR: &str = "row floor: BEGIN; FOR UPDATE; token upsert; ROLLBACK";
const ROW: &str = "distlock row, auto-renew off";
const ROW_RENEWED: &str = "distlock row acquire + release";
const ADVISORY_FLOOR: &str = "advisory floor: GET_LOCK; token upsert; RELEASE_LOCK";
const ADVISORY: &str = "distlock advisory, auto-renew off";
const ADVISORY_RENEWED: &str = "distlock advisory acquire + release";
const ROW_PLAIN_FLOOR: &str = "row, no token: BEGIN; FOR UPDATE; ROLLBACK";
const ROW_PLAIN: &str = "distlock row, fencing=false";
const ADVISORY_PLAIN_FLOOR: &str = "advisory, no token: GET_LOCK; RELEASE_LOCK";
const ADVISORY_PLAIN: &str = "distlock advisory, fencing=false";
const TASKS: usize = 8;
const RUN: Duration = Duration::from_secs(4);
const WORK: Duration = Duration::from_millis(1);

fn url() -> String {
    std::env::var("DISTLOCK_TEST_MYSQL_URL")
        .expect("DISTLOCK_TEST_MYSQL_URL (see scripts/services.sh env)")
}

/// The counter's committed upsert distlock makes for each grant.
const TOKEN_UPSERT: &str = "INSERT INTO distlock_locks_tokens (name, token) \
     VALUES (?, LAST_INSERT_ID(1)) ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1)";

/// Advance `name`'s counter in one committed statement: the token.
async fn draw_token(conn: &mut MySqlConnection, name: &str) -> u64 {
    sqlx::query(TOKEN_UPSERT)
        .bind(name.as_bytes())
        .execute(&mut *conn)
        .await
        .expect("token")
        .last_insert_id()
}

/// The cheapest hand-written row lock with a durable fencing token: the
/// lock's transaction on `conn` (with the same timeouts), the token's
/// committed upsert on `tokens` (one drawn inside the lock's transaction is
/// not durable before it ends), then the end of the lock's transaction.
async fn durable_row(conn: &mut MySqlConnection, tokens: &mut MySqlConnection, name: &str) {
    sqlx::raw_sql(
        "SET SESSION innodb_lock_wait_timeout = 50, SESSION idle_transaction_timeout = 30; START TRANSACTION",
    )
    .execute(&mut *conn)
    .await
    .expect("begin");
    lock_row(conn, name).await;
    assert!(draw_token(tokens, name).await > 0);
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut *conn)
        .await
        .expect("end");
}

/// Lock `name`'s row in the open transaction on `conn`.
async fn lock_row(conn: &mut MySqlConnection, name: &str) {
    let row = sqlx::query("SELECT name FROM distlock_locks WHERE name = ? FOR UPDATE")
        .bind(name.as_bytes())
        .fetch_optional(&mut *conn)
        .await
        .expect("lock");
    assert!(row.is_some());
}

/// The hand-written row lock without a fencing token.
async fn raw_row_plain(conn: &mut MySqlConnection, name: &str) {
    sqlx::raw_sql("START TRANSACTION")
        .execute(&mut *conn)
        .await
        .expect("begin");
    lock_row(conn, name).await;
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut *conn)
        .await
        .expect("end");
}

/// `GET_LOCK` on `name` as a hand-written lock names it.
async fn get_lock(conn: &mut MySqlConnection, name: &str) {
    let granted: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 50)")
        .bind(name.as_bytes())
        .fetch_one(&mut *conn)
        .await
        .expect("lock");
    assert_eq!(granted, Some(1));
}

/// `RELEASE_LOCK` of what [`get_lock`] took.
async fn release_lock(conn: &mut MySqlConnection, name: &str) {
    let released: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
        .bind(name.as_bytes())
        .fetch_one(&mut *conn)
        .await
        .expect("unlock");
    assert_eq!(released, Some(1));
}

/// The hand-written advisory lock without a fencing token.
async fn raw_advisory_plain(conn: &mut MySqlConnection, name: &str) {
    get_lock(conn, name).await;
    release_lock(conn, name).await;
}

/// The cheapest hand-written advisory lock with a durable fencing token:
/// `GET_LOCK`, the token's committed upsert, `RELEASE_LOCK`.
async fn durable_advisory(conn: &mut MySqlConnection, name: &str) {
    get_lock(conn, name).await;
    assert!(draw_token(conn, name).await > 0);
    release_lock(conn, name).await;
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
    let mut tokens = MySqlConnection::connect(&url()).await.expect("connection");
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
    let mut m = Cycles::new("mysql", BLOCK);
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
    ] {
        m.compare(ours, floor);
    }
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
        if let Some(rtt) = m.figures(RTT) {
            print_handoff_round_trips(&[("distlock", &run)], rtt.wall.0);
        }
    }
}
