//! The lock's settings: [`ZkConfig`] for an application's own client,
//! and the `zk://` and `zk+tls://` URLs (members, root path, credentials,
//! TLS files and options).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lock_core::LockError;
use lock_core::raw::LockUrl;

/// The default root path under which lock nodes live.
const DEFAULT_ROOT: &str = "/distlock";
/// The default session timeout asked of the server.
const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// The system's CA bundle, the default trust for `zk+tls://`.
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// PEM files for a TLS connection.
#[derive(Clone, Debug)]
pub(crate) struct TlsFiles {
    /// The CA certificates that sign the servers' certificates.
    pub ca: PathBuf,
    /// The client's certificate and key, for servers that ask for one.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// A parsed `zk[+tls]://[user:password@]host:port[,host:port…][/root][?options]`.
#[derive(Clone)]
pub(crate) struct ZkUrl {
    /// The members, `host:port[,host:port…]`, as the client takes them.
    pub hosts: String,
    /// The absolute path under which lock nodes live (a chroot of ours).
    pub root: String,
    /// The session timeout asked of the server (it may clamp it to its
    /// `minSessionTimeout`..`maxSessionTimeout`).
    pub session_timeout: Duration,
    /// `user:password` for the `digest` scheme, if given.
    pub digest: Option<String>,
    /// TLS (`zk+tls://`), with the files to trust and present.
    pub tls: Option<TlsFiles>,
}

impl fmt::Debug for ZkUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkUrl")
            .field("hosts", &self.hosts)
            .field("root", &self.root)
            .field("session_timeout", &self.session_timeout)
            .field("digest", &self.digest.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .finish()
    }
}

impl ZkUrl {
    /// Parse `raw`; errors show the URL with any password replaced.
    pub(crate) fn parse(raw: &str) -> Result<Self, LockError> {
        let url = LockUrl::parse(raw)?;
        url.expect_scheme(&["zk", "zk+tls"])?;
        let invalid = |reason: &str| url.invalid(reason);
        let tls = url.scheme() == "zk+tls";
        let digest = match url.user() {
            None => None,
            Some(user) => {
                let password = url
                    .password()
                    .ok_or_else(|| invalid("credentials must be user:password"))?;
                if user.is_empty() || user.contains(':') {
                    return Err(invalid("the digest user must be non-empty and without ':'"));
                }
                Some(format!("{user}:{password}"))
            }
        };
        let hosts = url.members()?.join(",");
        let root = url.path().trim_end_matches('/');
        let root = if root.is_empty() { DEFAULT_ROOT } else { root };
        if !plain_root(root) {
            return Err(invalid("the root must be a plain absolute path"));
        }
        let mut options = url.options()?;
        let session_timeout = match options.duration("session_timeout")? {
            Some(d) if d.is_zero() => {
                return Err(invalid("`session_timeout` must be positive"));
            }
            Some(d) => d,
            None => DEFAULT_SESSION_TIMEOUT,
        };
        let mut path = |key| {
            options.parsed(key, "a file path", |v: &str| {
                Some(PathBuf::from(v)).filter(|p| !p.as_os_str().is_empty())
            })
        };
        let (ca, cert, key) = (path("tls_ca")?, path("tls_cert")?, path("tls_key")?);
        options.finish()?;
        let tls = match (tls, ca, cert, key) {
            (false, None, None, None) => None,
            (false, ..) => return Err(invalid("TLS options need a zk+tls:// URL")),
            (true, ca, cert, key) => Some(TlsFiles {
                ca: ca.unwrap_or_else(|| PathBuf::from(SYSTEM_CA_BUNDLE)),
                identity: match (cert, key) {
                    (Some(c), Some(k)) => Some((c, k)),
                    (None, None) => None,
                    _ => return Err(invalid("`tls_cert` and `tls_key` go together")),
                },
            }),
        };
        Ok(ZkUrl {
            hosts,
            root: root.to_string(),
            session_timeout,
            digest,
            tls,
        })
    }

    /// The URL without credentials, for `Debug` and logs.
    pub(crate) fn display(&self) -> String {
        let user = self
            .digest
            .as_deref()
            .and_then(|d| d.split_once(':'))
            .map(|(u, _)| format!("{u}:***@"))
            .unwrap_or_default();
        let scheme = if self.tls.is_some() { "zk+tls" } else { "zk" };
        format!("{scheme}://{user}{}{}", self.hosts, self.root)
    }
}

