//! The Lua scripts, run with EVALSHA (reloaded automatically on NOSCRIPT).
//! Names and tokens travel only as KEYS and ARGV, never spliced into code.

use std::sync::LazyLock;

use redis::Script;

/// KEYS: lock, fence. ARGV: owner, ttl ms.
/// Returns `{1, token}` when granted, `{0, pttl}` when held by someone else.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('INCR', KEYS[2])}
end
return {0, redis.call('PTTL', KEYS[1])}
",
    )
});

/// KEYS: lock. ARGV: owner, channel. Deletes the lock only if `owner` holds
/// it, and then tells waiters. Returns 1 if it was ours, else 0.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
",
    )
});

/// KEYS: lock. ARGV: owner, ttl ms. Resets the lease only if `owner` holds
/// the lock. Returns 1 if it was ours, else 0.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
",
    )
});
