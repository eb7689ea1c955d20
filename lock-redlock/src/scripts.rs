//! The one script of Redlock's own; acquire, release and extend are
//! lock-redis's per-node scripts (`lock_redis::raw`).

use std::sync::LazyLock;

use redis::Script;

/// KEYS: lock, fence. ARGV: owner, token. Raises the fencing counter to
/// `token` (never lowers it), only while `owner` holds the lock on this node.
/// Publishes on the lock's changes channel (`LOCK:changed`) when it raised
/// the counter: the term an election's observers wait for is written.
/// Returns 1 if `owner` holds it, else 0.
pub(crate) static FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("fence.lua")));
