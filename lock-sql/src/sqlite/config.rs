//! [`SqliteConfig`] and the `sqlite://PATH?query` URL it is read from.

use std::path::PathBuf;
use std::time::Duration;

use lock_core::LockError;
use lock_core::raw::LockUrl;

use crate::ident::Identifier;

/// Settings for [`SqliteLock`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SqliteConfig {
    /// The lease table, created if missing. Default `distlock_leases`.
    pub table: Identifier,
    /// How long a statement waits for another process's write lock before
    /// failing with `Unavailable`. Default 5 s.
    pub busy_timeout: Duration,
    /// Pooled connections. Default 4.
    pub max_connections: u32,
    /// Hand out fencing tokens (the default). The token comes with the
    /// grant's own statement at no extra cost on SQLite; `false`
    /// (`fencing=false` in a URL) only leaves guards without one and makes
    /// `capabilities().fencing` `Fencing::None`, as on the other SQL
    /// backends.
    pub fencing: bool,
}

impl SqliteConfig {
    /// With [`table`](Self::table).
    pub fn with_table(mut self, table: Identifier) -> Self {
        self.table = table;
        self
    }

    /// With [`busy_timeout`](Self::busy_timeout).
    pub fn with_busy_timeout(mut self, busy_timeout: Duration) -> Self {
        self.busy_timeout = busy_timeout;
        self
    }

    /// With [`max_connections`](Self::max_connections).
    pub fn with_max_connections(mut self, max_connections: u32) -> Self {
        self.max_connections = max_connections;
        self
    }

    /// With [`fencing`](Self::fencing).
    pub fn with_fencing(mut self, fencing: bool) -> Self {
        self.fencing = fencing;
        self
    }
}

impl Default for SqliteConfig {
    fn default() -> Self {
        SqliteConfig {
            table: Identifier::default_table(),
            busy_timeout: Duration::from_secs(5),
            max_connections: 4,
            fencing: true,
        }
    }
}

impl SqliteConfig {
    /// The settings a `sqlite://` URL carries (its options; the path is
    /// [`SqliteLock::open`]'s own argument), read as
    /// [`SqliteLock::connect`] reads them.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        Ok(parse_url(url)?.1)
    }
}

/// SQLite's busy timeout is a C `int` of milliseconds.
pub(crate) const MAX_BUSY_TIMEOUT_MS: u64 = i32::MAX as u64;

/// Split `sqlite://PATH?query` into a path and settings.
pub(crate) fn parse_url(raw: &str) -> Result<(PathBuf, SqliteConfig), LockError> {
    let url = LockUrl::parse_file(raw)?;
    url.expect_scheme(&["sqlite"])?;
    let invalid = |reason: String| url.invalid(reason);
    if url.user().is_some() {
        return Err(invalid(
            "a sqlite:// URL takes no user or password (write an `@` in the path as %40)".into(),
        ));
    }
    let path = url.path().to_string();
    if path.is_empty() {
        return Err(invalid(
            "the database path is empty (use `sqlite:///abs/path.db` or `sqlite://rel/path.db`)"
                .into(),
        ));
    }
    let mut config = SqliteConfig::default();
    let mut options = url.options()?;
    if let Some(name) = options.text("table")? {
        config.table = Identifier::new(&name)?;
    }
    if let Some(d) = options.duration("busy_timeout")? {
        if d.as_millis() > u128::from(MAX_BUSY_TIMEOUT_MS) {
            return Err(invalid(format!(
                "`busy_timeout` is at most {MAX_BUSY_TIMEOUT_MS} ms (SQLite counts it in a 32-bit int), got {d:?}"
            )));
        }
        config.busy_timeout = d;
    }
    if let Some(n) = options.number("max_connections")? {
        config.max_connections = n;
    }
    if let Some(fencing) = options.flag("fencing")? {
        config.fencing = fencing;
    }
    options.finish()?;
    Ok((PathBuf::from(path), config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::SqliteLock;

    #[test]
    fn url_paths_and_options() {
        let (p, c) =
            parse_url("sqlite:///tmp/a%20b.db?table=my_locks&busy_timeout_ms=250").expect("valid");
        assert_eq!(p, PathBuf::from("/tmp/a b.db"));
        assert_eq!(c.table.as_str(), "my_locks");
        assert_eq!(c.busy_timeout, Duration::from_millis(250));
        let (p, _) = parse_url("sqlite://rel/x.db").expect("valid");
        assert_eq!(p, PathBuf::from("rel/x.db"));
        let (_, c) = parse_url("sqlite://x.db?busy_timeout=1.5s").expect("valid");
        assert_eq!(c.busy_timeout, Duration::from_millis(1500));
    }

    #[test]
    fn bad_urls_are_typed() {
        for bad in [
            "sqlite://",
            "postgres://x",
            "sqlite:///x.db?table=locks;%20DROP%20TABLE%20x",
            "sqlite:///x.db?nope=1",
            "sqlite:///x.db?busy_timeout_ms=soon",
            "sqlite:///x%zz.db",
        ] {
            match parse_url(bad) {
                Err(LockError::InvalidUrl { .. } | LockError::InvalidOptions { .. }) => {}
                other => panic!("{bad}: expected a typed error, got {other:?}"),
            }
        }
    }

    /// A busy timeout beyond SQLite's 32-bit millisecond count is refused
    /// with the option and its maximum named, from a URL and from a config
    /// (it used to panic in the driver's worker thread).
    #[tokio::test]
    async fn an_oversized_busy_timeout_is_refused() {
        for url in [
            "sqlite:///tmp/x.db?busy_timeout_ms=4294967296",
            "sqlite:///tmp/x.db?busy_timeout=25days",
        ] {
            match parse_url(url) {
                Err(LockError::InvalidUrl { reason, .. }) => {
                    assert!(reason.contains("busy_timeout"), "{reason}");
                    assert!(reason.contains("2147483647"), "{reason}");
                }
                other => panic!("{url}: expected InvalidUrl, got {other:?}"),
            }
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let config = SqliteConfig {
            busy_timeout: Duration::from_millis(1 << 32),
            ..SqliteConfig::default()
        };
        assert!(matches!(
            SqliteLock::open(dir.path().join("l.db"), config).await,
            Err(LockError::InvalidOptions { .. })
        ));
    }
}
