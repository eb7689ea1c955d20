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

/// Every backend family refuses an option it does not know, before it
/// connects (the servers named here do not exist), naming it and the
/// options it knows.
#[tokio::test]
async fn every_backend_refuses_an_option_it_does_not_know() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite = format!("sqlite://{}/l.db?bogus_opt=1", dir.path().display());
    let mut urls = vec!["memory://?bogus_opt=1".to_string()];
    if cfg!(feature = "sqlite") {
        urls.push(sqlite);
    }
    if cfg!(feature = "redis") {
        urls.push("redis://127.0.0.1:1/0?bogus_opt=1".into());
        urls.push("redis+sentinel://127.0.0.1:1/group?bogus_opt=1".into());
        urls.push("redis+cluster://127.0.0.1:1?bogus_opt=1".into());
    }
    if cfg!(feature = "redlock") {
        urls.push("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?bogus_opt=1".into());
    }
    if cfg!(feature = "postgres") {
        urls.push("postgres://u:pw@127.0.0.1:1/db?mode=advisory&bogus_opt=1".into());
    }
    if cfg!(feature = "mysql") {
        urls.push("mysql://u:pw@127.0.0.1:1/db?bogus_opt=1".into());
    }
    if cfg!(feature = "etcd") {
        urls.push("etcd://127.0.0.1:1?bogus_opt=1".into());
    }
    if cfg!(feature = "zookeeper") {
        urls.push("zk://127.0.0.1:1/locks?bogus_opt=1".into());
    }
    if cfg!(feature = "nats") {
        urls.push("nats://127.0.0.1:1?bogus_opt=1".into());
    }
    for url in &urls {
        let (_, reason) = invalid_url_reason(url).await;
        if url.starts_with("memory") {
            assert!(
                reason.contains("no host, path or options"),
                "{url}: {reason}"
            );
        } else {
            assert!(
                reason.contains("unknown option `bogus_opt`") && reason.contains("(known: "),
                "{url}: {reason}"
            );
        }
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

#[cfg(not(feature = "nats"))]
#[tokio::test]
async fn nats_without_its_feature_names_the_feature() {
    let (shown, reason) = invalid_url_reason("nats://user:s3cret-pw@127.0.0.1:4222").await;
    assert!(reason.contains("`nats`"), "{reason}");
    assert!(!shown.contains("s3cret-pw"));
}

#[cfg(feature = "nats")]
#[tokio::test]
async fn nats_url_errors_never_show_the_password() {
    for url in [
        // Nothing listens on port 1: refused.
        "nats://user:s3cret-pw@127.0.0.1:1?connect_timeout=200ms",
        "nats://s3cret-pw@127.0.0.1:1?connect_timeout=200ms",
        "nats://user:s3cret-pw@127.0.0.1:4222/bad.bucket",
        "nats://user:s3cret-pw@127.0.0.1:4222?bogus=1",
        "nats://user:s3cret-pw@127.0.0.1:4222?tls_ca=/x.pem",
    ] {
        let err = distlock::connect(url).await.err().expect("must fail");
        let text = format!("{err} {err:?}");
        assert!(!text.contains("s3cret-pw"), "credential leaked: {text}");
    }
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

#[tokio::test]
async fn malformed_migrate_urls_are_invalid_url() {
    for (url, expect) in [
        ("migrate://", "both `from` and `to`"),
        ("migrate://?from=memory://", "both `from` and `to`"),
        ("migrate://?to=memory://", "both `from` and `to`"),
        (
            "migrate://?from=memory://&to=memory://&x=1",
            "unknown option `x`",
        ),
        (
            "migrate://?from=memory://&from=memory://&to=memory://",
            "given twice",
        ),
        (
            "migrate://host?from=memory://&to=memory://",
            "no host or path",
        ),
        (
            "migrate://?from=migrate%3A%2F%2F%3Ffrom%3Dmemory%3A%2F%2F&to=memory://",
            "migrate one step at a time",
        ),
        ("migrate://?from=nonsense&to=memory://", "`from`"),
        (
            "migrate://?from=memory://&to=ftp://x",
            "`to`: unknown scheme `ftp`",
        ),
        (
            "migrate://?from=memory://&to=memory://&fencing_epoch=1",
            "unknown option",
        ),
    ] {
        let (_, reason) = invalid_url_reason(url).await;
        assert!(reason.contains(expect), "{url}: {reason}");
    }
}

#[tokio::test]
async fn migrate_url_gives_a_lock_held_on_both() {
    let locks = distlock::connect("migrate://?from=memory://&to=memory://")
        .await
        .expect("migrate");
    assert_eq!(locks.capabilities().backend, "migrate");
    let opts = LockOptions::new().wait(distlock::Wait::No);
    let g = locks.acquire("job", &opts).await.expect("acquire");
    assert_eq!(g.fencing_token(), Some(1));
    assert!(
        locks
            .try_acquire("job", &opts)
            .await
            .expect("try")
            .is_none()
    );
    assert!(g.release().await.expect("release"));
}

#[tokio::test]
async fn fencing_epoch_moves_tokens_above_every_lower_epoch() {
    let locks = distlock::connect("memory://?fencing_epoch=3")
        .await
        .expect("memory with an epoch");
    let g = locks
        .acquire("job", &LockOptions::new())
        .await
        .expect("acquire");
    assert_eq!(g.fencing_token(), Some((3 << 48) | 1));
    assert!(g.release().await.expect("release"));
    let (_, reason) = invalid_url_reason("memory://?fencing_epoch=x").await;
    assert!(reason.contains("fencing_epoch"), "{reason}");
}

#[cfg(not(feature = "redis"))]
#[tokio::test]
async fn a_migration_to_a_missing_backend_names_the_feature_and_hides_passwords() {
    let url = "migrate://?from=memory://&to=redis%3A%2F%2F%3As3cret-pw%40127.0.0.1%3A6379";
    let (shown, reason) = invalid_url_reason(url).await;
    assert!(
        reason.contains("`to`") && reason.contains("`redis`"),
        "{reason}"
    );
    assert!(
        !shown.contains("s3cret-pw") && !reason.contains("s3cret-pw"),
        "{shown} {reason}"
    );
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn migrate_url_errors_and_debug_never_show_nested_passwords() {
    let bad = "migrate://?from=redis%3A%2F%2F%3As3cret-pw%40127.0.0.1%3A1%2F0%3Fconnect_timeout_ms%3D200&to=memory://";
    let err = distlock::connect(bad).await.err().expect("must fail");
    let text = format!("{err} {err:?}");
    assert!(!text.contains("s3cret-pw"), "credential leaked: {text}");
    let bad = "migrate://?from=memory://&to=redis://:s3cret-pw@127.0.0.1:1/x";
    let err = distlock::connect(bad).await.err().expect("must fail");
    let text = format!("{err} {err:?}");
    assert!(!text.contains("s3cret-pw"), "credential leaked: {text}");
}

/// A layer that notes when it wraps, and wraps in an `EpochLock` if given
/// an epoch (so its presence shows in the fencing tokens).
struct Noting {
    name: &'static str,
    epoch: Option<u16>,
    log: std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>,
}

impl distlock::layers::Layer for Noting {
    fn layer(
        &self,
        inner: std::sync::Arc<dyn distlock::DistributedLock>,
    ) -> std::sync::Arc<dyn distlock::DistributedLock> {
        self.log.lock().expect("log").push(self.name);
        match self.epoch {
            Some(epoch) => std::sync::Arc::new(
                distlock::EpochLock::new(inner, epoch).expect("an epoch within range"),
            ),
            None => inner,
        }
    }
}

/// `connect_with` wraps the lock in its layers in the order they were
/// added, each around the one before, and the result is the outermost.
#[tokio::test]
async fn connect_with_wraps_the_lock_in_its_layers_in_order() {
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let noting = |name, epoch| Noting {
        name,
        epoch,
        log: log.clone(),
    };
    let options = distlock::ConnectOptions::new()
        .layer(noting("inner", Some(3)))
        .layer(noting("outer", None));
    let locks = distlock::connect_with("memory://", &options)
        .await
        .expect("memory");
    assert_eq!(*log.lock().expect("log"), ["inner", "outer"]);
    let g = locks
        .acquire("a", &LockOptions::new())
        .await
        .expect("acquire");
    assert_eq!(g.fencing_token(), Some((3 << distlock::EPOCH_SHIFT) + 1));
    assert!(g.release().await.expect("release"));
    let plain = distlock::connect_with("memory://", &distlock::ConnectOptions::new())
        .await
        .expect("memory");
    let g = plain
        .acquire("a", &LockOptions::new())
        .await
        .expect("acquire");
    assert_eq!(g.fencing_token(), Some(1));
}

/// Each backend's config reads from a URL what `connect` reads from it,
/// with durations in either spelling, so code and URL configure the same
/// thing; a misspelt option is refused by name.
#[cfg(feature = "full")]
#[test]
fn configs_read_from_urls_as_connect_does() {
    use std::time::Duration;
    let redis = distlock::RedisConfig::from_url("rediss://h:1/0?prefix=a:&handoff_window=40ms")
        .expect("redis");
    assert_eq!(
        (redis.prefix.as_str(), redis.handoff_window),
        ("a:", Duration::from_millis(40))
    );
    let redlock = distlock::RedlockConfig::from_url("redlock://a:1,b:2,c:3?node_timeout_ms=30")
        .expect("redlock");
    assert_eq!(redlock.node_timeout, Duration::from_millis(30));
    let etcd = distlock::EtcdConfig::from_url("etcd://h:1/app?session_ttl=20s").expect("etcd");
    assert_eq!(
        (etcd.prefix.as_str(), etcd.session_ttl),
        ("/app", Duration::from_secs(20))
    );
    let zk = distlock::ZkConfig::from_url("zk://u:p@h:1/app/locks").expect("zk");
    assert_eq!((zk.root.as_str(), zk.creator_only), ("/app/locks", true));
    let sql =
        distlock::SqlConfig::from_url("mariadb://u:p@h/db?mode=advisory&fencing=off").expect("sql");
    assert_eq!(
        (sql.mode, sql.fencing),
        (distlock::SqlMode::Advisory, false)
    );
    let sqlite =
        distlock::SqliteConfig::from_url("sqlite:///x.db?busy_timeout=250ms").expect("sqlite");
    assert_eq!(sqlite.busy_timeout, Duration::from_millis(250));
    match distlock::EtcdConfig::from_url("etcd://h:1?sesion_ttl=20s") {
        Err(LockError::InvalidUrl { reason, .. }) => {
            assert!(
                reason.contains("`sesion_ttl`") && reason.contains("session_ttl"),
                "{reason}"
            )
        }
        other => panic!("expected InvalidUrl, got {other:?}"),
    }
}

/// A lock built without a URL (as from the application's own client) gets
/// the options' fencing epoch, inside its layers; an epoch given both in
/// the URL and in the options is refused, typed; one above `MAX_EPOCH`
/// too.
#[tokio::test]
async fn connect_options_apply_an_epoch_and_layers_to_a_lock_built_without_a_url() {
    use distlock::layers::TracingLayer;
    use distlock::{ConnectOptions, LockError, LockOptions, MemoryLock};

    let options = ConnectOptions::new().fencing_epoch(3).layer(TracingLayer);
    let locks = options
        .apply(std::sync::Arc::new(MemoryLock::new()))
        .expect("apply");
    let guard = locks
        .acquire("apply", &LockOptions::new())
        .await
        .expect("acquire");
    assert_eq!(guard.fencing_token(), Some((3 << 48) | 1));
    assert!(guard.release().await.expect("release"));

    let twice = distlock::connect_with("memory://?fencing_epoch=1", &options).await;
    assert!(
        matches!(twice, Err(LockError::InvalidOptions { .. })),
        "{:?}",
        twice.err()
    );
    let too_high = ConnectOptions::new()
        .fencing_epoch(distlock::MAX_EPOCH + 1)
        .apply(std::sync::Arc::new(MemoryLock::new()));
    assert!(matches!(too_high, Err(LockError::InvalidOptions { .. })));
    let from_url = distlock::connect_with("memory://", &ConnectOptions::new().fencing_epoch(3))
        .await
        .expect("connect_with");
    let guard = from_url
        .acquire("apply", &LockOptions::new())
        .await
        .expect("acquire");
    assert_eq!(guard.fencing_token(), Some((3 << 48) | 1));
}
