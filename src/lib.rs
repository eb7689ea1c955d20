//! # distlock
//!
//! Distributed locks behind one trait, [`DistributedLock`], with the backend
//! chosen by a URL at run time and by cargo features at build time:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::LockError> {
//! use std::time::Duration;
//! use distlock::{LockOptions, Wait};
//!
//! let dir = tempfile::tempdir().expect("temp dir");
//! let url = format!("sqlite://{}/locks.db", dir.path().display());
//! let locks = distlock::connect(&url).await?;
//!
//! let opts = LockOptions::new().wait(Wait::UpTo(Duration::from_secs(5)));
//! let guard = locks.acquire("invoice-run", &opts).await?;
//! let token = guard.fencing_token(); // hand this to the protected resource
//! tokio::select! {
//!     _ = async { /* the protected work */ } => {}
//!     reason = guard.lost() => eprintln!("stopping: {reason}"),
//! }
//! assert!(guard.release().await?);
//! # let _ = token; Ok(()) }
//! ```
//!
//! See [`Capabilities`] to compare what each backend guarantees, and
//! [`LockOwner`] for opt-in reentrancy.

// On docs.rs, the items a cargo feature brings say so.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod connect;
mod epoch;
mod migrate;
mod registry;

/// Layers for any lock: tracing spans, metrics, retries (`lock-layers`).
pub use lock_layers as layers;

pub use connect::{ConnectOptions, connect, connect_with};
pub use epoch::{EPOCH_OPTION, EPOCH_SHIFT, EpochLock, MAX_EPOCH};
pub use lock_core::redact_url;
pub use lock_core::{
    Access, Backoff, Capabilities, Changes, CrashRelease, DEFAULT_NOTIFIED_REREAD,
    DEFAULT_POLL_INTERVAL, DistributedLock, ELECTION_PREFIX, Election, Fencing, Grade, Holder,
    Leader, Leadership, Led, LockError, LockGuard, LockInfo, LockOptions, LockOwner, LockSet,
    LockSetExt, LossKind, LossReason, MAX_IDENTITY_BYTES, MAX_NAME_BYTES, MAX_SET_NAMES,
    MAX_VALUE_BYTES, MemberLost, MemoryLock, PermitInfo, RELEASE_PATIENCE, ReentrantGuard, Report,
    RwHolderInfo, RwLockCapabilities, RwLockExt, RwLockInfo, Semaphore, SemaphoreCapabilities,
    SemaphoreInfo, WAIT_OVERRUN, Wait, Waiting, default_identity, with_lock,
};
#[cfg(feature = "etcd")]
pub use lock_etcd::{EtcdConfig, EtcdLock, etcd_client};
#[cfg(feature = "nats")]
pub use lock_nats::{NatsConfig, NatsLock, async_nats};
#[cfg(feature = "redis")]
pub use lock_redis::{RedisConfig, RedisLock, redis};
#[cfg(all(feature = "redlock", not(feature = "redis")))]
pub use lock_redlock::redis;
#[cfg(feature = "redlock")]
pub use lock_redlock::{Redlock, RedlockConfig};
#[cfg(feature = "mysql")]
pub use lock_sql::MySqlLock;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use lock_sql::sqlx;
#[cfg(feature = "postgres")]
pub use lock_sql::{PgLock, PgLockedTransaction};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use lock_sql::{SqlConfig, SqlMode};
#[cfg(feature = "sqlite")]
pub use lock_sql::{SqliteConfig, SqliteLock};
#[cfg(feature = "zookeeper")]
pub use lock_zk::{ZkConfig, ZkLock, zookeeper_client};
pub use migrate::MigratingLock;
pub use registry::{Scheme, schemes};

/// The README's examples, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The guide's examples (`docs/guide.md`), compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide.md")]
pub struct GuideDoctests;
