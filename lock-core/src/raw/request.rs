//! What a backend is handed: a [`Request`] that passed the checks every
//! backend makes, with the deadline of its wait.

use std::future::Future;

use tokio::time::Instant;

use crate::capabilities::Capabilities;
use crate::error::LockError;
use crate::name::validate_name;
use crate::options::{LockOptions, Wait};
use crate::raw::Kind;
use crate::raw::wait::sleep_until_some;

/// An acquisition that passed the checks every backend makes: the name is
/// acceptable, the options fit the backend, and the wait has a deadline.
/// What [`RawLock`](crate::raw::RawLock) is handed.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The lock's name, validated.
    pub name: &'a str,
    /// The options, validated against the backend's capabilities. Their
    /// `ttl` is what to ask the server for: the lease's TTL plus any
    /// [`lock_delay`](LockOptions::lock_delay), which
    /// [`LeaseState::granted`](crate::raw::LeaseState::granted) takes back
    /// off for the holder's deadline.
    pub opts: &'a LockOptions,
    /// When the acquisition began.
    pub start: Instant,
    /// When the wait ends: `start` for [`Wait::No`], `None` for
    /// [`Wait::Forever`] (or a wait too long to represent).
    pub deadline: Option<Instant>,
}

impl<'a> Request<'a> {
    /// Check `name` and `opts` against `caps` ([`check_request`]) and start
    /// the clock.
    pub fn checked(
        name: &'a str,
        opts: &'a LockOptions,
        caps: &Capabilities,
    ) -> Result<Self, LockError> {
        check_request(name, opts, caps)?;
        let start = Instant::now();
        Ok(Request {
            name,
            opts,
            start,
            deadline: wait_deadline(start, opts.wait),
        })
    }

    /// The primitive it asks for.
    pub fn kind(&self) -> Kind {
        Kind::of(self.opts)
    }

    /// Whether the wait is over at `now`.
    pub fn expired_at(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }

    /// `event` (a server's notification a waiter listens for), or `None`
    /// once the wait's deadline passes first.
    pub async fn or_deadline<T>(&self, event: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            done = event => Some(done),
            () = sleep_until_some(self.deadline) => None,
        }
    }

    /// The [`LockError::Timeout`] of this acquisition, as of now.
    pub fn timeout(&self) -> LockError {
        LockError::Timeout {
            name: self.name.to_string(),
            waited: self.start.elapsed(),
        }
    }
}

/// The checks every backend makes before touching its server: the name is
/// acceptable ([`validate_name`]) and the options fit the backend
/// ([`LockOptions::validate`]).
pub fn check_request(name: &str, opts: &LockOptions, caps: &Capabilities) -> Result<(), LockError> {
    validate_name(name)?;
    opts.validate(caps)
}

/// When `opts.wait` ends, measured from `start`; `None` for [`Wait::Forever`]
/// and for a wait too long to represent as an instant (`Duration::MAX`).
pub fn wait_deadline(start: Instant, wait: Wait) -> Option<Instant> {
    match wait {
        Wait::No => Some(start),
        #[allow(deprecated)]
        Wait::UpTo(d) | Wait::Up(d) => start.checked_add(d),
        Wait::Forever => None,
    }
}
