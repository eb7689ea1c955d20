//! Mapping redis-rs errors and timeouts to `LockError`.

use std::future::Future;

use lock_core::LockError;

use crate::config::RedisConfig;

pub(crate) const BACKEND: &str = "redis";

/// Connection-level failures are `Unavailable` (retry later), anything else
/// (a script error, an unexpected reply) is `Backend`. redis-rs errors do not
/// carry the connection's password.
pub(crate) fn map_redis(doing: &str, e: redis::RedisError) -> LockError {
    map_error(BACKEND, doing, e)
}

/// A Redis client error as a `LockError`, for this backend and for another
/// built on Redis: `Unavailable` for connection-level failures, `Backend`
/// for the rest, labelled `backend`.
pub fn map_error(backend: &'static str, doing: &str, e: redis::RedisError) -> LockError {
    if credentials_refused(&e) {
        // Asking again with the same user and password cannot help.
        return LockError::invalid_options(format!(
            "{doing}: the server refused the user name and password ({}); check them",
            e.code().unwrap_or("authentication failed")
        ));
    }
    if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || server_not_ready(&e)
    {
        LockError::unavailable(backend, doing.to_string(), e)
    } else {
        LockError::backend(backend, doing.to_string(), e)
    }
}

/// The server refused the connection's credentials: a wrong password or
/// user (`WRONGPASS`), or none given where one is needed (`NOAUTH`).
fn credentials_refused(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH"))
}

/// A server that answers but cannot serve yet: loading its data after a
/// restart (`LOADING`), a failover in progress (`TRYAGAIN`, `CLUSTERDOWN`,
/// `MASTERDOWN`, Sentinels that name no master that answers as one), a
/// replica that was a master (`READONLY`), a cluster slot still moving
/// when the cluster client's redirections ran out (`MOVED`, `ASK`). All
/// transient.
fn server_not_ready(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind as S};
    matches!(
        e.kind(),
        ErrorKind::Server(
            S::BusyLoading
                | S::TryAgain
                | S::ClusterDown
                | S::MasterDown
                | S::ReadOnly
                | S::Moved
                | S::Ask
        ) | ErrorKind::MasterNameNotFoundBySentinel
    )
}

/// Run `fut`, failing with `Unavailable` if it takes longer than a connect
/// plus a response timeout. Used where the connection manager's own bounds
/// do not apply (connecting, subscribing) or off the hot path.
pub(crate) async fn within<F: Future>(
    config: &RedisConfig,
    doing: &str,
    fut: F,
) -> Result<F::Output, LockError> {
    let limit = config.connect_timeout + config.response_timeout;
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| LockError::Unavailable {
            backend: BACKEND,
            reason: format!("{doing}: no answer within {limit:?}"),
            source: None,
        })
}

#[cfg(test)]
mod tests {
    use super::map_redis;
    use redis::{ErrorKind, RedisError, ServerErrorKind};

    #[test]
    fn refused_credentials_are_a_configuration_error() {
        let wrong = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        let e = map_redis("connecting to redis://127.0.0.1:6379/0", wrong);
        assert!(e.is_config() && !e.is_transient(), "{e:?}");
        assert!(
            e.to_string().contains("refused the user name and password"),
            "{e}"
        );
    }

    #[test]
    fn a_server_still_loading_is_transient() {
        let loading = RedisError::from((
            ErrorKind::Server(ServerErrorKind::BusyLoading),
            "Redis is loading the dataset in memory",
        ));
        let e = map_redis("acquiring a lock", loading);
        assert!(e.is_transient(), "{e:?}");
        let script = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "ERR bad script",
        ));
        assert!(!map_redis("acquiring a lock", script).is_transient());
        let failing_over = RedisError::from((
            ErrorKind::MasterNameNotFoundBySentinel,
            "Master with given name not found in sentinel",
        ));
        assert!(map_redis("finding the master", failing_over).is_transient());
        for redirect in [ServerErrorKind::Moved, ServerErrorKind::Ask] {
            let moving =
                RedisError::from((ErrorKind::Server(redirect), "MOVED 8318 127.0.0.1:16403"));
            assert!(map_redis("releasing a lock", moving).is_transient());
        }
    }
}
