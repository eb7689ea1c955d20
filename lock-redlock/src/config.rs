//! Client settings and the `redlock://host1:port,host2:port,…` URL form.

use std::fmt;
use std::time::Duration;

use lock_core::LockError;
use lock_core::raw::{DEFAULT_DRIFT_FACTOR, LockUrl};
use lock_redis::raw::{client_url, database};

/// Settings for a [`Redlock`](crate::Redlock).
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub struct RedlockConfig {
    /// Prepended to every key and channel on every node; default
    /// `distlock:` (the same rules as [`lock_redis::RedisConfig::prefix`]).
    pub prefix: String,
    /// Bound on each request to one node, far below the TTL: a node that is
    /// down or stopped costs at most this. Default 50 ms.
    pub node_timeout: Duration,
    /// Bound on establishing a connection to one node; default 1 s.
    pub connect_timeout: Duration,
    /// Clock-drift allowance as a fraction of the TTL (plus 2 ms) subtracted
    /// from every lease's validity; default 0.01.
    pub drift_factor: f64,
    /// How long a release reserves a node for the waiter first in that
    /// node's queue. Only matters when that waiter died or cannot reach the
    /// node: the others then wait this long. Default 1 s.
    pub handoff_window: Duration,
    /// The smallest validity left after an acquisition, as a fraction of the
    /// TTL, for it to count; default 0.05. An acquisition that took longer
    /// (slow nodes, a pause) is given back and retried.
    pub min_validity: f64,
}

impl RedlockConfig {
    /// With [`prefix`](Self::prefix).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// With [`node_timeout`](Self::node_timeout).
    pub fn with_node_timeout(mut self, node_timeout: Duration) -> Self {
        self.node_timeout = node_timeout;
        self
    }

    /// With [`connect_timeout`](Self::connect_timeout).
    pub fn with_connect_timeout(mut self, connect_timeout: Duration) -> Self {
        self.connect_timeout = connect_timeout;
        self
    }

    /// With [`drift_factor`](Self::drift_factor).
    pub fn with_drift_factor(mut self, drift_factor: f64) -> Self {
        self.drift_factor = drift_factor;
        self
    }

    /// With [`handoff_window`](Self::handoff_window).
    pub fn with_handoff_window(mut self, handoff_window: Duration) -> Self {
        self.handoff_window = handoff_window;
        self
    }

    /// With [`min_validity`](Self::min_validity).
    pub fn with_min_validity(mut self, min_validity: f64) -> Self {
        self.min_validity = min_validity;
        self
    }
}

impl Default for RedlockConfig {
    fn default() -> Self {
        RedlockConfig {
            prefix: "distlock:".to_string(),
            node_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            handoff_window: Duration::from_secs(1),
            drift_factor: DEFAULT_DRIFT_FACTOR,
            min_validity: 0.05,
        }
    }
}

impl fmt::Debug for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockConfig")
            .field("prefix", &self.prefix)
            .field("node_timeout", &self.node_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("handoff_window", &self.handoff_window)
            .field("drift_factor", &self.drift_factor)
            .field("min_validity", &self.min_validity)
            .finish()
    }
}

impl RedlockConfig {
    /// The settings a `redlock://` URL carries (its options), read as
    /// [`Redlock::connect`](crate::Redlock::connect) reads them, for
    /// [`Redlock::with_clients`](crate::Redlock::with_clients).
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        Ok(parse_url(url)?.config)
    }

    /// Check the settings; [`LockError::InvalidOptions`] says what is wrong.
    pub fn validate(&self) -> Result<(), LockError> {
        for (what, d, max) in [
            ("node_timeout", self.node_timeout, Duration::from_secs(60)),
            (
                "connect_timeout",
                self.connect_timeout,
                Duration::from_secs(3600),
            ),
            (
                "handoff_window",
                self.handoff_window,
                Duration::from_secs(3600),
            ),
        ] {
            if d.is_zero() || d > max {
                return Err(LockError::invalid_options(format!(
                    "redlock {what} must be between 1 ms and {max:?}, got {d:?}"
                )));
            }
        }
        for (what, x, max) in [
            ("drift_factor", self.drift_factor, 0.5),
            ("min_validity", self.min_validity, 0.9),
        ] {
            if !(x.is_finite() && (0.0..=max).contains(&x)) {
                return Err(LockError::invalid_options(format!(
                    "redlock {what} must be a fraction between 0 and {max}, got {x}"
                )));
            }
        }
        Ok(())
    }
}

