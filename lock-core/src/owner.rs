//! Owner tokens: who holds a lock, per acquisition.

use std::fmt;

/// A random 128-bit token identifying one acquisition. Backends store it with
/// the lock and only release or extend when the stored token matches, so a
/// late release never removes someone else's lock.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(u128);

impl OwnerToken {
    /// A fresh token from the thread-local CSPRNG.
    pub fn random() -> Self {
        OwnerToken(rand::random())
    }

    /// The token as 32 lowercase hex digits, the form stored on servers.
    pub fn to_hex(&self) -> String {
        format!("{:032x}", self.0)
    }

    /// The raw 128 bits.
    pub fn as_u128(&self) -> u128 {
        self.0
    }
}

impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({:032x})", self.0)
    }
}
