//! One client holds 2 000 auto-renewed advisory locks on Postgres and on
//! MySQL/MariaDB with a pool of 8 connections, through several renewal
//! rounds, and loses none: the locks share a few long-lived sessions
//! instead of taking a connection each.

use lock_core::DistributedLock;
use lock_testkit::faults::env;
use lock_testkit::scale::holds_many_renewed_locks;

const LOCKS: usize = 2_000;
const POOL: &str = "mode=advisory&max_connections=8&connect_timeout_ms=5000";

/// The URL in `var`, in advisory mode with a pool of 8.
fn url(var: &str) -> String {
    format!("{}?{POOL}", env(var))
}

async fn holds_two_thousand(lock: &dyn DistributedLock, what: &str) {
    // Names of this run apart from those of earlier runs.
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let report = holds_many_renewed_locks(lock, &format!("scale/{run:x}"), LOCKS).await;
    println!("{what}: {report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_holds_two_thousand_advisory_locks_on_a_pool_of_eight() {
    let lock = lock_sql::PgLock::connect(&url("DISTLOCK_TEST_POSTGRES_URL"))
        .await
        .expect("connect");
    holds_two_thousand(&lock, "postgres advisory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_holds_two_thousand_advisory_locks_on_a_pool_of_eight() {
    let lock = lock_sql::MySqlLock::connect(&url("DISTLOCK_TEST_MYSQL_URL"))
        .await
        .expect("connect");
    holds_two_thousand(&lock, "mysql advisory").await;
}