/// Whether `root` is a plain absolute path: `/` then non-empty components,
/// none `.` or `..`, printable ASCII only.
pub(crate) fn plain_root(root: &str) -> bool {
    root.starts_with('/')
        && !root
            .split('/')
            .skip(1)
            .any(|c| c.is_empty() || c == "." || c == "..")
        && root.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_root_options_and_credentials_are_read() {
        let u = ZkUrl::parse("zk://app:p%40ss@h1:2181,h2:2182/svc/locks?session_timeout_ms=4000")
            .expect("valid");
        assert_eq!(u.hosts, "h1:2181,h2:2182");
        assert_eq!(u.root, "/svc/locks");
        assert_eq!(u.session_timeout, Duration::from_secs(4));
        assert_eq!(u.digest.as_deref(), Some("app:p@ss"));
        assert_eq!(u.display(), "zk://app:***@h1:2181,h2:2182/svc/locks");
        assert!(!format!("{u:?}").contains("p@ss"));
        let named = ZkUrl::parse("zk://h:2181?session_timeout=6s").expect("valid");
        assert_eq!(named.session_timeout, Duration::from_secs(6));
        let plain = ZkUrl::parse("zk://h:2181").expect("valid");
        assert_eq!(plain.root, "/distlock");
        assert_eq!(plain.digest, None);
        assert_eq!(plain.session_timeout, Duration::from_secs(10));
        assert!(plain.tls.is_none());
        let tls =
            ZkUrl::parse("zk+tls://h:2281?tls_ca=/etc/zk/ca.pem&tls_cert=/c.pem&tls_key=/k.pem")
                .expect("valid");
        let files = tls.tls.as_ref().expect("tls");
        assert_eq!(files.ca, PathBuf::from("/etc/zk/ca.pem"));
        assert_eq!(
            files.identity,
            Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem")))
        );
        assert_eq!(tls.display(), "zk+tls://h:2281/distlock");
        let system = ZkUrl::parse("zk+tls://h:2281").expect("valid");
        assert_eq!(system.tls.expect("tls").ca, PathBuf::from(SYSTEM_CA_BUNDLE));
    }

    #[test]
    fn bad_urls_are_typed_and_redacted() {
        // A `%` that starts no escape is part of the password.
        let literal = ZkUrl::parse("zk://app:secretpw%zz@h:2181").expect("valid");
        assert!(literal.digest.is_some());
        for bad in [
            "zk://app:secretpw@",
            "zk://app:secretpw@h",
            "zk://app:secretpw@:2181",
            "zk://secretpw@h:2181",
            "zk://app:secretpw@h:2181/a/../b",
            "zk://app:secretpw@h:2181//a",
            "zk://app:secretpw@h:2181/a b",
            "zk://app:secretpw@h:2181?session_timeout_ms=0",
            "zk://app:secretpw@h:2181?nope=1",
            "zks://app:secretpw@h:2181",
            "zk://app:secretpw@h:2181?tls_ca=/ca.pem",
            "zk+tls://app:secretpw@h:2181?tls_cert=/c.pem",
            "zk+tls://app:secretpw@h:2181?tls_ca=",
        ] {
            match ZkUrl::parse(bad) {
                Err(e @ LockError::InvalidUrl { .. }) => {
                    assert!(!format!("{e} {e:?}").contains("secretpw"), "{bad}: {e}");
                }
                other => panic!("{bad}: expected InvalidUrl, got {other:?}"),
            }
        }
    }
}

/// Settings of a ZooKeeper lock built on the application's own client
/// ([`ZkLock::with_client`]): what a URL's path says, and who may touch the
/// lock nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZkConfig {
    /// The absolute path under which lock nodes live, created as needed;
    /// `/distlock` by default.
    pub root: String,
    /// Create lock nodes with the `creator_all` ACL (only clients holding
    /// the creator's credentials may use them), as a URL with digest
    /// credentials does; `false` (the default) gives them `anyone_all`.
    pub creator_only: bool,
}

impl ZkConfig {
    /// With [`root`](Self::root).
    pub fn with_root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// With [`creator_only`](Self::creator_only).
    pub fn with_creator_only(mut self, creator_only: bool) -> Self {
        self.creator_only = creator_only;
        self
    }
}

impl ZkConfig {
    /// The settings a `zk://` or `zk+tls://` URL carries (its root path;
    /// creator-only nodes when it has credentials), read as
    /// [`ZkLock::connect`] reads them, for [`ZkLock::with_client`].
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let parsed = ZkUrl::parse(url)?;
        Ok(ZkConfig {
            root: parsed.root,
            creator_only: parsed.digest.is_some(),
        })
    }
}

impl Default for ZkConfig {
    fn default() -> Self {
        ZkConfig {
            root: "/distlock".to_string(),
            creator_only: false,
        }
    }
}
