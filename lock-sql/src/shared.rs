//! Advisory locks multiplexed over a few long-lived sessions (Postgres and
//! MySQL advisory mode).
//!
//! A session-level advisory lock (`pg_advisory_lock`, `GET_LOCK`) belongs
//! to a database session, and one session can hold any number of them, so
//! the number of locks a client holds need not be bounded by its pool. A
//! lock granted **without waiting** is taken on one of a few shared
//! sessions; an acquisition that has to wait for another holder queues on
//! a pooled connection of its own, as before, so the server still does the
//! waiting, in arrival order, and wakes the next waiter itself.
//!
//! Each shared session is owned by one task that runs its statements one
//! after another. Callers send it commands and wait for the answer, so a
//! caller that gives up (a cancelled acquisition, a dropped guard) never
//! leaves half a statement on a connection that carries other locks; a
//! grant whose caller has gone is given back at once.
//!
//! - **Renewals are batched**: all renewals waiting for a session are
//!   answered by one statement (which proves the session, and so every
//!   lock on it, alive and sets the session's idle bound).
//! - **A hung client** (no statements for a while) is bounded by the
//!   server's idle timeout (`idle_session_timeout`, `wait_timeout`), set
//!   to the longest lease among the session's locks.
//! - **An abandoned lock** (a guard leaked while the client goes on) is
//!   given back by the session's task when its lease has run out without a
//!   renewal, as a connection of its own would be ended by the server.
//! - **Same-client exclusion**: the server's advisory locks are re-entrant
//!   within a session; the task refuses a second grant of a name it
//!   already holds, so such an acquisition waits on a connection of its
//!   own, behind the first, as one from another client would.
//! - **A lost session** (killed, a server restart) loses exactly the locks
//!   it carried: their renewals and releases answer "not held", which
//!   fires their `lost()`; the next acquisition opens a new session.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::LockError;
use lock_core::raw::GuardHandle;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::error::{connection_lost, map_sqlx};

/// The most commands a session's task takes in at once (one renewal
/// statement answers all the renewals among them).
const MAX_BATCH: usize = 4096;

/// What one attempt on a shared session came to.
enum Attempt {
    /// Granted, with this fencing token.
    Granted(u64),
    /// Held by another session (or by this one: never asked).
    Busy,
    /// Refused by the server; the session holds what it held before.
    Failed(sqlx::Error),
    /// The connection is gone, or its state is unknown.
    Broken(sqlx::Error),
}

impl Attempt {
    /// A failed statement: refused by the server (the session goes on), or
    /// the session is gone.
    fn failure(e: sqlx::Error) -> Attempt {
        match &e {
            sqlx::Error::Database(_) if !connection_lost(&e) => Attempt::Failed(e),
            _ => Attempt::Broken(e),
        }
    }
}

/// The statements of one database's advisory locks on a shared session.
#[async_trait]
pub(crate) trait SessionSql: Send + Sync + 'static {
    /// A connection of the session's own (outside the pool).
    type Conn: Send + 'static;

    /// Open a session.
    async fn open(&self) -> Result<Self::Conn, sqlx::Error>;

    /// Set the session's idle bound to `idle`, then one attempt at `name`,
    /// not waiting: if granted, the grant's fencing token, `name`'s counter
    /// advanced durably before answering (0 where grants draw none). A
    /// failure may leave `name` locked on the session (an advisory lock
    /// outlives the abort of the statement that took it): the caller gives
    /// it back.
    async fn try_lock(
        &self,
        conn: &mut Self::Conn,
        name: &str,
        idle: Duration,
    ) -> Result<Option<u64>, sqlx::Error>;

    /// Give `name` back (`last`: the session holds no other lock); whether
    /// the session held it.
    async fn unlock(
        &self,
        conn: &mut Self::Conn,
        name: &str,
        last: bool,
    ) -> Result<bool, sqlx::Error>;

    /// One statement proving the session alive, setting its idle bound to
    /// `idle`.
    async fn keep(&self, conn: &mut Self::Conn, idle: Duration) -> Result<(), sqlx::Error>;
}

/// An acquisition's answer: the grant if granted; an error says whether a
/// new session might do better.
type LockReply = Result<Option<Grant>, (LockError, bool)>;

