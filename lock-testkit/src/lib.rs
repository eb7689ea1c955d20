//! The distlock test kit, for backend authors and for the project's own
//! tests: a dev-dependency of every backend crate.
//!
//! - [`conformance`]: the conformance suite every backend runs against its
//!   real server ([`conformance_suite!`]), with its [`Harness`](conformance::Harness).
//! - [`election`]: the election suite (and the holder record), run by the
//!   same macro.
//! - [`semaphore`]: the semaphore suite (or, where a backend offers none,
//!   its typed refusal), run by the same macro.
//! - [`rw_lock`]: the reader-writer lock suite (or its typed refusal), run
//!   by the same macro.
//! - [`faults`]: the fault scenarios (a killed or frozen holder in a child
//!   process, a crashed server), `scripts/services.sh` verbs, the test
//!   environment's URLs.
//! - [`network`]: the network fault matrix (partition, lost grant, release
//!   and renewal) over [`tcp_proxy`] ([`network_fault_matrix!`]).
//! - [`docs`]: holds a backend crate's `docs.md` capability checklist to
//!   its `capabilities()`.
//! - [`bench`](mod@bench) and [`scale`]: measuring helpers for the benchmarks and the
//!   scale tests.
//!
//! These are test utilities: they panic with a message when a server or the
//! test environment is not what they need.

pub mod bench;
pub mod conformance;
pub mod docs;
pub mod election;
pub mod faults;
pub mod lock_set;
pub mod lock_timing;
pub mod network;
pub mod rw_lock;
pub mod scale;
pub mod semaphore;
pub mod tcp_proxy;
