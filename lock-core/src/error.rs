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
///
/// `Display` says what failed and where; the client library's error is the
/// [`source()`](std::error::Error::source), never repeated in the message,
/// so a reporter that walks the chain (anyhow's `{:#}`, eyre, `tracing`'s
/// error fields) shows each cause once. `source()` passes over the links of
/// a client error that only repeat what the message or the next link says
/// (as `sqlx` and `tonic` print their cause in their own message):
/// [`report`](Self::report) prints the whole chain the same way.
#[derive(Debug)]
#[non_exhaustive]
pub enum LockError {
    /// The wait timeout passed before the lock became free.
    Timeout {
        /// The lock name.
        name: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// The lock service could not be reached or did not answer in time.
    Unavailable {
        /// The backend that failed (`"sqlite"`, `"redis"`, …).
        backend: &'static str,
        /// What was being attempted when it failed.
        reason: String,
        /// The client library's error.
        source: Option<BoxError>,
    },

    /// A quorum-based backend got fewer grants than it needs.
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
    NotHeld {
        /// The lock name.
        name: String,
    },

    /// The lock was lost while held, for the given reason.
    Lost {
        /// The lock name.
        name: String,
        /// Why it is known or suspected lost.
        reason: LossReason,
    },

    /// The lock name is not acceptable.
    InvalidName {
        /// The offending name, shortened to at most 64 characters.
        name: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A [`LockOptions`](crate::LockOptions) value or backend setting is out of range.
    InvalidOptions {
        /// What is wrong and what is accepted.
        reason: String,
    },

    /// A connection URL could not be used. The URL is shown without credentials.
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
    LimitReached {
        /// The backend.
        backend: &'static str,
        /// The limit.
        limit: usize,
        /// What raises it, or what to use instead.
        advice: String,
    },

    /// The backend cannot do this operation.
    Unsupported {
        /// The backend.
        backend: &'static str,
        /// The operation asked for.
        operation: &'static str,
    },

    /// The server answered with something the backend did not expect.
    Backend {
        /// The backend that failed.
        backend: &'static str,
        /// What was being attempted.
        reason: String,
        /// The client library's error.
        source: Option<BoxError>,
    },
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Timeout { name, waited } => write!(
                f,
                "timed out after {waited:?} waiting for lock `{name}`; it is still held by someone else (raise the wait timeout or use try_acquire)"
            ),
            LockError::Unavailable {
                backend, reason, ..
            } => write!(f, "{backend} is unavailable: {reason}"),
            LockError::QuorumNotReached {
                acquired,
                needed,
                causes,
            } => {
                write!(
                    f,
                    "quorum not reached: {acquired} of the {needed} nodes needed granted the lock"
                )?;
                if !causes.is_empty() {
                    write!(f, " ({})", causes.join("; "))?;
                }
                Ok(())
            }
            LockError::NotHeld { name } => write!(
                f,
                "lock `{name}` is not held by this owner (released, expired or taken over)"
            ),
            LockError::Lost { name, reason } => write!(f, "lock `{name}` was lost: {reason}"),
            LockError::InvalidName { name, reason } => {
                write!(f, "invalid lock name {name:?}: {reason}")
            }
            LockError::InvalidOptions { reason } => write!(f, "invalid lock options: {reason}"),
            LockError::InvalidUrl { url, reason } => {
                write!(f, "invalid lock URL `{url}`: {reason}")
            }
            LockError::LimitReached {
                backend,
                limit,
                advice,
            } => write!(
                f,
                "{backend}: this client already holds or waits for {limit} locks, the most it can at once ({advice})"
            ),
            LockError::Unsupported { backend, operation } => {
                write!(f, "{backend} does not support {operation}")
            }
            LockError::Backend {
                backend, reason, ..
            } => write!(f, "{backend} error: {reason}"),
        }
    }
}

impl std::error::Error for LockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LockError::Unavailable { reason, source, .. }
            | LockError::Backend { reason, source, .. } => {
                first_new_cause(reason, source.as_deref()?)
            }
            _ => None,
        }
    }
}

/// The first link of `cause`'s chain that says something new: a link whose
/// message `reason` already contains, or that contains its own source's
/// message (a client error printing its cause), is passed over for the
/// next one.
fn first_new_cause<'a>(
    reason: &str,
    cause: &'a (dyn std::error::Error + Send + Sync + 'static),
) -> Option<&'a (dyn std::error::Error + 'static)> {
    let mut link: &(dyn std::error::Error + 'static) = cause;
    loop {
        let said = link.to_string();
        let repeated = said.is_empty() || reason.contains(&said);
        match link.source() {
            Some(next) if repeated || said.contains(&next.to_string()) => link = next,
            None if repeated => return None,
            _ => return Some(link),
        }
    }
}

/// An error and its causes on one line, each once, joined by `": "` (as
/// anyhow's `{:#}` prints them): from [`LockError::report`].
pub struct Report<'a>(&'a (dyn std::error::Error + Send + Sync + 'static));

impl std::fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

impl std::fmt::Debug for Report<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl LockError {
    /// This error and its causes on one line, each once: for a log line
    /// or a message where no reporter walks [`source()`](std::error::Error::source).
    pub fn report(&self) -> Report<'_> {
        Report(self)
    }

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

    /// A client error that prints its cause in its own message too, as
    /// sqlx's `Io` and tonic's statuses do.
    #[derive(Debug, thiserror::Error)]
    #[error("error communicating with database: {0}")]
    struct Repeating(#[source] std::io::Error);

    /// The chain as anyhow's `{:#}` walks it.
    fn chain(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
        std::iter::successors(Some(e), |e| e.source())
            .map(ToString::to_string)
            .collect()
    }

    fn refused() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused")
    }

    #[test]
    fn each_cause_shows_once_in_the_chain() {
        let e = LockError::unavailable(
            "redis",
            "connecting to redis://127.0.0.1:1/0",
            Wrapping(refused()),
        );
        assert_eq!(
            chain(&e),
            [
                "redis is unavailable: connecting to redis://127.0.0.1:1/0",
                "failed to connect",
                "Connection refused"
            ]
        );
        assert_eq!(
            e.report().to_string(),
            "redis is unavailable: connecting to redis://127.0.0.1:1/0: failed to connect: Connection refused"
        );
        // A link that repeats its cause is passed over for the cause.
        let e = LockError::unavailable(
            "postgres",
            "connecting to 127.0.0.1:1",
            Repeating(refused()),
        );
        assert_eq!(
            chain(&e),
            [
                "postgres is unavailable: connecting to 127.0.0.1:1",
                "Connection refused"
            ]
        );
        // A cause the reason already names is not shown again.
        let said = LockError::backend(
            "etcd",
            "put failed: Connection refused",
            std::io::Error::other("Connection refused"),
        );
        assert_eq!(chain(&said), ["etcd error: put failed: Connection refused"]);
        let alone = LockError::Unavailable {
            backend: "zk",
            reason: "no session".into(),
            source: None,
        };
        assert_eq!(chain(&alone), ["zk is unavailable: no session"]);
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
