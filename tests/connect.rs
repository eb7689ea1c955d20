//! `distlock::connect`: URL dispatch, typed errors, no credentials in errors.

use distlock::{LockError, LockOptions};

#[tokio::test]
async fn memory_url_gives_a_working_lock() {
    let locks = distlock::connect("memory://").await.expect("memory");
    assert_eq!(locks.capabilities().backend, "memory");
    let g = locks
        .try_acquire("a", &LockOptions::new())
        .await
        .expect("try")
        .expect("free");
    assert!(
        locks
            .try_acquire("a", &LockOptions::new())
            .await
            .expect("try")
            .is_none()
    );
    assert!(g.release().await.expect("release"));
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_url_gives_a_lock_shared_through_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/l.db?table=app_locks", dir.path().display());
    let a = distlock::connect(&url).await.expect("sqlite");
    let b = distlock::connect(&url).await.expect("sqlite");
    assert_eq!(a.capabilities().backend, "sqlite");
    let opts = LockOptions::new().wait(distlock::Wait::No);
    let g = a.acquire("job", &opts).await.expect("acquire");
    assert!(b.try_acquire("job", &opts).await.expect("try").is_none());
    assert!(g.release().await.expect("release"));
}

async fn invalid_url_reason(url: &str) -> (String, String) {
    match distlock::connect(url).await {
        Err(LockError::InvalidUrl { url, reason }) => (url, reason),
        Err(other) => panic!("{url}: expected InvalidUrl, got {other}"),
        Ok(_) => panic!("{url}: expected InvalidUrl, got a lock"),
    }
}

#[tokio::test]
async fn malformed_and_unknown_urls_are_invalid_url() {
    for url in [
        "",
        "nonsense",
        "memory:",
        "memory://host",
        "ftp://x",
        "sqlite://",
    ] {
        let (_, reason) = invalid_url_reason(url).await;
        assert!(!reason.is_empty());
    }
    let (_, reason) = invalid_url_reason("ftp://x").await;
    assert!(reason.contains("unknown scheme `ftp`"), "{reason}");
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn bad_table_name_is_invalid_options() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!(
        "sqlite://{}/l.db?table=locks;%20DROP%20TABLE%20x",
        dir.path().display()
    );
    assert!(matches!(
        distlock::connect(&url).await,
        Err(LockError::InvalidOptions { .. })
    ));
}

#[cfg(not(feature = "zookeeper"))]
#[tokio::test]
async fn a_scheme_without_its_feature_names_the_feature() {
    let (shown, reason) = invalid_url_reason("zk://127.0.0.1:2181").await;
    assert!(reason.contains("`zookeeper`"), "{reason}");
    assert!(!shown.contains("s3cret-pw"));
}

#[cfg(not(feature = "redis"))]
#[tokio::test]
async fn redis_without_its_feature_names_the_feature() {
    let (shown, reason) = invalid_url_reason("redis://:s3cret-pw@127.0.0.1:6379").await;
    assert!(reason.contains("`redis`"), "{reason}");
    assert!(!shown.contains("s3cret-pw"));
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_url_errors_never_show_the_password() {
    for url in [
        "redis://:s3cret-pw@127.0.0.1:1/0?connect_timeout_ms=200",
        "redis://:s3cret-pw@127.0.0.1:6379/x",
        "redis://:s3cret-pw@127.0.0.1:6379/0?bogus=1",
    ] {
        let err = distlock::connect(url).await.err().expect("must fail");
        let text = format!("{err} {err:?}");
        assert!(!text.contains("s3cret-pw"), "credential leaked: {text}");
    }
}

#[cfg(feature = "redlock")]
#[tokio::test]
async fn redlock_url_errors_never_show_the_password() {
    for url in [
        // Nothing listens on port 1: no majority answers.
        "redlock://u:s3cret-pw@127.0.0.1:1,127.0.0.1:1,127.0.0.1:1?connect_timeout_ms=200",
        "redlock://u:s3cret-pw@127.0.0.1:1,127.0.0.1:2",
        "redlock://u:s3cret-pw@127.0.0.1:1/0?bogus=1",
    ] {
        let err = distlock::connect(url).await.err().expect("must fail");
        let text = format!("{err} {err:?}");
        assert!(!text.contains("s3cret-pw"), "credential leaked: {text}");
    }
}
