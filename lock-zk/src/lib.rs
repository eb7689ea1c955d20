//! distlock backend for ZooKeeper (3.5 or later).
//!
//! See [`ZkLock`]: an ephemeral-sequential node per acquisition under the
//! lock's node, the lowest sequence holds, a waiter watches only its
//! predecessor, and the node's `czxid` is the fencing token.

use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    Capabilities, CrashRelease, DistributedLock, Fencing, Grade, GuardHandle, LeaseState,
    LockError, LockGuard, LockOptions, LossKind, LossReason, OwnerToken, PendingGrant, Wait,
    Waiting, Watchdog, check_request, wait_deadline,
};
use tokio::time::Instant;
use zookeeper_client::{Acls, Client, CreateMode, SessionState};

const BACKEND: &str = "zookeeper";

const CAPABILITIES: Capabilities = Capabilities {
    backend: BACKEND,
    grade: Grade::Correctness,
    // The node's czxid: the zxid of the transaction that created it, global
    // and strictly increasing across the ensemble's history.
    fencing: Fencing::Safe,
    // The lowest sequence number holds; waiters queue in creation order.
    fair_queue: true,
    crash_release: CrashRelease::Session,
    survives_server_failure: true,
    // A lock acquired without auto-renewal ends when its TTL runs out on
    // the holder's clock (the client deletes its node).
    depends_on_clocks: true,
    waiting: Waiting::Notified,
    max_ttl: Duration::from_secs(30 * 86_400),
    min_lease: lock_core::MIN_TTL,
};

/// Locks on ZooKeeper.
///
/// - **Acquire** creates an `EPHEMERAL_SEQUENTIAL` node `lock-ID-SEQ`
///   under `ROOT/n<encoded name>` (created as needed); `ID` is unique per
///   attempt, so a create whose reply was lost is found again by listing
///   the children instead of being left behind. The lowest sequence holds;
///   a waiter watches only the node just before its own and looks again
///   when it goes. Timeout and cancellation delete the waiter's node.
/// - **Crash release**: the node is ephemeral, so a crashed holder's lock
///   ends with its session. A lock acquired without auto-renewal also ends
///   when its TTL runs out: the client deletes its node then.
/// - **Fencing token**: the node's `czxid`.
/// - **Loss signals**: a disconnection fires `lost()` on every guard of the
///   session as *suspected* (`LossKind::Suspected`): the node may well
///   survive, but the holder cannot know until it reconnects, so it should
///   stop writing. A session expiry (or close) fires it as *confirmed*.
///   Expect a suspected loss when the server the client talks to dies, a
///   leader included, even though the ensemble keeps the session. After an
///   expiry the client opens a new session for later acquisitions.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{DistributedLock, LockOptions};
/// let locks = lock_zk::ZkLock::connect("zk://10.0.0.1:2181,10.0.0.2:2181/myapp").await?;
/// let guard = locks.acquire("nightly-report", &LockOptions::new()).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZkLock {
    inner: Arc<Inner>,
    watchdog: Watchdog,
}

struct Inner {
    /// The current session; replaced by a fresh one after it expires.
    session: Mutex<Arc<Session>>,
    /// Serialises building a fresh session.
    reconnect: tokio::sync::Mutex<()>,
    hosts: String,
    session_timeout: Duration,
    root: String,
    display: String,
}

/// One ZooKeeper session and the guards whose nodes live in it.
struct Session {
    client: Client,
    guards: Mutex<Vec<Weak<LeaseState>>>,
}

