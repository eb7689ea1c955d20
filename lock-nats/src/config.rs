//! Client settings and the `nats://host:port[,host:port…][/bucket]` URL form.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lock_core::LockError;
use lock_core::raw::LockUrl;

/// The port a NATS server listens on unless the URL names another.
const DEFAULT_PORT: u16 = 4222;

/// The most replicas a JetStream stream can have.
const MAX_REPLICAS: usize = 5;

/// Settings for a [`NatsLock`](crate::NatsLock).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NatsConfig {
    /// The key-value bucket every lock lives in (`distlock` by default):
    /// the JetStream stream `KV_BUCKET`, made on first use if missing.
    /// Letters, digits, `-` and `_`, at most 64.
    pub bucket: String,
    /// How many servers keep the bucket's stream, when this client makes
    /// it (default 1). With 3 or more, grants survive the loss of a
    /// minority of them and the locks are correctness-grade; an existing
    /// stream keeps its own count, which the capabilities follow.
    pub replicas: usize,
    /// Bound on establishing a connection; default 2 s.
    pub connect_timeout: Duration,
    /// Bound on each request (a grant, a renewal, a release); default 2 s.
    pub request_timeout: Duration,
}

impl NatsConfig {
    /// With [`bucket`](Self::bucket).
    pub fn with_bucket(mut self, bucket: impl Into<String>) -> Self {
        self.bucket = bucket.into();
        self
    }

    /// With [`replicas`](Self::replicas).
    pub fn with_replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas;
        self
    }

    /// With [`connect_timeout`](Self::connect_timeout).
    pub fn with_connect_timeout(mut self, connect_timeout: Duration) -> Self {
        self.connect_timeout = connect_timeout;
        self
    }

    /// With [`request_timeout`](Self::request_timeout).
    pub fn with_request_timeout(mut self, request_timeout: Duration) -> Self {
        self.request_timeout = request_timeout;
        self
    }

    /// The settings a `nats://` URL carries (its bucket and options), read
    /// as [`NatsLock::connect`](crate::NatsLock::connect) reads them, for
    /// [`NatsLock::with_client`](crate::NatsLock::with_client).
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        Ok(parse_url(url)?.config)
    }

    /// Check the settings; [`LockError::InvalidOptions`] says what is wrong.
    pub fn validate(&self) -> Result<(), LockError> {
        let b = &self.bucket;
        if b.is_empty()
            || b.len() > 64
            || !b
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        {
            return Err(LockError::invalid_options(format!(
                "NATS bucket {:?} must be 1 to 64 letters, digits, `-` or `_`",
                b.chars().take(80).collect::<String>()
            )));
        }
        if !(1..=MAX_REPLICAS).contains(&self.replicas) {
            return Err(LockError::invalid_options(format!(
                "NATS replicas must be between 1 and {MAX_REPLICAS}, got {}",
                self.replicas
            )));
        }
        for (what, d) in [
            ("connect_timeout", self.connect_timeout),
            ("request_timeout", self.request_timeout),
        ] {
            if d.is_zero() || d > Duration::from_secs(3600) {
                return Err(LockError::invalid_options(format!(
                    "NATS {what} must be between 1 ms and 1 h, got {d:?}"
                )));
            }
        }
        Ok(())
    }
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            bucket: "distlock".to_string(),
            replicas: 1,
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(2),
        }
    }
}

impl fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsConfig")
            .field("bucket", &self.bucket)
            .field("replicas", &self.replicas)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

/// How a client authenticates. Not `Debug`: it holds the secret.
pub(crate) enum Credentials {
    /// `user:password@`.
    UserPassword(String, String),
    /// `token@`: a server's authorization token.
    Token(String),
}

/// A parsed NATS URL. Not `Debug`: it holds the password.
pub(crate) struct ParsedUrl {
    /// `nats://host:port` or `tls://host:port`, one per server.
    pub(crate) servers: Vec<String>,
    pub(crate) credentials: Option<Credentials>,
    pub(crate) tls: bool,
    /// A CA certificate (PEM) to trust beside the system's, for TLS.
    pub(crate) tls_ca: Option<PathBuf>,
    pub(crate) config: NatsConfig,
    /// Whether the client also connects to the servers the ones named
    /// advertise (`discover=false` keeps it to the URL's: a client that
    /// reaches the cluster through addresses of its own, a proxy or a
    /// NAT, cannot reach the advertised ones).
    pub(crate) discover: bool,
    /// The URL without credentials.
    pub(crate) display: String,
}

