//! `RedisLock`: the client and its acquire path.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::raw::{
    Attempt, Batcher, GuardHandle, HolderRecord, Kind, OwnerToken, PendingGrant, RawGuard, RawLock,
    Request, Unrenewed, Wakeups, Watchdog, validate_name,
};
use lock_core::{
    Capabilities, Changes, Fencing, Grade, LockError, LockGuard, LockInfo, LockOptions,
    RwLockCapabilities, RwLockInfo, SemaphoreCapabilities, SemaphoreInfo, Waiting,
};
use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::config::{RedisConfig, Target, parse_url};
use crate::error::{BACKEND, map_redis, within};
use crate::extends::{Extension, extend_batcher};
use crate::handle::RedisHandle;
use crate::keys::Keys;
use crate::permits::MAX_LIMIT;
use crate::queue_wait::{QueuedLock, queue_entry_ttl, wait_in_queue};
use crate::script_call::ScriptCall;
use crate::scripts::{ACQUIRE, WITHDRAW};
use crate::server::{Follower, Server, manager_config};
use crate::sets::MAX_ATOMIC_SET;
use crate::state::read_state;
use crate::subscriber::{Subscriber, Subscription};

pub(crate) const CAPABILITIES: Capabilities = Capabilities::new(BACKEND, Grade::Efficiency)
    // INCR in the acquire script: monotonic only while this one node keeps
    // its data (a failover to a replica or a restart without persistence can
    // go back).
    .with_fencing(Fencing::WhileServerKeepsData)
    // FIFO hand-off on release (reservations); a lock that expires instead of
    // being released goes to whichever waiter retries first.
    .with_fair_queue(true)
    .with_waiting(Waiting::Notified)
    // The acquire script writes the holder record with the grant.
    .with_holder(true)
    // Grants, releases and holder records publish on the lock's changes
    // channel; a lease that runs out publishes nothing, and an election's
    // observer reads again when the lease it read ends.
    .with_observers(Waiting::Notified)
    // PX carries the delay; the extend script's PEXPIRE sets a hold's end.
    .with_lock_delay(true)
    .with_hold_at_least(true)
    // One script run takes a whole set (all keys on this one node).
    .with_atomic_sets(MAX_ATOMIC_SET)
    // Slot keys with the lease as TTL; waiters woken on release, unordered.
    .with_semaphore(Some(
        SemaphoreCapabilities::new(MAX_LIMIT).with_waiting(Waiting::Notified),
    ))
    // Writer and reader keys with the lease as TTL; a waiting writer's mark
    // holds later readers back; waiters woken on release, unordered.
    .with_rw_lock(Some(
        RwLockCapabilities::new()
            .with_writer_preference(true)
            .with_waiting(Waiting::Notified)
            .with_upgradeable(true),
    ));

/// Backstop wait when the holder's key has no TTL (set by someone else).
const BACKSTOP: Duration = Duration::from_millis(500);

/// Locks on one Redis node.
///
/// - Acquire is one round trip: a script doing `SET key owner NX PX ttl`
///   and, on success, `INCR` of the lock's fencing counter.
/// - Release and extend are scripts that compare the owner token first.
/// - Waiters queue on the server in arrival order and subscribe to the
///   lock's release channel on one shared subscriber connection. A release
///   hands the lock to the first waiter (reserving it briefly, so the
///   releaser cannot take it straight back) and wakes only that waiter. The
///   holder's remaining TTL is the backstop; nobody polls on a timer.
/// - Auto-renewed guards are renewed by one [`Watchdog`] per client.
///
/// Efficiency-grade: Redis replicates asynchronously, so a failover can
/// lose a granted lock (and its fencing counter). Needs Redis ≥ 6 (RESP3).
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{DistributedLock, LockOptions};
/// let locks = lock_redis::RedisLock::connect("redis://127.0.0.1:6379/0?prefix=myapp:").await?;
/// let guard = locks.acquire("cache-refill", &LockOptions::new()).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisLock {
    pub(crate) inner: Arc<Inner>,
    pub(crate) watchdog: Watchdog,
}

pub(crate) struct Inner {
    /// Where commands go: the node, or the group's current master.
    pub(crate) conn: Server,
    pub(crate) keys: Keys,
    pub(crate) config: RedisConfig,
    display: String,
    pub(crate) subscriber: OnceCell<Arc<Subscriber>>,
    pub(crate) wakeups: Wakeups,
    /// Extends (renewals) waiting together go out as one script run.
    pub(crate) extends: Batcher<Extension, bool>,
}