enum Command {
    Lock {
        name: String,
        idle: Duration,
        /// The session's own queue, for a grant its caller never takes.
        session: mpsc::UnboundedSender<Command>,
        reply: oneshot::Sender<LockReply>,
    },
    /// Give `name` back if the session holds it under grant `id`.
    Unlock {
        name: String,
        id: u64,
        reply: oneshot::Sender<bool>,
    },
    Renew {
        name: String,
        id: u64,
        idle: Duration,
        reply: oneshot::Sender<bool>,
    },
}

/// A grant on its way to its caller. A caller that is gone by then (an
/// acquisition cancelled after the session answered but before the answer
/// was read) drops it unclaimed, and the lock goes back to the session at
/// once instead of staying held by nobody until its lease runs out.
pub(crate) struct Grant {
    session: mpsc::UnboundedSender<Command>,
    name: String,
    /// The session's number for this grant (fencing tokens may be off).
    id: u64,
    token: u64,
    claimed: bool,
}

impl Grant {
    /// The caller takes the lock: its handle and token.
    fn claim(mut self) -> (SharedHandle, u64) {
        self.claimed = true;
        let handle = SharedHandle {
            session: self.session.clone(),
            name: std::mem::take(&mut self.name),
            id: self.id,
        };
        (handle, self.token)
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if self.claimed {
            return;
        }
        let (reply, _) = oneshot::channel();
        let _ = self.session.send(Command::Unlock {
            name: std::mem::take(&mut self.name),
            id: self.id,
            reply,
        });
    }
}

/// A client's shared sessions: opened on first use, in turns, and again
/// after one is lost.
pub(crate) struct SharedSessions<S: SessionSql> {
    backend: &'static str,
    sql: Arc<S>,
    slots: Vec<tokio::sync::Mutex<Option<mpsc::UnboundedSender<Command>>>>,
    next: AtomicUsize,
}

impl<S: SessionSql> SharedSessions<S> {
    /// `count` sessions (none: every lock on a connection of its own).
    pub(crate) fn new(backend: &'static str, sql: S, count: usize) -> Self {
        SharedSessions {
            backend,
            sql: Arc::new(sql),
            slots: (0..count).map(|_| tokio::sync::Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// Whether locks are multiplexed at all.
    pub(crate) fn enabled(&self) -> bool {
        !self.slots.is_empty()
    }

    /// One attempt at `name` on a shared session, its idle bound at least
    /// `idle`: the lock's handle and token, or `None` if it is held.
    pub(crate) async fn try_lock(
        &self,
        name: &str,
        idle: Duration,
    ) -> Result<Option<(Arc<dyn GuardHandle>, u64)>, LockError> {
        let count = self.slots.len().max(1);
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % count;
        let mut last_error = None;
        // A session that died while idle fails its next statement; a new
        // one is opened for the next try.
        for _ in 0..3 {
            let session = self.session(slot).await?;
            let (reply, answer) = oneshot::channel();
            let sent = session.send(Command::Lock {
                name: name.to_string(),
                idle,
                session: session.clone(),
                reply,
            });
            if sent.is_err() {
                continue;
            }
            match answer.await {
                Ok(Ok(Some(grant))) => {
                    let (handle, token) = grant.claim();
                    return Ok(Some((Arc::new(handle), token)));
                }
                Ok(Ok(None)) => return Ok(None),
                Ok(Err((e, true))) => last_error = Some(e),
                Ok(Err((e, false))) => return Err(e),
                // The session's task ended before answering.
                Err(_) => {}
            }
        }
        Err(last_error.unwrap_or_else(|| LockError::Unavailable {
            backend: self.backend,
            reason: "acquiring a lock: the shared session kept failing".into(),
            source: None,
        }))
    }

    /// One attempt at `name` on the first session, answered as the session
    /// answers it: a grant nobody has claimed yet.
    #[cfg(all(test, feature = "mysql"))]
    pub(crate) async fn grant_unclaimed(&self, name: &str, idle: Duration) -> Option<Grant> {
        let session = self.session(0).await.ok()?;
        let (reply, answer) = oneshot::channel();
        session
            .send(Command::Lock {
                name: name.to_string(),
                idle,
                session: session.clone(),
                reply,
            })
            .ok()?;
        answer.await.ok()?.ok()?
    }

    /// Slot `i`'s session, opened if there is none (or it was lost).
    async fn session(&self, i: usize) -> Result<mpsc::UnboundedSender<Command>, LockError> {
        let Some(slot) = self.slots.get(i) else {
            return Err(LockError::Backend {
                backend: self.backend,
                reason: "no shared session is configured".into(),
                source: None,
            });
        };
        let mut slot = slot.lock().await;
        if let Some(tx) = slot.as_ref().filter(|tx| !tx.is_closed()) {
            return Ok(tx.clone());
        }
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| LockError::Unavailable {
                backend: self.backend,
                reason: "a shared session needs a Tokio runtime".into(),
                source: None,
            })?;
        let conn = self
            .sql
            .open()
            .await
            .map_err(|e| map_sqlx(self.backend, "opening a shared session", e))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let session = Session {
            backend: self.backend,
            sql: Arc::clone(&self.sql),
            conn,
            held: HashMap::new(),
            idle: Duration::ZERO,
            earliest: None,
            grants: 0,
        };
        runtime.spawn(session.serve(rx));
        *slot = Some(tx.clone());
        Ok(tx)
    }
}

impl<S: SessionSql> fmt::Debug for SharedSessions<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedSessions")
            .field("backend", &self.backend)
            .field("sessions", &self.slots.len())
            .finish_non_exhaustive()
    }
}

