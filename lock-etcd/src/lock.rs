//! `EtcdLock`: the client and the acquire path (one transaction, then a
//! watch on the predecessor only).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, WatchResponse, WatchStream,
};
use lock_core::raw::{
    GuardHandle, HolderRecord, Kind, LeaseState, OwnerToken, PendingGrant, RawGuard, RawLock,
    Request, Retry, Unrenewed, Watchdog, validate_name,
};
use lock_core::{
    Capabilities, Changes, CrashRelease, Fencing, Grade, LockError, LockGuard, LockInfo,
    LockOptions, RwLockCapabilities, RwLockInfo, SemaphoreCapabilities, SemaphoreInfo, Waiting,
};
use tokio::time::Instant;

use crate::config::{EtcdConfig, parse_url};
use crate::error::{BACKEND, map_etcd};
use crate::handle::{EtcdHandle, Lease};
use crate::keys;
use crate::permits::MAX_LIMIT;
use crate::queue::{self, Place, Turn};
use crate::requests;
use crate::session::Session;
use crate::sets::MAX_ATOMIC_SET;

/// What etcd locks prove. They depend on clocks (as `new` says): the
/// lease runs on the leader's clock, the guard's validity is the local
/// clock's view of it.
fn capabilities(min_lease: Duration) -> Capabilities {
    Capabilities::new(BACKEND, Grade::Correctness)
        // The key's create_revision: global, strictly increasing, kept by
        // the Raft log of a majority of members.
        .with_fencing(Fencing::Safe)
        // Waiters are ordered by the revision of their key.
        .with_fair_queue(true)
        .with_crash_release(CrashRelease::Session)
        .with_survives_server_failure(true)
        .with_waiting(Waiting::Notified)
        .with_min_lease(min_lease)
        // The holder record is the key's value.
        .with_holder(true)
        // A lease of the lock's own carries the delay (keep-alives renew
        // it whole); a lease cannot be shortened, so no hold.
        .with_lock_delay(true)
        .with_observers(Waiting::Notified)
        // One transaction: every name's directory compared empty, a key
        // put in each.
        .with_atomic_sets(MAX_ATOMIC_SET)
        // A queue of keys by create revision, the first `limit` holding
        // slot keys; waiters watch the queue's deletions.
        .with_semaphore(Some(
            SemaphoreCapabilities::new(MAX_LIMIT)
                .with_fair_queue(true)
                .with_waiting(Waiting::Notified),
        ))
        // `r`/`w` keys by create revision: a writer waits for every key
        // before it, a reader for the writers' keys; each watches one key.
        .with_rw_lock(Some(
            RwLockCapabilities::new()
                .with_writer_preference(true)
                .with_fair_queue(true)
                .with_waiting(Waiting::Notified),
        ))
}

/// Locks on etcd (v3 API, 3.4 or later).
///
/// - **Session lease**: one lease per client, kept alive at about TTL/3
///   by one background task. Locks acquired with the session's TTL and
///   auto-renewal are attached to it, so a crashed process frees all its
///   locks when the lease runs out. Other TTLs, or `auto_renew(false)`, get
///   a lease of their own (renewed by the [`Watchdog`] if asked).
/// - **Acquire** is one transaction: put `PREFIX/NAME/LEASE-OWNER` if
///   absent and read the first key under `PREFIX/NAME/` by create revision.
///   The lowest create revision holds the lock. A waiter watches only the
///   key just before its own (no herd, no polling) from the revision it
///   read plus one, and, when that key is the first, its own key too, in
///   the same watcher. When the first key goes with its own still there
///   (events come in revision order), it holds the lock; after any other
///   deletion it reads its place as of that deletion's revision, checking
///   its own key was still there. Either way a waiter whose lease expired
///   while queued never believes it holds the lock.
/// - **Fencing token**: the key's create revision, global and strictly
///   increasing. [`EtcdLock::fencing_compare`] gives the transaction
///   comparison that guards your own etcd writes with the lock.
/// - **Release** deletes the key, a plain delete as the Lock RPC's unlock:
///   the key's name holds the acquisition's random owner token and only
///   that acquisition ever writes it, so a key of that name is ours, and
///   the count deleted says whether we still held it.
///
/// TTLs are whole seconds on etcd, and the server grants at least its own
/// minimum (`capabilities().min_lease`); shorter TTLs are rounded up.
/// etcd keeps every revision until compacted: enable auto-compaction on
/// the server (e.g. `--auto-compaction-mode=revision
/// --auto-compaction-retention=10000`), or it slows down as history grows.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{DistributedLock, LockOptions};
/// let locks = lock_etcd::EtcdLock::connect("etcd://10.0.0.1:2379,10.0.0.2:2379/myapp").await?;
/// let guard = locks.acquire("nightly-report", &LockOptions::new()).await?;
/// let token = guard.fencing_token(); // create revision of our key
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdLock {
    pub(crate) inner: Arc<Inner>,
    pub(crate) watchdog: Watchdog,
}

