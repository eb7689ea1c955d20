//! Postgres faults and the lock's transaction. The faults every
//! session-lock dialect meets (a holder process killed, the server
//! restarted, crashed or frozen, shared sessions lost) are written once in
//! `common::session_fault_tests!`; here, besides: a holder's session
//! terminated on the server, an advisory grant whose token write fails,
//! and the atomicity of writes committed with the release.
//!
//! These tests stop the server, so they run one at a time (a shared
//! mutex) in this binary, apart from the conformance suite.

#[macro_use]
mod common;

use std::time::Duration;

use lock_core::{DistributedLock, LockError, LockOptions, Wait};
use lock_sql::PgLock;
use lock_testkit::faults::{env, one_at_a_time, unique};
use tokio::time::Instant;

session_fault_tests! {
    lock: PgLock,
    url: "DISTLOCK_TEST_POSTGRES_URL",
    server: "postgres",
    warm_pool: "max_connections=2&connect_timeout_ms=2000",
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_transaction_leaves_neither_the_write_nor_the_lock() {
    let _serial = one_at_a_time(&SERIAL).await;
    let locks = client("row").await;
    let table = unique("tx")
        .replace(['/', '-'], "_")
        .replace("faults_tx_", "tx_test_");
    let mut setup = locks
        .begin(&unique("setup"), &quick(5000))
        .await
        .expect("begin");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (id INT PRIMARY KEY, v INT NOT NULL); INSERT INTO {table} VALUES (1, 0)"
    )))
    .execute(setup.conn().expect("conn"))
    .await
    .expect("setup");
    setup.commit().await.expect("commit setup");
    let name = unique("tx");
    let update = format!("UPDATE {table} SET v = v + 1 WHERE id = 1");
    let read = format!("SELECT v FROM {table} WHERE id = 1");

    // A failure between the write and the commit: the transaction is
    // dropped. Neither the write nor the lock survives it.
    let mut tx = locks.begin(&name, &quick(5000)).await.expect("begin");
    let first = tx.fencing_token().expect("token");
    sqlx::query(sqlx::AssertSqlSafe(update.clone()))
        .execute(tx.conn().expect("conn"))
        .await
        .expect("write");
    drop(tx);
    let other = client("row").await;
    let start = Instant::now();
    let g = other
        .acquire(&name, &quick(5000).wait_timeout(Duration::from_secs(5)))
        .await
        .expect("the lock is free after the failed transaction");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert!(g.fencing_token().expect("token") > first);
    assert!(g.release().await.expect("release"));
    assert_eq!(
        read_back(&other, &read).await,
        0,
        "the write of the failed transaction survived"
    );

    // A commit applies the write and frees the lock, together.
    let mut tx = locks.begin(&name, &quick(5000)).await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(update))
        .execute(tx.conn().expect("conn"))
        .await
        .expect("write");
    assert!(
        other
            .try_acquire(&name, &quick(5000))
            .await
            .expect("try")
            .is_none()
    );
    tx.commit().await.expect("commit");
    let g = other
        .try_acquire(&name, &quick(5000))
        .await
        .expect("try")
        .expect("free after the commit");
    assert!(g.release().await.expect("release"));
    assert_eq!(
        read_back(&other, &read).await,
        1,
        "the committed write is there"
    );
}

/// The value `read` selects, read in a lock transaction of its own.
async fn read_back(locks: &PgLock, read: &str) -> i32 {
    let mut tx = locks
        .begin(&unique("read"), &quick(5000))
        .await
        .expect("begin");
    sqlx::query_scalar(sqlx::AssertSqlSafe(read.to_string()))
        .fetch_one(tx.conn().expect("conn"))
        .await
        .expect("read")
}

/// An advisory grant draws its token in the lock's own statement. When the
/// token's write fails (here a trigger refuses every write to the token
/// table), the acquisition fails and the lock is free again at once: a
/// shared session gives it back, a connection of its own is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_advisory_grant_whose_token_write_fails_leaves_the_lock_free() {
    let _serial = one_at_a_time(&SERIAL).await;
    let table = format!("poison_{}", std::process::id());
    let url = |more: &str| {
        format!(
            "{}?connect_timeout_ms=2000&mode=advisory&table={table}{more}",
            env("DISTLOCK_TEST_POSTGRES_URL")
        )
    };
    // Without fencing no token is written: it tells whether the lock is free.
    let probe = PgLock::connect(&url("&fencing=false"))
        .await
        .expect("connect the probe");
    let admin = sqlx::PgPool::connect(&env("DISTLOCK_TEST_POSTGRES_URL"))
        .await
        .expect("connect for the trigger");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE OR REPLACE FUNCTION {table}_refuse() RETURNS trigger LANGUAGE plpgsql \
         AS $$ BEGIN RAISE EXCEPTION 'token write refused'; END $$; \
         CREATE OR REPLACE TRIGGER refuse BEFORE INSERT OR UPDATE ON {table}_counters \
         FOR EACH ROW EXECUTE FUNCTION {table}_refuse()"
    )))
    .execute(&admin)
    .await
    .expect("create the trigger");
    let shared = PgLock::connect(&url("")).await.expect("connect");
    let own = PgLock::connect(&url("&sessions=0")).await.expect("connect");
    let once = LockOptions::new().wait(Wait::No);
    let waiting = LockOptions::new().wait_timeout(Duration::from_secs(5));
    for (how, locks, opts) in [
        ("on a shared session", &shared, &once),
        ("on a connection of its own, one attempt", &own, &once),
        ("on a connection of its own, waiting", &own, &waiting),
    ] {
        let name = unique("token-refused");
        let failed = locks.acquire(&name, opts).await;
        assert!(
            matches!(&failed, Err(LockError::Backend { .. })),
            "{how}: a grant without its token answered {failed:?}"
        );
        let g = probe
            .acquire(&name, &LockOptions::new().wait(Wait::No))
            .await
            .unwrap_or_else(|e| panic!("{how}: the failed grant left the lock held: {e}"));
        assert!(g.release().await.expect("release"));
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE {table}_counters, {table}_run, {table}_epoch, {table}; \
         DROP FUNCTION {table}_refuse()"
    )))
    .execute(&admin)
    .await
    .expect("drop the case's tables");
}

/// One Postgres backend process killed with SIGKILL while tokens are being
/// drawn: the postmaster ends every session and runs crash recovery without
/// restarting (which empties the unlogged token counters, and which
/// `pg_postmaster_start_time()` does not show). Tokens keep rising across
/// it, in both modes. See `common::tokens_rise_across`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_survive_a_backend_crash() {
    let _serial = one_at_a_time(&SERIAL).await;
    let kill_a_backend = || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let mut victim = <sqlx::PgConnection as sqlx::Connection>::connect(&env(
                "DISTLOCK_TEST_POSTGRES_URL",
            ))
            .await
            .expect("connect the victim");
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut victim)
                .await
                .expect("its pid");
            let killed = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()
                .expect("kill");
            assert!(killed.success(), "kill -KILL {pid}");
        });
    };
    tokens_rise_across("a backend killed", || kill_a_backend).await;
}
