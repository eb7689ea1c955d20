//! What a backend can tell about a lock without taking it.

use std::time::Duration;

use crate::holder::Holder;

/// A snapshot of one lock's state on its server, from
/// [`DistributedLock::inspect`](crate::DistributedLock::inspect): whether it
/// is held and, where the backend can read them, the holder's fencing token,
/// how long the holder's lease still runs, how many acquisitions wait, and
/// who the holder is (identity and value, as its grant recorded them).
///
/// It may change as soon as it is read: use it to look (an operator's
/// `distlock status`, a dashboard), never to decide whether to acquire.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LockInfo {
    /// Someone holds the lock now.
    pub held: bool,
    /// The holder's fencing token, where the backend keeps it readable.
    pub fencing_token: Option<u64>,
    /// How long the holder's lease runs unless renewed, where the server
    /// keeps a lease (`None` where the lock lasts as long as the holder's
    /// session or connection).
    pub expires_in: Option<Duration>,
    /// How many acquisitions wait for the lock, where the server can tell.
    pub waiters: Option<usize>,
    /// Who holds the lock (identity, value, since when), where the backend
    /// records it ([`Capabilities::holder`](crate::Capabilities::holder)).
    /// Never a metrics label: it is per holder.
    pub holder: Option<Holder>,
}

impl LockInfo {
    /// A lock nobody holds.
    pub fn free() -> Self {
        LockInfo::default()
    }

    /// A held lock (the other fields unknown until set).
    pub fn held() -> Self {
        LockInfo {
            held: true,
            ..LockInfo::default()
        }
    }

    /// Set the holder's fencing token.
    pub fn with_fencing_token(mut self, token: Option<u64>) -> Self {
        self.fencing_token = token;
        self
    }

    /// Set how long the holder's lease has left.
    pub fn with_expires_in(mut self, left: Option<Duration>) -> Self {
        self.expires_in = left;
        self
    }

    /// Set the holder's record.
    pub fn with_holder(mut self, holder: Option<Holder>) -> Self {
        self.holder = holder;
        self
    }

    /// Set the number of waiting acquisitions.
    pub fn with_waiters(mut self, waiters: Option<usize>) -> Self {
        self.waiters = waiters;
        self
    }
}
