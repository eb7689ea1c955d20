//! TLS to ZooKeeper (`zk+tls://`): the server's certificate is checked
//! against the CA the URL names; bad TLS settings are typed errors, not
//! hangs. (The conformance suite also runs over TLS, in `zk_conformance`.)

use std::time::Duration;

use lock_core::{DistributedLock, LockError, LockOptions, Wait};
use lock_testkit::faults::env;
use lock_zk::ZkLock;
use tokio::time::Instant;

/// The TLS URL without its options, e.g. `zk+tls://127.0.0.1:12191`.
fn tls_base() -> String {
    let url = env("DISTLOCK_TEST_ZK_TLS_URL");
    url.split('?').next().unwrap_or_default().to_string()
}

#[tokio::test]
async fn a_tls_client_locks_and_reports_tls_in_debug() {
    let locks = ZkLock::connect(&env("DISTLOCK_TEST_ZK_TLS_URL"))
        .await
        .expect("connect over TLS");
    assert!(format!("{locks:?}").contains("zk+tls://"), "{locks:?}");
    let g = locks
        .acquire(
            &lock_testkit::faults::unique("tls"),
            &LockOptions::new().wait(Wait::No),
        )
        .await
        .expect("acquire over TLS");
    assert!(g.fencing_token().is_some());
    assert!(g.release().await.expect("release"));
}

#[tokio::test]
async fn a_missing_ca_file_is_invalid_options() {
    match ZkLock::connect(&format!("{}?tls_ca=/nonexistent/ca.pem", tls_base())).await {
        Err(LockError::InvalidOptions { reason }) => {
            assert!(reason.contains("/nonexistent/ca.pem"), "{reason}")
        }
        other => panic!("expected InvalidOptions, got {other:?}"),
    }
}

/// A CA that did not sign the server's certificate (the system bundle):
/// the handshake fails and connecting ends with an error within about the
/// session timeout.
#[tokio::test]
async fn an_untrusted_server_is_refused() {
    let start = Instant::now();
    let refused = ZkLock::connect(&format!(
        "{}?session_timeout_ms=2000&tls_ca=/etc/ssl/certs/ca-certificates.crt",
        tls_base()
    ))
    .await;
    assert!(
        matches!(refused, Err(LockError::Unavailable { .. })),
        "{refused:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
}
