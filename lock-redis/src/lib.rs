#![doc = include_str!("../docs.md")]
//! ## Overview
//!
//! distlock backend for a single Redis node.
//!
//! See [`RedisLock`]: one round trip to acquire and to release, owner-checked
//! Lua scripts, pub/sub wake-up of waiters (no polling), a fencing counter in
//! the acquire script, and the shared lock-core watchdog for renewal.
//!
//! Keys: `PREFIX{name}` holds the owner token with the lease as its TTL,
//! `PREFIX{name}:fence` the fencing counter (kept forever, a few bytes per
//! distinct name), and `PREFIX{name}:released` is the release channel;
//! a reader-writer lock's keys are `PREFIX{name}:rw:…` (see `docs.md`); `%`,
//! `{` and `}` in names are escaped, so the three share one Cluster slot.

mod config;
mod error;
mod extends;
mod handle;
mod keys;
mod lock;
mod permits;
mod queue_wait;
mod rw;
mod script_call;
mod scripts;
mod sentinels;
mod server;
mod sets;
mod state;
mod subscriber;

pub mod raw {
    //! For authors of other backends on Redis, as `lock_core::raw` is for
    //! every backend author: the per-node scripts, key names, state reader,
    //! renewal batching and shared subscriber that lock-redlock runs on each
    //! of its masters, and the queued wait both locks are written with. Not
    //! needed to use [`RedisLock`](crate::RedisLock).

    pub use crate::config::{client_for_lock, client_url, database, ensure_tls_provider};
    pub use crate::error::map_error;
    pub use crate::extends::{Extension, extend_batcher};
    pub use crate::keys::{Keys, LockKeys, PermitKeys, RwKeys};
    pub use crate::queue_wait::{QUEUE_TTL, QueuedLock, queue_entry_ttl, wait_in_queue};
    pub use crate::rw::RwState;
    pub use crate::script_call::{Acknowledge, ScriptCall};
    pub use crate::scripts::{
        ACQUIRE, EXTEND, RELEASE, RW_ACQUIRE, RW_RELEASE, RW_STATE, SET_ACQUIRE, SET_HOLDER,
        WITHDRAW,
    };
    pub use crate::sets::{MAX_ATOMIC_SET, set_answer};
    pub use crate::state::{LockState, live_waiters, read_state};
    pub use crate::subscriber::{Subscriber, Subscription};
}

pub use config::RedisConfig;
pub use lock::RedisLock;
/// The `redis` client crate this backend is built on, for
/// [`RedisLock::with_client`].
pub use redis;
