#![doc = include_str!("../docs.md")]
//! ## Overview
//!
//! distlock backend for etcd (v3 API, 3.4 or later).
//!
//! See [`EtcdLock`]: a session lease kept alive in the background, one
//! transaction to acquire, waiters that watch only their predecessor,
//! create-revision fencing tokens (with [`EtcdLock::fencing_compare`] for
//! guarding your own etcd transactions), and `lost()` on every guard of a
//! session whose lease expires or is revoked.
//!
//! Building this crate needs `protoc` (Debian: `protobuf-compiler`), which
//! etcd-client's build script runs.

mod config;
mod error;
mod handle;
mod keys;
mod lock;
mod permits;
mod queue;
mod requests;
mod rw;
mod session;
mod sets;

pub use config::EtcdConfig;
/// The `etcd-client` crate this backend is built on, for
/// [`EtcdLock::with_client`].
pub use etcd_client;
pub use lock::EtcdLock;
