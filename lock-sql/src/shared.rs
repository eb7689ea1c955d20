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
//! A session's statements run one after another, under its mutex. An
//! acquisition or a release runs its statement in the caller's own task
//! (no hand-over to another task and back), and a statement once sent
//! runs to its end even if its caller gives up (a cancelled acquisition, a
//! dropped guard): the rest of it is handed to the runtime
//! ([`RunToEnd`]), so no connection that carries other locks is left with
//! half a statement, and a grant whose caller has gone is given back at
//! once. Each session also has a task of its own, for what no caller
//! waits on: renewals, leases run out, grants nobody claimed.
//!
//! - **Renewals are batched**: all renewals waiting for a session are
//!   answered by one statement (which proves the session, and so every
//!   lock on it, alive and sets the session's idle bound).
//! - **A hung client** (no statements for a while) is bounded by the
//!   server's idle timeout (`idle_session_timeout`, `wait_timeout`), set
//!   to the longest lease among the session's locks. The bound is set only
//!   when it changes (a session that takes locks of one lease sends no
//!   statement for it after the first), and stays when the session's last
//!   lock is given back: a client quiet for longer than that finds the
//!   session ended by the server, and its next acquisition opens a new one
//!   (as after any lost session).
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
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::LockError;
use lock_core::raw::GuardHandle;
use tokio::runtime::Handle;
use tokio::sync::{Mutex, Notify, mpsc, oneshot};
use tokio::time::Instant;

use crate::error::{connection_lost, map_sqlx};

/// The most commands a session's task takes in at once (one renewal
/// statement answers all the renewals among them).
const MAX_BATCH: usize = 4096;

/// The most names one set attempt takes on a shared session, in one
/// statement ([`SharedSessions::try_lock_set`]).
pub(crate) const MAX_ATOMIC_SET: usize = 64;

/// What one attempt on a shared session came to: `T` is what a grant
/// brings (a lock's fencing token, a set's tokens).
enum Attempt<T> {
    /// Granted, with this fencing token (these tokens).
    Granted(T),
    /// Held by another session (or by this one: never asked).
    Busy,
    /// Refused by the server; the session holds what it held before.
    Failed(sqlx::Error),
    /// The connection is gone, or its state is unknown.
    Broken(sqlx::Error),
}

