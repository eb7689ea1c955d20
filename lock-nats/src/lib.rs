#![doc = include_str!("../docs.md")]
//! ## Overview
//!
//! distlock backend for NATS JetStream (nats-server 2.11 or later).
//!
//! See [`NatsLock`]: a lock is one message of the bucket's stream,
//! written only if its subject has none (a compare-and-set on the
//! subject's last sequence), its stream sequence the fencing token, with a
//! per-message TTL as its lease; renewals rewrite it on the same
//! condition, a release deletes it by sequence and announces it to the
//! waiters. Semaphores and reader-writer locks are messages on subjects of
//! their name's, each published on the condition that none of them changed
//! since they were read.

mod config;
mod dial;
mod error;
mod grant;
mod handle;
mod keys;
mod lock;
mod permits;
mod queue;
mod rw;
mod stream;

/// The `async-nats` crate this backend is built on, for
/// [`NatsLock::with_client`].
pub use async_nats;
pub use config::NatsConfig;
pub use lock::NatsLock;
