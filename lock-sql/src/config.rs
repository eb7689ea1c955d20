//! The options distlock reads from a `postgres://` or `mysql://` URL; the
//! rest of the URL goes to sqlx unchanged.

use std::time::Duration;

use lock_core::LockError;
use lock_core::raw::LockUrl;

use crate::ident::Identifier;

/// How a SQL server holds the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlMode {
    /// A row lock (`SELECT … FOR UPDATE`) in a transaction held open.
    Row,
    /// A session advisory lock (`pg_advisory_lock`, `GET_LOCK`).
    Advisory,
}

/// Settings of a Postgres or MySQL lock built on the application's own
/// pool (`PgLock::with_pool`, `MySqlLock::with_pool`): what a URL's
/// `table`, `mode` and `sessions` options say; the pool brings the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqlConfig {
    /// The lock table (created if missing, unless
    /// [`create_schema`](Self::create_schema) is off); `distlock_locks` by
    /// default, at most 54 characters (room for its `_epoch`, `_run` and
    /// `_counters` companions).
    pub table: Identifier,
    /// Row locks (the default) or advisory locks.
    pub mode: SqlMode,
    /// Advisory mode: the long-lived sessions that carry locks granted
    /// without waiting, 0..=64 (default 2; 0 puts every lock on a pooled
    /// connection of its own).
    pub sessions: usize,
    /// Draw a fencing token for every grant (the default): a per-name
    /// counter that never goes backwards, across crashes and restarts of
    /// the server too. `false` (`fencing=false` in a URL) skips the token's
    /// write, for locks that only need exclusion; guards then carry no
    /// token and `capabilities().fencing` is `Fencing::None`.
    pub fencing: bool,
    /// Create the lock's tables at start-up if they are missing (the
    /// default). `false` (`create_schema=false` in a URL) leaves the schema
    /// to the application: the lock only checks that its tables are there,
    /// and refuses to start, naming the statements to run
    /// (`PgLock::ddl`, `MySqlLock::ddl`), when they are not.
    pub create_schema: bool,
}

impl SqlConfig {
    /// With [`table`](Self::table).
    pub fn with_table(mut self, table: Identifier) -> Self {
        self.table = table;
        self
    }

    /// With [`mode`](Self::mode).
    pub fn with_mode(mut self, mode: SqlMode) -> Self {
        self.mode = mode;
        self
    }

    /// With [`sessions`](Self::sessions).
    pub fn with_sessions(mut self, sessions: usize) -> Self {
        self.sessions = sessions;
        self
    }

    /// With [`fencing`](Self::fencing).
    pub fn with_fencing(mut self, fencing: bool) -> Self {
        self.fencing = fencing;
        self
    }

    /// With [`create_schema`](Self::create_schema).
    pub fn with_create_schema(mut self, create_schema: bool) -> Self {
        self.create_schema = create_schema;
        self
    }
}

impl Default for SqlConfig {
    fn default() -> Self {
        SqlConfig {
            table: Identifier::default_lock_table(),
            mode: SqlMode::Row,
            sessions: DEFAULT_SESSIONS,
            fencing: true,
            create_schema: true,
        }
    }
}

impl SqlConfig {
    /// The settings a `postgres://`, `postgresql://`, `mysql://` or
    /// `mariadb://` URL carries (`table`, `mode`, `sessions`, `fencing`,
    /// `create_schema`),
    /// read as `connect` reads them, for the `with_pool` constructors.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        Ok(SqlUrl::parse(url, &["postgres", "postgresql", "mysql", "mariadb"])?.config())
    }

    /// Check the settings; [`LockError::InvalidOptions`] says what is wrong.
    pub fn validate(&self) -> Result<(), LockError> {
        if self.table.as_str().len() > MAX_TABLE_LEN {
            return Err(LockError::invalid_options(TABLE_TOO_LONG));
        }
        if self.sessions > MAX_SESSIONS {
            return Err(LockError::invalid_options(format!(
                "`sessions` must be 0..={MAX_SESSIONS}, got {}",
                self.sessions
            )));
        }
        Ok(())
    }
}