impl<T> Attempt<T> {
    /// A failed statement: refused by the server (the session goes on), or
    /// the session is gone.
    fn failure(e: sqlx::Error) -> Attempt<T> {
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
    type Conn: sqlx::Connection + Send + 'static;

    /// The session's idle bound set to `idle` if given (`None`: the
    /// server has it already), then one attempt at `name`, not waiting: if
    /// granted, the grant's fencing token, `name`'s counter advanced
    /// before answering, with the holder `record` beside it (0 where grants
    /// draw none, and then no record is kept). A failure may leave `name`
    /// locked on the session (an advisory lock outlives the abort of the
    /// statement that took it): the caller gives it back.
    async fn try_lock(
        &self,
        conn: &mut Self::Conn,
        name: &str,
        record: &[u8],
        idle: Option<Duration>,
    ) -> Tried;

    /// The session's idle bound set to `idle` if given, then one attempt
    /// at every name of `names` (distinct, at most [`MAX_ATOMIC_SET`]) in
    /// one request, not waiting, all or none: when every name is free
    /// (nobody holds it or waits for it), all are taken and their tokens
    /// drawn as [`try_lock`](Self::try_lock) draws one, in `names`' order;
    /// when one is not, none is taken, and none of the others is locked
    /// on the way (whoever holds or waits for it is seen first). Only a
    /// grant racing this very request can make it take some and give them
    /// back before answering. A failure may leave names locked on the
    /// session: the caller gives them back.
    async fn try_lock_set(
        &self,
        conn: &mut Self::Conn,
        names: &[&str],
        record: &[u8],
        idle: Option<Duration>,
    ) -> TriedSet;

    /// Give `name` back; whether the session held it. The session's idle
    /// bound stays as it is.
    async fn unlock(&self, conn: &mut Self::Conn, name: &str) -> Result<bool, sqlx::Error>;

    /// One statement proving the session alive, setting its idle bound to
    /// `idle`.
    async fn keep(&self, conn: &mut Self::Conn, idle: Duration) -> Result<(), sqlx::Error>;

    /// The session's idle bound as the server holds it.
    #[cfg(test)]
    async fn idle_bound(&self, conn: &mut Self::Conn) -> Result<Duration, sqlx::Error>;
}

/// One attempt's answer on a session: the token if granted (0 where
/// grants draw none), `None` if the name is held.
pub(crate) type Tried = Result<Option<u64>, sqlx::Error>;

/// One set attempt's answer on a session: every name's token in order if
/// all were granted (0 where grants draw none), `None` if one is held.
pub(crate) type TriedSet = Result<Option<Vec<u64>>, sqlx::Error>;

/// An acquisition's answer: the grant if granted; an error says whether a
/// new session might do better.
type LockReply<T = Grant> = Result<Option<T>, (LockError, bool)>;

/// What a session's task is asked to do.
enum Command {
    /// Give `name` back if the session holds it under grant `id` (a grant
    /// nobody claimed).
    Unlock { name: String, id: u64 },
    /// Renew `name` under grant `id`, the session's idle bound at least
    /// `idle`; whether the session still holds it.
    Renew {
        name: String,
        id: u64,
        idle: Duration,
        reply: oneshot::Sender<bool>,
    },
}

/// A grant on its way to its caller. A caller that is gone by then (an
/// acquisition cancelled while its statement ran) drops it unclaimed, and
/// the lock goes back to the session at once instead of staying held by
/// nobody until its lease runs out.
pub(crate) struct Grant {
    commands: mpsc::UnboundedSender<Command>,
    name: String,
    /// The session's number for this grant (fencing tokens may be off).
    id: u64,
    token: u64,
    claimed: bool,
}

impl Grant {
    /// The caller takes the lock on `session`: its handle and token.
    fn claim<S: SessionSql>(mut self, session: Arc<SessionRef<S>>) -> (SharedHandle<S>, u64) {
        self.claimed = true;
        let handle = SharedHandle {
            session,
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
        let _ = self.commands.send(Command::Unlock {
            name: std::mem::take(&mut self.name),
            id: self.id,
        });
    }
}

/// A statement on a shared session that runs to its end whatever its
/// caller does: polled in the caller's task while the caller waits, handed
/// to the runtime if the caller drops it unfinished.
struct RunToEnd<T: Send + 'static> {
    statement: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    runtime: Handle,
}

impl<T: Send + 'static> RunToEnd<T> {
    fn new(runtime: &Handle, statement: impl Future<Output = T> + Send + 'static) -> Self {
        RunToEnd {
            statement: Some(Box::pin(statement)),
            runtime: runtime.clone(),
        }
    }
}

impl<T: Send + 'static> Future for RunToEnd<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = self.get_mut();
        let Some(statement) = this.statement.as_mut() else {
            return Poll::Pending;
        };
        let answer = std::task::ready!(statement.as_mut().poll(cx));
        this.statement = None;
        Poll::Ready(answer)
    }
}

impl<T: Send + 'static> Drop for RunToEnd<T> {
    fn drop(&mut self) {
        if let Some(statement) = self.statement.take() {
            // The answer goes nowhere; a grant in it is given back. Should
            // the runtime be shutting down, the statement is dropped half
            // way, and the session ends at its next use (`Session::begin`).
            // The task runs detached: its handle is not needed.
            drop(self.runtime.spawn(async move {
                drop(statement.await);
            }));
        }
    }
}

/// One shared session as its users see it: its state (run by whoever holds
/// its mutex: a caller's statement, or the session's task) and its task's
/// queue.
pub(crate) struct SessionRef<S: SessionSql> {
    state: Arc<Mutex<Session<S>>>,
    commands: mpsc::UnboundedSender<Command>,
    /// Set when the session has ended (its connection closed).
    ended: Arc<AtomicBool>,
    runtime: Handle,
}

impl<S: SessionSql> SessionRef<S> {
    /// Whether the session can take statements.
    fn alive(&self) -> bool {
        !self.ended.load(Ordering::Acquire) && !self.commands.is_closed()
    }

    /// One attempt at `name` with the holder `record`, its idle bound at
    /// least `idle`.
    async fn lock(&self, name: &str, record: &[u8], idle: Duration) -> LockReply {
        let mut session = Arc::clone(&self.state).lock_owned().await;
        let commands = self.commands.clone();
        let (name, record) = (name.to_string(), record.to_vec());
        RunToEnd::new(&self.runtime, async move {
            let Some((id, token)) = session.lock(&name, &record, idle).await? else {
                return Ok(None);
            };
            Ok(Some(Grant {
                commands,
                name,
                id,
                token,
                claimed: false,
            }))
        })
        .await
    }

