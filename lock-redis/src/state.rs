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

/// Read `keys`' state on `conn` in one `MULTI`/`EXEC`, then count the
/// queue's live entries.
pub async fn read_state<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
) -> redis::RedisResult<LockState> {
    type State = (
        Option<String>,
        i64,
        Option<u64>,
        Vec<String>,
        Option<Vec<u8>>,
    );
    let (owner, pttl, fence, queue, holder): State = redis::pipe()
        .atomic()
        .get(&keys.lock)
        .pttl(&keys.lock)
        .get(&keys.fence)
        .zrange(&keys.queue, 0, -1)
        .get(&keys.holder)
        .query_async(conn)
        .await?;
    Ok(LockState {
        owner,
        left: u64::try_from(pttl).ok().map(Duration::from_millis),
        fence,
        queued: count_live(conn, &keys.queue, &queue).await?,
        holder,
    })
}

/// How many waiters of the queue `queue` are live: their entries renewed
/// within their TTL (each entry's key `QUEUE:ID` lives).
pub async fn live_waiters<C: ConnectionLike>(
    conn: &mut C,
    queue: &str,
) -> redis::RedisResult<usize> {
    let waiters: Vec<String> = redis::cmd("ZRANGE")
        .arg(queue)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await?;
    count_live(conn, queue, &waiters).await
}

/// How many of `waiters` in `queue` have a live entry: one `EXISTS` of
/// their keys (in the queue's slot).
async fn count_live<C: ConnectionLike>(
    conn: &mut C,
    queue: &str,
    waiters: &[String],
) -> redis::RedisResult<usize> {
    if waiters.is_empty() {
        return Ok(0);
    }
    let mut exists = redis::cmd("EXISTS");
    for waiter in waiters {
        exists.arg(format!("{queue}:{waiter}"));
    }
    exists.query_async(conn).await
}
