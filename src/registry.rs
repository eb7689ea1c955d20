//! The URL schemes [`connect`](crate::connect) knows: each backend's
//! schemes, the cargo feature that compiles it in, and its constructor
//! when that feature is on. Adding a backend is one entry here.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use lock_core::{DistributedLock, LockError};

/// A lock being built from its URL.
type Connecting<'a> =
    Pin<Box<dyn Future<Output = Result<Arc<dyn DistributedLock>, LockError>> + Send + 'a>>;

/// A backend's constructor: the URL as the user wrote it (without the
/// options [`connect`](crate::connect) takes itself).
type Build = for<'a> fn(&'a str) -> Connecting<'a>;

/// One backend of the registry.
struct Backend {
    /// The schemes it answers, lower-case.
    schemes: &'static [&'static str],
    /// The cargo feature that compiles it in (`None`: always there).
    feature: Option<&'static str>,
    /// Its constructor; `None` when the feature is off.
    build: Option<Build>,
    /// Whether its URLs take `fencing_epoch` (every backend's but
    /// `migrate://`'s, whose nested URLs take their own).
    takes_epoch: bool,
}

/// A registry entry for a backend crate's lock type with an
/// `async fn connect(&str) -> Result<Self, LockError>`, compiled in with
/// cargo feature `$feature`.
macro_rules! backend {
    ($feature:literal, [$($scheme:literal),+ $(,)?], $lock:path) => {{
        #[cfg(feature = $feature)]
        fn build(url: &str) -> Connecting<'_> {
            Box::pin(async move {
                let lock = <$lock>::connect(url).await?;
                Ok(Arc::new(lock) as Arc<dyn DistributedLock>)
            })
        }
        Backend {
            schemes: &[$($scheme),+],
            feature: Some($feature),
            #[cfg(feature = $feature)]
            build: Some(build),
            #[cfg(not(feature = $feature))]
            build: None,
            takes_epoch: true,
        }
    }};
}

/// Every backend, in the order the scheme list shows them.
const BACKENDS: &[Backend] = &[
    Backend {
        schemes: &["memory"],
        feature: None,
        build: Some(memory),
        takes_epoch: true,
    },
    backend!("sqlite", ["sqlite"], lock_sql::SqliteLock),
    backend!(
        "redis",
        [
            "redis",
            "rediss",
            "redis+sentinel",
            "rediss+sentinel",
            "redis+cluster",
            "rediss+cluster",
        ],
        lock_redis::RedisLock
    ),
    backend!("redlock", ["redlock"], lock_redlock::Redlock),
    backend!("postgres", ["postgres", "postgresql"], lock_sql::PgLock),
    backend!("mysql", ["mysql", "mariadb"], lock_sql::MySqlLock),
    backend!("etcd", ["etcd", "etcd+https"], lock_etcd::EtcdLock),
    backend!("zookeeper", ["zk", "zk+tls"], lock_zk::ZkLock),
    backend!("nats", ["nats", "nats+tls"], lock_nats::NatsLock),
    Backend {
        schemes: &["migrate"],
        feature: None,
        build: Some(migrate),
        takes_epoch: false,
    },
];

/// `memory://`: a new, empty set of in-process locks.
fn memory(url: &str) -> Connecting<'_> {
    Box::pin(async move {
        let rest = url.split_once("://").map_or("", |(_, rest)| rest);
        if !rest.is_empty() {
            return Err(LockError::InvalidUrl {
                url: lock_core::redact_url(url),
                reason: "memory:// takes no host, path or options".into(),
            });
        }
        Ok(Arc::new(lock_core::MemoryLock::new()) as Arc<dyn DistributedLock>)
    })
}

/// `migrate://?from=…&to=…`: held on both nested URLs' locks.
fn migrate(url: &str) -> Connecting<'_> {
    Box::pin(async move {
        let lock = crate::MigratingLock::connect(url).await?;
        Ok(Arc::new(lock) as Arc<dyn DistributedLock>)
    })
}

/// A URL scheme [`connect`](crate::connect) knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Scheme {
    /// The scheme, as written before `://`.
    pub name: &'static str,
    /// The cargo feature of distlock that compiles its backend in; `None`
    /// for `memory://` and `migrate://`, which are always there.
    pub feature: Option<&'static str>,
    /// Whether that backend is compiled into this build.
    pub compiled_in: bool,
}

/// Every scheme [`connect`](crate::connect) knows, whether or not its
/// backend is compiled in.
///
/// ```
/// assert!(distlock::schemes().any(|s| s.name == "memory" && s.compiled_in));
/// ```
pub fn schemes() -> impl Iterator<Item = Scheme> {
    BACKENDS.iter().flat_map(|b| {
        b.schemes.iter().map(|&name| Scheme {
            name,
            feature: b.feature,
            compiled_in: b.build.is_some(),
        })
    })
}

/// What [`connect`](crate::connect) needs of a scheme's backend.
pub(crate) struct Found {
    /// The constructor.
    pub(crate) build: Build,
    /// Whether the URL takes `fencing_epoch`.
    pub(crate) takes_epoch: bool,
}

/// The backend of `scheme` (lower-case), or why there is none: an
/// unknown scheme, or a backend whose feature is off.
pub(crate) fn backend(scheme: &str) -> Result<Found, String> {
    let Some(backend) = BACKENDS.iter().find(|b| b.schemes.contains(&scheme)) else {
        let known: Vec<&str> = schemes().map(|s| s.name).collect();
        return Err(format!(
            "unknown scheme `{scheme}` (known: {})",
            known.join(", ")
        ));
    };
    let build = backend.build.ok_or_else(|| {
        let feature = backend.feature.unwrap_or_default();
        format!(
            "the `{feature}` backend is not compiled in: enable the distlock cargo feature `{feature}` (or `full`)"
        )
    })?;
    Ok(Found {
        build,
        takes_epoch: backend.takes_epoch,
    })
}
