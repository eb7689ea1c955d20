//! MariaDB faults: a holder process killed with SIGKILL, a holder's
//! connection killed on the server (by hand, or by a force-release that
//! must leave none of its own probes queued), and the server restarted
//! under a held lock. The restart stops the server, so these tests run one at a time (a
//! shared mutex) in this binary, apart from the conformance suite.

mod common;

use std::time::Duration;

use lock_core::{DistributedLock, LockError, LockOptions, LossReason, Wait};
use lock_sql::MySqlLock;
use lock_testkit::faults::{Restore, acquires_again, env, one_at_a_time, services, unique};
use tokio::sync::Mutex;
use tokio::time::Instant;

static SERIAL: Mutex<()> = Mutex::const_new(());

async fn client(mode: &str) -> MySqlLock {
    MySqlLock::connect(&format!(
        "{}?connect_timeout_ms=2000&mode={mode}",
        env("DISTLOCK_TEST_MYSQL_URL")
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
async fn a_killed_connection_fires_lost_and_the_next_token_is_larger() {
    let _serial = one_at_a_time(&SERIAL).await;
    for mode in ["row", "advisory"] {
        let (locks, other) = (client(mode).await, client(mode).await);
        let name = unique("killed-connection");
        let opts = LockOptions::new()
            .ttl(Duration::from_millis(1500))
            .wait(Wait::No);
        let g = locks.acquire(&name, &opts).await.expect("acquire");
        assert!(
            other.force_release(&name).await.expect("kill"),
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
            .expect("free after the kill");
        assert!(next.fencing_token() > g.fencing_token(), "{mode}");
        eprintln!(
            "mysql faults ({mode}): lost() {:?} after the connection was killed",
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
/// holder's connection, and its lock, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_process_frees_the_lock_at_once() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::killed_holder_frees_the_lock(
        "a_killed_holder_process_frees_the_lock_at_once",
        async || client("row").await,
        LockOptions::new(),
        Duration::ZERO,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_fires_lost_and_the_client_recovers() {
    let _serial = one_at_a_time(&SERIAL).await;
    let locks = client("row").await;
    let g = locks
        .acquire(
            &unique("restart"),
            &LockOptions::new()
                .ttl(Duration::from_millis(1500))
                .wait(Wait::No),
        )
        .await
        .expect("acquire");
    let restart = Restore::servers(["mysql"]);
    services(&["stop", "mysql"]);
    let stopped_at = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost() fires");
    eprintln!(
        "mysql faults: lost() ({reason:?}) {:?} after the server stopped",
        stopped_at.elapsed()
    );
    let during = locks.try_acquire(&unique("down"), &quick(5000)).await;
    assert!(
        matches!(during, Err(LockError::Unavailable { .. })),
        "expected Unavailable while the server is down, got {during:?}"
    );
    drop(restart);
    let recovered = acquires_again(&locks, &quick(5000), Duration::from_secs(30)).await;
    eprintln!("mysql faults: recovered {:?} after the restart", recovered);
}

/// See `common::warm_connections_do_not_starve_the_pool`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_connections_do_not_starve_the_pool() {
    let _serial = one_at_a_time(&SERIAL).await;
    let locks = MySqlLock::connect(&format!(
        "{}?mode=advisory&sessions=0&max_connections=2&connect_timeout_ms=2000",
        env("DISTLOCK_TEST_MYSQL_URL")
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
        common::tokens_survive_a_server_crash("mysql", &format!("mysql {mode}"), async || {
            MySqlLock::connect(&format!(
                "{}?connect_timeout_ms=2000&mode={mode}",
                env("DISTLOCK_TEST_MYSQL_URL")
            ))
            .await
        })
        .await;
    }
}

/// See `lock_testkit::faults::server_failure_gives_transient_errors`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_failure_gives_transient_errors() {
    let _serial = one_at_a_time(&SERIAL).await;
    for mode in ["row", "advisory"] {
        lock_testkit::faults::server_failure_gives_transient_errors(
            async || client(mode).await,
            &["mysql"],
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
            async || client(mode).await,
            &["mysql"],
            LockOptions::new().ttl(Duration::from_secs(5)),
        )
        .await;
    }
}

/// See `lock_testkit::faults::unrenewed_holder_learns_of_a_server_crash`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewed_holder_learns_of_a_server_crash() {
    let _serial = one_at_a_time(&SERIAL).await;
    for mode in ["row", "advisory"] {
        lock_testkit::faults::unrenewed_holder_learns_of_a_server_crash(
            async || client(mode).await,
            &["mysql"],
        )
        .await;
    }
}

/// An advisory-mode client with `sessions` shared sessions.
async fn advisory(sessions: usize) -> MySqlLock {
    MySqlLock::connect(&format!(
        "{}?connect_timeout_ms=2000&mode=advisory&sessions={sessions}",
        env("DISTLOCK_TEST_MYSQL_URL")
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
/// server's idle bound (`idle_transaction_timeout` / `wait_timeout`), set from the lease, ends the frozen
/// holder's session and its lock. The child runs the same test, so each
/// mode has a test of its own.
async fn a_frozen_holder_loses_its_lock(test: &str, mode: &str) {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::frozen_holder_loses_its_lock_to_a_later_token(
        test,
        async || client(mode).await,
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

/// Row-mode `force_release` finds each holder while other operators look
/// for theirs at the same moment. InnoDB refreshes its information_schema
/// lock tables only after 100 ms without a reader, so searches that polled
/// faster than that kept each other's snapshot stale and failed with "holder
/// could not be identified".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_row_force_releases_each_find_their_holder() {
    let _serial = one_at_a_time(&SERIAL).await;
    const N: usize = 4;
    let holder = client("row").await;
    // Renewed every second: the renewal learns of the killed connection.
    let opts = quick(3_000);
    let mut held = Vec::new();
    for i in 0..N {
        let name = unique(&format!("concurrent-force-{i}"));
        let g = holder.acquire(&name, &opts).await.expect("acquire");
        held.push((name, g));
    }
    // A monitoring tool that read InnoDB's lock tables until a moment ago:
    // the snapshot it left behind predates every search's probe.
    let monitor = lock_sql::sqlx::MySqlPool::connect(&env("DISTLOCK_TEST_MYSQL_URL"))
        .await
        .expect("monitor connects");
    let reading = tokio::spawn(async move {
        let until = Instant::now() + Duration::from_millis(1500);
        while Instant::now() < until {
            lock_sql::sqlx::query("SELECT COUNT(*) FROM information_schema.innodb_trx")
                .execute(&monitor)
                .await
                .expect("monitor reads");
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut searches = Vec::new();
    for (name, _) in &held {
        let name = name.clone();
        searches.push(tokio::spawn(async move {
            client("row").await.force_release(&name).await
        }));
    }
    let mut results = Vec::new();
    for search in searches {
        results.push(search.await.expect("search task"));
    }
    reading.await.expect("monitor task");
    for ((name, g), result) in held.iter().zip(results) {
        assert!(
            result.expect("the holder is identified"),
            "`{name}`: force_release found it held"
        );
        let reason = tokio::time::timeout(Duration::from_secs(5), g.lost())
            .await
            .expect("lost() fires once the holder's connection is killed");
        assert_eq!(reason, LossReason::TakenOver);
    }
}

/// Transactions of the server waiting for a row lock of the lock table, as
/// InnoDB's lock tables show them once they have been left unread for
/// 100 ms (they are a snapshot renewed only then).
async fn waiting_for_a_lock_row(monitor: &lock_sql::sqlx::MySqlPool) -> i64 {
    tokio::time::sleep(Duration::from_millis(300)).await;
    lock_sql::sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.innodb_trx \
         WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE '%distlock_locks%'",
    )
    .fetch_one(monitor)
    .await
    .expect("read InnoDB's transactions")
}

/// Row mode finds a holder by queueing a probe behind it and asking InnoDB
/// who blocks the probe. The probe must have left the queue before the
/// holder is killed: otherwise, once the waiter ahead of it is granted the
/// freed lock, the probe still waits behind it (its client gone, which the
/// server does not notice during a lock wait) and is handed the lock at
/// the waiter's release, holding it until it finds its client gone, ahead
/// of any newcomer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_force_release_leaves_no_probe_in_the_queue() {
    let _serial = one_at_a_time(&SERIAL).await;
    let monitor = lock_sql::sqlx::MySqlPool::connect(&env("DISTLOCK_TEST_MYSQL_URL"))
        .await
        .expect("monitor connects");
    let (holder, waiting, operator) = (
        client("row").await,
        client("row").await,
        client("row").await,
    );
    // A wait that another test left behind ends first (such a waiter ends
    // once it is granted and finds its client gone).
    let quiet = Instant::now();
    while waiting_for_a_lock_row(&monitor).await > 0 {
        assert!(
            quiet.elapsed() < Duration::from_secs(20),
            "lock waits from before the test never ended"
        );
    }
    let name = unique("force-release-probe");
    let g = holder
        .acquire(&name, &quick(30_000))
        .await
        .expect("acquire");
    let waiter = tokio::spawn({
        let name = name.clone();
        async move {
            waiting
                .acquire(
                    &name,
                    &quick(30_000).wait(Wait::Up(Duration::from_secs(20))),
                )
                .await
        }
    });
    let queued = Instant::now();
    while waiting_for_a_lock_row(&monitor).await < 1 {
        assert!(
            queued.elapsed() < Duration::from_secs(10),
            "the waiter never queued"
        );
    }
    assert!(operator.force_release(&name).await.expect("force_release"));
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is granted the freed lock")
        .expect("waiter task")
        .expect("the waiter's acquire");
    assert_eq!(
        waiting_for_a_lock_row(&monitor).await,
        0,
        "the holder search's probe still waits for the row after the force-release"
    );
    assert!(next.release().await.expect("release"));
    let newcomer = operator
        .try_acquire(&name, &quick(30_000))
        .await
        .expect("try")
        .expect("free for a newcomer at once after the waiter's release");
    assert!(newcomer.release().await.expect("release"));
    drop(g);
}

/// See `lock_testkit::faults::a_grant_answered_past_its_deadline_is_not_handed_out`:
/// a 1 s lease, its grant answered 1.3 s after the request (the grant is
/// confirmed, and its lease counted from the confirmation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_answered_past_its_deadline_is_not_handed_out() {
    let _serial = one_at_a_time(&SERIAL).await;
    for mode in ["row", "advisory"] {
        lock_testkit::faults::a_grant_answered_past_its_deadline_is_not_handed_out(
            async || client(mode).await,
            &["mysql"],
            LockOptions::new().ttl(Duration::from_secs(1)),
            Duration::from_millis(1300),
        )
        .await;
    }
}
