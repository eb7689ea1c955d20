//! MariaDB faults. The faults every session-lock dialect meets (a holder
//! process killed, the server restarted, crashed or frozen, shared
//! sessions lost) are written once in `common::session_fault_tests!`;
//! here, besides: a holder's connection killed on the server, by hand or
//! by force-releases that must find their holders side by side and leave
//! none of their probes queued.
//!
//! These tests stop the server, so they run one at a time (a shared
//! mutex) in this binary, apart from the conformance suite.

#[macro_use]
mod common;

use std::time::Duration;

use lock_core::{DistributedLock, LossReason, Wait};
use lock_testkit::faults::{env, one_at_a_time, unique};
use tokio::time::Instant;

session_fault_tests! {
    lock: lock_sql::MySqlLock,
    url: "DISTLOCK_TEST_MYSQL_URL",
    server: "mysql",
    warm_pool: "mode=advisory&sessions=0&max_connections=2&connect_timeout_ms=2000",
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
                    &quick(30_000).wait(Wait::UpTo(Duration::from_secs(20))),
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
