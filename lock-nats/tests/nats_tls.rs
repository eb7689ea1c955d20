//! TLS to NATS (`nats+tls://`): the server's certificate is checked
//! against the CA the URL names, a server that offers no TLS is refused,
//! and bad TLS settings are typed errors, not hangs or panics. Run in the
//! workspace's build (`--workspace --all-features`), where rustls has two
//! crypto providers compiled in and no default until one is installed.

use std::time::Duration;

use lock_core::{DistributedLock, LockError, LockOptions, Wait};
use lock_nats::NatsLock;
use lock_testkit::faults::{env, upstreams_of};
use tokio::time::Instant;

/// The TLS URL without its options, e.g. `nats+tls://127.0.0.1:14222`.
fn tls_base() -> String {
    let url = env("DISTLOCK_TEST_NATS_TLS_URL");
    url.split('?').next().unwrap_or_default().to_string()
}

/// A refusal comes within the connect and request timeouts, not later.
const BOUND: Duration = Duration::from_secs(5);

#[tokio::test]
async fn a_tls_client_locks_and_reports_tls_in_debug() {
    let locks = NatsLock::connect(&env("DISTLOCK_TEST_NATS_TLS_URL"))
        .await
        .expect("connect over TLS");
    assert!(format!("{locks:?}").contains("nats+tls://"), "{locks:?}");
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
    match NatsLock::connect(&format!("{}?tls_ca=/nonexistent/ca.pem", tls_base())).await {
        Err(LockError::InvalidOptions { reason }) => {
            assert!(reason.contains("/nonexistent/ca.pem"), "{reason}")
        }
        other => panic!("expected InvalidOptions, got {other:?}"),
    }
}

/// A plain connection installs nothing process-wide: the crypto provider
/// stays the application's to choose (TLS installs ring's only where
/// none was chosen, so that a build with two providers does not panic).
#[tokio::test]
async fn a_plain_connection_leaves_the_crypto_provider_to_the_application() {
    let locks = NatsLock::connect(&env("DISTLOCK_TEST_NATS_URL"))
        .await
        .expect("connect");
    let g = locks
        .acquire(
            &lock_testkit::faults::unique("plain"),
            &LockOptions::new().wait(Wait::No),
        )
        .await
        .expect("acquire");
    assert!(g.release().await.expect("release"));
    assert!(
        rustls::crypto::CryptoProvider::get_default().is_none(),
        "a process-wide crypto provider was installed for a plain connection"
    );
}

/// A CA that did not sign the server's certificate (the system bundle):
/// the handshake fails, and connecting says so at once.
#[tokio::test]
async fn an_untrusted_server_is_refused() {
    let start = Instant::now();
    let refused = NatsLock::connect(&format!(
        "{}?connect_timeout=2s&tls_ca=/etc/ssl/certs/ca-certificates.crt",
        tls_base()
    ))
    .await;
    assert!(
        matches!(refused, Err(LockError::Backend { .. })),
        "{refused:?}"
    );
    assert!(
        start.elapsed() < BOUND,
        "refused after {:?}",
        start.elapsed()
    );
}

/// `nats+tls://` never falls back to a plain connection: a server that
/// offers no TLS (a member of the test cluster) is refused.
#[tokio::test]
async fn a_server_without_tls_is_refused() {
    let plain = upstreams_of(&env("DISTLOCK_TEST_NATS_CLUSTER_URL"));
    let start = Instant::now();
    let refused = NatsLock::connect(&format!(
        "nats+tls://{}?connect_timeout=2s&tls_ca=/etc/ssl/certs/ca-certificates.crt",
        plain[0]
    ))
    .await;
    assert!(
        matches!(
            refused,
            Err(LockError::Backend { .. } | LockError::Unavailable { .. })
        ),
        "{refused:?}"
    );
    assert!(
        start.elapsed() < BOUND,
        "refused after {:?}",
        start.elapsed()
    );
}
