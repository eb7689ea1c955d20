//! Lock-name rules shared by every backend.

use crate::error::LockError;

/// The longest accepted lock name, in bytes of UTF-8.
///
/// 256 bytes fit every backend's key limits (a MySQL `utf8mb4` primary key, a
/// ZooKeeper path segment after encoding, a Redis key with prefix) with room
/// to spare.
pub const MAX_NAME_BYTES: usize = 256;

/// Check a lock name: any non-empty UTF-8 string of at most
/// [`MAX_NAME_BYTES`] bytes without NUL characters (which C-based servers
/// truncate at). Backends map accepted names to keys safely themselves.
///
/// ```
/// use lock_core::raw::validate_name;
/// assert!(validate_name("orders/42: refund").is_ok());
/// assert!(validate_name("").is_err());
/// ```
pub fn validate_name(name: &str) -> Result<(), LockError> {
    let reason = if name.is_empty() {
        "a lock name must not be empty".to_string()
    } else if name.len() > MAX_NAME_BYTES {
        format!(
            "a lock name may be at most {MAX_NAME_BYTES} bytes of UTF-8, this one has {}",
            name.len()
        )
    } else if name.contains('\0') {
        "a lock name must not contain NUL characters".to_string()
    } else {
        return Ok(());
    };
    Err(LockError::InvalidName {
        name: name.chars().take(64).collect(),
        reason,
    })
}
