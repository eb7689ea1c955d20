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
        sqlx::Error::Database(_) => is_busy(&e),
        _ => false,
    };
    if transient {
        LockError::unavailable(backend, doing, e)
    } else {
        LockError::backend(backend, doing, e)
    }
}