    /// One attempt at every name of `names` at once, with the holder
    /// `record`, its idle bound at least `idle`: a grant per name, in
    /// order, or `None` if one is held.
    async fn lock_set(
        &self,
        names: &[&str],
        record: &[u8],
        idle: Duration,
    ) -> LockReply<Vec<Grant>> {
        let mut session = Arc::clone(&self.state).lock_owned().await;
        let commands = self.commands.clone();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let record = record.to_vec();
        RunToEnd::new(&self.runtime, async move {
            let Some(granted) = session.lock_set(&names, &record, idle).await? else {
                return Ok(None);
            };
            let grants = names
                .into_iter()
                .zip(granted)
                .map(|(name, (id, token))| Grant {
                    commands: commands.clone(),
                    name,
                    id,
                    token,
                    claimed: false,
                });
            Ok(Some(grants.collect()))
        })
        .await
    }

    /// Give `name` back if the session holds it under grant `id`.
    async fn unlock(&self, name: &str, id: u64) -> bool {
        let mut session = Arc::clone(&self.state).lock_owned().await;
        let name = name.to_string();
        RunToEnd::new(&self.runtime, async move {
            session.unlock_grant(&name, id).await
        })
        .await
    }
}

/// A client's shared sessions: opened on first use, in turns, and again
/// after one is lost.
pub(crate) struct SharedSessions<S: SessionSql> {
    backend: &'static str,
    sql: Arc<S>,
    /// What a session connects with.
    options: <S::Conn as sqlx::Connection>::Options,
    slots: Vec<Mutex<Option<Arc<SessionRef<S>>>>>,
    next: AtomicUsize,
}