/// The longest lock table name: room for the `_counters` suffix within
/// Postgres's 63.
const MAX_TABLE_LEN: usize = 54;

const TABLE_TOO_LONG: &str =
    "the table name must leave room for the `_counters` table: at most 54 characters";

/// The most shared sessions of one client.
const MAX_SESSIONS: usize = 64;

/// A parsed URL. Not `Debug`: `client_url` holds the password.
pub(crate) struct SqlUrl {
    /// For sqlx: the URL without distlock's options.
    pub(crate) client_url: String,
    /// The URL without credentials, for errors and `Debug`.
    pub(crate) display: String,
    pub(crate) table: Identifier,
    pub(crate) mode: SqlMode,
    pub(crate) max_connections: u32,
    pub(crate) connect_timeout: Duration,
    /// Advisory mode: the sessions that carry locks granted without
    /// waiting (0: every lock on a connection of its own).
    pub(crate) sessions: usize,
    /// Whether grants draw fencing tokens.
    pub(crate) fencing: bool,
    /// Whether the lock creates its tables.
    pub(crate) create_schema: bool,
}

/// The URL options sqlx's Postgres driver reads (`PgConnectOptions`), passed
/// on to it.
const POSTGRES_DRIVER_OPTIONS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// The URL options sqlx's MySQL driver reads (`MySqlConnectOptions`).
const MYSQL_DRIVER_OPTIONS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslca",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "charset",
    "collation",
    "statement-cache-capacity",
    "socket",
    "timezone",
    "time-zone",
];

/// Shared sessions of a client in advisory mode, unless the URL says.
const DEFAULT_SESSIONS: usize = 2;

impl SqlUrl {
    pub(crate) fn parse(raw: &str, schemes: &[&str]) -> Result<Self, LockError> {
        let url = LockUrl::parse(raw)?;
        let display = url.without_query().shown().to_string();
        let invalid = |reason: String| url.invalid(reason);
        url.expect_scheme(schemes)?;
        let mut options = url.options()?;
        let table = match options.text("table")? {
            Some(name) => {
                let table = Identifier::new(&name)?;
                if table.as_str().len() > MAX_TABLE_LEN {
                    return Err(LockError::invalid_options(TABLE_TOO_LONG));
                }
                table
            }
            None => Identifier::default_lock_table(),
        };
        let mode = options
            .parsed("mode", "row or advisory", |v| match v {
                "row" => Some(SqlMode::Row),
                "advisory" => Some(SqlMode::Advisory),
                _ => None,
            })?
            .unwrap_or(SqlMode::Row);
        let max_connections = options
            .parsed("max_connections", "1..=1000", |v| {
                v.parse().ok().filter(|n| (1..=1000).contains(n))
            })?
            .unwrap_or(32);
        let sessions = options
            .parsed("sessions", &format!("0..={MAX_SESSIONS}"), |v| {
                v.parse().ok().filter(|&n| n <= MAX_SESSIONS)
            })?
            .unwrap_or(DEFAULT_SESSIONS);
        let fencing = options.flag("fencing")?.unwrap_or(true);
        let create_schema = options.flag("create_schema")?.unwrap_or(true);
        let connect_timeout = match options.duration("connect_timeout")? {
            Some(d) if d.is_zero() => {
                return Err(invalid("`connect_timeout` must be positive".into()));
            }
            Some(d) => d,
            None => Duration::from_secs(5),
        };
        // The driver's own (`sslmode`, `application_name`, …); anything
        // else is a mistake, refused by name.
        let rest = match url.scheme() {
            "mysql" | "mariadb" => options.driver(MYSQL_DRIVER_OPTIONS, &[]),
            _ => options.driver(POSTGRES_DRIVER_OPTIONS, &["options["]),
        };
        options.finish()?;
        let mut client_url = url.without_query().to_url_with_credentials();
        if !rest.is_empty() {
            client_url.push('?');
            client_url.push_str(
                &url::form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(rest)
                    .finish(),
            );
        }
        Ok(SqlUrl {
            client_url,
            display,
            table,
            mode,
            max_connections,
            connect_timeout,
            sessions,
            fencing,
            create_schema,
        })
    }

