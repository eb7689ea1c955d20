//! A lock wait is a slow statement by design on Postgres and MySQL: it must
//! not fill the application's log with the SQL client's slow-statement
//! warnings. A wait of 1.5 s on each, under a subscriber that records
//! every warning.

use std::time::Duration;

use distlock::{LockOptions, Wait};

mod common;
use common::Captured;

fn env(var: &str) -> String {
    std::env::var(var)
        .unwrap_or_else(|_| panic!("{var} is not set: run the tests through scripts/test.sh"))
}

#[test]
fn waits_log_no_slow_statement_warnings() {
    let captured = Captured::default();
    let _default = tracing::subscriber::set_default(captured.subscriber(tracing::Level::WARN));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let postgres = env("DISTLOCK_TEST_POSTGRES_URL");
    let mysql = env("DISTLOCK_TEST_MYSQL_URL");
    for url in [
        postgres.clone(),
        format!("{postgres}?mode=advisory"),
        mysql.clone(),
        format!("{mysql}?mode=advisory"),
    ] {
        rt.block_on(async {
            let holder = distlock::connect(&url).await.expect("connect");
            let waiter = distlock::connect(&url).await.expect("connect");
            let name = format!("quiet-waits/{:016x}", rand::random::<u64>());
            let opts = LockOptions::new().ttl(Duration::from_secs(10));
            let held = holder.acquire(&name, &opts).await.expect("acquire");
            let release = async {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                held.release().await.expect("release");
            };
            let waiting = opts.clone().wait(Wait::UpTo(Duration::from_secs(10)));
            let wait = waiter.acquire(&name, &waiting);
            let ((), got) = tokio::join!(release, wait);
            got.expect("the waiter gets the lock")
                .release()
                .await
                .expect("release");
        });
    }
    let logs = captured.text();
    assert!(
        !logs.contains("slow statement"),
        "a lock wait was logged as a slow statement:\n{logs}"
    );
}
