//! Client settings and the `etcd://host:port[,host:port…][/prefix]` URL form.

use std::fmt;
use std::time::Duration;

use lock_core::LockError;
use lock_core::raw::LockUrl;

/// Settings for an [`EtcdLock`](crate::EtcdLock).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// Key prefix under which every lock lives (`/distlock` by default); a
    /// lock's keys are `PREFIX/ESCAPED-NAME/…`.
    pub prefix: String,
    /// TTL of the client's session lease, kept alive in the background;
    /// locks acquired with this TTL and auto-renewal share it. Whole seconds,
    /// default 30 s. A crashed client's locks are freed when it runs out.
    /// Keep it well above two election timeouts of the cluster: keep-alives
    /// stop during a leader election, and a session whose keep-alives fail
    /// past its validity deadline is given up (its guards' `lost()` fires).
    pub session_ttl: Duration,
    /// Bound on establishing a connection; default 2 s.
    pub connect_timeout: Duration,
    /// Bound on each request; default 2 s.
    pub request_timeout: Duration,
}

impl EtcdConfig {
    /// With [`prefix`](Self::prefix).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// With [`session_ttl`](Self::session_ttl).
    pub fn with_session_ttl(mut self, session_ttl: Duration) -> Self {
        self.session_ttl = session_ttl;
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
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            prefix: "/distlock".to_string(),
            session_ttl: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(2),
        }
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("prefix", &self.prefix)
            .field("session_ttl", &self.session_ttl)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

impl EtcdConfig {
    /// The settings an `etcd://` or `etcd+https://` URL carries (its prefix
    /// and options), read as [`EtcdLock::connect`](crate::EtcdLock::connect)
    /// reads them, for [`EtcdLock::with_client`](crate::EtcdLock::with_client).
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        Ok(parse_url(url)?.config)
    }

    /// Check the settings; [`LockError::InvalidOptions`] says what is wrong.
    pub fn validate(&self) -> Result<(), LockError> {
        let p = &self.prefix;
        if p.is_empty()
            || p.len() > 128
            || !p.starts_with('/')
            || p.ends_with('/')
            || !p.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(LockError::invalid_options(format!(
                "etcd key prefix {:?} must start with `/`, not end with one, and be at most 128 printable ASCII characters",
                p.chars().take(80).collect::<String>()
            )));
        }
        let secs = self.session_ttl.as_secs();
        if secs == 0 || self.session_ttl.subsec_nanos() != 0 || secs > 86_400 {
            return Err(LockError::invalid_options(format!(
                "etcd session_ttl must be whole seconds between 1 s and 1 day, got {:?}",
                self.session_ttl
            )));
        }
        for (what, d) in [
            ("connect_timeout", self.connect_timeout),
            ("request_timeout", self.request_timeout),
        ] {
            if d.is_zero() || d > Duration::from_secs(3600) {
                return Err(LockError::invalid_options(format!(
                    "etcd {what} must be between 1 ms and 1 h, got {d:?}"
                )));
            }
        }
        Ok(())
    }
}

/// A parsed etcd URL. Not `Debug`: it holds the password.
pub(crate) struct ParsedUrl {
    /// `http://host:port` or `https://host:port`, one per member.
    pub(crate) endpoints: Vec<String>,
    pub(crate) user: Option<(String, String)>,
    pub(crate) tls: bool,
    pub(crate) config: EtcdConfig,
    /// The URL without credentials.
    pub(crate) display: String,
}

/// Parse `etcd://[user:pass@]host:port[,host:port…][/prefix][?options]`, or
/// `etcd+https://…` for TLS. The options are durations with their unit
/// (`session_ttl=10s`); the older `session_ttl_s`, `connect_timeout_ms` and
/// `request_timeout_ms` are accepted too.
pub(crate) fn parse_url(raw: &str) -> Result<ParsedUrl, LockError> {
    let url = LockUrl::parse(raw)?;
    url.expect_scheme(&["etcd", "etcd+https"])?;
    let tls = url.scheme() == "etcd+https";
    let user = url.user().map(|user| {
        (
            user.to_string(),
            url.password().unwrap_or_default().to_string(),
        )
    });
    let mut config = EtcdConfig::default();
    let path = url.path();
    if !path.is_empty() && path != "/" {
        config.prefix = path.trim_end_matches('/').to_string();
    }
    let mut options = url.options()?;
    for (key, setting) in [
        ("session_ttl", &mut config.session_ttl),
        ("connect_timeout", &mut config.connect_timeout),
        ("request_timeout", &mut config.request_timeout),
    ] {
        if let Some(d) = options.duration(key)? {
            *setting = d;
        }
    }
    options.finish()?;
    config.validate()?;
    let members = url.members()?;
    let endpoints = members
        .iter()
        .map(|m| format!("{}://{m}", if tls { "https" } else { "http" }))
        .collect();
    Ok(ParsedUrl {
        display: format!("{}://{}{}", url.scheme(), members.join(","), config.prefix),
        endpoints,
        user,
        tls,
        config,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_prefix_and_options() {
        let p = parse_url("etcd://u:p%40ss@127.0.0.1:2379,h2:2380/app/locks/?session_ttl_s=5")
            .expect("valid");
        assert_eq!(p.endpoints, ["http://127.0.0.1:2379", "http://h2:2380"]);
        let q = parse_url("etcd://h:1?session_ttl=1m&request_timeout=750ms").expect("valid");
        assert_eq!(q.config.session_ttl, Duration::from_secs(60));
        assert_eq!(q.config.request_timeout, Duration::from_millis(750));
        assert_eq!(p.config.prefix, "/app/locks");
        assert_eq!(p.config.session_ttl, Duration::from_secs(5));
        assert_eq!(p.user, Some(("u".to_string(), "p@ss".to_string())));
        // User-info is not form data: `+`, `&` and `=` are kept.
        let q = parse_url("etcd://u+v:p+q&r=s t!%@h:1").expect("valid");
        assert_eq!(q.user, Some(("u+v".to_string(), "p+q&r=s t!%".to_string())));
        assert_eq!(p.display, "etcd://127.0.0.1:2379,h2:2380/app/locks");
        let tls = parse_url("etcd+https://h:2379").expect("valid");
        assert!(tls.tls && tls.endpoints[0].starts_with("https://"));
    }

    #[test]
    fn bad_urls_are_typed_and_redacted() {
        for bad in [
            "etcd://u:secretpw@",
            "redis://u:secretpw@h:1",
            "etcd://u:secretpw@h",
            "etcd://u:secretpw@h:notaport",
            "etcd://u:secretpw@h:1?nope=1",
            "etcd://u:secretpw@h:1?session_ttl_s=0",
            "etcd://u:secretpw@h:1/bad%20prefix?request_timeout_ms=0",
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
