//! Who holds a lock: the identity and the small value a grant records on
//! the server beside the lock, read back by
//! [`inspect`](crate::DistributedLock::inspect) and by an election's
//! observers.

use std::fmt;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::LockError;

/// The longest holder identity, in bytes ([`LockOptions::identity`](crate::LockOptions::identity)).
pub const MAX_IDENTITY_BYTES: usize = 256;

/// The largest holder value, in bytes ([`LockOptions::value`](crate::LockOptions::value),
/// an election's value): a small record such as an address, not a payload.
pub const MAX_VALUE_BYTES: usize = 1024;

/// The holder of a lock as its grant recorded it: who (an identity, by
/// default `host (pid N, program)`), what it published (a value of up to
/// [`MAX_VALUE_BYTES`], empty unless set), and since when by the holder's
/// own clock.
///
/// It describes; it never decides: the fencing token orders grants, not
/// the time here (the holder's clock may be off).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// Who holds the lock ([`LockOptions::identity`](crate::LockOptions::identity)).
    pub identity: String,
    /// What the holder published with it ([`LockOptions::value`](crate::LockOptions::value);
    /// an election's leader replaces it with `proclaim`).
    pub value: Vec<u8>,
    /// When the holder asked for the lock, by its own wall clock.
    pub since: SystemTime,
}

impl Holder {
    /// The value as text, if it is UTF-8.
    pub fn value_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.value).ok()
    }
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("Holder");
        s.field("identity", &self.identity);
        match self.value_str() {
            Some(text) => s.field("value", &text),
            None => s.field("value", &format_args!("{} bytes", self.value.len())),
        };
        s.field("since", &humantime::format_rfc3339_millis(self.since))
            .finish()
    }
}

/// This process's default holder identity: `host (pid N, program)`,
/// computed once.
pub fn default_identity() -> &'static str {
    static IDENTITY: OnceLock<String> = OnceLock::new();
    IDENTITY.get_or_init(|| {
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        let program = std::env::args_os()
            .next()
            .and_then(|p| {
                std::path::Path::new(&p)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| "unknown program".to_string());
        let mut identity = format!("{host} (pid {}, {program})", std::process::id());
        truncate_utf8(&mut identity, MAX_IDENTITY_BYTES);
        identity
    })
}

fn truncate_utf8(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// Check an identity and a value against their limits.
pub(crate) fn validate_holder(identity: Option<&str>, value: &[u8]) -> Result<(), LockError> {
    if let Some(identity) = identity
        && identity.len() > MAX_IDENTITY_BYTES
    {
        return Err(LockError::invalid_options(format!(
            "the holder identity is {} bytes; at most {MAX_IDENTITY_BYTES} are kept",
            identity.len()
        )));
    }
    validate_value(value)
}

/// Check a holder value against [`MAX_VALUE_BYTES`].
pub(crate) fn validate_value(value: &[u8]) -> Result<(), LockError> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(LockError::invalid_options(format!(
            "the holder value is {} bytes; at most {MAX_VALUE_BYTES} are kept",
            value.len()
        )));
    }
    Ok(())
}

/// The first bytes of every record: a format tag and version.
const MAGIC: &[u8; 4] = b"dlh1";

/// A holder as one byte string, the form every backend stores (a Redis
/// string, an etcd value, a ZooKeeper node's data, a SQL `bytea`/`VARBINARY`/
/// `BLOB`): `dlh1`, the identity's length (2 bytes, big-endian), the
/// identity, the time in milliseconds since 1970 (8 bytes, big-endian),
/// then the value.
#[derive(Clone, PartialEq, Eq)]
pub struct HolderRecord(Vec<u8>);

impl HolderRecord {
    /// The record of a grant asked for now by `identity` with `value`
    /// (checked by the options before: longer ones are cut to the limits).
    pub fn new(identity: &str, value: &[u8]) -> Self {
        Self::at(identity, value, SystemTime::now())
    }

    fn at(identity: &str, value: &[u8], since: SystemTime) -> Self {
        let mut identity = identity.to_string();
        truncate_utf8(&mut identity, MAX_IDENTITY_BYTES);
        let value = &value[..value.len().min(MAX_VALUE_BYTES)];
        let millis = since
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let mut out = Vec::with_capacity(MAGIC.len() + 2 + identity.len() + 8 + value.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(identity.len() as u16).to_be_bytes());
        out.extend_from_slice(identity.as_bytes());
        out.extend_from_slice(&millis.to_be_bytes());
        out.extend_from_slice(value);
        HolderRecord(out)
    }