impl Inner {
    /// The client of the server commands go to now (its address,
    /// credentials and TLS set-up), for connections of their own.
    pub(crate) fn connector(&self) -> crate::server::Connector {
        self.conn.connector()
    }

    /// One node's capabilities; through Sentinel the service also survives
    /// the master's failure (the client follows the promoted replica), and
    /// is still efficiency-grade: the failover can lose a lock.
    ///
    /// On a Redis Cluster a script run only touches one hash slot's keys,
    /// and the names of a set hash to different slots: sets are taken name
    /// by name (`atomic_sets` 0).
    pub(crate) fn capabilities(&self) -> Capabilities {
        let caps = CAPABILITIES.with_survives_server_failure(self.conn.follows_failovers());
        if self.conn.is_cluster() {
            caps.with_atomic_sets(0)
        } else {
            caps
        }
    }

    /// What a guard that is not auto-renewed gets: left to its TTL on one
    /// node; checked about every third of its TTL where a failover can take
    /// its key away, so that `lost()` fires then, not at its deadline.
    pub(crate) fn unrenewed(&self) -> Unrenewed {
        if self.conn.follows_failovers() {
            Unrenewed::Watched
        } else {
            Unrenewed::Left
        }
    }
}

impl RedisLock {
    /// Connect to `redis://[user:pass@]host[:port][/db]` (or `rediss://` for
    /// TLS), or to the master of a Sentinel group,
    /// `redis+sentinel://[user:pass@]s1[:26379],s2,…/GROUP[/db]` (or
    /// `rediss+sentinel://`; the credentials are the data nodes'), with
    /// options `prefix`, `connect_timeout`, `response_timeout`,
    /// `handoff_window`, `replicas` and `replicas_timeout` (durations with
    /// their unit: `250ms`, `2s`).
    ///
    /// Through Sentinel, the client follows the group's master across
    /// failovers without a restart; a lock whose key did not reach the new
    /// master fires `lost()` when the client finds the new master.
    ///
    /// A Redis Cluster is
    /// `redis+cluster://[user:pass@]h1[:6379],h2[:6379],…[?…]` (or
    /// `rediss+cluster://`): any of its nodes, from which the client learns
    /// the rest. Every key of one lock shares one hash slot; each command
    /// goes to that slot's master, and the client follows `MOVED`, `ASK`
    /// and failovers by itself. A lock whose key did not reach the promoted
    /// replica fires `lost()` at its next renewal or check.
    ///
    /// For servers reached through port forwarding, both forms take
    /// `node_map=ANNOUNCED>VIA,…`: a node the cluster announces (or the
    /// Sentinels name) as `ANNOUNCED` (`host:port`) is reached at `VIA`.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let parsed = parse_url(url)?;
        let invalid = |e: redis::RedisError| LockError::InvalidUrl {
            url: parsed.display.clone(),
            reason: format!(
                "rejected by the redis client: {}",
                e.detail().unwrap_or("invalid")
            ),
        };
        match parsed.target {
            Target::Node(ref client_url) => {
                let client = redis::Client::open(client_url.as_str()).map_err(invalid)?;
                Self::from_parts(client, parsed.config, parsed.display).await
            }
            Target::Cluster(seeds) => {
                parsed.config.validate()?;
                let seeds = Arc::new(seeds);
                let conn = seeds
                    .connect(&parsed.config, None, "connecting to the cluster")
                    .await?;
                tracing::debug!(target: "distlock", server = %parsed.display,
                    "redis lock client connected to the cluster");
                Self::on_server(Server::Cluster(conn, seeds), parsed.config, parsed.display)
            }
            Target::Sentinel {
                ref sentinels,
                ref group,
                db,
                ref user,
                ref password,
                tls,
                ref node_map,
            } => {
                if tls {
                    crate::config::install_tls_provider();
                }
                let mut builder = SentinelClientBuilder::new(
                    sentinels.iter().cloned(),
                    group,
                    SentinelServerType::Master,
                )
                .map_err(invalid)?
                .set_client_to_redis_db(i64::from(db))
                .set_client_to_redis_protocol(redis::ProtocolVersion::RESP3);
                if let Some(user) = user {
                    builder = builder.set_client_to_redis_username(user);
                }
                if let Some(password) = password {
                    builder = builder.set_client_to_redis_password(password);
                }
                if tls {
                    builder = builder
                        .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
                        .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure);
                }
                let sentinel = builder.build().map_err(invalid)?;
                let asked = crate::sentinels::Sentinels::new(sentinels).map_err(invalid)?;
                let follower = Follower::connect(
                    (sentinel, asked),
                    group.clone(),
                    parsed.config.clone(),
                    node_map.clone(),
                )
                .await?;
                Self::on_server(Server::Sentinel(follower), parsed.config, parsed.display)
            }
        }
    }

    /// A lock on a Redis client the application already has (its own
    /// credentials and TLS set-up), with `config` in place of a URL's
    /// options: `RedisLock::with_client(client, RedisConfig::default())`.
    ///
    /// The client may speak RESP2 (redis-rs's default) or RESP3: the lock's
    /// own connections always speak RESP3, since waiters are woken by push
    /// messages (the server must be Redis ≥ 6). The lock opens connections
    /// of its own from the client's settings (one multiplexed connection,
    /// and one for wake-ups); the application's client is not changed.
    /// Invalid settings are [`LockError::InvalidOptions`].
    pub async fn with_client(
        client: redis::Client,
        config: RedisConfig,
    ) -> Result<Self, LockError> {
        let (client, server) = crate::config::client_for_lock(&client)?;
        Self::from_parts(client, config, server).await
    }

    async fn from_parts(
        client: redis::Client,
        config: RedisConfig,
        server: String,
    ) -> Result<Self, LockError> {
        config.validate()?;
        crate::config::ensure_tls_provider(&client);
        // Commands on the hot path rely on these bounds alone (no timer of
        // our own per call): the reply within `response_timeout`, and one
        // reconnect attempt within `connect_timeout`, so an outage fails fast.
        let conn = within(
            &config,
            "connecting",
            client.get_connection_manager_with_config(manager_config(&config)),
        )
        .await?
        .map_err(|e| map_redis(&format!("connecting to {server}"), e))?;
        tracing::debug!(target: "distlock", server = %server, "redis lock client connected");
        Self::on_server(Server::Node(conn, Box::new(client)), config, server)
    }

    fn on_server(conn: Server, config: RedisConfig, server: String) -> Result<Self, LockError> {
        // The connection's own response timeout bounds each batch too, with
        // a connect attempt's time on top for a reconnect.
        let extends = extend_batcher(
            BACKEND,
            &server,
            conn.clone(),
            config.acknowledgement(),
            config.response_timeout + config.connect_timeout,
            conn.is_cluster(),
        );
        let switches = conn.switches();
        let lock = RedisLock {
            inner: Arc::new(Inner {
                extends,
                conn,
                keys: Keys::new(&config.prefix),
                config,
                display: server,
                subscriber: OnceCell::new(),
                wakeups: Wakeups::new(),
            }),
            watchdog: Watchdog::new(),
        };
        if let Some(switches) = switches {
            tokio::spawn(follow_switches(
                Arc::downgrade(&lock.inner),
                lock.watchdog.clone(),
                switches,
            ));
        }
        Ok(lock)
    }

    /// How many acquisitions of `name` wait in its server-side queue.
    pub async fn queued(&self, name: &str) -> Result<usize, LockError> {
        let mut conn = self.inner.conn.clone();
        let key = self.inner.keys.all(name).queue;
        let waiting: usize = within(
            &self.inner.config,
            "counting a lock's waiters",
            crate::state::live_waiters(&mut conn, &key),
        )
        .await?
        .map_err(|e| map_redis("counting a lock's waiters", e))?;
        Ok(waiting)
    }

    /// One attempt. A `waiter` id joins the queue if the attempt fails.
    /// Cancel-safe: if the future is dropped while the script is in flight,
    /// a [`PendingGrant`] releases by owner token in the background.
    async fn attempt(
        &self,
        name: &str,
        opts: &LockOptions,
        waiter: Option<&str>,
    ) -> Result<Attempt, LockError> {
        let inner = &self.inner;
        let owner = OwnerToken::random();
        let handle = Arc::new(self.handle(name, owner, opts));
        let keys = &handle.keys;
        let mut call = ScriptCall::new(
            &ACQUIRE,
            &[
                &keys.lock,
                &keys.fence,
                &keys.queue,
                &keys.handoff,
                &keys.holder,
            ],
            6,
        );
        call.arg(&handle.owner)
            .arg(lock_core::raw::lease_millis(opts.ttl))
            .arg(waiter.unwrap_or_default())
            .arg(queue_entry_ttl(opts.ttl).as_millis() as u64)
            .arg("")
            .arg(handle.record.as_bytes())
            .acknowledged(inner.config.acknowledgement());
        let pending = PendingGrant::new(handle);
        let mut conn = inner.conn.clone();
        let sent_at = Instant::now();
        let (granted, value): (i64, i64) = call
            .invoke(&mut conn)
            .await
            .map_err(|e| map_redis("acquiring a lock", e))?;
        if granted != 1 {
            drop(pending.disarm());
            let expires_in = u64::try_from(value)
                .ok()
                .filter(|&ms| ms > 0)
                .map(Duration::from_millis);
            return Ok(Attempt::Held { expires_in });
        }
        let (handle, lease) = match pending.grant_in_time(BACKEND, name, sent_at, opts).await {
            Ok(granted) => granted,
            // Granted too late to be of use (and given back): the lease may
            // already be over.
            Err(too_late) => return Ok(Attempt::TooLate(too_late)),
        };
        let token = u64::try_from(value).map_err(|_| LockError::Backend {
            backend: BACKEND,
            reason: format!("fencing counter of {name:?} is not positive ({value})"),
            source: None,
        })?;
        let guard = LockGuard::new(name, Some(token), inner.capabilities(), lease, handle);
        Ok(Attempt::Acquired(guard.kept_by(
            &self.watchdog,
            opts,
            inner.unrenewed(),
        )))
    }

    pub(crate) fn handle(&self, name: &str, owner: OwnerToken, opts: &LockOptions) -> RedisHandle {
        RedisHandle {
            inner: Arc::clone(&self.inner),
            keys: self.inner.keys.all(name),
            owner: owner.to_hex(),
            record: opts.holder_record(),
        }
    }

    pub(crate) async fn subscriber(&self) -> Result<&Arc<Subscriber>, LockError> {
        self.inner.connected_subscriber().await
    }
}

