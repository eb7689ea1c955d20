//! Building a lock from a URL.

use std::fmt;
use std::sync::Arc;

use lock_core::raw::LockUrl;
use lock_core::{DistributedLock, LockError, redact_url};
use lock_layers::Layer;

use crate::epoch::{EPOCH_OPTION, EpochLock, parse_epoch};
use crate::registry;

/// Build a lock service from a URL; the scheme picks the backend.
///
/// | URL | backend | feature |
/// |---|---|---|
/// | `memory://` | in-process locks (a new, empty set per call) | always |
/// | `sqlite://PATH[?table=…&busy_timeout=…&fencing=false]` | SQLite lease table | `sqlite` (default) |
/// | `redis://[user:pass@]host[:port][/db][?prefix=…&connect_timeout=…&response_timeout=…&replicas=…]`, `rediss://…` (TLS) | one Redis node | `redis` |
/// | `redis+sentinel://[user:pass@]s1[:26379],s2,…/GROUP[/db][?…]`, `rediss+sentinel://…` (TLS) | a Sentinel group's master | `redis` |
/// | `redis+cluster://[user:pass@]h1[:6379],h2,…[?…]`, `rediss+cluster://…` (TLS) | a Redis Cluster | `redis` |
/// | `redlock://[user:pass@]h1:p1,h2:p2,h3:p3[/db][?node_timeout=…&drift_factor=…&tls=true…]` | Redlock over N independent masters | `redlock` |
/// | `etcd://[user:pass@]host:port[,host:port…][/prefix][?session_ttl=…&connect_timeout=…&request_timeout=…]`, `etcd+https://…` (TLS) | etcd leases | `etcd` |
/// | `postgres://user:pass@host[:port]/db[?table=…&mode=row\|advisory&max_connections=…&sessions=…&fencing=false&sslmode=…]` | Postgres row or advisory locks | `postgres` |
/// | `mysql://user:pass@host[:port]/db[?table=…&mode=row\|advisory&max_connections=…&sessions=…&fencing=false]`, `mariadb://…` | MySQL 8 / MariaDB ≥ 10.6 row or `GET_LOCK` locks | `mysql` |
/// | `zk://[user:pass@]host:port[,host:port…][/root][?session_timeout=…]`, `zk+tls://…[?tls_ca=PEM&tls_cert=PEM&tls_key=PEM]` (TLS) | ZooKeeper ephemeral-sequential nodes | `zookeeper` |
/// | `nats://[user:pass@\|token@]host[:port][,host[:port]…][/bucket][?replicas=…&connect_timeout=…&request_timeout=…]`, `nats+tls://…[?tls_ca=PEM]` (TLS) | NATS JetStream (nats-server ≥ 2.11), a message per lock with a per-message TTL | `nats` |
/// | `migrate://?from=OLD_URL&to=NEW_URL` (nested URLs percent-encoded) | held on both, during a rolling migration ([`MigratingLock`](crate::MigratingLock)) | those of the nested URLs |
///
/// Every URL but `migrate://` also takes `fencing_epoch=N` (0–32767): the
/// backend's tokens are handed out as `(N << 48) | token` ([`EpochLock`]),
/// which the last step of a migration uses to stay above the old backend's
/// tokens.
///
/// A scheme whose feature is off gives [`LockError::InvalidUrl`] naming the
/// feature to enable; credentials never appear in errors.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::LockError> {
/// use distlock::LockOptions;
/// let locks = distlock::connect("memory://").await?;
/// let guard = locks.acquire("cache-refill", &LockOptions::new()).await?;
/// assert_eq!(guard.fencing_token(), Some(1));
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>, LockError> {
    let invalid = |reason: String| LockError::InvalidUrl {
        url: redact_url(url),
        reason,
    };
    let scheme = LockUrl::scheme_of(url)?;
    let backend = registry::backend(&scheme).map_err(invalid)?;
    if !backend.takes_epoch {
        return (backend.build)(url).await;
    }
    let (stripped, epoch) = LockUrl::take_option(url, EPOCH_OPTION)?;
    let epoch = epoch
        .map(|v| parse_epoch(&v))
        .transpose()
        .map_err(invalid)?;
    let lock = (backend.build)(&stripped).await.map_err(|e| match e {
        // Name the URL as the caller wrote it.
        LockError::InvalidUrl { reason, .. } => invalid(reason),
        other => other,
    })?;
    Ok(match epoch {
        Some(epoch) => Arc::new(EpochLock::new(lock, epoch)?),
        None => lock,
    })
}

