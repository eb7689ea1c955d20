#![doc = include_str!("../docs.md")]
//! ## Overview
//!
//! distlock backend for ZooKeeper (3.5 or later).
//!
//! See [`ZkLock`]: an ephemeral-sequential node per acquisition under the
//! lock's node, the lowest sequence holds, a waiter watches only its
//! predecessor, and the node's `czxid` is the fencing token.
//!
//! Modules: `config` holds [`ZkConfig`] and reads `zk://` URLs, `lock`
//! the [`ZkLock`] client and its `RawLock` implementation, `handle`
//! releases and checks a held node, `error` maps client errors; then
//! what is ZooKeeper's own: `session` turns session states into loss
//! signals, `path` maps names to nodes, `queue` joins a lock's queue.

mod config;
mod error;
mod handle;
mod lock;
mod observe;
mod path;
mod permits;
mod queue;
mod rw;
mod session;

pub use config::ZkConfig;
pub use lock::ZkLock;
/// The client crate, re-exported so that `with_client` gets the same version.
pub use zookeeper_client;