/// One node of a parsed Redlock URL.
pub(crate) struct NodeUrl {
    /// For `redis::Client::open`, credentials included (never printed).
    pub(crate) client_url: String,
    /// `host:port`, safe to show.
    pub(crate) display: String,
}

/// A parsed Redlock URL.
pub(crate) struct ParsedRedlockUrl {
    pub(crate) nodes: Vec<NodeUrl>,
    pub(crate) config: RedlockConfig,
}

/// Parse `redlock://[user:pass@]host:port[,host:port…][/db][?options]`.
/// Every node shares the credentials, database and options; `tls=true`
/// connects to every node with TLS (as `rediss://`).
pub(crate) fn parse_url(raw: &str) -> Result<ParsedRedlockUrl, LockError> {
    let url = LockUrl::parse(raw)?;
    url.expect_scheme(&["redlock"])?;
    let db = database(&url)?;
    let mut config = RedlockConfig::default();
    let mut options = url.options()?;
    if let Some(prefix) = options.text("prefix")? {
        config.prefix = prefix;
    }
    for (key, setting) in [
        ("node_timeout", &mut config.node_timeout),
        ("connect_timeout", &mut config.connect_timeout),
        ("handoff_window", &mut config.handoff_window),
    ] {
        if let Some(d) = options.duration(key)? {
            *setting = d;
        }
    }
    for (key, setting) in [
        ("drift_factor", &mut config.drift_factor),
        ("min_validity", &mut config.min_validity),
    ] {
        if let Some(f) = options.parsed(key, "a decimal fraction", |v| v.parse().ok())? {
            *setting = f;
        }
    }
    let tls = options.flag("tls")?.unwrap_or(false);
    options.finish()?;
    config.validate()?;
    let n = url.hosts().len();
    if !(n == 1 || (n >= 3 && n % 2 == 1)) {
        return Err(url.invalid(format!(
            "Redlock needs an odd number of nodes, at least 3 (or 1 for testing), got {n}"
        )));
    }
    let nodes = url
        .hosts()
        .iter()
        .map(|host| NodeUrl {
            client_url: client_url(&url, tls, host, db),
            display: format!("{}/{db}", host.with_default_port(6379)),
        })
        .collect();
    // The prefix rules are lock-redis's.
    lock_redis::RedisConfig::default()
        .with_prefix(config.prefix.clone())
        .validate()?;
    Ok(ParsedRedlockUrl { nodes, config })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_share_credentials_database_and_options() {
        let p = parse_url(
            "redlock://:pw@127.0.0.1:1,127.0.0.1:2,h3:3/2?node_timeout_ms=20&prefix=app:&drift_factor=0.02",
        )
        .expect("valid");
        assert_eq!(p.nodes.len(), 3);
        assert_eq!(p.config.node_timeout, Duration::from_millis(20));
        assert_eq!(p.config.prefix, "app:");
        assert_eq!(p.config.drift_factor, 0.02);
        assert_eq!(p.nodes[2].display, "h3:3/2");
        assert!(
            p.nodes[0]
                .client_url
                .starts_with("redis://:pw@127.0.0.1:1/2?")
        );
        let d = parse_url("redlock://a:1?node_timeout=35ms").expect("valid");
        assert_eq!(d.config.node_timeout, Duration::from_millis(35));
        let tls = parse_url("redlock://a:1?tls=true").expect("valid");
        assert!(tls.nodes[0].client_url.starts_with("rediss://"));
    }

    #[test]
    fn bad_urls_are_typed_and_redacted() {
        for bad in [
            "redis://:secretpw@a:1",
            "redlock://:secretpw@a:1,b:2",
            "redlock://:secretpw@a:1,,b:2",
            "redlock://:secretpw@a:1/x",
            "redlock://:secretpw@a:1?nope=1",
            "redlock://:secretpw@a:1?node_timeout_ms=0",
            "redlock://:secretpw@a:1?drift_factor=2",
            "redlock://:secretpw@a:1?tls=maybe",
            "redlock://:secretpw@a:1?prefix=a{b}",
        ] {
            match parse_url(bad) {
                Err(e @ (LockError::InvalidUrl { .. } | LockError::InvalidOptions { .. })) => {
                    assert!(!format!("{e} {e:?}").contains("secretpw"), "{bad}: {e}");
                }
                Err(other) => panic!("{bad}: unexpected {other}"),
                Ok(_) => panic!("{bad}: accepted"),
            }
        }
    }
}
