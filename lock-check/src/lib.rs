//! `lock-check`: a history checker for distlock backends.
//!
//! A run starts N worker processes (this same binary) on one lock name. Each
//! acquires with a wait, writes 1–5 times to a [fenced
//! register](register::FencedRegister) while it holds the lock, and ends the
//! hold by `release()`, by dropping the guard, or by letting an unrenewed
//! lease run out. Every event goes to a per-process append-only log stamped
//! with `CLOCK_MONOTONIC` ([`clock`]). Meanwhile the controller applies a
//! [`Nemesis`](nemesis::Nemesis): SIGKILL or SIGSTOP the holder, kill or
//! pause the servers through `scripts/services.sh`, kill a minority (and
//! once a majority) of a cluster. Afterwards [`analysis`] reads the logs and
//! counts exclusion violations (split by what the register did), token
//! order, losses not signalled in time, grants lost on arrival, liveness and
//! errors, and fails the run where a count exceeds what the backend's
//! `capabilities()` allow.
//!
//! With `--election` the workers are candidates of an election on the
//! lock's name (they campaign, write with their term and proclaim values)
//! and observer processes log what `observe` shows; [`election`] checks
//! that no observer saw a term go back or a state no leader published.
//!
//! `lock-check scale` is the scale benchmark ([`scale`]): one client holding
//! thousands of auto-renewed locks, with its memory, CPU and the servers'
//! own request counts ([`server_stats`]).
//!
//! The binary's `--help` and this crate's `README.md` show how to run one
//! case and the whole matrix.

pub mod analysis;
pub mod clock;
pub mod controller;
pub mod election;
pub mod event;
pub mod nemesis;
pub mod register;
pub mod sabotage;
pub mod scale;
pub mod server_stats;
pub mod worker;

pub use analysis::Report;
pub use controller::{RunConfig, run};
