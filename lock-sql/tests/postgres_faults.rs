//! Postgres faults and the lock's transaction: a holder process killed with
//! SIGKILL, a holder's session terminated on the server, the server
//! restarted under a held lock, and the atomicity of writes committed with
//! the release.
//!
//! The restart stops the server, so these tests run one at a time (a shared
//! mutex) in this binary, apart from the conformance suite.

mod common;

use std::time::Duration;

use lock_core::{DistributedLock, LockError, LockOptions, LossReason, Wait};
use lock_sql::PgLock;
use lock_testkit::faults::{Restore, acquires_again, env, one_at_a_time, services, unique};
use tokio::sync::Mutex;
use tokio::time::Instant;

static SERIAL: Mutex<()> = Mutex::const_new(());

async fn client() -> PgLock {
    client_in("row").await
}

async fn client_in(mode: &str) -> PgLock {
    PgLock::connect(&format!(
        "{}?connect_timeout_ms=2000&mode={mode}",
        env("DISTLOCK_TEST_POSTGRES_URL")
    ))
    .await
    .expect("connect")
}

fn quick(ttl_ms: u64) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_millis(ttl_ms))
        .wait(Wait::No)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_transaction_leaves_neither_the_write_nor_the_lock() {
    let _serial = one_at_a_time(&SERIAL).await;
    let locks = client().await;
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
    let other = client().await;
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
    let v: i32 = sqlx::query_scalar(sqlx::AssertSqlSafe(read.clone()))
        .fetch_one(
            other
                .begin(&unique("read"), &quick(5000))
                .await
                .expect("begin")
                .conn()
                .expect("conn"),
        )
        .await
        .expect("read");
    assert_eq!(v, 0, "the write of the failed transaction survived");

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
    let v: i32 = sqlx::query_scalar(sqlx::AssertSqlSafe(read))
        .fetch_one(
            other
                .begin(&unique("read"), &quick(5000))
                .await
                .expect("begin")
                .conn()
                .expect("conn"),
        )
        .await
        .expect("read");
    assert_eq!(v, 1, "the committed write is there");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_session_fires_lost_and_the_next_token_is_larger() {
    let _serial = one_at_a_time(&SERIAL).await;
    for mode in ["row", "advisory"] {
        let url = format!("{}?mode={mode}", env("DISTLOCK_TEST_POSTGRES_URL"));
        let (locks, other) = (
            PgLock::connect(&url).await.expect("connect"),
            PgLock::connect(&url).await.expect("connect"),
        );
        let name = unique("terminated");
        let opts = LockOptions::new()
            .ttl(Duration::from_millis(900))
            .wait(Wait::No);
        let g = locks.acquire(&name, &opts).await.expect("acquire");
        assert!(
            other.force_release(&name).await.expect("terminate"),
            "{mode}: holder found"
        );
        let start = Instant::now();
        let reason = tokio::time::timeout(Duration::from_secs(3), g.lost())
            .await
            .expect("lost() fires");
        assert_eq!(reason, LossReason::TakenOver, "{mode}");
        let next = other
            .try_acquire(&name, &opts)
            .await
            .expect("try")
            .expect("free after the termination");
        assert!(next.fencing_token() > g.fencing_token(), "{mode}");
        eprintln!(
            "postgres faults ({mode}): lost() {:?} after the session was terminated",
            start.elapsed()
        );
        assert!(
            !g.release().await.expect("release"),
            "{mode}: not held any more"
        );
        assert!(next.release().await.expect("release"));
    }
}

/// See `lock_testkit::faults::killed_holder_frees_the_lock`: the server ends the dead
/// holder's session, and its lock, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_process_frees_the_lock_at_once() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::killed_holder_frees_the_lock(
        "a_killed_holder_process_frees_the_lock_at_once",
        client,
        LockOptions::new(),
        Duration::ZERO,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_fires_lost_and_the_client_recovers() {
    let _serial = one_at_a_time(&SERIAL).await;
    let locks = client().await;
    let name = unique("restart");
    let g = locks
        .acquire(
            &name,
            &LockOptions::new()
                .ttl(Duration::from_millis(1500))
                .wait(Wait::No),
        )
        .await
        .expect("acquire");
    let restart = Restore::servers(["postgres"]);
    services(&["stop", "postgres"]);
    let stopped_at = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost() fires");
    eprintln!(
        "postgres faults: lost() ({reason:?}) {:?} after the server stopped",
        stopped_at.elapsed()
    );
    let during = locks.try_acquire(&unique("down"), &quick(5000)).await;
    assert!(
        matches!(during, Err(LockError::Unavailable { .. })),
        "expected Unavailable while the server is down, got {during:?}"
    );
    drop(restart);
    let recovered = acquires_again(&locks, &quick(5000), Duration::from_secs(20)).await;
    eprintln!(
        "postgres faults: recovered {:?} after the restart",
        recovered
    );
}

/// See `common::warm_connections_do_not_starve_the_pool`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_connections_do_not_starve_the_pool() {
    let _serial = one_at_a_time(&SERIAL).await;
    let locks = PgLock::connect(&format!(
        "{}?max_connections=2&connect_timeout_ms=2000",
        env("DISTLOCK_TEST_POSTGRES_URL")
    ))
    .await
    .expect("connect");
    common::warm_connections_do_not_starve_the_pool(&locks, async |name| {
        locks.force_release(name).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_survive_a_server_crash() {
    let _serial = one_at_a_time(&SERIAL).await;
    for mode in ["row", "advisory"] {
        common::tokens_survive_a_server_crash(
            "postgres",
            &format!("postgres {mode}"),
            async || {
                PgLock::connect(&format!(
                    "{}?connect_timeout_ms=2000&mode={mode}",
                    env("DISTLOCK_TEST_POSTGRES_URL")
                ))
                .await
            },
        )
        .await;
    }
}

/// See `lock_testkit::faults::server_failure_gives_transient_errors`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_failure_gives_transient_errors() {
    let _serial = one_at_a_time(&SERIAL).await;
    for mode in ["row", "advisory"] {
        lock_testkit::faults::server_failure_gives_transient_errors(
            async || client_in(mode).await,
            &["postgres"],
            LockOptions::new().ttl(Duration::from_secs(5)),
        )
        .await;
    }
}

/// See `lock_testkit::faults::frozen_server_bounds_waits_and_releases`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_server_bounds_waits_and_releases() {
    let _serial = one_at_a_time(&SERIAL).await;
    for mode in ["row", "advisory"] {
        lock_testkit::faults::frozen_server_bounds_waits_and_releases(
            async || client_in(mode).await,
            &["postgres"],
            LockOptions::new().ttl(Duration::from_secs(5)),
        )
        .await;
    }
}

/// See `lock_testkit::faults::unrenewed_holder_learns_of_a_server_crash`: the server's
/// crash ends the holder's session and its lock; the holder's guard, though
/// not renewed, is checked, and its `lost()` fires before the restarted
/// server grants the lock to another client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewed_holder_learns_of_a_server_crash() {
    let _serial = one_at_a_time(&SERIAL).await;
    for mode in ["row", "advisory"] {
        lock_testkit::faults::unrenewed_holder_learns_of_a_server_crash(
            async || client_in(mode).await,
            &["postgres"],
        )
        .await;
    }
}