impl Inner {
    /// The client's subscriber, connected on first use.
    pub(crate) async fn connected_subscriber(&self) -> Result<&Arc<Subscriber>, LockError> {
        self.subscriber
            .get_or_try_init(|| async {
                Subscriber::connect_with(&self.connector(), &self.config, self.wakeups.clone())
                    .await
            })
            .await
    }
}

#[async_trait]
impl RawLock for RedisLock {
    async fn attempt_once(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        match req.kind() {
            Kind::Rw(access) => self.try_rw(req, access).await,
            Kind::Permit(limit) => self
                .attempt_permit(req.name, req.opts, limit)
                .await?
                .into_guard(),
            Kind::Lock => self.attempt(req.name, req.opts, None).await?.into_guard(),
        }
    }

    /// One script run for the whole set.
    async fn attempt_set_once(
        &self,
        reqs: &[Request<'_>],
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        self.attempt_set(reqs).await
    }

    async fn wait(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        match req.kind() {
            Kind::Rw(access) => return self.wait_for_rw(req, access).await,
            Kind::Permit(limit) => return self.wait_for_permit(req, limit).await,
            Kind::Lock => {}
        }
        let waiter = OwnerToken::random().to_hex();
        let wake = self.inner.wakeups.subscribe(&waiter);
        wait_in_queue(&Queue(self), req, waiter, wake).await
    }

    fn raw_capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    /// One atomic read of the lock key, its remaining TTL, the name's
    /// fencing counter (the holder's token: only a grant advances it) and
    /// the queue's length.
    async fn raw_inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        validate_name(name)?;
        let keys = self.inner.keys.all(name);
        let mut conn = self.inner.conn.clone();
        let state = within(
            &self.inner.config,
            "reading a lock's state",
            read_state(&mut conn, &keys),
        )
        .await?
        .map_err(|e| map_redis("reading a lock's state", e))?;
        let waiters = Some(state.queued);
        Ok(match state.owner {
            None => LockInfo::free().with_waiters(waiters),
            Some(_) => LockInfo::held()
                .with_fencing_token(state.fence)
                .with_expires_in(state.left)
                .with_waiters(waiters)
                .with_holder(
                    state
                        .holder
                        .map(|r| HolderRecord::decode_for(BACKEND, name, &r))
                        .transpose()?,
                ),
        })
    }