/// A lock held on a shared session, under the session's number for its
/// grant (so a stale handle never gives back a later grant of the same
/// name).
struct SharedHandle {
    session: mpsc::UnboundedSender<Command>,
    name: String,
    id: u64,
}

impl SharedHandle {
    /// Send a command answered with a yes or no; no answer (the session is
    /// gone, and the lock with it) is a no.
    async fn ask(&self, command: impl FnOnce(oneshot::Sender<bool>) -> Command) -> bool {
        let (reply, answer) = oneshot::channel();
        if self.session.send(command(reply)).is_err() {
            return false;
        }
        answer.await.unwrap_or(false)
    }
}

#[async_trait]
impl GuardHandle for SharedHandle {
    async fn release(&self) -> Result<bool, LockError> {
        let (name, id) = (self.name.clone(), self.id);
        Ok(self.ask(|reply| Command::Unlock { name, id, reply }).await)
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        let (name, id) = (self.name.clone(), self.id);
        Ok(self
            .ask(|reply| Command::Renew {
                name,
                id,
                idle: ttl,
                reply,
            })
            .await)
    }
}

/// A lock held on the session: the session's number for its grant, when
/// the session's task gives it back unless renewed, and the idle bound it
/// asked for.
struct Held {
    id: u64,
    until: Instant,
    idle: Duration,
}

/// The session's task: its connection and the locks on it.
struct Session<S: SessionSql> {
    backend: &'static str,
    sql: Arc<S>,
    conn: S::Conn,
    held: HashMap<String, Held>,
    /// The idle bound last set on the server.
    idle: Duration,
    /// No lock runs out before this (a lower bound: renewals only move
    /// leases later).
    earliest: Option<Instant>,
    /// Grants made so far: the next grant's number.
    grants: u64,
}

/// The connection is gone or in an unknown state: the task ends, and the
/// server frees every lock of the session with it.
struct Broken;

impl<S: SessionSql> Session<S> {
    async fn serve(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut batch = Vec::with_capacity(64);
        loop {
            let expiry = self.earliest;
            let received = tokio::select! {
                n = commands.recv_many(&mut batch, MAX_BATCH) => n,
                () = sleep_until_some(expiry) => {
                    if self.expire().await.is_err() {
                        break;
                    }
                    continue;
                }
            };
            // Every sender is gone: the client and all its guards.
            if received == 0 {
                break;
            }
            if self.run(&mut batch).await.is_err() {
                break;
            }
        }
        tracing::debug!(
            backend = self.backend,
            locks = self.held.len(),
            "a shared session ended"
        );
    }

    /// Acquisitions and releases in order, then one statement for all the
    /// renewals.
    async fn run(&mut self, batch: &mut Vec<Command>) -> Result<(), Broken> {
        let mut renewals = Vec::new();
        for command in batch.drain(..) {
            match command {
                Command::Lock {
                    name,
                    idle,
                    session,
                    reply,
                } => self.lock(name, idle, session, reply).await?,
                Command::Unlock { name, id, reply } => {
                    let ours = self.holds(&name, id) && self.unlock(&name).await?;
                    let _ = reply.send(ours);
                }
                Command::Renew {
                    name,
                    id,
                    idle,
                    reply,
                } => renewals.push((name, id, idle, reply)),
            }
        }
        if renewals.is_empty() {
            return Ok(());
        }
        for (name, id, idle, _) in &renewals {
            if let Some(held) = self.held.get_mut(name).filter(|h| h.id == *id) {
                held.idle = *idle;
            }
        }
        let idle = self.held.values().map(|h| h.idle).max().unwrap_or_default();
        if let Err(e) = self.sql.keep(&mut self.conn, idle).await {
            tracing::debug!(backend = self.backend, error = %e, "renewing on a shared session failed");
            return Err(Broken);
        }
        self.idle = idle;
        let done = Instant::now();
        for (name, id, idle, reply) in renewals {
            let ours = match self.held.get_mut(&name).filter(|h| h.id == id) {
                Some(held) => {
                    held.until = done + idle;
                    true
                }
                None => false,
            };
            let _ = reply.send(ours);
        }
        Ok(())
    }