    /// The settings a lock takes from this URL.
    pub(crate) fn config(&self) -> SqlConfig {
        SqlConfig {
            table: self.table.clone(),
            mode: self.mode,
            sessions: self.sessions,
            fencing: self.fencing,
            create_schema: self.create_schema,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_options_are_taken_out_and_the_rest_kept() {
        let u = SqlUrl::parse(
            "postgres://app:s3cret@db:5432/app?table=app_locks&mode=advisory&sslmode=require",
            &["postgres"],
        )
        .expect("valid");
        assert_eq!(u.table.as_str(), "app_locks");
        assert_eq!(u.mode, SqlMode::Advisory);
        assert_eq!(
            u.client_url,
            "postgres://app:s3cret@db:5432/app?sslmode=require"
        );
        assert_eq!(u.display, "postgres://app:***@db:5432/app");
        let t = SqlUrl::parse("mysql://db/app?connect_timeout=2s", &["mysql"]).expect("valid");
        assert_eq!(t.connect_timeout, Duration::from_secs(2));
    }

    #[test]
    fn an_unknown_option_is_refused_by_name_with_the_known_ones() {
        for (url, schemes, unknown, known) in [
            (
                "postgres://u:s3cret@h/db?mode=advisory&sesions=3",
                &["postgres"],
                "`sesions`",
                "sslmode",
            ),
            (
                "mysql://u:s3cret@h/db?bogus=1",
                &["mysql"],
                "`bogus`",
                "ssl-ca",
            ),
        ] {
            let Err(e @ LockError::InvalidUrl { .. }) = SqlUrl::parse(url, schemes) else {
                panic!("{url}: not refused as an invalid URL");
            };
            let said = e.to_string();
            assert!(
                said.contains(&format!("unknown option {unknown}")),
                "{said}"
            );
            assert!(said.contains("sessions") && said.contains(known), "{said}");
        }
        let driver = SqlUrl::parse(
            "postgres://h/db?sslmode=disable&options[search_path]=app&application_name=x",
            &["postgres"],
        )
        .expect("the driver's options are taken");
        assert_eq!(
            driver.client_url,
            "postgres://h/db?sslmode=disable&options%5Bsearch_path%5D=app&application_name=x"
        );
    }

    #[test]
    fn bad_options_are_typed_and_redacted() {
        for bad in [
            "postgres://u:s3cret@h/db?table=locks;%20DROP%20TABLE%20x",
            "postgres://u:s3cret@h/db?mode=sometimes",
            "postgres://u:s3cret@h/db?max_connections=0",
            "postgres://u:s3cret@h/db?mode=advisory&sessions=65",
            "postgres://u:s3cret@h/db?sessions=two",
            "postgres://u:s3cret@h/db?fencing=maybe",
            "mysql://u:s3cret@h/db",
            "postgres://u:s3cret@h/db?mode=advisory&sesions=3",
            "postgres://u:s3cret@h/db?bogus=1",
            "postgres://u:s3cret@h/db?ssl_mode=require",
        ] {
            match SqlUrl::parse(bad, &["postgres"]) {
                Err(e @ (LockError::InvalidUrl { .. } | LockError::InvalidOptions { .. })) => {
                    assert!(!format!("{e} {e:?}").contains("s3cret"), "{bad}: {e}");
                }
                Err(other) => panic!("{bad}: unexpected {other}"),
                Ok(_) => panic!("{bad}: accepted"),
            }
        }
    }
}
