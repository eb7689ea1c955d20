//! [`ZkLock`]: the lock's client, its sessions, and the `RawLock`
//! implementation (join the queue, wait for the predecessor, grant).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use lock_core::raw::{
    GuardHandle, HolderRecord, Kind, LeaseState, OwnerToken, PendingGrant, RawGuard, RawLock,
    Request, Retry, Unrenewed, Watchdog, confirmed_lease_start, validate_name,
};
use lock_core::{
    Capabilities, Changes, CrashRelease, Fencing, Grade, LockError, LockGuard, LockInfo,
    LockOptions, RwLockCapabilities, RwLockInfo, SemaphoreCapabilities, SemaphoreInfo, Waiting,
};
use tokio::time::Instant;

use crate::config::{self, ZkConfig, ZkUrl};
use crate::error::zk_error;
use crate::handle::ZkHandle;
use crate::path::lock_node;
use crate::permits::MAX_LIMIT;
use crate::queue::{await_turn, catch_up, enqueue, queue, synced_queue};
use crate::session::{Session, retrying, retrying_resendable};

/// The backend's name in errors and capabilities.
pub(crate) const BACKEND: &str = "zookeeper";

/// What ZooKeeper locks prove. They depend on clocks (as `new` says): a
/// lock acquired without auto-renewal ends when its TTL runs out on the
/// holder's clock (the client deletes its node).
const CAPABILITIES: Capabilities = Capabilities::new(BACKEND, Grade::Correctness)
    // The node's czxid: the zxid of the transaction that created it, global
    // and strictly increasing across the ensemble's history. Not the
    // sequence number: it counts per lock node, and the lock node (a
    // container) is removed when empty and made again from zero.
    .with_fencing(Fencing::Safe)
    // The lowest sequence number holds; waiters queue in creation order.
    .with_fair_queue(true)
    .with_crash_release(CrashRelease::Session)
    .with_survives_server_failure(true)
    .with_waiting(Waiting::Notified)
    // The holder record is the node's data.
    .with_holder(true)
    // Watches on the queue and the first node's data (`observe.rs`).
    .with_observers(Waiting::Notified)
    // A queue of sequential nodes, the first `limit` holding slot nodes;
    // waiters watch the queue's children.
    .with_semaphore(Some(
        SemaphoreCapabilities::new(MAX_LIMIT)
            .with_fair_queue(true)
            .with_waiting(Waiting::Notified),
    ))
    // `r`/`w` sequential nodes: a writer waits for every node before it,
    // a reader for the writers'; each watches one node.
    .with_rw_lock(Some(
        RwLockCapabilities::new()
            .with_writer_preference(true)
            .with_fair_queue(true)
            .with_waiting(Waiting::Notified),
    ));

/// Locks on ZooKeeper.
///
/// - **Acquire** creates an `EPHEMERAL_SEQUENTIAL` node `lock-ID-SEQ`
///   under `ROOT/n<encoded name>` (created as needed); `ID` is unique per
///   attempt, so a create whose reply was lost is found again by listing
///   the children instead of being left behind. The lowest sequence holds;
///   a waiter watches only the node just before its own and looks again
///   when it goes. Timeout and cancellation delete the waiter's node, even
///   one whose create was still unanswered. The lock node is a *container*:
///   the server removes it once its last child is gone.
/// - **Connection drops** within the session: requests lost with the
///   connection are sent again once the client reconnects; a lost create
///   is looked up by its id first, and a lost delete that finds the node
///   gone counts as done. A waiter whose session expires queues again on a
///   fresh session while its wait allows; a fresh session that cannot
///   connect at once (the server just back, the network still cut) is
///   started again with the request's backoff, within the wait.
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
    /// Where a fresh session comes from: the URL, or nowhere (the
    /// application's client).
    url: Option<Arc<ZkUrl>>,
    /// The path under which lock nodes live.
    root: String,
    /// The URL without credentials.
    display: String,
}

/// How many sessions one waiting acquisition may go through: a waiter whose
/// session expires joins the queue again on a fresh one.
const SESSIONS_PER_ACQUIRE: u32 = 3;

/// How many times one acquisition tries to start a fresh session whose
/// connection fails for a transient reason (the server just back, a
/// connect that times out), the request's backoff between tries; the
/// wait's deadline bounds the tries too.
const STARTS_PER_SESSION: u32 = 6;

