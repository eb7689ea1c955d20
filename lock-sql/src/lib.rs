//! SQL lock backends on sqlx.
//!
//! - `sqlite` (feature, default): a lease table shared by the processes of
//!   one machine — the zero-setup default of distlock. See [`SqliteLock`].
//! - `postgres`, `mysql`: row locks with `SELECT … FOR UPDATE`; reserved
//!   features, not implemented in this version.
//!
//! The lock table's name is validated as an [`Identifier`]; lock names only
//! ever travel as bind parameters.

#[cfg(feature = "sqlite")]
mod error;
mod ident;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use ident::{Identifier, MAX_IDENTIFIER_LEN};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteConfig, SqliteLock};
