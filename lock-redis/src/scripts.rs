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
pub static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("acquire.lua")));

/// KEYS: lock, queue, handoff. ARGV: owner, channel, hand-off window ms,
/// and optionally `"1"` to broadcast.
/// Deletes the lock only if `owner` holds it, then hands it to the first
/// waiter in line. With nobody in line and the broadcast flag set, it
/// publishes an empty message instead, which wakes every waiter (Redlock,
/// whose waiters do not queue). Returns 1 if it was ours, else 0.
pub static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("release.lua")));

/// KEYS: queue, handoff. ARGV: waiter id, channel, hand-off window ms.
/// Leaves the queue; a reservation held by this waiter passes to the next.
pub static WITHDRAW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("withdraw.lua")));

/// KEYS: lock. ARGV: owner, ttl ms. Resets the lease only if `owner` holds
/// the lock. Returns 1 if it was ours, else 0.
pub static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("extend.lua")));
