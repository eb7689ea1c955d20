//! The conformance suite against SQLite, with two independent clients
//! (separate connection pools) on one database file.

use std::sync::OnceLock;

use lock_sql::{SqliteConfig, SqliteLock};
use lock_testkit::conformance::Harness;

/// One database file for the whole test binary, so cases run concurrently
/// against the same file (as separate processes would).
fn db_dir() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temporary directory"))
}

async fn harness() -> Harness {
    let path = db_dir().path().join("conformance.db");
    Harness::of(async || {
        SqliteLock::open(&path, SqliteConfig::default())
            .await
            .expect("open sqlite")
    })
    .await
}

lock_testkit::conformance_suite!(harness());

/// The crate's `docs.md` opens with the capability checklist this backend
/// reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_open_with_the_capability_checklist() {
    let h = harness().await;
    lock_testkit::docs::assert_checklist(include_str!("../docs.md"), &h.lock.capabilities());
}