    /// The lock's changes channel (`LOCK:changed`), on this client's
    /// subscriber connection: the acquire, release and holder scripts
    /// publish on it.
    async fn raw_changes(&self, name: &str) -> Result<Option<Changes>, LockError> {
        validate_name(name)?;
        let channel = self.inner.keys.all(name).changes;
        Ok(Some(self.subscriber().await?.observe(&channel).await?))
    }

    /// The live slot keys of `name`'s permits, with their tokens and
    /// holder records, read in one script run.
    async fn raw_inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        validate_name(name)?;
        self.inspect_permits(name).await
    }

    /// The holders of reader-writer lock `name`, its write counter and its
    /// waiting writers, read in one script run.
    async fn raw_inspect_rw(&self, name: &str) -> Result<RwLockInfo, LockError> {
        self.inspect_rw_lock(name).await
    }

    /// Release `name` on behalf of whoever holds it: the release script
    /// run with the holder's owner token as read from the key, so the lock
    /// is handed to the first waiter in the queue as on a normal release.
    /// The holder's next renewal fails and its `lost()` fires.
    async fn raw_force_release(&self, name: &str) -> Result<bool, LockError> {
        validate_name(name)?;
        let keys = self.inner.keys.all(name);
        // A holder that changes between the read and the script (it
        // released, another took over) is read again.
        for _ in 0..3 {
            let mut conn = self.inner.conn.clone();
            let owner: Option<String> = within(
                &self.inner.config,
                "reading a lock's holder",
                redis::cmd("GET").arg(&keys.lock).query_async(&mut conn),
            )
            .await?
            .map_err(|e| map_redis("reading a lock's holder", e))?;
            let Some(owner) = owner else {
                return Ok(false);
            };
            let holder = RedisHandle {
                inner: Arc::clone(&self.inner),
                keys: keys.clone(),
                owner,
                record: HolderRecord::new("operator", b""),
            };
            if holder.release().await? {
                return Ok(true);
            }
        }
        Err(LockError::Backend {
            backend: BACKEND,
            reason: format!("lock `{name}` changed hands three times while being force-released"),
            source: None,
        })
    }
}