    /// The same holder with another value (an election's `proclaim`).
    pub fn with_value(&self, value: &[u8]) -> Self {
        match Self::decode(&self.0) {
            Ok(h) => Self::at(&h.identity, value, h.since),
            Err(_) => Self::new(default_identity(), value),
        }
    }

    /// A record read back from a server, if the bytes are one.
    pub fn from_stored(bytes: &[u8]) -> Option<Self> {
        Self::decode(bytes)
            .ok()
            .map(|_| HolderRecord(bytes.to_vec()))
    }

    /// The stored bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Read a stored record back. Bytes that are not a record (written by
    /// something else, or cut short) are an error naming what is wrong,
    /// for the backend to report as [`LockError::Backend`].
    pub fn decode(bytes: &[u8]) -> Result<Holder, String> {
        let rest = bytes
            .strip_prefix(MAGIC.as_slice())
            .ok_or_else(|| "the holder record does not start with its format tag".to_string())?;
        let (len, rest) = rest
            .split_first_chunk::<2>()
            .ok_or_else(|| "the holder record is cut short".to_string())?;
        let len = usize::from(u16::from_be_bytes(*len));
        if rest.len() < len + 8 {
            return Err("the holder record is cut short".to_string());
        }
        let (identity, rest) = rest.split_at(len);
        let identity = std::str::from_utf8(identity)
            .map_err(|_| "the holder identity is not UTF-8".to_string())?
            .to_string();
        let (millis, value) = rest
            .split_first_chunk::<8>()
            .ok_or_else(|| "the holder record is cut short".to_string())?;
        let since = UNIX_EPOCH
            .checked_add(Duration::from_millis(u64::from_be_bytes(*millis)))
            .unwrap_or(UNIX_EPOCH);
        Ok(Holder {
            identity,
            value: value.to_vec(),
            since,
        })
    }

    /// [`decode`](Self::decode), the error as [`LockError::Backend`] of
    /// `backend` about lock `name`.
    pub fn decode_for(
        backend: &'static str,
        name: &str,
        bytes: &[u8],
    ) -> Result<Holder, LockError> {
        Self::decode(bytes).map_err(|reason| LockError::Backend {
            backend,
            reason: format!("reading the holder of lock {name:?}: {reason}"),
            source: None,
        })
    }
}

impl fmt::Debug for HolderRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Self::decode(&self.0) {
            Ok(h) => h.fmt(f),
            Err(e) => write!(f, "HolderRecord({e})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written() {
        let since = UNIX_EPOCH + Duration::from_millis(1_790_000_000_123);
        let rec = HolderRecord::at("api-2 (pid 4312, api)", b"10.0.0.7:8080", since);
        let h = HolderRecord::decode(rec.as_bytes()).expect("decode");
        assert_eq!(h.identity, "api-2 (pid 4312, api)");
        assert_eq!(h.value_str(), Some("10.0.0.7:8080"));
        assert_eq!(h.since, since);
        let other = HolderRecord::decode(rec.with_value(b"").as_bytes()).expect("decode");
        assert_eq!(
            (other.identity, other.value, other.since),
            (h.identity, vec![], since)
        );
    }

    #[test]
    fn foreign_or_short_bytes_are_an_error_not_a_panic() {
        let rec = HolderRecord::new("x", b"v");
        for cut in 0..rec.as_bytes().len() - 1 {
            assert!(
                HolderRecord::decode(&rec.as_bytes()[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        assert!(HolderRecord::decode(b"owner-token").is_err());
        let err = HolderRecord::decode_for("redis", "job", b"").expect_err("empty");
        assert!(err.to_string().contains("job"), "{err}");
    }

    #[test]
    fn the_default_identity_names_host_pid_and_program() {
        let id = default_identity();
        assert!(id.contains(&format!("pid {}", std::process::id())), "{id}");
        assert!(id.len() <= MAX_IDENTITY_BYTES);
    }

    #[test]
    fn limits_are_typed_errors() {
        assert!(validate_holder(Some(&"x".repeat(MAX_IDENTITY_BYTES + 1)), b"").is_err());
        assert!(validate_holder(None, &[0; MAX_VALUE_BYTES + 1]).is_err());
        assert!(validate_holder(Some("a"), &[0; MAX_VALUE_BYTES]).is_ok());
    }
}