impl Session {
    /// Connect, and watch the session's state: a disconnection fires every
    /// guard's `lost()` as *suspected* (the session, and so the node, may
    /// still be alive: the holder cannot know until it reconnects); an
    /// expiry or a close as *confirmed*.
    async fn connect(hosts: &str, timeout: Duration) -> Result<Arc<Self>, LockError> {
        let connect = Client::connector()
            .with_session_timeout(timeout)
            .with_connection_timeout(Duration::from_secs(2))
            .connect(hosts);
        let client = tokio::time::timeout(timeout + Duration::from_secs(2), connect)
            .await
            .map_err(|_| LockError::Unavailable {
                backend: BACKEND,
                reason: format!("connecting to {hosts}: no answer in time"),
                source: None,
            })?
            .map_err(|e| unavailable(&format!("connecting to {hosts}"), e))?;
        let session = Arc::new(Session {
            client,
            guards: Mutex::new(Vec::new()),
        });
        let mut states = session.client.state_watcher();
        let watched = Arc::downgrade(&session);
        tokio::spawn(async move {
            loop {
                let state = states.changed().await;
                let Some(session) = watched.upgrade() else {
                    return;
                };
                let (kind, detail) = match state {
                    SessionState::Disconnected => {
                        (LossKind::Suspected, "disconnected from ZooKeeper")
                    }
                    SessionState::Expired => (LossKind::Confirmed, "ZooKeeper session expired"),
                    SessionState::Closed | SessionState::AuthFailed => {
                        (LossKind::Confirmed, "ZooKeeper session closed")
                    }
                    _ => continue,
                };
                tracing::warn!(
                    ?state,
                    "zookeeper session state; its locks are {kind:?} lost"
                );
                session.lose_all(kind, detail);
                if state.is_terminated() {
                    return;
                }
            }
        });
        Ok(session)
    }

    fn guards(&self) -> std::sync::MutexGuard<'_, Vec<Weak<LeaseState>>> {
        self.guards.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn attach(&self, lease: &Arc<LeaseState>) {
        let mut guards = self.guards();
        guards.retain(|g| g.strong_count() > 0);
        guards.push(Arc::downgrade(lease));
    }

    fn lose_all(&self, kind: LossKind, detail: &str) {
        for lease in self.guards().iter().filter_map(Weak::upgrade) {
            lease.mark_lost(LossReason::ConnectionLost {
                kind,
                detail: detail.to_string(),
            });
        }
    }
}

fn unavailable(doing: &str, e: zookeeper_client::Error) -> LockError {
    use zookeeper_client::Error as E;
    match e {
        E::ConnectionLoss | E::SessionExpired | E::NoHosts | E::Timeout | E::ClientClosed => {
            LockError::unavailable(BACKEND, doing.to_string(), e)
        }
        other => LockError::backend(BACKEND, doing.to_string(), other),
    }
}

