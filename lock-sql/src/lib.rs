//! SQL lock backends on sqlx.
//!
//! - `sqlite` (feature, default): a lease table shared by the processes of
//!   one machine — the zero-setup default of distlock. See [`SqliteLock`].
//! - `postgres`: row locks with `SELECT … FOR UPDATE`, or advisory locks;
//!   fencing tokens from a sequence; the lock's transaction in the user's
//!   hands. See [`PgLock`].
//! - `mysql`: reserved, not implemented in this version.
//!
//! The lock table's name is validated as an [`Identifier`]; lock names only
//! ever travel as bind parameters.

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod error;
mod ident;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "postgres")]
mod url_opts;

pub use ident::{Identifier, MAX_IDENTIFIER_LEN};
#[cfg(feature = "postgres")]
pub use postgres::{PgLock, PgLockedTransaction};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteConfig, SqliteLock};
#[cfg(feature = "postgres")]
pub use url_opts::SqlMode;
