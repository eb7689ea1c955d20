//! SQLite: a lease table for locks shared by the processes of one machine.
//!
//! Each lock is a row `(name, owner, fence, expires_at_ms)`. Acquiring is one
//! upsert under `BEGIN IMMEDIATE` (SQLite's single writer lock) that takes the
//! row only when it is free or its lease has run out, and bumps the fencing
//! counter in the same row. Release and extend compare the owner token.
//! Expiry uses the wall clock in Unix milliseconds, which all processes on
//! one machine share; a step of the system clock moves every lease with it.
//!
//! SQLite cannot notify waiters, so `acquire` polls with backoff and jitter.
//! Polls after the first only read the row (a WAL read never waits for the
//! writer) and take the write lock only when the lock looks free, so waiters
//! do not starve the holder's renewals of SQLite's single write lock. A
//! release made in this process wakes this process's waiters on the same
//! file at once.
//!
//! **Fair order across processes.** A waiter that finds the lock held takes
//! a ticket: a row in `TABLE_waiters` with an increasing number and a
//! heartbeat it refreshes while it polls. A grant goes only to an attempt
//! with no live ticket ahead of it (a `try_acquire` has none, so it never
//! overtakes a waiter), so waiters are served in ticket order, whichever
//! process polls first. A waiter that leaves (granted, timed out, dropped)
//! deletes its ticket; a crashed one's ticket is ignored once its heartbeat
//! is older than `TICKET_STALE` (3 s).
//!
//! Commits run with SQLite's `synchronous = NORMAL` (no fsync per commit):
//! a committed grant survives a crash of any process. A crash of the
//! machine may roll back the latest commits, which costs nothing to the
//! leases (their holders ran on that machine and are gone with it) but
//! would take fencing counters back; the tokens count in an epoch that the
//! first open after each boot of the machine advances, flushed (`tokens`).
//! Where the kernel tells no boot id, commits keep `synchronous = FULL`.
//!
//! Modules: `config` holds [`SqliteConfig`] and reads `sqlite://` URLs,
//! `lock` the [`SqliteLock`] client and its `RawLock` implementation,
//! `handle` the guard's release and extend, `tokens` the fencing epoch;
//! then what is SQLite's own:
//! `ticket` a waiter's place in line, `batch` the shared transactions of
//! renewals and releases, `gate` this process's turns at the file's single
//! writer lock. Errors are the SQL backends' (`crate::error`).

mod batch;
mod config;
mod gate;
mod handle;
mod lock;
mod permits;
mod rw;
mod ticket;
mod tokens;

pub use config::SqliteConfig;
pub use lock::SqliteLock;
