//! `rediss://` sets up TLS without panicking even when the program links
//! more than one rustls crypto provider (the workspace's ZooKeeper client
//! brings a second one), and a server that does not speak TLS is a typed
//! error; a plain `redis://` lock installs no process-wide provider, so
//! the application can install its own afterwards. (nextest runs each test
//! in a process of its own.)

use lock_core::{DistributedLock, LockError, LockOptions, Wait};
use lock_redis::RedisLock;

#[tokio::test]
async fn rediss_to_a_plain_server_is_a_typed_error() {
    let plain = lock_testkit::faults::env("DISTLOCK_TEST_REDIS_URL");
    let tls = plain.replacen("redis://", "rediss://", 1);
    let outcome = match RedisLock::connect(&format!("{tls}?connect_timeout_ms=500")).await {
        Err(e) => Err(e),
        Ok(locks) => locks
            .try_acquire("tls-check", &LockOptions::new().wait(Wait::No))
            .await
            .map(|_| ()),
    };
    assert!(
        matches!(outcome, Err(LockError::Unavailable { .. })),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_plain_connection_leaves_the_crypto_provider_to_the_application() {
    let plain = lock_testkit::faults::env("DISTLOCK_TEST_REDIS_URL");
    let locks = RedisLock::connect(&plain).await.expect("connect");
    let guard = locks
        .acquire("tls-provider-check", &LockOptions::new().wait(Wait::No))
        .await
        .expect("acquire");
    assert!(guard.release().await.expect("release"));
    assert!(
        rustls::crypto::CryptoProvider::get_default().is_none(),
        "a process-wide crypto provider was installed for a plain connection"
    );
    rustls::crypto::ring::default_provider()
        .install_default()
        .expect("the application installs its own provider");
}

/// `rediss+cluster://` and `rediss+sentinel://` to servers that do not
/// speak TLS are typed errors too, never a panic (rustls set up as for
/// `rediss://`).
#[tokio::test]
async fn tls_to_a_plain_cluster_or_sentinel_group_is_a_typed_error() {
    for (var, from, to) in [
        (
            "DISTLOCK_TEST_REDIS_CLUSTER_URL",
            "redis+cluster://",
            "rediss+cluster://",
        ),
        (
            "DISTLOCK_TEST_REDIS_SENTINEL_URL",
            "redis+sentinel://",
            "rediss+sentinel://",
        ),
    ] {
        let tls = lock_testkit::faults::env(var).replacen(from, to, 1);
        let outcome = match RedisLock::connect(&format!(
            "{tls}?connect_timeout=500ms&response_timeout=500ms"
        ))
        .await
        {
            Err(e) => Err(e),
            Ok(locks) => locks
                .try_acquire("tls-check", &LockOptions::new().wait(Wait::No))
                .await
                .map(|_| ()),
        };
        assert!(
            matches!(outcome, Err(LockError::Unavailable { .. })),
            "{to}: {outcome:?}"
        );
    }
}
