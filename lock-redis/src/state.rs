//! A lock's state as one Redis node holds it, read in one atomic round
//! trip (for `inspect`, here and in lock-redlock).

use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::keys::LockKeys;

/// What a node holds for one lock.
pub struct LockState {
    /// The holder's owner token, if the lock key exists.
    pub owner: Option<String>,
    /// The lock key's time to live.
    pub left: Option<Duration>,
    /// The name's fencing counter: the holder's token while it is held,
    /// since only a grant advances it.
    pub fence: Option<u64>,
    /// Live entries in the waiters' queue (renewed within their TTL).
    pub queued: usize,
    /// The latest grant's holder record (only a grant writes it): the
    /// holder's while the lock is held.
    pub holder: Option<Vec<u8>>,
}

/// Read `keys`' state on `conn` in one `MULTI`/`EXEC`.
pub async fn read_state<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
) -> redis::RedisResult<LockState> {
    type State = (Option<String>, i64, Option<u64>, usize, Option<Vec<u8>>);
    let (owner, pttl, fence, queued, holder): State = redis::pipe()
        .atomic()
        .get(&keys.lock)
        .pttl(&keys.lock)
        .get(&keys.fence)
        .cmd("EVAL")
        .arg(crate::scripts::QUEUE_LEN)
        .arg(1)
        .arg(&keys.queue)
        .get(&keys.holder)
        .query_async(conn)
        .await?;
    Ok(LockState {
        owner,
        left: u64::try_from(pttl).ok().map(Duration::from_millis),
        fence,
        queued,
        holder,
    })
}
