//! A failed connection's error through the reporters users print it with:
//! anyhow's and eyre's `{:#}`, `tracing`'s error fields and
//! [`LockError::report`]. Each shows what failed and where, then each cause
//! once (a client library that prints its cause in its own message too,
//! as sqlx and tonic do, is not allowed to repeat it).

mod common;
use common::Captured;

use distlock::LockError;

/// The error of connecting to `url`, where nothing listens.
async fn refused(url: &str) -> LockError {
    match distlock::connect(url).await {
        Err(e) => e,
        Ok(_) => panic!("{url}: connected to a port nobody listens on"),
    }
}

/// How often `needle` appears in `haystack`, ignoring case.
fn times(haystack: &str, needle: &str) -> usize {
    haystack.to_lowercase().matches(needle).count()
}

#[tokio::test]
async fn each_cause_is_printed_once_by_every_reporter() {
    let mut urls = vec![
        "redis://127.0.0.1:1/0?connect_timeout=2s",
        "postgres://app:s3cret@127.0.0.1:1/db?connect_timeout=2s",
        "mysql://app:s3cret@127.0.0.1:1/db?connect_timeout=2s",
        "nats://127.0.0.1:1?connect_timeout=2s",
    ];
    if cfg!(feature = "etcd") {
        urls.push("etcd://127.0.0.1:1?connect_timeout=2s");
    }
    for url in urls {
        let e = refused(url).await;
        let top = e.to_string();
        assert!(
            top.contains("127.0.0.1:1") && !top.to_lowercase().contains("refused"),
            "{url}: Display names what failed and where, and leaves the cause to source(): {top}"
        );
        let captured = Captured::default();
        tracing::subscriber::with_default(captured.subscriber(tracing::Level::INFO), || {
            tracing::error!(error = &e as &(dyn std::error::Error + 'static), "failed");
        });
        let report = e.report().to_string();
        let anyhow = format!("{:#}", anyhow::Error::from(refused(url).await));
        let eyre = format!("{:#}", eyre::Report::from(refused(url).await));
        for (reporter, text) in [
            ("report()", report),
            ("anyhow {:#}", anyhow),
            ("eyre {:#}", eyre),
            ("tracing", captured.text()),
        ] {
            assert_eq!(
                times(&text, "connection refused"),
                1,
                "{url}: {reporter} should name the cause once: {text}"
            );
            assert!(
                !text.contains("s3cret"),
                "{url}: {reporter} shows the password: {text}"
            );
        }
    }
}