/// How a client built from a URL connects again: for a release at
/// shutdown, on a runtime of its own. Holds the credentials: never shown.
pub(crate) struct Reconnect {
    endpoints: Vec<String>,
    options: ConnectOptions,
    /// A connection within this, or `Unavailable`.
    limit: Duration,
}

impl Reconnect {
    /// A new client, on the current runtime.
    pub(crate) async fn connect(&self, display: &str) -> Result<Client, LockError> {
        let limit = self.limit;
        let connect = Client::connect(&self.endpoints, Some(self.options.clone()));
        tokio::time::timeout(limit, connect)
            .await
            .map_err(|_| LockError::Unavailable {
                backend: BACKEND,
                reason: format!("connecting to {display}: no answer within {limit:?}"),
                source: None,
            })?
            .map_err(|e| map_etcd(&format!("connecting to {display}"), e))
    }
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) config: EtcdConfig,
    pub(crate) display: String,
    pub(crate) caps: Capabilities,
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    /// The key of every lock held through this client, by (name, token).
    pub(crate) held: Mutex<HashMap<(String, i64), String>>,
    /// How to connect again, for a client built from a URL (`None` for
    /// the application's own client).
    pub(crate) reconnect: Option<Reconnect>,
}

impl EtcdLock {
    /// Connect to `etcd://[user:pass@]host:port[,host:port…][/prefix]` (or
    /// `etcd+https://` for TLS) with options `session_ttl`,
    /// `connect_timeout` and `request_timeout` (durations with their unit,
    /// `10s`, `500ms`; the older `session_ttl_s` and `*_ms` names too).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let parsed = parse_url(url)?;
        let config = parsed.config;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_timeout(config.request_timeout)
            .with_keep_alive(Duration::from_secs(5), config.request_timeout)
            .with_require_leader(true);
        if let Some((user, password)) = parsed.user {
            options = options.with_user(user, password);
        }
        if parsed.tls {
            options = options.with_tls(etcd_client::TlsOptions::new());
        }
        let limit = config.connect_timeout + config.request_timeout;
        let reconnect = Reconnect {
            endpoints: parsed.endpoints,
            options,
            limit,
        };
        let client = reconnect.connect(&parsed.display).await?;
        Self::from_parts(client, config, parsed.display, Some(reconnect)).await
    }

    /// A lock on an etcd client the application already has (its own
    /// endpoints, credentials and TLS set-up), with `config` in place of a
    /// URL's options: `EtcdLock::with_client(client, EtcdConfig::default())`.
    /// The lock's requests are bounded by the client's own settings: give
    /// it a request timeout and HTTP/2 keep-alive
    /// (`ConnectOptions::with_timeout`, `with_keep_alive`), as
    /// [`connect`](Self::connect) does with `config`'s timeouts, so that a
    /// partition fails requests instead of stalling them (`lost()` fires at
    /// the validity deadline either way). Invalid settings are
    /// [`LockError::InvalidOptions`]; a server that does not answer the
    /// first request within `config`'s timeouts is
    /// [`LockError::Unavailable`].
    pub async fn with_client(client: Client, config: EtcdConfig) -> Result<Self, LockError> {
        config.validate()?;
        Self::from_parts(
            client,
            config,
            "etcd (the application's client)".to_string(),
            None,
        )
        .await
    }

    async fn from_parts(
        client: Client,
        config: EtcdConfig,
        server: String,
        reconnect: Option<Reconnect>,
    ) -> Result<Self, LockError> {
        let limit = config.connect_timeout + config.request_timeout;
        // The server's shortest lease: a 1 s request comes back raised to it.
        let probe = tokio::time::timeout(limit, client.lease_client().grant(1, None))
            .await
            .map_err(|_| LockError::Unavailable {
                backend: BACKEND,
                reason: format!("{server}: no answer within {limit:?}"),
                source: None,
            })?
            .map_err(|e| map_etcd(&format!("granting a lease on {server}"), e))?;
        let min_lease = Duration::from_secs(u64::try_from(probe.ttl()).unwrap_or(1).max(1));
        let _ = client.lease_client().revoke(probe.id()).await;
        tracing::debug!(target: "distlock", server = %server, ?min_lease, "etcd lock client connected");
        Ok(EtcdLock {
            inner: Arc::new(Inner {
                client,
                display: server,
                caps: capabilities(min_lease),
                config,
                session: tokio::sync::Mutex::new(None),
                held: Mutex::new(HashMap::new()),
                reconnect,
            }),
            watchdog: Watchdog::new(),
        })
    }

    /// The comparison `create_revision(key) == token` for the key that
    /// holds `guard`'s lock: put it in the `when` of your own etcd
    /// transaction and the write happens only while the lock is still held
    /// (the etcd-native form of fencing).
    ///
    /// ```no_run
    /// # async fn demo(locks: lock_etcd::EtcdLock, mut client: etcd_client::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// use lock_core::{DistributedLock, LockOptions};
    /// let guard = locks.acquire("ledger", &LockOptions::new()).await?;
    /// let txn = etcd_client::Txn::new()
    ///     .when([locks.fencing_compare(&guard)?])
    ///     .and_then([etcd_client::TxnOp::put("/ledger/balance", "42", None)]);
    /// let done = client.txn(txn).await?;
    /// assert!(done.succeeded(), "the lock was lost before the write");
    /// # Ok(()) }
    /// ```
    pub fn fencing_compare(&self, guard: &LockGuard) -> Result<Compare, LockError> {
        let not_held = || LockError::NotHeld {
            name: guard.name().to_string(),
        };
        let token = guard
            .fencing_token()
            .and_then(|t| i64::try_from(t).ok())
            .ok_or_else(not_held)?;
        let held = self.inner.held.lock().unwrap_or_else(|e| e.into_inner());
        let key = held
            .get(&(guard.name().to_string(), token))
            .ok_or_else(not_held)?;
        Ok(Compare::create_revision(
            key.as_str(),
            CompareOp::Equal,
            token,
        ))
    }

    /// The key of `name`'s holder (the first under its directory by
    /// creation), if any, and how many keys the directory holds.
    async fn holder(&self, name: &str) -> Result<(Option<KeyValue>, usize), LockError> {
        validate_name(name)?;
        let dir = keys::dir(&self.inner.config.prefix, name);
        let mut first = requests::get(
            &self.inner.client,
            &dir,
            queue::first_with_value(&dir),
            "reading a lock's holder",
        )
        .await?;
        let count = usize::try_from(first.count()).unwrap_or(0);
        Ok((first.take_kvs().into_iter().next(), count))
    }

    /// How many acquisitions of `name` wait behind its holder: the keys
    /// under the lock's directory after the first.
    pub async fn queued(&self, name: &str) -> Result<usize, LockError> {
        let dir = keys::dir(&self.inner.config.prefix, name);
        let all = requests::get(
            &self.inner.client,
            &dir,
            GetOptions::new()
                .with_range(keys::range_end(&dir))
                .with_count_only(),
            "counting a lock's waiters",
        )
        .await?;
        Ok(usize::try_from(all.count()).unwrap_or(0).saturating_sub(1))
    }

    /// Compact the key-value history up to the current revision (what the
    /// server's auto-compaction does); used before benchmarks.
    pub async fn compact(&self) -> Result<(), LockError> {
        let mut kv = self.inner.client.kv_client();
        let now = kv
            .get("/", Some(GetOptions::new().with_count_only()))
            .await
            .map_err(|e| map_etcd("reading the revision", e))?;
        let rev = now.header().map_or(0, |h| h.revision());
        kv.compact(rev, None)
            .await
            .map_err(|e| map_etcd("compacting", e))?;
        Ok(())
    }

    /// The lease for a new key: the session's, if `opts` match it (and ask
    /// for no lock delay, which the session's lease does not carry), else
    /// one of the lock's own. Returns it with the key's lease state.
    pub(crate) async fn lease_for(
        &self,
        opts: &LockOptions,
    ) -> Result<(Lease, Arc<LeaseState>), LockError> {
        let inner = &self.inner;
        if opts.auto_renew && opts.lock_delay.is_none() && opts.ttl == inner.config.session_ttl {
            let mut slot = inner.session.lock().await;
            let session = match slot.as_ref() {
                Some(s) if s.usable() => Arc::clone(s),
                _ => {
                    let s = Session::start(&inner.client, inner.config.session_ttl).await?;
                    *slot = Some(Arc::clone(&s));
                    s
                }
            };
            let state = session.attach();
            return Ok((Lease::Session(session), state));
        }
        let secs = opts.ttl.as_secs() + u64::from(opts.ttl.subsec_nanos() > 0);
        let sent_at = Instant::now();
        let granted = requests::grant(&inner.client, secs.max(1), "granting a lease").await?;
        let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0).max(1));
        Ok((
            Lease::Own {
                id: granted.id(),
                ttl,
            },
            Arc::new(
                LeaseState::lease(sent_at, ttl)
                    .with_margin(opts.safety_margin)
                    .delaying(opts.lock_delay),
            ),
        ))
    }

    pub(crate) fn guard(
        &self,
        name: &str,
        handle: Arc<EtcdHandle>,
        rev: i64,
        opts: &LockOptions,
    ) -> LockGuard {
        let token = u64::try_from(rev).ok();
        let state = Arc::clone(&handle.state);
        let own = matches!(handle.current_lease(), Lease::Own { .. });
        self.inner
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((name.to_string(), rev), handle.key.clone());
        let guard = LockGuard::new(name, token, self.inner.caps, state, handle);
        // Session guards are renewed by the session's keep-alive.
        if own {
            guard.kept_by(&self.watchdog, opts, Unrenewed::Left)
        } else {
            guard
        }
    }

    /// Acquire; `wait == false` gives up (removing our key) if not first.
    async fn acquire_inner(
        &self,
        name: &str,
        opts: &LockOptions,
        deadline: Option<Instant>,
        wait: bool,
    ) -> Result<Option<LockGuard>, LockError> {
        let leased = self.lease_for(opts).await?;
        let dir = keys::dir(&self.inner.config.prefix, name);
        let key = keys::key(&dir, leased.0.id(), &OwnerToken::random().to_hex());
        let handle = Arc::new(EtcdHandle::new(
            Arc::clone(&self.inner),
            name,
            dir,
            key,
            opts.holder_record(),
            leased,
        ));
        // Until a guard owns the key, leaving (failure, timeout,
        // cancellation) deletes it and gives back a lease of its own.
        let pending = PendingGrant::new(Arc::clone(&handle) as Arc<dyn GuardHandle>);
        let client = &self.inner.client;
        let (rev, first_place) = match queue::enqueue(
            client,
            &handle.dir,
            &handle.key,
            handle.record().as_bytes(),
            handle.lease_id(),
        )
        .await
        {
            Ok(queued) => queued,
            Err(e) => return Err(handle.put_failed(e)),
        };
        *handle.rev.lock().unwrap_or_else(|e| e.into_inner()) = rev;
        if first_place.predecessor.is_some() && !wait {
            let _ = pending.give_back().await;
            return Ok(None);
        }
        let mut step = Step::Wait(first_place);
        loop {
            // The lease's validity deadline passed (an answer that came
            // too late, a wait longer than a lease of our own could be
            // kept alive): no guard is handed out past it. The key goes
            // before the caller hears.
            if handle.state.lost_now().is_some() {
                let _ = pending.give_back().await;
                return Err(queue::place_lost(name));
            }
            let next = match step {
                Step::Wait(Place {
                    predecessor: None, ..
                }) => {
                    pending.disarm();
                    return Ok(Some(self.guard(name, handle, rev, opts)));
                }
                Step::Wait(Place {
                    predecessor: Some(pred),
                    next_in_line,
                    read_at,
                }) => match self
                    .await_turn(&handle, &pred, next_in_line, read_at + 1, deadline)
                    .await
                {
                    Ok(Turn::OursGone) => return Err(queue::place_lost(name)),
                    // The first key went, and ours had not gone before it
                    // (the watch reports both in revision order): ours is
                    // first now.
                    Ok(Turn::PredecessorGone(_)) if next_in_line => Ok(Step::Wait(Place {
                        predecessor: None,
                        next_in_line: false,
                        read_at,
                    })),
                    // Usually we are first now; one read settles it.
                    Ok(Turn::PredecessorGone(at)) => Ok(Step::RereadAt(at)),
                    Ok(Turn::Ended) => Ok(Step::Reread),
                    Err(e) => Err(e),
                },
                Step::RereadAt(at) => {
                    match queue::place_at(client, &handle.dir, &handle.key, rev, at).await {
                        Ok(Some(place)) if place.predecessor.is_none() => Ok(Step::Wait(place)),
                        // Still waiting (a waiter ahead gave up): a watch
                        // from that revision, already past, would be served
                        // by etcd's slower catch-up; the place now starts
                        // a live one.
                        Ok(Some(_)) => Ok(Step::Reread),
                        Ok(None) => return Err(queue::place_lost(name)),
                        Err(e) => {
                            tracing::debug!(target: "distlock", lock = %name, error = %e.report(), "the queue as of a deletion could not be read; reading it now");
                            Ok(Step::Reread)
                        }
                    }
                }
                Step::Reread => match queue::place(client, &handle.dir, &handle.key, rev).await {
                    Ok(Some(place)) => Ok(Step::Wait(place)),
                    Ok(None) => return Err(queue::place_lost(name)),
                    Err(e) => Err(e),
                },
            };
            step = match next {
                Ok(step) => step,
                // A leader election or a member going away while we wait:
                // keep our place and look again, until the deadline.
                Err(e) if e.is_transient() => {
                    ride_out(name, e, deadline).await?;
                    Step::Reread
                }
                // The wait ran out: our key goes before the caller hears.
                Err(e @ LockError::Timeout { .. }) => {
                    let _ = pending.give_back().await;
                    return Err(e);
                }
                Err(e) => return Err(e),
            };
        }
    }

    /// Wait until the predecessor or our own key is deleted, the watch
    /// ends, or `deadline` passes. Keeps a lease of our own alive meanwhile.
    async fn await_turn(
        &self,
        handle: &EtcdHandle,
        predecessor: &[u8],
        next_in_line: bool,
        from: i64,
        deadline: Option<Instant>,
    ) -> Result<Turn, LockError> {
        // Our own key matters only where its predecessor's deletion alone
        // would make it the holder.
        let ours = next_in_line.then_some(handle.key.as_str());
        let watch = queue::watch(&self.inner.client, predecessor, ours, from).await?;
        self.watch_until(handle, watch, deadline, |message| {
            queue::turn(message, predecessor, ours)
        })
        .await
    }

    /// Read `watch` until `turn` finds a turn in one of its messages, or
    /// `deadline` passes (`Timeout`). Keeps a lease of our own alive
    /// meanwhile (`Turn::OursGone` if it has gone).
    pub(crate) async fn watch_until(
        &self,
        handle: &EtcdHandle,
        mut watch: WatchStream,
        deadline: Option<Instant>,
        mut turn: impl FnMut(Result<Option<WatchResponse>, etcd_client::Error>) -> Option<Turn>,
    ) -> Result<Turn, LockError> {
        let keep_alive_every = match handle.current_lease() {
            Lease::Own { ttl, .. } => Some(ttl / 3),
            Lease::Session(_) => None,
        };
        let mut keep_alive_at = keep_alive_every.map(|p| Instant::now() + p);
        loop {
            let until = match (deadline, keep_alive_at) {
                (Some(d), Some(k)) => Some(d.min(k)),
                (d, k) => d.or(k),
            };
            let timer = async {
                match until {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                message = watch.message() => {
                    if let Some(turn) = turn(message) {
                        return Ok(turn);
                    }
                }
                _ = timer => {
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        return Err(LockError::Timeout {
                            name: handle.name.clone(),
                            waited: Duration::ZERO,
                        });
                    }
                    if let (Some(every), Some(at)) = (keep_alive_every, keep_alive_at)
                        && now >= at
                    {
                        keep_alive_at = Some(now + every);
                        if handle.keep_alive_once().await? {
                            handle.state.renewed(now, handle.lease_ttl());
                        } else {
                            return Ok(Turn::OursGone);
                        }
                    }
                }
            }
        }
    }
}

