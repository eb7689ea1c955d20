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
        // On every acquire, so without `fmt`: the bytes most significant
        // first, as `{:032x}` writes them. 16 bytes fill the 32 digits
        // exactly, so the encoding cannot fail.
        let mut digits = [0u8; 32];
        let _ = hex::encode_to_slice(self.0.to_be_bytes(), &mut digits);
        std::str::from_utf8(&digits).unwrap_or_default().to_owned()
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

#[cfg(test)]
mod tests {
    use super::OwnerToken;

    #[test]
    fn hex_is_32_lowercase_digits_most_significant_first() {
        for bits in [
            0,
            1,
            0xab,
            u128::MAX,
            0x0123_4567_89ab_cdef << 64,
            rand::random(),
        ] {
            let token = OwnerToken(bits);
            assert_eq!(token.to_hex(), format!("{bits:032x}"));
            assert_eq!(token.to_hex(), token.to_string());
        }
    }
}
