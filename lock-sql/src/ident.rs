//! SQL identifiers (the lock table's name) are validated, never escaped:
//! lock names travel only as bind parameters, and the table name is the one
//! piece of SQL text a user can configure.

use lock_core::LockError;

/// The longest accepted table name (Postgres truncates at 63 bytes, MySQL at 64).
pub const MAX_IDENTIFIER_LEN: usize = 63;

/// A checked SQL identifier: an ASCII letter or `_`, then letters, digits or
/// `_`, at most [`MAX_IDENTIFIER_LEN`] characters.
///
/// ```
/// use lock_sql::Identifier;
/// assert!(Identifier::new("distlock_leases").is_ok());
/// assert!(Identifier::new("locks; DROP TABLE x").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identifier(String);

impl Identifier {
    /// Check `name`; [`LockError::InvalidOptions`] says what is wrong.
    pub fn new(name: &str) -> Result<Self, LockError> {
        let mut chars = name.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if first_ok && rest_ok && name.len() <= MAX_IDENTIFIER_LEN {
            Ok(Identifier(name.to_string()))
        } else {
            Err(LockError::invalid_options(format!(
                "table name {:?} is not a plain SQL identifier (a letter or `_`, then letters, digits or `_`, at most {MAX_IDENTIFIER_LEN} characters)",
                name.chars().take(80).collect::<String>()
            )))
        }
    }

    /// SQLite's default lease table, `distlock_leases`.
    #[cfg(feature = "sqlite")]
    pub fn default_table() -> Self {
        Identifier("distlock_leases".to_string())
    }

    /// The default lock table of Postgres and MySQL (a known-good constant).
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn default_lock_table() -> Self {
        Identifier("distlock_locks".to_string())
    }

    /// The identifier as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}
