//! ZooKeeper client errors as `LockError`s, and which of them mean the
//! request's connection went away.

use lock_core::LockError;

use crate::lock::BACKEND;

/// The request's connection is gone, whatever became of the request: it
/// failed, or the client ended it itself (no reply in time).
pub(crate) fn connection_dropped(e: &zookeeper_client::Error) -> bool {
    connection_failed(e) || connection_ended_by_client(e)
}

/// The request's connection failed, whatever became of the request: a
/// connection loss as the client reports it, or an I/O error (a reset by
/// a crashed server) that the client passes through as a custom error.
pub(crate) fn connection_failed(e: &zookeeper_client::Error) -> bool {
    if matches!(e, zookeeper_client::Error::ConnectionLoss) {
        return true;
    }
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        // The client keeps a custom error's cause behind an `Arc`.
        let inner = c.downcast_ref::<Shared>().map_or(c, |shared| &**shared);
        if inner.is::<std::io::Error>() {
            return true;
        }
        cause = inner.source();
    }
    false
}

/// A custom error with a message only: the client makes those just when
/// it ends a connection itself (no reply within its timeout, a writable
/// server found while read-only). The request is not sent again (its
/// session may be gone), but the failure is the network's: transient.
fn connection_ended_by_client(e: &zookeeper_client::Error) -> bool {
    matches!(e, zookeeper_client::Error::Custom(_)) && std::error::Error::source(e).is_none()
}

/// A client error as a `LockError`: connection and session trouble, a
/// throttling or read-only server, is `Unavailable` (transient); anything
/// else (`NoAuth`, …) a backend error.
pub(crate) fn zk_error(doing: &str, e: zookeeper_client::Error) -> LockError {
    use zookeeper_client::Error as E;
    if connection_dropped(&e) {
        return LockError::unavailable(BACKEND, doing.to_string(), e);
    }
    match e {
        E::SessionExpired
        | E::NoHosts
        | E::Timeout
        | E::ClientClosed
        | E::SessionMoved
        | E::Throttled
        | E::NotReadOnly => LockError::unavailable(BACKEND, doing.to_string(), e),
        E::NoAuth | E::AuthFailed => LockError::backend(
            BACKEND,
            format!("{doing}: not authorised (check the URL's digest credentials)"),
            e,
        ),
        other => LockError::backend(BACKEND, doing.to_string(), other),
    }
}