impl ZkLock {
    /// Connect to `zk://[user:password@]host:port[,host:port…][/root][?session_timeout_ms=…]`.
    ///
    /// - `root`: the path under which lock nodes live, `/distlock` by
    ///   default (created as needed).
    /// - `session_timeout_ms`: asked of the server, 10 000 by default; the
    ///   server clamps it to its `minSessionTimeout`..`maxSessionTimeout`.
    /// - `user:password` (`%`-escaped): credentials for ZooKeeper's `digest`
    ///   scheme. The nodes we create then carry the ACL `auth` (creator
    ///   only), so only clients with the same credentials can read, join or
    ///   delete them. Without credentials, nodes are open to anyone.
    ///
    /// The password never appears in `Debug`, logs or errors.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let url = ZkUrl::parse(url)?;
        let session = Session::connect(&url).await?;
        Ok(ZkLock {
            inner: Arc::new(Inner {
                session: Mutex::new(session),
                reconnect: tokio::sync::Mutex::new(()),
                display: url.display(),
                root: url.root.clone(),
                url: Some(Arc::new(url)),
            }),
            watchdog: Watchdog::new(),
        })
    }

    /// A lock on a client the application already has (its own ensemble
    /// string, chroot, credentials, TLS and session timeout), with
    /// `config` in place of a URL's path:
    /// `ZkLock::with_client(client, ZkConfig::default())`.
    ///
    /// The lock lives in the client's session. A ZooKeeper client cannot
    /// start a second session once its own has expired or been closed, so
    /// after that every acquisition answers [`LockError::Unavailable`]
    /// (a lock built from a URL opens a fresh session instead): watch the
    /// client's state and build a new lock on a new client. Guards held in
    /// the session see its end as a confirmed loss, as with a URL.
    /// A root that is not a plain absolute path is
    /// [`LockError::InvalidOptions`].
    pub async fn with_client(
        client: zookeeper_client::Client,
        config: ZkConfig,
    ) -> Result<Self, LockError> {
        let root = config.root.trim_end_matches('/');
        if !config::plain_root(root) {
            return Err(LockError::invalid_options(format!(
                "the root must be a plain absolute path, got {:?}",
                config.root
            )));
        }
        let acls = if config.creator_only {
            zookeeper_client::Acls::creator_all()
        } else {
            zookeeper_client::Acls::anyone_all()
        };
        Ok(ZkLock {
            inner: Arc::new(Inner {
                session: Mutex::new(Session::watch(client, acls)),
                reconnect: tokio::sync::Mutex::new(()),
                display: "zookeeper (the application's client)".to_string(),
                root: root.to_string(),
                url: None,
            }),
            watchdog: Watchdog::new(),
        })
    }

    /// The current session, or a fresh one if it expired or was closed:
    /// the client recovers for later acquisitions without being rebuilt.
    async fn session(&self) -> Result<Arc<Session>, LockError> {
        let current = self.current();
        if !current.is_terminated() {
            return Ok(current);
        }
        let _one = self.inner.reconnect.lock().await;
        let current = self.current();
        if !current.is_terminated() {
            return Ok(current);
        }
        let Some(url) = &self.inner.url else {
            return Err(LockError::Unavailable {
                backend: BACKEND,
                reason: "the application's ZooKeeper session has ended; build the lock on a \
                         new client"
                    .into(),
                source: None,
            });
        };
        tracing::info!(target: "distlock", server = %self.inner.display, "zookeeper session ended; starting a new one");
        let fresh = Session::connect(url).await?;
        *self.inner.session.lock().unwrap_or_else(|e| e.into_inner()) = Arc::clone(&fresh);
        Ok(fresh)
    }

    /// [`session`](Self::session) for an acquisition: a transient failure
    /// to start a fresh session is tried again, with the request's backoff,
    /// while the wait (until `deadline`) allows, at most
    /// [`STARTS_PER_SESSION`] times.
    async fn session_within(
        &self,
        opts: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Arc<Session>, LockError> {
        let retry = Retry::with_backoff(opts.backoff)
            .attempts(STARTS_PER_SESSION)
            .deadline(deadline);
        let restartable = |e: &LockError| e.is_transient() && self.inner.url.is_some();
        retry
            .run("starting a zookeeper session", restartable, |_| {
                self.session()
            })
            .await
    }

    /// The path under which lock and semaphore nodes live.
    pub(crate) fn root(&self) -> &str {
        &self.inner.root
    }

    /// Where a fresh session comes from (`None`: the application's client).
    pub(crate) fn url(&self) -> Option<Arc<ZkUrl>> {
        self.inner.url.clone()
    }

    fn current(&self) -> Arc<Session> {
        Arc::clone(&self.inner.session.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// How many acquisitions of `name` wait behind its holder: the nodes
    /// in its queue after the first, read once this client's member has
    /// caught up with the leader.
    pub async fn queued(&self, name: &str) -> Result<usize, LockError> {
        let dir = lock_node(&self.inner.root, name);
        let session = self.session().await?;
        Ok(synced_queue(&session.client, &dir)
            .await?
            .len()
            .saturating_sub(1))
    }

    /// Join the queue and wait; a waiter whose session ends meanwhile joins
    /// again on a fresh one, at most [`SESSIONS_PER_ACQUIRE`] times in all
    /// and not past the wait's deadline.
    async fn acquire_inner(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        let (opts, deadline) = (req.opts, req.deadline);
        let dir = lock_node(&self.inner.root, req.name);
        // Whether the last attempt failed because its session ended.
        let session_ended = AtomicBool::new(false);
        let (ended, dir) = (&session_ended, dir.as_str());
        let session_gone = |_: &LockError| ended.load(Ordering::Relaxed);
        let join = move |sent| async move {
            if sent > 0 {
                tracing::info!(
                    target: "distlock",
                    name = req.name,
                    "zookeeper session ended while waiting; queueing again on a new one"
                );
            }
            ended.store(false, Ordering::Relaxed);
            let session = self.session_within(opts, deadline).await?;
            session_bounds_ttl(&session, opts)?;
            let done = match req.kind() {
                Kind::Rw(access) => self.attempt_rw(&session, req, access).await,
                Kind::Permit(limit) => self.attempt_permit(&session, req, limit).await,
                _ => self.attempt(&session, dir, req).await,
            };
            ended.store(done.is_err() && session.is_terminated(), Ordering::Relaxed);
            done
        };
        Retry::immediately()
            .attempts(SESSIONS_PER_ACQUIRE)
            .deadline(deadline)
            .run("waiting for a zookeeper lock", session_gone, join)
            .await
    }

    /// Join the queue in `session` and wait (until `deadline`) to be first.
    async fn attempt(
        &self,
        session: &Arc<Session>,
        dir: &str,
        req: Request<'_>,
    ) -> Result<Option<LockGuard>, LockError> {
        let (name, opts) = (req.name, req.opts);
        let id = OwnerToken::random().to_hex();
        let id = &id[..16];
        let sent_at = Instant::now();
        let client = &session.client;
        let record = opts.holder_record();
        let ours = enqueue(session, dir, id, record.as_bytes()).await?;
        let handle = Arc::new(ZkHandle::new(
            Arc::clone(session),
            ours.path,
            self.inner.url.clone(),
            record,
        ));
        // Leaving without the lock (timeout, error, cancellation) deletes
        // our node.
        let pending = PendingGrant::new(Arc::clone(&handle) as Arc<dyn GuardHandle>);
        let child = handle.path.rsplit('/').next().unwrap_or_default();
        let holds = await_turn(client, dir, child, &req, false, |ahead| {
            Ok(Kind::Lock.turn(&vec![Kind::Lock; ahead.len()]))
        })
        .await?;
        if holds.is_none() {
            let _ = pending.give_back().await;
            return Ok(None);
        }
        self.guard(name, session, pending, ours.czxid, sent_at, opts)
            .await
            .map(Some)
    }

    /// Wrap our first node in a guard. Its lease counts from a request that
    /// bounds the grant: the create, or, after a wait, a check that the
    /// node is still there; and it never outlasts the session that
    /// carries the node, counted from that request.
    pub(crate) async fn guard(
        &self,
        name: &str,
        session: &Session,
        pending: PendingGrant,
        czxid: i64,
        sent_at: Instant,
        opts: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        // The lease is the TTL bounded by the session: a wait long for
        // that bound (not only for the TTL) needs the grant confirmed, or
        // a lease counted from the create would be spent on arrival.
        let session_timeout = session.client.session_timeout();
        let lease_length = opts.ttl.min(session_timeout);
        let start = confirmed_lease_start(&pending, sent_at, lease_length, BACKEND, name).await?;
        let lease = Arc::new(LeaseState::granted(start, opts).bounded_by(session_timeout));
        session.attach(&lease);
        let margin = lease.safety_margin();
        let guard = LockGuard::new(
            name,
            u64::try_from(czxid).ok(),
            CAPABILITIES,
            lease,
            pending.disarm(),
        );
        // Unrenewed, the node would outlive the TTL with the session:
        // deleted then. Never before the holder's own deadline; and, as a
        // server-side lease would, not before the TTL counted from the
        // grant.
        let grace = margin + start.elapsed();
        Ok(guard.kept_by(&self.watchdog, opts, Unrenewed::ReleasedAfter(grace)))
    }
}

/// Without auto-renewal nothing confirms the session while the lock is
/// held, so the holder could not know its node outlived the session's
/// timeout: a longer TTL is refused. (With auto-renewal the deadline is
/// bounded by the session and renewed within it.)
fn session_bounds_ttl(session: &Session, opts: &LockOptions) -> Result<(), LockError> {
    let timeout = session.client.session_timeout();
    if opts.auto_renew || opts.ttl <= timeout {
        return Ok(());
    }
    Err(LockError::invalid_options(format!(
        "a ZooKeeper lock without auto-renewal cannot outlive its session: ttl {:?} exceeds \
         the negotiated session timeout {timeout:?} (enable auto_renew or raise session_timeout_ms)",
        opts.ttl
    )))
}

#[async_trait]
impl RawLock for ZkLock {
    async fn attempt_once(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        let once = Request {
            deadline: Some(req.start),
            ..req
        };
        self.acquire_inner(once).await
    }

    async fn wait(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        self.acquire_inner(req).await
    }

    fn raw_capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    /// The reader-writer lock's queue and counter.
    async fn raw_inspect_rw(&self, name: &str) -> Result<RwLockInfo, LockError> {
        let session = self.session().await?;
        self.inspect_rw_lock(&session, name).await
    }

    /// The slot nodes of `name`'s permits and its queue's length.
    async fn raw_inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        validate_name(name)?;
        let session = self.session().await?;
        self.inspect_permits(&session, name).await
    }

    /// The first node of the lock's queue (by sequence) is the holder: its
    /// `czxid` is the token; the nodes after it wait. The lock lives as long
    /// as the holder's session, so no lease time is reported. The queue is
    /// read once this client's member has caught up with the leader (a
    /// follower may not have applied another client's grant yet).
    async fn raw_inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        validate_name(name)?;
        let dir = lock_node(&self.inner.root, name);
        let session = self.session().await?;
        // One catch-up serves every listing below. A holder that goes
        // between the listing and the read is looked for again.
        catch_up(&session.client, &dir).await?;
        for _ in 0..3 {
            let nodes = queue(&session.client, &dir).await?;
            let Some(first) = nodes.first() else {
                return Ok(LockInfo::free().with_waiters(Some(0)));
            };
            let path = format!("{dir}/{first}");
            let read = match retrying_resendable(|| session.client.get_data(&path)).await {
                Ok(read) => Some(read),
                Err(zookeeper_client::Error::NoNode) => None,
                Err(e) => return Err(zk_error("reading the holder's node", e)),
            };
            if let Some((data, stat)) = read {
                let holder = match data.as_slice() {
                    [] => None,
                    bytes => Some(HolderRecord::decode_for(BACKEND, name, bytes)?),
                };
                return Ok(LockInfo::held()
                    .with_fencing_token(u64::try_from(stat.czxid).ok())
                    .with_waiters(Some(nodes.len() - 1))
                    .with_holder(holder));
            }
        }
        Err(LockError::Backend {
            backend: BACKEND,
            reason: format!("lock `{name}` changed hands three times while being read"),
            source: None,
        })
    }

    /// Watches on the lock's queue and on its first node's data
    /// ([`crate::observe`]), on this client's session.
    async fn raw_changes(&self, name: &str) -> Result<Option<Changes>, LockError> {
        validate_name(name)?;
        let dir = lock_node(&self.inner.root, name);
        let session = self.session().await?;
        crate::observe::changes(session, dir).await.map(Some)
    }

    /// Delete the holder's node of `name`: the next waiter (watching it)
    /// is notified at once, and the holder's `lost()` fires when its
    /// client sees the node gone (its next renewal at the latest). The
    /// holder is looked up once this client's member has caught up with
    /// the leader.
    async fn raw_force_release(&self, name: &str) -> Result<bool, LockError> {
        validate_name(name)?;
        let dir = lock_node(&self.inner.root, name);
        let session = self.session().await?;
        let Some(first) = synced_queue(&session.client, &dir)
            .await?
            .into_iter()
            .next()
        else {
            return Ok(false);
        };
        let path = format!("{dir}/{first}");
        match retrying(|| session.client.delete(&path, None)).await {
            Ok(()) => Ok(true),
            Err(zookeeper_client::Error::NoNode) => Ok(false),
            Err(e) => Err(zk_error("deleting the holder's node", e)),
        }
    }
}

impl fmt::Debug for ZkLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLock")
            .field("server", &self.inner.display)
            .finish_non_exhaustive()
    }
}
