//! The request path of the Postgres and MySQL locks: a lock that is free
//! is taken on a shared session (when sessions are shared), and one that
//! has to be waited for is queued on a connection of its own, where the
//! server keeps arrival order. A shared session's attempt never jumps that
//! queue: the server refuses it while anyone waits.

use async_trait::async_trait;
use lock_core::raw::Request;
use lock_core::{LockError, LockGuard, LockOptions, Wait};

/// The two ways a Postgres or MySQL lock takes a lock.
#[async_trait]
pub(crate) trait PinnedOrShared: Send + Sync {
    /// Whether free locks are taken on shared sessions.
    fn shares_sessions(&self) -> bool;

    /// One attempt on a shared session, without waiting.
    async fn on_shared(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError>;

    /// On a connection of its own, waiting as `opts.wait` says.
    async fn on_pinned(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError>;
}

/// One attempt, without waiting.
pub(crate) async fn attempt_once<L: PinnedOrShared>(
    locks: &L,
    req: Request<'_>,
) -> Result<Option<LockGuard>, LockError> {
    let opts = req.opts.clone().wait(Wait::No);
    if locks.shares_sessions() {
        locks.on_shared(req.name, &opts).await
    } else {
        locks.on_pinned(req.name, &opts).await
    }
}

/// Free now: taken on a shared session. Held: waited for on a connection
/// of its own.
pub(crate) async fn wait<L: PinnedOrShared>(
    locks: &L,
    req: Request<'_>,
) -> Result<Option<LockGuard>, LockError> {
    if locks.shares_sessions()
        && let Some(guard) = locks.on_shared(req.name, req.opts).await?
    {
        return Ok(Some(guard));
    }
    locks.on_pinned(req.name, req.opts).await
}
