//! Mapping sqlx errors to [`LockError`].

use lock_core::LockError;

/// SQLITE_BUSY (5) or SQLITE_LOCKED (6), with extended codes: another
/// connection holds a lock this one needs.
pub(crate) fn is_busy(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .is_some_and(|c| matches!(c & 0xff, 5 | 6)),
        _ => false,
    }
}

/// The connection is unusable: an I/O failure, or the server ending the
/// session (SQLSTATE class 08; 57P01–57P03: shutdown, crash, starting up;
/// 57P05 and 25P03: an idle session or an idle transaction timed out).
pub(crate) fn connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| {
            c.starts_with("08")
                || matches!(c.as_ref(), "57P01" | "57P02" | "57P03" | "57P05" | "25P03")
        }),
        _ => false,
    }
}

/// Turn a sqlx error into a `LockError`: connection-level failures and a
/// busy database are `Unavailable` (worth retrying), anything else `Backend`.
/// sqlx errors never carry the connection password.
pub(crate) fn map_sqlx(backend: &'static str, doing: &str, e: sqlx::Error) -> LockError {
    let transient = match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        // Class 53: the server is out of a resource (connections, memory,
        // room in its lock table), for now.
        sqlx::Error::Database(db) => {
            is_busy(&e) || connection_lost(&e) || db.code().is_some_and(|c| c.starts_with("53"))
        }
        _ => false,
    };
    if transient {
        LockError::unavailable(backend, doing, e)
    } else {
        LockError::backend(backend, doing, e)
    }
}