impl<S: SessionSql> SharedSessions<S> {
    /// `count` sessions (none: every lock on a connection of its own),
    /// each connected with `options`.
    pub(crate) fn new(
        backend: &'static str,
        sql: S,
        options: <S::Conn as sqlx::Connection>::Options,
        count: usize,
    ) -> Self {
        SharedSessions {
            backend,
            sql: Arc::new(sql),
            options,
            slots: (0..count).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// Whether locks are multiplexed at all.
    pub(crate) fn enabled(&self) -> bool {
        !self.slots.is_empty()
    }

    /// One attempt at `name` on a shared session, with the holder
    /// `record`, its idle bound at least `idle`: the lock's handle and
    /// token, or `None` if it is held.
    pub(crate) async fn try_lock(
        &self,
        name: &str,
        record: &[u8],
        idle: Duration,
    ) -> Result<Option<(Arc<dyn GuardHandle>, u64)>, LockError> {
        self.on_a_session("acquiring a lock", move |session| async move {
            let grant = session.lock(name, record, idle).await?;
            Ok(grant.map(|grant| claimed(grant, &session)))
        })
        .await
    }

    /// One attempt at every name of `names` (distinct, at most
    /// [`MAX_ATOMIC_SET`]) on a shared session, all or none (see
    /// [`SessionSql::try_lock_set`]), with the holder `record`, its idle
    /// bound at least `idle`: each lock's handle and token, in order, or
    /// `None` if one is held.
    pub(crate) async fn try_lock_set(
        &self,
        names: &[&str],
        record: &[u8],
        idle: Duration,
    ) -> Result<Option<Vec<(Arc<dyn GuardHandle>, u64)>>, LockError> {
        self.on_a_session("acquiring a lock set", move |session| async move {
            let grants = session.lock_set(names, record, idle).await?;
            Ok(grants.map(|grants| grants.into_iter().map(|g| claimed(g, &session)).collect()))
        })
        .await
    }

    /// `attempt` on the next session in turn; a session that died while
    /// idle fails its next statement, and a new one is opened for the next
    /// try (three in all).
    async fn on_a_session<T, F, Fut>(&self, what: &str, attempt: F) -> Result<T, LockError>
    where
        F: Fn(Arc<SessionRef<S>>) -> Fut,
        Fut: Future<Output = Result<T, (LockError, bool)>>,
    {
        let count = self.slots.len().max(1);
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % count;
        let mut last_error = None;
        for _ in 0..3 {
            let session = self.session(slot).await?;
            match attempt(session).await {
                Ok(answer) => return Ok(answer),
                Err((e, true)) => last_error = Some(e),
                Err((e, false)) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| LockError::Unavailable {
            backend: self.backend,
            reason: format!("{what}: the shared session kept failing"),
            source: None,
        }))
    }

    /// One attempt at `name` on the first session, answered as the session
    /// answers it: a grant nobody has claimed yet.
    #[cfg(all(test, feature = "mysql"))]
    pub(crate) async fn grant_unclaimed(&self, name: &str, idle: Duration) -> Option<Grant> {
        self.session(0)
            .await
            .ok()?
            .lock(name, b"", idle)
            .await
            .ok()?
    }

    /// `f` run on the first session's connection (opened if there is
    /// none), between statements: a test's view of the server's state.
    #[cfg(test)]
    pub(crate) async fn on_connection<T>(
        &self,
        f: impl AsyncFnOnce(&mut S::Conn) -> T,
    ) -> Option<T> {
        let session = self.session(0).await.ok()?;
        let mut state = session.state.lock().await;
        Some(f(state.conn.as_mut()?).await)
    }

    /// The test, written once for every dialect, that a session sets its
    /// idle bound only when a lock's lease asks for another, and keeps it
    /// when its last lock is given back.
    #[cfg(test)]
    pub(crate) async fn check_idle_bound_set_only_when_it_changes(&self) {
        let name = format!("idle-bound-{}", std::process::id());
        let shown = async || {
            self.on_connection(async |conn| self.sql.idle_bound(conn).await)
                .await
                .expect("the session is open")
                .expect("read the idle bound")
        };
        let cycle = async |secs| {
            let (handle, _token) = self
                .try_lock(&name, b"", Duration::from_secs(secs))
                .await
                .expect("lock")
                .expect("a free name is granted");
            let held = shown().await;
            assert!(
                handle.release().await.expect("unlock"),
                "the session held the name"
            );
            assert_eq!(
                shown().await,
                held,
                "the bound stays when the lock is given back"
            );
            held.as_secs()
        };
        assert_eq!(cycle(30).await, 30, "a new session's bound is set");
        // Changed behind the client's back: a lock of the same lease
        // sends no statement for the bound, so the change shows.
        self.on_connection(async |conn| self.sql.keep(conn, Duration::from_secs(5)).await)
            .await
            .expect("the session is open")
            .expect("change the bound");
        assert_eq!(cycle(30).await, 5, "an unchanged bound is not set again");
        assert_eq!(cycle(20).await, 20, "a changed bound is set");
    }

    /// Slot `i`'s session, opened if there is none (or it was lost).
    async fn session(&self, i: usize) -> Result<Arc<SessionRef<S>>, LockError> {
        let Some(slot) = self.slots.get(i) else {
            return Err(LockError::Backend {
                backend: self.backend,
                reason: "no shared session is configured".into(),
                source: None,
            });
        };
        let mut slot = slot.lock().await;
        if let Some(session) = slot.as_ref().filter(|s| s.alive()) {
            return Ok(Arc::clone(session));
        }
        let runtime = Handle::try_current().map_err(|_| LockError::Unavailable {
            backend: self.backend,
            reason: "a shared session needs a Tokio runtime".into(),
            source: None,
        })?;
        let conn = sqlx::ConnectOptions::connect(&self.options)
            .await
            .map_err(|e| map_sqlx(self.backend, "opening a shared session", e))?;
        let (commands, queue) = mpsc::unbounded_channel();
        let wake = Arc::new(Notify::new());
        let ended = Arc::new(AtomicBool::new(false));
        let state = Arc::new(Mutex::new(Session {
            backend: self.backend,
            sql: Arc::clone(&self.sql),
            conn: Some(conn),
            midway: false,
            held: HashMap::new(),
            idle: Duration::ZERO,
            server_idle: None,
            timer: None,
            grants: 0,
            wake: Arc::clone(&wake),
            ended: Arc::clone(&ended),
        }));
        runtime.spawn(serve(Arc::clone(&state), wake, queue));
        let session = Arc::new(SessionRef {
            state,
            commands,
            ended,
            runtime,
        });
        *slot = Some(Arc::clone(&session));
        Ok(session)
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

/// `grant` claimed on `session`: the lock's handle and token.
fn claimed<S: SessionSql>(
    grant: Grant,
    session: &Arc<SessionRef<S>>,
) -> (Arc<dyn GuardHandle>, u64) {
    let (handle, token) = grant.claim(Arc::clone(session));
    (Arc::new(handle), token)
}

/// A lock held on a shared session, under the session's number for its
/// grant (so a stale handle never gives back a later grant of the same
/// name).
struct SharedHandle<S: SessionSql> {
    session: Arc<SessionRef<S>>,
    name: String,
    id: u64,
}

#[async_trait]
impl<S: SessionSql> GuardHandle for SharedHandle<S> {
    async fn release(&self) -> Result<bool, LockError> {
        Ok(self.session.unlock(&self.name, self.id).await)
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        let (reply, answer) = oneshot::channel();
        let renew = Command::Renew {
            name: self.name.clone(),
            id: self.id,
            idle: ttl,
            reply,
        };
        // No answer (the session is gone, and the lock with it) is a no.
        if self.session.commands.send(renew).is_err() {
            return Ok(false);
        }
        Ok(answer.await.unwrap_or(false))
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

/// A shared session's connection and the locks on it.
struct Session<S: SessionSql> {
    backend: &'static str,
    sql: Arc<S>,
    /// `None` once the session has ended.
    conn: Option<S::Conn>,
    /// An operation is under way (or was dropped half way, leaving the
    /// connection's state unknown).
    midway: bool,
    held: HashMap<String, Held>,
    /// The idle bound the session's locks need: the longest lease asked
    /// for since it last held nothing.
    idle: Duration,
    /// The idle bound last set on the server for this session, which
    /// keeps it when the session empties: an attempt sets it only when
    /// it changes. `None` until set, while a statement setting it is under
    /// way, and after one failed (its effect unknown).
    server_idle: Option<Duration>,
    /// When the session's task next looks for leases run out; no lock's
    /// lease runs out before it (renewals only move leases later).
    timer: Option<Instant>,
    /// Grants made so far: the next grant's number.
    grants: u64,
    /// Wakes the session's task (an earlier timer, or the end).
    wake: Arc<Notify>,
    ended: Arc<AtomicBool>,
}

/// A session's task: renewals and unclaimed grants from its queue, and
/// leases run out, until the session ends or every sender (the client and
/// all its guards) is gone.
async fn serve<S: SessionSql>(
    state: Arc<Mutex<Session<S>>>,
    wake: Arc<Notify>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut batch = Vec::with_capacity(64);
    loop {
        let timer = {
            let session = state.lock().await;
            if session.conn.is_none() {
                break;
            }
            session.timer
        };
        tokio::select! {
            n = commands.recv_many(&mut batch, MAX_BATCH) => {
                if n == 0 {
                    break;
                }
                state.lock().await.run(&mut batch).await;
            }
            () = wake.notified() => {}
            () = sleep_until_some(timer) => state.lock().await.expire().await,
        }
    }
    let mut session = state.lock().await;
    tracing::debug!(target: "distlock",
        backend = session.backend,
        locks = session.held.len(),
        "a shared session ended"
    );
    session.end();
}

impl<S: SessionSql> Session<S> {
    /// Start an operation: false if the session has ended. One dropped
    /// half way before it (the runtime shutting down) left the connection
    /// in an unknown state, and the session ends now.
    fn begin(&mut self) -> bool {
        if self.midway {
            tracing::debug!(target: "distlock",
                backend = self.backend,
                "a shared session's statement was dropped half way"
            );
            self.end();
        }
        self.midway = self.conn.is_some();
        self.midway
    }

    /// Close the connection (the server frees every lock on it) and stop
    /// the session's task.
    fn end(&mut self) {
        self.conn = None;
        self.midway = false;
        self.ended.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Give back every lock whose lease ran out without a renewal (a guard
    /// leaked while the client goes on).
    async fn expire(&mut self) {
        if !self.begin() {
            return;
        }
        let now = Instant::now();
        let expired: Vec<String> = self
            .held
            .iter()
            .filter(|(_, h)| h.until <= now)
            .map(|(name, _)| name.clone())
            .collect();
        for name in expired {
            tracing::debug!(target: "distlock", backend = self.backend, lock = %name, "an unrenewed lock ran out on its shared session");
            self.unlock(&name).await;
            if self.conn.is_none() {
                return;
            }
        }
        self.timer = self.held.values().map(|h| h.until).min();
        self.midway = false;
    }

    /// Unclaimed grants given back, in order, then one statement for all
    /// the renewals.
    async fn run(&mut self, batch: &mut Vec<Command>) {
        let mut renewals = Vec::new();
        let live = self.begin();
        for command in batch.drain(..) {
            match command {
                Command::Unlock { name, id } => {
                    if live && self.holds(&name, id) {
                        self.unlock(&name).await;
                    }
                }
                Command::Renew {
                    name,
                    id,
                    idle,
                    reply,
                } => renewals.push((name, id, idle, reply)),
            }
        }
        // A session that has ended holds nothing: every renewal is a no.
        if renewals.is_empty() || self.conn.is_none() {
            self.midway = false;
            return;
        }
        for (name, id, idle, _) in &renewals {
            if let Some(held) = self.held.get_mut(name).filter(|h| h.id == *id) {
                held.idle = *idle;
            }
        }
        let idle = self.held.values().map(|h| h.idle).max().unwrap_or_default();
        let sql = Arc::clone(&self.sql);
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        self.server_idle = None;
        if let Err(e) = sql.keep(conn, idle).await {
            tracing::debug!(target: "distlock", backend = self.backend, error = %e, "renewing on a shared session failed");
            self.end();
            return;
        }
        self.idle = idle;
        self.server_idle = Some(idle);
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
        self.midway = false;
    }

    /// Whether the session holds `name` under grant `id`.
    fn holds(&self, name: &str, id: u64) -> bool {
        self.held.get(name).is_some_and(|h| h.id == id)
    }

    /// Give `name` back if the session holds it under grant `id`; whether
    /// it did.
    async fn unlock_grant(&mut self, name: &str, id: u64) -> bool {
        if !self.holds(name, id) || !self.begin() {
            return false;
        }
        let ours = self.unlock(name).await;
        self.midway = false;
        ours
    }

    /// One attempt at `name` with the holder `record`: the grant's number
    /// and token if granted.
    async fn lock(
        &mut self,
        name: &str,
        record: &[u8],
        idle: Duration,
    ) -> Result<Option<(u64, u64)>, (LockError, bool)> {
        self.begin_or_ended()?;
        let answer = self.grant(name, record, idle).await;
        self.midway = false;
        answer
    }

    /// One attempt at every name of `names` with the holder `record`:
    /// each grant's number and token, in order, if all were granted.
    async fn lock_set(
        &mut self,
        names: &[String],
        record: &[u8],
        idle: Duration,
    ) -> Result<Option<Vec<(u64, u64)>>, (LockError, bool)> {
        self.begin_or_ended()?;
        let answer = self.grant_set(names, record, idle).await;
        self.midway = false;
        answer
    }

    /// [`begin`](Self::begin), or the error of a session that has ended
    /// (a new session might do better).
    fn begin_or_ended(&mut self) -> Result<(), (LockError, bool)> {
        if self.begin() {
            return Ok(());
        }
        let ended = LockError::Unavailable {
            backend: self.backend,
            reason: "acquiring a lock: the shared session has ended".into(),
            source: None,
        };
        Err((ended, true))
    }

    async fn grant(
        &mut self,
        name: &str,
        record: &[u8],
        idle: Duration,
    ) -> Result<Option<(u64, u64)>, (LockError, bool)> {
        if self.held.contains_key(name) {
            return Ok(None);
        }
        let bound = self.idle.max(idle);
        let sql = Arc::clone(&self.sql);
        let answer = match self.prepare(bound) {
            Some((conn, set_idle)) => sql.try_lock(conn, name, record, set_idle).await,
            None => Err(sqlx::Error::WorkerCrashed),
        };
        let attempt = self.conclude(&[name], bound, answer).await;
        let granted = self.settle(attempt, bound, "acquiring a lock")?;
        Ok(granted.map(|token| (self.hold(name, idle), token)))
    }

    /// As [`grant`](Self::grant), for every name of `names` at once: none
    /// if the session itself holds one of them already.
    async fn grant_set(
        &mut self,
        names: &[String],
        record: &[u8],
        idle: Duration,
    ) -> Result<Option<Vec<(u64, u64)>>, (LockError, bool)> {
        if names.iter().any(|name| self.held.contains_key(name)) {
            return Ok(None);
        }
        let bound = self.idle.max(idle);
        let sql = Arc::clone(&self.sql);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let answer = match self.prepare(bound) {
            Some((conn, set_idle)) => {
                match sql.try_lock_set(conn, &names, record, set_idle).await {
                    Ok(Some(tokens)) if tokens.len() != names.len() => {
                        Err(sqlx::Error::Protocol(format!(
                            "a lock set statement answered {} tokens for {} names",
                            tokens.len(),
                            names.len()
                        )))
                    }
                    answer => answer,
                }
            }
            None => Err(sqlx::Error::WorkerCrashed),
        };
        let attempt = self.conclude(&names, bound, answer).await;
        let granted = self.settle(attempt, bound, "acquiring a lock set")?;
        Ok(granted.map(|tokens| {
            names
                .iter()
                .zip(tokens)
                .map(|(name, token)| (self.hold(name, idle), token))
                .collect()
        }))
    }

    /// What an attempt came to, for its caller: the session's idle bound
    /// is `bound` once the server answered; a broken session ends.
    fn settle<T>(
        &mut self,
        attempt: Attempt<T>,
        bound: Duration,
        what: &str,
    ) -> Result<Option<T>, (LockError, bool)> {
        match attempt {
            Attempt::Granted(granted) => {
                self.idle = bound;
                Ok(Some(granted))
            }
            Attempt::Busy => {
                self.idle = bound;
                Ok(None)
            }
            Attempt::Failed(e) => Err((map_sqlx(self.backend, what, e), false)),
            Attempt::Broken(e) => {
                tracing::debug!(target: "distlock", backend = self.backend, error = %e, "a shared session broke");
                self.end();
                Err((map_sqlx(self.backend, what, e), true))
            }
        }
    }

    /// Record the session's grant of `name` for a lease of `idle`: the
    /// grant's number.
    fn hold(&mut self, name: &str, idle: Duration) -> u64 {
        let until = Instant::now() + idle;
        if self.timer.is_none_or(|t| until < t) {
            self.timer = Some(until);
            self.wake.notify_one();
        }
        let id = self.grants;
        self.grants += 1;
        self.held.insert(name.to_string(), Held { id, until, idle });
        id
    }

    /// The connection for an attempt, and the idle bound it sets if that
    /// changed (`bound`); `None` once the session has ended.
    fn prepare(&mut self, bound: Duration) -> Option<(&mut S::Conn, Option<Duration>)> {
        let set_idle = (self.server_idle != Some(bound)).then_some(bound);
        self.server_idle = None;
        Some((self.conn.as_mut()?, set_idle))
    }

    /// What an attempt's statement at `names` answered: a failed attempt,
    /// which may have locked some of `names` before failing (a token that
    /// could not be drawn), gives them back before answering.
    async fn conclude<T>(
        &mut self,
        names: &[&str],
        bound: Duration,
        answer: Result<Option<T>, sqlx::Error>,
    ) -> Attempt<T> {
        let failure = match answer {
            Ok(answer) => {
                self.server_idle = Some(bound);
                return match answer {
                    Some(granted) => Attempt::Granted(granted),
                    None => Attempt::Busy,
                };
            }
            Err(e) => e,
        };
        if connection_lost(&failure) {
            return Attempt::Broken(failure);
        }
        let sql = Arc::clone(&self.sql);
        let Some(conn) = self.conn.as_mut() else {
            return Attempt::Broken(failure);
        };
        for name in names {
            if sql.unlock(conn, name).await.is_err() {
                return Attempt::Broken(failure);
            }
        }
        Attempt::failure(failure)
    }

    /// Give `name` back if the session holds it: whether it was ours. A
    /// failure leaves the connection's state unknown: the session ends,
    /// and the server frees every lock on it.
    async fn unlock(&mut self, name: &str) -> bool {
        if self.held.remove(name).is_none() {
            return false;
        }
        if self.held.is_empty() {
            self.idle = Duration::ZERO;
        }
        let sql = Arc::clone(&self.sql);
        let Some(conn) = self.conn.as_mut() else {
            return false;
        };
        match sql.unlock(conn, name).await {
            Ok(ours) => ours,
            Err(e) => {
                tracing::debug!(target: "distlock", backend = self.backend, error = %e, "releasing on a shared session failed");
                self.end();
                false
            }
        }
    }
}

/// Sleep until `at`, or for ever.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
