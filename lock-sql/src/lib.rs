// On docs.rs, the items a cargo feature brings say so.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc = include_str!("../docs.md")]
//! ## Overview
//!
//! SQL lock backends on sqlx.
//!
//! - `sqlite` (feature, default): a lease table shared by the processes of
//!   one machine — the zero-setup default of distlock. See [`SqliteLock`].
//! - `postgres` and `mysql` share one engine, [`SqlLock`], generic over
//!   the server's dialect: [`PgLock`] and [`MySqlLock`] are its two
//!   instances.
//! - `postgres`: row locks with `SELECT … FOR UPDATE`, or advisory locks;
//!   fencing tokens from a sequence; the lock's transaction in the user's
//!   hands. See [`PgLock`].
//! - `mysql`: MySQL 8 / MariaDB ≥ 10.6 row locks or `GET_LOCK`, with
//!   auto-increment fencing tokens. See [`MySqlLock`].
//!
//! The lock table's name is validated as an [`Identifier`]; lock names only
//! ever travel as bind parameters.

#[cfg(any(feature = "postgres", feature = "mysql"))]
mod config;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod engine;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod error;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod held;
mod ident;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod permits;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod rw;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod shared;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod transaction;

#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use config::{SqlConfig, SqlMode};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use engine::SqlLock;
pub use ident::{Identifier, MAX_IDENTIFIER_LEN};
#[cfg(feature = "mysql")]
pub use mysql::{MySqlDialect, MySqlLock};
#[cfg(feature = "postgres")]
pub use postgres::{PgDialect, PgLock, PgLockedTransaction};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteConfig, SqliteLock};
/// The `sqlx` crate these backends are built on, for the `with_pool`
/// constructors (an application's own pool) and the transactions of
/// `PgLockedTransaction`.
pub use sqlx;