/// A waiter's answer to a transient error (a leader election, a member
/// going away): keep its place and look again after a short pause, or,
/// if the pause would outlast the wait's `deadline`, the error.
pub(crate) async fn ride_out(
    name: &str,
    e: LockError,
    deadline: Option<Instant>,
) -> Result<(), LockError> {
    tracing::debug!(target: "distlock", lock = %name, error = %e.report(), "etcd unavailable while waiting; retrying");
    let pause = Instant::now() + Duration::from_millis(200);
    if deadline.is_some_and(|d| d <= pause) {
        return Err(e);
    }
    tokio::time::sleep_until(pause).await;
    Ok(())
}

/// The next thing a waiter does.
enum Step {
    /// Wait from this place.
    Wait(Place),
    /// Read the place as of a deletion's revision.
    RereadAt(i64),
    /// Read the place again, now.
    Reread,
}

/// How many places in the queue one waiting acquisition may go through.
const PLACES_PER_ACQUIRE: u32 = 3;

/// An acquisition whose key went with its lease or session before the
/// grant: the server was unreachable for too long. Transient; `Lost`
/// belongs to a held guard.
pub(crate) fn place_gone(name: &str) -> LockError {
    LockError::Unavailable {
        backend: "etcd",
        reason: format!(
            "lock {name:?}: the waiter's lease or session ended before the grant (etcd unreachable?); try again"
        ),
        source: None,
    }
}

