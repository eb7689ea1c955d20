//! The request path of the Postgres and MySQL locks: a lock that is free
//! is taken on a shared session (when sessions are shared), and one that
//! has to be waited for is queued on a connection of its own, where the
//! server keeps arrival order. A shared session's attempt never jumps that
//! queue: the server refuses it while anyone waits.
//!
//! Both ways are handed the caller's [`Request`], so the wait's deadline is
//! the one set when the acquisition began: time spent on the shared
//! session's attempt and on the pool's checkout counts against the wait.

use async_trait::async_trait;
use lock_core::raw::Request;
use lock_core::{LockError, LockGuard, Wait};

/// The two ways a Postgres or MySQL lock takes a lock.
#[async_trait]
pub(crate) trait PinnedOrShared: Send + Sync {
    /// Whether free locks are taken on shared sessions.
    fn shares_sessions(&self) -> bool;

    /// One attempt on a shared session, without waiting.
    async fn on_shared(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError>;

    /// On a connection of its own, waiting until `req`'s deadline
    /// (a single attempt for [`Wait::No`]).
    async fn on_pinned(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError>;
}

/// One attempt, without waiting.
pub(crate) async fn attempt_once<L: PinnedOrShared>(
    locks: &L,
    req: Request<'_>,
) -> Result<Option<LockGuard>, LockError> {
    let opts = req.opts.clone().wait(Wait::No);
    let once = Request {
        opts: &opts,
        deadline: Some(req.start),
        ..req
    };
    if locks.shares_sessions() {
        locks.on_shared(once).await
    } else {
        locks.on_pinned(once).await
    }
}

/// Free now: taken on a shared session. Held: waited for on a connection
/// of its own.
pub(crate) async fn wait<L: PinnedOrShared>(
    locks: &L,
    req: Request<'_>,
) -> Result<Option<LockGuard>, LockError> {
    if locks.shares_sessions()
        && let Some(guard) = locks.on_shared(req).await?
    {
        return Ok(Some(guard));
    }
    locks.on_pinned(req).await
}
