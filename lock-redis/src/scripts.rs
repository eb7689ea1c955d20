//! The Lua scripts, run with EVALSHA (loaded again on NOSCRIPT) through
//! [`ScriptCall`](crate::script_call::ScriptCall).
//! Names, tokens and ids travel only as KEYS and ARGV, never spliced into code.
//!
//! Hand-off: a waiter's id joins the lock's queue atomically with its
//! failed attempt. The queue is a sorted set ordered by arrival ticket: the
//! server's clock (µs) when the waiter first queued, or a ticket the client
//! gives (Redlock, so that every node orders its waiters the same way). A
//! release pops the first, reserves the lock for it for a short window and
//! publishes its id, so exactly that waiter retries, and a releaser that
//! comes straight back cannot overtake it. A waiter that gives up withdraws
//! and passes a reservation it held on to the next in line; one that died
//! holds things up only for the window.
//!
//! Observers: a grant, a release and a new holder record publish on the
//! lock's changes channel, `KEYS[1]` (the lock key) followed by
//! `:changed` (made in the script from the key it was given: a channel is
//! no key, and it shares the key's hash tag). The message names the
//! change; an observer reads the lock again whatever it says.

use std::sync::LazyLock;

use redis::Script;

/// KEYS: lock, fence, queue, handoff, and optionally the holder key. ARGV:
/// owner, ttl ms, waiter id (empty for a newcomer that does not queue),
/// the waiter's entry TTL ms (its entry counts while `QUEUE:ID` lives,
/// renewed by each attempt), optionally the waiter's arrival ticket (decimal µs; empty
/// or absent: the server's clock) and the holder record, written to the
/// holder key with the grant. A waiter keeps the ticket it first queued with.
/// Returns `{1, token}` when granted (publishing `granted` on the
/// changes channel), `{0, ms to wait}` otherwise. A run whose owner already
/// holds the key (the same attempt's request sent again) answers `{1,
/// token}` with the token of that grant, changing nothing.
pub static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("acquire.lua")));

/// KEYS: lock, fence, handoff and holder key of each name of a set, in
/// turn. ARGV: owner, ttl ms, holder record. Takes every lock if none is
/// held or reserved for a waiter, writing each holder record and
/// publishing `granted` on each changes channel: `{1, token, …}` (a token
/// per name, in order); else takes none: `{0}`.
pub static SET_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("set_acquire.lua")));

/// KEYS: lock, queue, handoff. ARGV: owner, channel, hand-off window ms,
/// and optionally a waiter id, its ticket and its entry TTL ms.
/// Deletes the lock only if `owner` holds it, then hands it to the first
/// waiter in line whose entry is live (dropping the lapsed ones before it). With a waiter given, that waiter (the owner giving back
/// a grant it could not use, in Redlock) first rejoins the queue with its
/// ticket, so the first in line by ticket gets the lock, whoever that is,
/// and every node converges on the same one. Publishes `released` on the
/// changes channel when it deleted the lock. Returns 1 if it was ours,
/// else 0.
pub static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("release.lua")));

/// KEYS: queue, handoff. ARGV: waiter id, channel, hand-off window ms.
/// Leaves the queue; a reservation held by this waiter passes to the next
/// live one.
pub static WITHDRAW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("withdraw.lua")));

/// KEYS: lock, holder. ARGV: owner, record. Writes the holder record only
/// if `owner` holds the lock, publishing `value` on the changes channel.
/// Returns 1 if it did, else 0.
pub static SET_HOLDER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("set_holder.lua")));

/// KEYS: locks. ARGV: each key's owner and ttl ms, in turn. Resets each
/// lease only if its owner holds the lock (one run serves a batch of
/// renewals). Returns one 1 (it was ours) or 0 per key, in order.
pub static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("extend.lua")));

/// KEYS: a semaphore's limit, fence and permits hash. ARGV: the slot keys'
/// prefix, owner, ttl ms, limit, holder record. Refuses if a slot below
/// another recorded limit is held (`{-1, that limit}`); else takes the
/// lowest free slot (`{1, slot, token}`); else `{0, ms until the first
/// permit's lease ends, or -1}`.
pub(crate) static PERMIT_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("permit_acquire.lua")));

/// KEYS: the first slot key looked at. ARGV: owner, channel, wake-up
/// message, slot keys' prefix, first and last slot. Frees the slot `owner`
/// holds and publishes the message. Returns 1 if it was ours, else 0.
pub(crate) static PERMIT_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("permit_release.lua")));

/// KEYS: a grant's key (a permit's slot key, a reader's or the writer's
/// key), the hash of holder records. ARGV: owner, the grant's holder
/// field, record. Writes the record only while `owner` holds the key.
pub(crate) static PERMIT_SET_HOLDER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("permit_set_holder.lua")));

/// KEYS: a semaphore's limit and permits hash. ARGV: the slot keys'
/// prefix. Returns the limit and each live permit's slot, ms left, token
/// and holder record, as strings; `{}` when none is live.
pub(crate) static PERMIT_STATE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("permit_state.lua")));

/// KEYS: a reader-writer lock's writer key, readers' set, write counter,
/// holder records and waiters. ARGV: the readers' key prefix,
/// owner, ttl ms, 'r', 'w' or 'u' (upgradeable), holder record, arrival,
/// waiter id, mark ms.
/// `{1, token}` when granted, else `{0, ms until the blocking lease ends,
/// or -1}`; a waiter refused marks itself.
pub static RW_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("rw_acquire.lua")));

/// KEYS: a reader-writer grant's key, the readers' set, the holder records.
/// ARGV: owner, its holder field, channel, wake-up message. Frees the grant
/// if `owner` holds it and publishes the message; 1 if it was ours.
pub static RW_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("rw_release.lua")));

/// KEYS: as [`RW_ACQUIRE`]'s. ARGV: the readers' key prefix. Returns the
/// write counter, the waiting writers, and each live holder's access, ms
/// left and record, as strings.
pub static RW_STATE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("rw_state.lua")));

/// KEYS: a reader-writer lock's writer key, readers' set, write counter,
/// holder records. ARGV: the readers' key prefix, owner, `up` or `give
/// up`, channel, wake-up message. `up`: `{1, token}` once the upgradeable
/// reader `owner` is the writer, `{0, ms until the first other reader's
/// lease ends}` while others read (new readers kept out meanwhile), `{-1}`
/// if it is not the live upgradeable reader. `give up` lets readers in
/// again.
pub(crate) static RW_UPGRADE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("rw_upgrade.lua")));
