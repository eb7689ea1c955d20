//! The conformance suite against the MariaDB that `scripts/services.sh`
//! runs (`DISTLOCK_TEST_MYSQL_URL`): the session-lock suite
//! (`suites/session_conformance.rs`), the application's connections given
//! back unchanged, and the checklist of `docs.md`.

#[macro_use]
#[path = "suites/session_conformance.rs"]
mod session_conformance;

session_conformance! {
    lock: lock_sql::MySqlLock,
    url: "DISTLOCK_TEST_MYSQL_URL",
    pool: lock_sql::sqlx::mysql::MySqlPoolOptions,
}

/// The crate's `docs.md` opens with the capability checklist this backend
/// reports, in both modes (a column each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_open_with_the_capability_checklist() {
    for mode in ["row", "advisory"] {
        let h = harness_for(&format!("mode={mode}")).await;
        lock_testkit::docs::assert_checklist_column(
            include_str!("../docs.md"),
            &format!("mysql {mode}"),
            &h.lock.capabilities(),
        );
    }
}
