//! The one error type every backend returns.

use std::time::Duration;

use crate::loss::LossReason;

/// A boxed error from a client library or the operating system, kept as the
/// `source()` of a [`LockError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong when taking, holding or giving back a lock.
///
/// Messages carry enough context to act on (the lock name, the backend, what
/// to change) and never contain credentials: URLs are shown redacted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The wait timeout passed before the lock became free.
    #[error(
        "timed out after {waited:?} waiting for lock `{name}`; it is still held by someone else (raise the wait timeout or use try_acquire)"
    )]
    Timeout {
        /// The lock name.
        name: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// The lock service could not be reached or did not answer in time.
    #[error("{backend} is unavailable: {reason}{}", cause_suffix(reason, source))]
    Unavailable {
        /// The backend that failed (`"sqlite"`, `"redis"`, …).
        backend: &'static str,
        /// What was being attempted when it failed.
        reason: String,
        /// The client library's error.
        #[source]
        source: Option<BoxError>,
    },

    /// A quorum-based backend got fewer grants than it needs.
    #[error(
        "quorum not reached: {acquired} of the {needed} nodes needed granted the lock{}",
        causes_suffix(causes)
    )]
    QuorumNotReached {
        /// Nodes that granted the lock.
        acquired: usize,
        /// Nodes needed for a majority.
        needed: usize,
        /// Why the other nodes did not, one entry per node that failed
        /// (`"host:port: cause"`), for diagnostics.
        causes: Vec<String>,
    },

    /// The lock is not (or no longer) held by this owner: released already,
    /// expired, or taken by someone else.
    #[error("lock `{name}` is not held by this owner (released, expired or taken over)")]
    NotHeld {
        /// The lock name.
        name: String,
    },

    /// The lock was lost while held, for the given reason.
    #[error("lock `{name}` was lost: {reason}")]
    Lost {
        /// The lock name.
        name: String,
        /// Why it is known or suspected lost.
        reason: LossReason,
    },

    /// The lock name is not acceptable.
    #[error("invalid lock name {name:?}: {reason}")]
    InvalidName {
        /// The offending name, shortened to at most 64 characters.
        name: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A [`LockOptions`](crate::LockOptions) value or backend setting is out of range.
    #[error("invalid lock options: {reason}")]
    InvalidOptions {
        /// What is wrong and what is accepted.
        reason: String,
    },

    /// A connection URL could not be used. The URL is shown without credentials.
    #[error("invalid lock URL `{url}`: {reason}")]
    InvalidUrl {
        /// The URL with any password removed.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// This client already holds, or waits for, as many locks as the
    /// backend lets one client have at once
    /// ([`Capabilities::max_held`](crate::Capabilities::max_held)): a
    /// release makes room. Returned at once, not after the wait.
    #[error(
        "{backend}: this client already holds or waits for {limit} locks, the most it can at once ({advice})"
    )]
    LimitReached {
        /// The backend.
        backend: &'static str,
        /// The limit.
        limit: usize,
        /// What raises it, or what to use instead.
        advice: String,
    },

    /// The backend cannot do this operation.
    #[error("{backend} does not support {operation}")]
    Unsupported {
        /// The backend.
        backend: &'static str,
        /// The operation asked for.
        operation: &'static str,
    },

    /// The server answered with something the backend did not expect.
    #[error("{backend} error: {reason}{}", cause_suffix(reason, source))]
    Backend {
        /// The backend that failed.
        backend: &'static str,
        /// What was being attempted.
        reason: String,
        /// The client library's error.
        #[source]
        source: Option<BoxError>,
    },
}

/// `": "` and the innermost cause of `source`, unless `reason` says it
/// already: a message that names what failed and why, once, whatever
/// prints it (`Display` alone, or a reporter that also walks `source()`).
fn cause_suffix(reason: &str, source: &Option<BoxError>) -> String {
    let Some(mut cause) = source
        .as_deref()
        .map(|e| e as &(dyn std::error::Error + 'static))
    else {
        return String::new();
    };
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    let said = cause.to_string();
    if said.is_empty() || reason.contains(&said) {
        String::new()
    } else {
        format!(": {said}")
    }
}

fn causes_suffix(causes: &[String]) -> String {
    if causes.is_empty() {
        String::new()
    } else {
        format!(" ({})", causes.join("; "))
    }
}

impl LockError {
    /// An [`InvalidOptions`](LockError::InvalidOptions) error.
    pub fn invalid_options(reason: impl Into<String>) -> Self {
        LockError::InvalidOptions {
            reason: reason.into(),
        }
    }

    /// An [`Unavailable`](LockError::Unavailable) error wrapping a client error.
    pub fn unavailable(
        backend: &'static str,
        reason: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        LockError::Unavailable {
            backend,
            reason: reason.into(),
            source: Some(source.into()),
        }
    }

    /// A [`Backend`](LockError::Backend) error wrapping a client error.
    pub fn backend(
        backend: &'static str,
        reason: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        LockError::Backend {
            backend,
            reason: reason.into(),
            source: Some(source.into()),
        }
    }

    /// True for errors worth retrying later (the service was unreachable or
    /// a quorum was missed), false for errors that retrying cannot fix.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            LockError::Unavailable { .. } | LockError::QuorumNotReached { .. }
        )
    }

    /// True for errors in what the caller asked for (the URL, the lock
    /// name, the options, an operation the backend does not offer): asking
    /// again unchanged fails the same way, on any server. A tool that
    /// retries transient errors reports these as configuration errors.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            LockError::InvalidUrl { .. }
                | LockError::InvalidName { .. }
                | LockError::InvalidOptions { .. }
                | LockError::Unsupported { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error two levels deep, as a client library wraps an I/O error.
    #[derive(Debug, thiserror::Error)]
    #[error("failed to connect")]
    struct Wrapping(#[source] std::io::Error);

    #[test]
    fn display_names_the_innermost_cause_once() {
        let refused =
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let e = LockError::unavailable(
            "redis",
            "connecting to redis://127.0.0.1:1/0",
            Wrapping(refused),
        );
        assert_eq!(
            e.to_string(),
            "redis is unavailable: connecting to redis://127.0.0.1:1/0: Connection refused"
        );
        let said = LockError::backend(
            "etcd",
            "put failed: Connection refused",
            std::io::Error::other("Connection refused"),
        );
        assert_eq!(
            said.to_string(),
            "etcd error: put failed: Connection refused"
        );
        let alone = LockError::Unavailable {
            backend: "zk",
            reason: "no session".into(),
            source: None,
        };
        assert_eq!(alone.to_string(), "zk is unavailable: no session");
    }

    #[test]
    fn configuration_errors_are_not_transient() {
        let config = [
            LockError::invalid_options("ttl"),
            LockError::InvalidName {
                name: String::new(),
                reason: "empty".into(),
            },
            LockError::InvalidUrl {
                url: "x://".into(),
                reason: "scheme".into(),
            },
            LockError::Unsupported {
                backend: "zk",
                operation: "inspect",
            },
        ];
        for e in &config {
            assert!(e.is_config() && !e.is_transient(), "{e}");
        }
        let down = LockError::unavailable("redis", "connecting", "refused");
        assert!(!down.is_config() && down.is_transient());
    }
}
