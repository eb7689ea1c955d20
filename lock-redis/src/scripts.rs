//! The Lua scripts, run with EVALSHA (reloaded automatically on NOSCRIPT).
//! Names, tokens and ids travel only as KEYS and ARGV, never spliced into code.
//!
//! Hand-off: a waiter's id joins the lock's FIFO queue atomically with its
//! failed attempt. A release pops the head, reserves the lock for it for a
//! short window and publishes its id, so exactly that waiter retries, and a
//! releaser that comes straight back cannot overtake it. A waiter that gives
//! up withdraws and passes a reservation it held on to the next in line; one
//! that died holds things up only for the window.

use std::sync::LazyLock;

use redis::Script;

/// KEYS: lock, fence, queue, handoff. ARGV: owner, ttl ms, waiter id (empty
/// for a newcomer that does not queue), queue TTL ms.
/// Returns `{1, token}` when granted, `{0, ms to wait}` otherwise.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local reserved = redis.call('GET', KEYS[4])
if (not reserved or reserved == ARGV[3])
    and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if reserved then redis.call('DEL', KEYS[4]) end
  if ARGV[3] ~= '' then redis.call('LREM', KEYS[3], 1, ARGV[3]) end
  return {1, redis.call('INCR', KEYS[2])}
end
if ARGV[3] ~= '' then
  if not redis.call('LPOS', KEYS[3], ARGV[3]) then
    redis.call('RPUSH', KEYS[3], ARGV[3])
  end
  redis.call('PEXPIRE', KEYS[3], ARGV[4])
end
local wait = redis.call('PTTL', KEYS[1])
if reserved and reserved ~= ARGV[3] then
  wait = math.max(wait, redis.call('PTTL', KEYS[4]))
end
return {0, wait}
",
    )
});

/// KEYS: lock, queue, handoff. ARGV: owner, channel, hand-off window ms.
/// Deletes the lock only if `owner` holds it, then hands it to the first
/// waiter in line. Returns 1 if it was ours, else 0.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
local next = redis.call('LPOP', KEYS[2])
if next then
  redis.call('SET', KEYS[3], next, 'PX', ARGV[3])
  redis.call('PUBLISH', ARGV[2], next)
end
return 1
",
    )
});

/// KEYS: queue, handoff. ARGV: waiter id, channel, hand-off window ms.
/// Leaves the queue; a reservation held by this waiter passes to the next.
pub(crate) static WITHDRAW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
redis.call('LREM', KEYS[1], 0, ARGV[1])
if redis.call('GET', KEYS[2]) == ARGV[1] then
  local next = redis.call('LPOP', KEYS[1])
  if next then
    redis.call('SET', KEYS[2], next, 'PX', ARGV[3])
    redis.call('PUBLISH', ARGV[2], next)
  else
    redis.call('DEL', KEYS[2])
  end
end
return 1
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