/// An advisory-mode client with `sessions` shared sessions.
async fn advisory(sessions: usize) -> PgLock {
    PgLock::connect(&format!(
        "{}?connect_timeout_ms=2000&mode=advisory&sessions={sessions}",
        env("DISTLOCK_TEST_POSTGRES_URL")
    ))
    .await
    .expect("connect")
}

/// See `common::a_lost_session_loses_exactly_its_locks`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_loses_exactly_its_locks() {
    let _serial = one_at_a_time(&SERIAL).await;
    let (locks, other) = (advisory(2).await, advisory(2).await);
    common::a_lost_session_loses_exactly_its_locks(&locks, &other, async |name| {
        other.force_release(name).await
    })
    .await;
}

/// See `common::a_quiet_session_ended_by_the_server_is_replaced`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_session_ended_by_the_server_is_replaced() {
    let _serial = one_at_a_time(&SERIAL).await;
    common::a_quiet_session_ended_by_the_server_is_replaced(&advisory(1).await, &advisory(1).await)
        .await;
}

/// See `common::a_leaked_guard_expires_beside_renewed_locks`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaked_guard_expires_beside_renewed_locks() {
    let _serial = one_at_a_time(&SERIAL).await;
    common::a_leaked_guard_expires_beside_renewed_locks(&advisory(1).await, &advisory(1).await)
        .await;
}

/// See `common::a_held_name_is_not_granted_twice_on_one_session`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_name_is_not_granted_twice_on_one_session() {
    let _serial = one_at_a_time(&SERIAL).await;
    common::a_held_name_is_not_granted_twice_on_one_session(&advisory(1).await).await;
}

/// See `lock_testkit::faults::frozen_holder_loses_its_lock_to_a_later_token`: the
/// server's idle bound (`idle_in_transaction_session_timeout` / `idle_session_timeout`), set from the lease, ends the frozen
/// holder's session and its lock. The child runs the same test, so each
/// mode has a test of its own.
async fn a_frozen_holder_loses_its_lock(test: &str, mode: &str) {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::frozen_holder_loses_its_lock_to_a_later_token(
        test,
        async || client_in(mode).await,
        LockOptions::new().ttl(Duration::from_secs(2)),
        Duration::from_secs(3),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_row_holder_loses_its_lock_to_a_later_token() {
    a_frozen_holder_loses_its_lock("a_frozen_row_holder_loses_its_lock_to_a_later_token", "row")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_advisory_holder_loses_its_lock_to_a_later_token() {
    a_frozen_holder_loses_its_lock(
        "a_frozen_advisory_holder_loses_its_lock_to_a_later_token",
        "advisory",
    )
    .await;
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
         CREATE OR REPLACE TRIGGER refuse BEFORE INSERT OR UPDATE ON {table}_tokens \
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
        "DROP TABLE {table}_tokens, {table}; DROP SEQUENCE {table}_fence; \
         DROP FUNCTION {table}_refuse()"
    )))
    .execute(&admin)
    .await
    .expect("drop the case's tables");
}

/// See `lock_testkit::faults::a_grant_answered_past_its_deadline_is_not_handed_out`:
/// a 1 s lease, its grant answered 1.3 s after the request (the grant is
/// confirmed, and its lease counted from the confirmation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_answered_past_its_deadline_is_not_handed_out() {
    let _serial = one_at_a_time(&SERIAL).await;
    for mode in ["row", "advisory"] {
        lock_testkit::faults::a_grant_answered_past_its_deadline_is_not_handed_out(
            async || client_in(mode).await,
            &["postgres"],
            LockOptions::new().ttl(Duration::from_secs(1)),
            Duration::from_millis(1300),
        )
        .await;
    }
}