impl EtcdLock {
    /// Acquire what `req` asks for, waiting until `deadline` if `wait`.
    async fn acquire_kind(
        &self,
        req: Request<'_>,
        deadline: Option<Instant>,
        wait: bool,
    ) -> Result<Option<LockGuard>, LockError> {
        let (name, opts) = (req.name, req.opts);
        match req.kind() {
            Kind::Rw(access) => self.acquire_rw(name, opts, access, deadline, wait).await,
            Kind::Permit(limit) => self.acquire_permit(name, opts, limit, deadline, wait).await,
            _ => self.acquire_inner(name, opts, deadline, wait).await,
        }
    }
}

#[async_trait]
impl RawLock for EtcdLock {
    async fn attempt_once(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        let once = self.acquire_kind(req, None, false).await;
        match once {
            Err(LockError::Lost { .. }) => Err(place_gone(req.name)),
            other => other,
        }
    }

    /// One transaction for the whole set.
    async fn attempt_set_once(
        &self,
        reqs: &[Request<'_>],
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        self.attempt_set(reqs).await
    }

    /// A waiter whose place in the queue goes (its lease or session ended,
    /// say in a short partition) queues again, on a fresh lease or
    /// session, while its wait allows, as a ZooKeeper waiter does.
    async fn wait(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        let name = req.name;
        let place_lost = |e: &LockError| matches!(e, LockError::Lost { .. });
        let outcome = Retry::immediately()
            .attempts(PLACES_PER_ACQUIRE)
            .deadline(req.deadline)
            .run("waiting for an etcd lock", place_lost, |sent| {
                if sent > 0 {
                    tracing::info!(target: "distlock", lock = %name, "etcd waiter lost its place (its lease or session ended); queueing again");
                }
                self.acquire_kind(req, req.deadline, true)
            })
            .await;
        match outcome {
            Ok(Some(guard)) => Ok(Some(guard)),
            Ok(None) | Err(LockError::Timeout { .. }) => Ok(None),
            Err(LockError::Lost { .. }) => Err(place_gone(name)),
            Err(e) => Err(e),
        }
    }

    fn raw_capabilities(&self) -> Capabilities {
        self.inner.caps
    }

    /// The first key under the lock's directory (by creation) is the
    /// holder: its create revision is the token and its lease's time to
    /// live the time left (whole seconds); the keys after it wait.
    /// A watch on the lock's whole key range (holder and waiters): each
    /// response with events is a change (a grant, a release, a waiter
    /// coming or going, a value put by `set_value`); lease renewals put
    /// nothing.
    async fn raw_changes(&self, name: &str) -> Result<Option<Changes>, LockError> {
        validate_name(name)?;
        let dir = keys::dir(&self.inner.config.prefix, name);
        let stream = requests::watch(
            &self.inner.client,
            dir.as_bytes(),
            etcd_client::WatchOptions::new().with_prefix(),
            "watching a lock for observers",
        )
        .await?;
        Ok(Some(Box::pin(futures_util::stream::unfold(
            Some(stream),
            |stream| async move {
                let mut stream = stream?;
                loop {
                    match stream.message().await {
                        Ok(Some(r)) if r.canceled() => {
                            let e = LockError::unavailable(
                                BACKEND,
                                "watching a lock for observers",
                                format!("the watch was cancelled: {}", r.cancel_reason()),
                            );
                            return Some((Err(e), None));
                        }
                        Ok(Some(r)) if r.events().is_empty() => {}
                        Ok(Some(_)) => return Some((Ok(()), Some(stream))),
                        Ok(None) => return None,
                        Err(e) => {
                            return Some((Err(map_etcd("watching a lock for observers", e)), None));
                        }
                    }
                }
            },
        ))))
    }

    async fn raw_inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        let (holder, keys) = self.holder(name).await?;
        let Some(holder) = holder else {
            return Ok(LockInfo::free().with_waiters(Some(0)));
        };
        let left = if holder.lease() == 0 {
            None
        } else {
            requests::time_left(
                &self.inner.client,
                holder.lease(),
                "reading the holder's lease",
            )
            .await?
            .map(Duration::from_secs)
        };
        let record = match holder.value() {
            [] => None,
            bytes => Some(HolderRecord::decode_for(BACKEND, name, bytes)?),
        };
        Ok(LockInfo::held()
            .with_fencing_token(u64::try_from(holder.create_revision()).ok())
            .with_expires_in(left)
            .with_waiters(Some(keys.saturating_sub(1)))
            .with_holder(record))
    }

    /// The slot keys of `name`'s permits and its queue's length.
    /// The reader-writer lock's keys and counter, read in one transaction.
    async fn raw_inspect_rw(&self, name: &str) -> Result<RwLockInfo, LockError> {
        self.inspect_rw_lock(name).await
    }

    async fn raw_inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        validate_name(name)?;
        self.inspect_permits(name).await
    }

    /// Revoke the lease of `name`'s holder: its key goes, the next waiter
    /// is notified at once, and the holder's `lost()` fires. The holder's
    /// other locks on the same lease (a client's locks share its session
    /// lease) are freed with it.
    async fn raw_force_release(&self, name: &str) -> Result<bool, LockError> {
        let Some(holder) = self.holder(name).await?.0 else {
            return Ok(false);
        };
        requests::revoke(
            &self.inner.client,
            holder.lease(),
            "revoking the holder's lease",
        )
        .await?;
        Ok(true)
    }
}

impl fmt::Debug for EtcdLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLock")
            .field("server", &self.inner.display)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}
