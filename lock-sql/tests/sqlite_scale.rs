//! One client holds 2 000 auto-renewed locks in one SQLite file through
//! several renewal rounds, and loses none (renewals share transactions).

use lock_sql::{SqliteConfig, SqliteLock};
use lock_testkit::scale::holds_many_renewed_locks;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_renewed_locks_stay_held() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lock = SqliteLock::open(dir.path().join("locks.db"), SqliteConfig::default())
        .await
        .expect("open the lock file");
    let run = holds_many_renewed_locks(&lock, "scale", 2_000).await;
    println!("sqlite: {run:?}");
}