impl fmt::Debug for RedisLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLock")
            .field("server", &self.inner.display)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// After each change of a Sentinel group's master: every lock the client
/// holds is renewed or checked at once (those whose keys the new master
/// lacks fire `lost()`), the subscriber moves to the new master, and every
/// waiter looks again. Ends with the client.
async fn follow_switches(
    inner: std::sync::Weak<Inner>,
    watchdog: Watchdog,
    mut switches: tokio::sync::watch::Receiver<u64>,
) {
    while switches.changed().await.is_ok() {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        watchdog.check_now();
        if let Some(subscriber) = inner.subscriber.get()
            && let crate::server::Connector::Node(client) = inner.connector()
            && let Err(e) = subscriber.repoint(&client).await
        {
            tracing::warn!(target: "distlock", error = %e.report(),
                "moving the subscriber to the new master failed; waiters fall back to their backstop");
        }
        inner.wakeups.wake_all();
    }
}

/// Take `waiter` out of `name`'s queue, passing on a hand-off made to it.
async fn withdraw(inner: Arc<Inner>, name: String, waiter: String) {
    let mut conn = inner.conn.clone();
    let keys = inner.keys.all(&name);
    let mut call = ScriptCall::new(&WITHDRAW, &[&keys.queue, &keys.handoff], 3);
    call.arg(&waiter)
        .arg(&keys.channel)
        .arg(inner.config.handoff_window.as_millis() as u64);
    let done = within(
        &inner.config,
        "withdrawing a waiter",
        call.invoke::<i64>(&mut conn),
    )
    .await;
    if !matches!(done, Ok(Ok(_))) {
        tracing::debug!(target: "distlock", "withdrawing a waiter failed; its queue entry lapses by itself");
    }
}

/// The lock as its queued wait sees it.
struct Queue<'a>(&'a RedisLock);

impl QueuedLock for Queue<'_> {
    type Waiter = String;
    type Listening = Subscription;

    fn joined(&self, name: &str) -> Option<Subscription> {
        let channel = self.0.inner.keys.channel(name);
        let subscriber = self.0.inner.subscriber.get()?;
        subscriber.join_subscribed(&channel)
    }

    async fn listen(&self, name: &str) -> Result<Subscription, LockError> {
        let channel = self.0.inner.keys.channel(name);
        self.0.subscriber().await?.subscribe(&channel).await
    }

    async fn queue_attempt(
        &self,
        name: &str,
        opts: &LockOptions,
        waiter: Option<&String>,
    ) -> Result<Attempt, LockError> {
        self.0.attempt(name, opts, waiter.map(String::as_str)).await
    }

    fn withdrawal(&self, name: &str, waiter: &String) -> impl Future<Output = ()> + Send + 'static {
        withdraw(Arc::clone(&self.0.inner), name.to_string(), waiter.clone())
    }

    /// Until the holder's lease ends, or for a backstop if its key has no
    /// TTL (set by someone else).
    fn pause_while_held(&self, holder_left: Option<Duration>, _: &LockOptions, _: u32) -> Duration {
        holder_left.unwrap_or(BACKSTOP)
    }
}