/// Parse `nats://[user:pass@|token@]host[:port][,host[:port]…][/bucket][?options]`,
/// or `nats+tls://…` for TLS. Options: `replicas`, `connect_timeout` and
/// `request_timeout` (durations with their unit, `2s`, `500ms`),
/// `discover` (`false`: only the URL's servers) and `tls_ca` (a PEM file)
/// with TLS.
pub(crate) fn parse_url(raw: &str) -> Result<ParsedUrl, LockError> {
    let url = LockUrl::parse(raw)?;
    url.expect_scheme(&["nats", "nats+tls"])?;
    let tls = url.scheme() == "nats+tls";
    let credentials = url.user().map(|user| match url.password() {
        Some(password) => Credentials::UserPassword(user.to_string(), password.to_string()),
        None => Credentials::Token(user.to_string()),
    });
    let mut config = NatsConfig::default();
    let path = url.path().trim_matches('/');
    if !path.is_empty() {
        config.bucket = path.to_string();
    }
    let mut options = url.options()?;
    if let Some(replicas) = options.number::<usize>("replicas")? {
        config.replicas = replicas;
    }
    for (key, setting) in [
        ("connect_timeout", &mut config.connect_timeout),
        ("request_timeout", &mut config.request_timeout),
    ] {
        if let Some(d) = options.duration(key)? {
            *setting = d;
        }
    }
    let tls_ca = options.text("tls_ca")?.map(PathBuf::from);
    let discover = options.flag("discover")?.unwrap_or(true);
    options.finish()?;
    if tls_ca.is_some() && !tls {
        return Err(url.invalid("tls_ca needs TLS: use nats+tls://"));
    }
    config.validate()?;
    if url.hosts().is_empty() {
        return Err(url.invalid("no server given"));
    }
    let members: Vec<String> = url
        .hosts()
        .iter()
        .map(|h| h.with_default_port(DEFAULT_PORT))
        .collect();
    let servers = members
        .iter()
        .map(|m| format!("{}://{m}", if tls { "tls" } else { "nats" }))
        .collect();
    Ok(ParsedUrl {
        display: format!("{}://{}/{}", url.scheme(), members.join(","), config.bucket),
        servers,
        credentials,
        tls,
        tls_ca,
        config,
        discover,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_bucket_and_options() {
        let p =
            parse_url("nats://u:p%40ss@127.0.0.1:4222,h2/locks?replicas=3&request_timeout=750ms")
                .expect("valid");
        assert_eq!(p.servers, ["nats://127.0.0.1:4222", "nats://h2:4222"]);
        assert_eq!(p.config.bucket, "locks");
        assert_eq!(p.config.replicas, 3);
        assert_eq!(p.config.request_timeout, Duration::from_millis(750));
        assert!(matches!(
            p.credentials,
            Some(Credentials::UserPassword(ref u, ref pw)) if u == "u" && pw == "p@ss"
        ));
        assert_eq!(p.display, "nats://127.0.0.1:4222,h2:4222/locks");
        assert!(p.discover);
        assert!(
            !parse_url("nats://h?discover=false")
                .expect("valid")
                .discover
        );
        let t = parse_url("nats+tls://s3cret@h:1?tls_ca=/etc/ca.pem").expect("valid");
        assert!(t.tls && t.servers[0].starts_with("tls://"));
        assert!(matches!(t.credentials, Some(Credentials::Token(ref s)) if s == "s3cret"));
        assert_eq!(t.tls_ca, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(t.config.bucket, "distlock");
    }

    #[test]
    fn bad_urls_are_typed_and_redacted() {
        for bad in [
            "nats://u:secretpw@",
            "redis://u:secretpw@h:1",
            "nats://u:secretpw@h:notaport",
            "nats://u:secretpw@h:1?nope=1",
            "nats://u:secretpw@h:1?replicas=0",
            "nats://u:secretpw@h:1?replicas=7",
            "nats://u:secretpw@h:1/bad.bucket",
            "nats://u:secretpw@h:1?tls_ca=/x.pem",
            "nats://u:secretpw@h:1?request_timeout=0ms",
            "nats://u:secretpw@h:1?discover=maybe",
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
