//! What Redlock's failures say: a node's error or silence, and a quorum
//! not reached with every failed node's cause.

use std::time::Duration;

use lock_core::LockError;
use lock_redis::raw::map_error;

use crate::quorum::Replies;

/// The backend's name in errors and capabilities.
pub(crate) const BACKEND: &str = "redlock";

/// A node's reply to a request (`doing`, on the node shown as `node`)
/// bounded by `limit`: its value, the client's error, or no answer in time
/// (transient).
pub(crate) fn node_reply<T>(
    node: &str,
    doing: &str,
    limit: Duration,
    reply: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>,
) -> Result<T, LockError> {
    match reply {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(map_error(BACKEND, &format!("{doing} on {node}"), e)),
        Err(_) => Err(LockError::Unavailable {
            backend: BACKEND,
            reason: format!("{doing} on {node}: no answer within {limit:?}"),
            source: None,
        }),
    }
}

/// Fewer than `needed` nodes did what was asked (`acquired` did); the
/// causes name every node that failed.
pub(crate) fn quorum_not_reached<T>(
    acquired: usize,
    needed: usize,
    replies: &Replies<T>,
    names: &[String],
) -> LockError {
    LockError::QuorumNotReached {
        acquired,
        needed,
        causes: causes(replies, names),
    }
}

/// `"node: cause"` for every node that failed, for diagnostics.
pub(crate) fn causes<T>(replies: &Replies<T>, names: &[String]) -> Vec<String> {
    replies
        .iter()
        .zip(names)
        .filter_map(|(r, name)| match r {
            Some(Err(e)) => {
                // The whole chain: "unavailable: releasing on X" alone does
                // not say whether it timed out, was refused or dropped.
                let mut cause = format!("{name}: {e}");
                let mut source = std::error::Error::source(e);
                while let Some(inner) = source {
                    cause.push_str(&format!(": {inner}"));
                    source = inner.source();
                }
                Some(cause)
            }
            _ => None,
        })
        .collect()
}