    /// Whether the session holds `name` under grant `id`.
    fn holds(&self, name: &str, id: u64) -> bool {
        self.held.get(name).is_some_and(|h| h.id == id)
    }

    async fn lock(
        &mut self,
        name: String,
        idle: Duration,
        session: mpsc::UnboundedSender<Command>,
        reply: oneshot::Sender<LockReply>,
    ) -> Result<(), Broken> {
        if self.held.contains_key(&name) {
            let _ = reply.send(Ok(None));
            return Ok(());
        }
        let bound = self.idle.max(idle);
        match self.attempt(&name, bound).await {
            Attempt::Granted(token) => {
                self.idle = bound;
                let until = Instant::now() + idle;
                self.earliest = Some(self.earliest.map_or(until, |e| e.min(until)));
                let id = self.grants;
                self.grants += 1;
                self.held.insert(name.clone(), Held { id, until, idle });
                let grant = Grant {
                    session,
                    name,
                    id,
                    token,
                    claimed: false,
                };
                if let Err(Ok(Some(mut grant))) = reply.send(Ok(Some(grant))) {
                    // Nobody is waiting for it any more.
                    grant.claimed = true;
                    self.unlock(&grant.name).await?;
                }
                Ok(())
            }
            Attempt::Busy => {
                self.idle = bound;
                let _ = reply.send(Ok(None));
                Ok(())
            }
            Attempt::Failed(e) => {
                let _ = reply.send(Err((map_sqlx(self.backend, "acquiring a lock", e), false)));
                Ok(())
            }
            Attempt::Broken(e) => {
                tracing::debug!(backend = self.backend, error = %e, "a shared session broke");
                let _ = reply.send(Err((map_sqlx(self.backend, "acquiring a lock", e), true)));
                Err(Broken)
            }
        }
    }

    /// One attempt at `name` and, if granted, its token; a failed attempt,
    /// which may have locked `name` before failing (a token that could not
    /// be drawn), gives it back before answering.
    async fn attempt(&mut self, name: &str, bound: Duration) -> Attempt {
        let failure = match self.sql.try_lock(&mut self.conn, name, bound).await {
            Ok(Some(token)) => return Attempt::Granted(token),
            Ok(None) => return Attempt::Busy,
            Err(e) => e,
        };
        if connection_lost(&failure) {
            return Attempt::Broken(failure);
        }
        match self.sql.unlock(&mut self.conn, name, false).await {
            Ok(_) => Attempt::failure(failure),
            Err(_) => Attempt::Broken(failure),
        }
    }

    /// Give `name` back if the session holds it.
    async fn unlock(&mut self, name: &str) -> Result<bool, Broken> {
        if self.held.remove(name).is_none() {
            return Ok(false);
        }
        let last = self.held.is_empty();
        match self.sql.unlock(&mut self.conn, name, last).await {
            Ok(ours) => {
                if last {
                    self.idle = Duration::ZERO;
                    self.earliest = None;
                }
                Ok(ours)
            }
            Err(e) => {
                tracing::debug!(backend = self.backend, error = %e, "releasing on a shared session failed");
                Err(Broken)
            }
        }
    }

    /// Give back every lock whose lease ran out without a renewal (a guard
    /// leaked while the client goes on).
    async fn expire(&mut self) -> Result<(), Broken> {
        let now = Instant::now();
        let expired: Vec<String> = self
            .held
            .iter()
            .filter(|(_, h)| h.until <= now)
            .map(|(name, _)| name.clone())
            .collect();
        for name in expired {
            tracing::debug!(backend = self.backend, lock = %name, "an unrenewed lock ran out on its shared session");
            self.unlock(&name).await?;
        }
        self.earliest = self.held.values().map(|h| h.until).min();
        Ok(())
    }
}

/// Sleep until `at`, or for ever.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