/// The lock node of `name` under `root`: `n` and the name with every byte
/// outside `[A-Za-z0-9_-]` written as `%XX`, so `/`, `.`, `..`, control
/// characters and any UTF-8 are safe and distinct path components.
fn lock_node(root: &str, name: &str) -> String {
    let mut out = format!("{root}/n");
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The sequence number at the end of a child's name.
fn sequence(child: &str) -> Option<i64> {
    child.rsplit('-').next()?.parse().ok()
}

impl ZkLock {
    /// Connect to `zk://host:port[,host:port…][/root][?session_timeout_ms=…]`
    /// (root `/distlock` by default; session timeout 10 s).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let invalid = |reason: &str| LockError::InvalidUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let rest = url
            .strip_prefix("zk://")
            .ok_or_else(|| invalid("expected a zk:// URL"))?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (hosts, root) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let root = if root.is_empty() { "/distlock" } else { root };
        if hosts.is_empty()
            || hosts.split(',').any(|h| {
                h.rsplit_once(':')
                    .is_none_or(|(_, p)| p.parse::<u16>().is_err())
            })
        {
            return Err(invalid("members must be host:port"));
        }
        if root
            .split('/')
            .skip(1)
            .any(|c| c.is_empty() || c == "." || c == "..")
            || !root.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(invalid("the root must be a plain absolute path"));
        }
        let mut session_timeout = Duration::from_secs(10);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("session_timeout_ms", v)) => {
                    session_timeout = Duration::from_millis(
                        v.parse().ok().filter(|&ms: &u64| ms > 0).ok_or_else(|| {
                            invalid("`session_timeout_ms` must be a positive number")
                        })?,
                    )
                }
                _ => return Err(invalid("unknown option (known: session_timeout_ms)")),
            }
        }
        let session = Session::connect(hosts, session_timeout).await?;
        Ok(ZkLock {
            inner: Arc::new(Inner {
                session: Mutex::new(session),
                reconnect: tokio::sync::Mutex::new(()),
                hosts: hosts.to_string(),
                session_timeout,
                root: root.to_string(),
                display: format!("zk://{hosts}{root}"),
            }),
            watchdog: Watchdog::new(),
        })
    }

    /// The current session, or a fresh one if it expired or was closed:
    /// the client recovers for later acquisitions without being rebuilt.
    async fn session(&self) -> Result<Arc<Session>, LockError> {
        let current = self.current();
        if !current.client.state().is_terminated() {
            return Ok(current);
        }
        let _one = self.inner.reconnect.lock().await;
        let current = self.current();
        if !current.client.state().is_terminated() {
            return Ok(current);
        }
        tracing::info!(server = %self.inner.display, "zookeeper session ended; starting a new one");
        let fresh = Session::connect(&self.inner.hosts, self.inner.session_timeout).await?;
        *self.inner.session.lock().unwrap_or_else(|e| e.into_inner()) = Arc::clone(&fresh);
        Ok(fresh)
    }

    fn current(&self) -> Arc<Session> {
        Arc::clone(&self.inner.session.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Fault injection (and the operator's force-unlock): delete the holder's
    /// node of `name`. The holder's next renewal fails and its `lost()`
    /// fires. Returns whether there was a holder.
    pub async fn take_away(&self, name: &str) -> Result<bool, LockError> {
        let dir = lock_node(&self.inner.root, name);
        let session = self.session().await?;
        let Some(first) = Self::queue(&session.client, &dir).await?.into_iter().next() else {
            return Ok(false);
        };
        match session.client.delete(&format!("{dir}/{first}"), None).await {
            Ok(()) => Ok(true),
            Err(zookeeper_client::Error::NoNode) => Ok(false),
            Err(e) => Err(unavailable("deleting the holder's node", e)),
        }
    }

    /// The children of `dir` in sequence order (none if `dir` is missing).
    async fn queue(client: &Client, dir: &str) -> Result<Vec<String>, LockError> {
        let mut children = match client.list_children(dir).await {
            Ok(c) => c,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(e) => return Err(unavailable("listing the queue", e)),
        };
        children.retain(|c| c.starts_with("lock-") && sequence(c).is_some());
        children.sort_by_key(|c| sequence(c));
        Ok(children)
    }

    /// Create our node; if the reply is lost, find it again by its id.
    async fn enqueue(client: &Client, dir: &str, id: &str) -> Result<(String, i64), LockError> {
        let acls = Acls::anyone_all();
        let prefix = format!("{dir}/lock-{id}-");
        let created = loop {
            match client
                .create(
                    &prefix,
                    b"",
                    &CreateMode::EphemeralSequential.with_acls(acls),
                )
                .await
            {
                Ok(done) => break done,
                Err(zookeeper_client::Error::NoNode) => {
                    match client
                        .mkdir(dir, &CreateMode::Persistent.with_acls(acls))
                        .await
                    {
                        Ok(()) | Err(zookeeper_client::Error::NodeExists) => continue,
                        Err(e) => return Err(unavailable("creating the lock node", e)),
                    }
                }
                Err(zookeeper_client::Error::ConnectionLoss) => {
                    // The create may have landed: look for our id.
                    if let Some(mine) = Self::queue(client, dir)
                        .await?
                        .into_iter()
                        .find(|c| c.contains(id))
                    {
                        let path = format!("{dir}/{mine}");
                        let stat = client
                            .check_stat(&path)
                            .await
                            .map_err(|e| unavailable("reading our node", e))?;
                        if let Some(stat) = stat {
                            return Ok((path, stat.czxid));
                        }
                    }
                }
                Err(e) => return Err(unavailable("creating our node", e)),
            }
        };
        let (stat, seq) = created;
        Ok((format!("{prefix}{seq}"), stat.czxid))
    }

    async fn acquire_inner(
        &self,
        name: &str,
        opts: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<LockGuard>, LockError> {
        let dir = lock_node(&self.inner.root, name);
        let id = OwnerToken::random().to_hex();
        let id = &id[..16];
        let sent_at = Instant::now();
        let session = self.session().await?;
        let client = &session.client;
        let (path, czxid) = Self::enqueue(client, &dir, id).await?;
        let handle = Arc::new(ZkHandle {
            session: Arc::clone(&session),
            path,
        });
        // Leaving without the lock (timeout, error, cancellation) deletes
        // our node.
        let pending = PendingGrant::new(Arc::clone(&handle) as Arc<dyn GuardHandle>);
        let ours = handle
            .path
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        loop {
            let queue = Self::queue(client, &dir).await?;
            let Some(at) = queue.iter().position(|c| *c == ours) else {
                // Our node is gone (session expired while we waited).
                return Err(LockError::Lost {
                    name: name.to_string(),
                    reason: lock_core::LossReason::TakenOver,
                });
            };
            if at == 0 {
                pending.disarm();
                return Ok(Some(self.guard(name, handle, czxid, sent_at, opts)));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                let _ = pending.disarm().release().await;
                return Ok(None);
            }
            let pred = format!("{dir}/{}", queue[at - 1]);
            let (stat, watcher) = client
                .check_and_watch_stat(&pred)
                .await
                .map_err(|e| unavailable("watching the predecessor", e))?;
            if stat.is_none() {
                continue;
            }
            let timer = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = watcher.changed() => {}
                _ = timer => {}
            }
        }
    }

    fn guard(
        &self,
        name: &str,
        handle: Arc<ZkHandle>,
        czxid: i64,
        sent_at: Instant,
        opts: &LockOptions,
    ) -> LockGuard {
        let lease = Arc::new(LeaseState::lease(sent_at, opts.ttl));
        handle.session.attach(&lease);
        if !opts.auto_renew {
            // Never before the holder's own deadline; and, as a server-side
            // lease would, not before the TTL counted from the grant.
            let grace = lock_core::drift_allowance(opts.ttl) + sent_at.elapsed();
            expire_at_deadline(Arc::downgrade(&handle), Arc::clone(&lease), grace);
        }
        let guard = LockGuard::new(name, u64::try_from(czxid).ok(), CAPABILITIES, lease, handle);
        if opts.auto_renew {
            guard.renewed_by(&self.watchdog)
        } else {
            guard
        }
    }
}

/// A lock without auto-renewal ends `grace` after its validity deadline
/// (unless an `extend` moved it): delete its node then, as a lease would
/// expire.
fn expire_at_deadline(handle: Weak<ZkHandle>, lease: Arc<LeaseState>, grace: Duration) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        loop {
            let Some(deadline) = lease.deadline() else {
                return;
            };
            tokio::time::sleep_until(deadline + grace).await;
            if lease.deadline().is_some_and(|d| d + grace > Instant::now()) {
                continue; // extended
            }
            if let Some(handle) = handle.upgrade() {
                let _ = handle.session.client.delete(&handle.path, None).await;
            }
            return;
        }
    });
}