/// What [`connect_with`] applies to a lock besides its URL: settings that
/// are objects, not text. Layers (tracing, metrics, retries, or the
/// application's own [`Layer`]), wrapped around the lock in the order they
/// are added: the first added is the innermost; and a fencing epoch, the
/// `fencing_epoch` URL option for a lock built without a URL. A lock built
/// from the application's own client or pool (`RedisLock::with_client`,
/// `PgLock::with_pool`, …) gets the same through [`apply`](Self::apply).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::LockError> {
/// use distlock::layers::{MetricsLayer, RetryLayer, TracingLayer};
/// use distlock::{ConnectOptions, LockOptions};
///
/// let options = ConnectOptions::new()
///     .layer(RetryLayer::default())
///     .layer(MetricsLayer)
///     .layer(TracingLayer);
/// let locks = distlock::connect_with("memory://", &options).await?;
/// let guard = locks.acquire("invoice-run", &LockOptions::new()).await?;
/// assert!(guard.release().await?);
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct ConnectOptions {
    layers: Vec<Arc<dyn Layer + Send + Sync>>,
    epoch: Option<u16>,
}

impl ConnectOptions {
    /// No layers: [`connect_with`] then gives what [`connect`] gives.
    pub fn new() -> Self {
        ConnectOptions::default()
    }

    /// Wrap the lock in `layer`, outside the layers added before.
    pub fn layer(mut self, layer: impl Layer + Send + Sync + 'static) -> Self {
        self.layers.push(Arc::new(layer));
        self
    }

    /// Hand out the backend's tokens in `epoch` ([`EpochLock`]), inside
    /// every layer; as the `fencing_epoch` URL option, which must then not
    /// be given as well. Checked (at most [`MAX_EPOCH`](crate::MAX_EPOCH))
    /// when applied.
    pub fn fencing_epoch(mut self, epoch: u16) -> Self {
        self.epoch = Some(epoch);
        self
    }

    /// `lock` with these options: its tokens in the fencing epoch if one is
    /// set, then the layers, innermost first. For a lock built from the
    /// application's own client or pool.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::LockError> {
    /// use std::sync::Arc;
    /// use distlock::layers::TracingLayer;
    /// use distlock::{ConnectOptions, LockOptions, MemoryLock};
    ///
    /// let options = ConnectOptions::new().fencing_epoch(2).layer(TracingLayer);
    /// let locks = options.apply(Arc::new(MemoryLock::new()))?;
    /// let guard = locks.acquire("invoice-run", &LockOptions::new()).await?;
    /// assert_eq!(guard.fencing_token(), Some((2 << 48) | 1));
    /// # Ok(()) }
    /// ```
    pub fn apply(
        &self,
        lock: Arc<dyn DistributedLock>,
    ) -> Result<Arc<dyn DistributedLock>, LockError> {
        let lock: Arc<dyn DistributedLock> = match self.epoch {
            Some(epoch) => Arc::new(EpochLock::new(lock, epoch)?),
            None => lock,
        };
        Ok(self
            .layers
            .iter()
            .fold(lock, |inner, layer| layer.layer(inner)))
    }
}

impl fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("layers", &self.layers.len())
            .field("epoch", &self.epoch)
            .finish()
    }
}

/// [`connect`], then what `options` adds (its layers, innermost first).
pub async fn connect_with(
    url: &str,
    options: &ConnectOptions,
) -> Result<Arc<dyn DistributedLock>, LockError> {
    if options.epoch.is_some() && LockUrl::take_option(url, EPOCH_OPTION)?.1.is_some() {
        return Err(LockError::invalid_options(format!(
            "a fencing epoch is given twice: as `{EPOCH_OPTION}` in the URL and in the ConnectOptions"
        )));
    }
    options.apply(connect(url).await?)
}
