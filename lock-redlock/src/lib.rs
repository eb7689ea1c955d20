#![doc = include_str!("../docs.md")]
//! ## Overview
//!
//! distlock backend for Redlock: one lock over N independent Redis masters.
//!
//! See [`Redlock`]: the per-node scripts of lock-redis sent to all nodes at
//! once, a majority with enough validity left, release on every node on
//! failure, a majority-quorum fencing counter, and pub/sub wake-ups of
//! waiters. Its assumptions (clocks, pauses, persistence or delayed
//! restarts) are spelled out on [`Redlock`]; prefer etcd or ZooKeeper when
//! they cannot be met.

mod config;
mod error;
mod handle;
mod lock;
mod node;
mod quorum;
mod rw;
mod scripts;
mod sets;

pub use config::RedlockConfig;
pub use lock::Redlock;
/// The client crate, re-exported so that `with_clients` gets the same version.
pub use redis;