#[async_trait]
impl DistributedLock for ZkLock {
    async fn try_acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        check_request(name, opts, &CAPABILITIES)?;
        self.acquire_inner(name, opts, Some(Instant::now())).await
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        check_request(name, opts, &CAPABILITIES)?;
        let start = Instant::now();
        let deadline = match opts.wait {
            Wait::No => Some(start),
            w => wait_deadline(start, w),
        };
        self.acquire_inner(name, opts, deadline)
            .await?
            .ok_or_else(|| LockError::Timeout {
                name: name.to_string(),
                waited: start.elapsed(),
            })
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }
}

impl fmt::Debug for ZkLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLock")
            .field("server", &self.inner.display)
            .finish_non_exhaustive()
    }
}

struct ZkHandle {
    /// The session our node lives in.
    session: Arc<Session>,
    path: String,
}

#[async_trait]
impl GuardHandle for ZkHandle {
    async fn release(&self) -> Result<bool, LockError> {
        use zookeeper_client::Error as E;
        match self.session.client.delete(&self.path, None).await {
            Ok(()) => Ok(true),
            // Gone, or gone with its session.
            Err(E::NoNode | E::SessionExpired | E::ClientClosed) => Ok(false),
            Err(e) => Err(unavailable("releasing a lock", e)),
        }
    }

    async fn extend(&self, _ttl: Duration) -> Result<bool, LockError> {
        use zookeeper_client::Error as E;
        match self.session.client.check_stat(&self.path).await {
            Ok(stat) => Ok(stat.is_some()),
            Err(E::SessionExpired | E::ClientClosed) => Ok(false),
            Err(e) => Err(unavailable("checking a lock node", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_safe_distinct_components() {
        assert_eq!(lock_node("/r", "a/b"), "/r/na%2Fb");
        assert_eq!(lock_node("/r", ".."), "/r/n%2E%2E");
        assert_ne!(lock_node("/r", "%2F"), lock_node("/r", "/"));
        assert_eq!(sequence("lock-abc-0000000042"), Some(42));
    }
}
