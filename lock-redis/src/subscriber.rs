//! One subscriber connection per client, shared by all its waiters.
//!
//! Release messages arrive as RESP3 push messages carrying the id of the
//! waiter the lock was handed to; they are turned straight into a wake-up of
//! that waiter, if it is one of ours (no task, no queue).
//!
//! A channel is subscribed while a waiter needs it and lingers for
//! [`LINGER`] after the last one leaves, so a busy lock does not pay a
//! SUBSCRIBE and an UNSUBSCRIBE per wait. After a reconnect the connection
//! manager resubscribes, and every waiter is woken once to re-check, since
//! messages may have been missed meanwhile.
//!
//! The same connection carries an election's observers: a lock's changes
//! channel is observed through [`Subscriber::observe`], and each message on
//! it, each disconnection and each (re)subscription marks the channel
//! changed for every observer of it in this client.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use lock_core::raw::Wakeups;
use lock_core::{Changes, LockError};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::watch;

use crate::config::RedisConfig;
use crate::error::{map_redis, within};
use crate::server::Connector;

/// How long a channel stays subscribed after its last waiter left.
const LINGER: Duration = Duration::from_secs(5);

/// The observers' signals, per observed channel.
type Observed = Arc<Mutex<HashMap<String, watch::Sender<()>>>>;

fn lock_observed(observed: &Observed) -> MutexGuard<'_, HashMap<String, watch::Sender<()>>> {
    observed.lock().unwrap_or_else(|e| e.into_inner())
}

/// The channel a push message is about, if it names one.
fn push_channel(info: &PushInfo) -> Option<&str> {
    match info.data.first() {
        Some(Value::BulkString(c)) => std::str::from_utf8(c).ok(),
        _ => None,
    }
}

/// The connection a subscriber subscribes on.
#[derive(Clone)]
enum SubscriberConnection {
    /// To one node (for a Sentinel group, the current master).
    Node(ConnectionManager),
    /// To a Redis Cluster: each channel is subscribed on the master of its
    /// slot, and subscribed again where the slot moves after a failover.
    /// A script's `PUBLISH` reaches every node of the cluster.
    Cluster(ClusterConnection),
}

impl SubscriberConnection {
    async fn subscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            SubscriberConnection::Node(conn) => conn.subscribe(channel).await,
            SubscriberConnection::Cluster(conn) => conn.subscribe(channel).await,
        }
    }

    async fn unsubscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            SubscriberConnection::Node(conn) => conn.unsubscribe(channel).await,
            SubscriberConnection::Cluster(conn) => conn.unsubscribe(channel).await,
        }
    }
}

/// The shared subscriber connection of one client to one Redis server (or
/// one cluster).
pub struct Subscriber {
    /// Replaced when a Sentinel group's master changes ([`Subscriber::repoint`]).
    conn: std::sync::RwLock<SubscriberConnection>,
    wakeups: Wakeups,
    /// Observed channels: a signal each, shared by their observers.
    observed: Observed,
    /// Waiters per channel, and whether the SUBSCRIBE has been answered.
    channels: Mutex<HashMap<String, Channel>>,
    /// Serialises SUBSCRIBE and UNSUBSCRIBE so that they reach the server in
    /// the order the channel table decided them.
    io: tokio::sync::Mutex<()>,
    config: RedisConfig,
    /// On a cluster: signalled when a node's connection drops (and when the
    /// subscriber goes, which ends the task that subscribes again).
    node_dropped: Option<Arc<tokio::sync::Notify>>,
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        if let Some(dropped) = &self.node_dropped {
            dropped.notify_one();
        }
    }
}

#[derive(Default)]
struct Channel {
    users: usize,
    subscribed: bool,
    /// Bumped whenever the channel is taken into use; a linger timer only
    /// unsubscribes if nothing used the channel since it was started.
    generation: u64,
}

/// A waiter's claim on a channel; dropping it releases the claim.
pub struct Subscription {
    subscriber: Arc<Subscriber>,
    channel: String,
}

impl Subscriber {
    /// Connect the subscriber. A message (a waiter id) wakes that waiter
    /// ([`Wakeups::wake_one`]); a reconnect wakes everyone. A message on
    /// an observed channel, and a subscription to one being confirmed,
    /// signal its observers; a disconnection signals every observer.
    pub async fn connect(
        client: &redis::Client,
        config: &RedisConfig,
        wakeups: Wakeups,
    ) -> Result<Arc<Self>, LockError> {
        Self::connect_with(&Connector::Node(Box::new(client.clone())), config, wakeups).await
    }

    /// [`Subscriber::connect`] on the server, or the cluster, `connector`
    /// names.
    pub(crate) async fn connect_with(
        connector: &Connector,
        config: &RedisConfig,
        wakeups: Wakeups,
    ) -> Result<Arc<Self>, LockError> {
        let observed = Observed::default();
        let node_dropped = Arc::new(tokio::sync::Notify::new());
        let conn = match connector {
            Connector::Node(client) => SubscriberConnection::Node(
                connect_manager(client, config, &observed, &wakeups).await?,
            ),
            Connector::Cluster(seeds) => {
                let on_push = push_handler(&observed, &wakeups);
                let dropped = Arc::clone(&node_dropped);
                let on_push = move |info: PushInfo| {
                    if info.kind == PushKind::Disconnection {
                        dropped.notify_one();
                    }
                    on_push(info);
                };
                SubscriberConnection::Cluster(
                    seeds
                        .connect(config, Some(Arc::new(on_push)), "connecting the subscriber")
                        .await?,
                )
            }
        };
        let cluster = matches!(conn, SubscriberConnection::Cluster(_));
        let subscriber = Arc::new(Subscriber {
            conn: std::sync::RwLock::new(conn),
            wakeups,
            observed,
            channels: Mutex::new(HashMap::new()),
            io: tokio::sync::Mutex::new(()),
            config: config.clone(),
            node_dropped: cluster.then(|| Arc::clone(&node_dropped)),
        });
        if cluster {
            tokio::spawn(resubscribe_after_node_drops(
                Arc::downgrade(&subscriber),
                node_dropped,
            ));
        }
        Ok(subscriber)
    }

    /// Subscribe every subscribed channel again, then wake every waiter and
    /// signal every observer (messages may have been missed meanwhile).
    async fn subscribe_again(&self) -> Result<(), LockError> {
        let io = self.io.lock().await;
        let mut conn = self.conn();
        self.subscribe_all_on(&mut conn, "subscribing again after a node dropped")
            .await?;
        drop(io);
        wake_everyone(&self.wakeups, &self.observed);
        Ok(())
    }

    /// Subscribe `conn` to every channel subscribed now; the caller holds
    /// `io`.
    async fn subscribe_all_on(
        &self,
        conn: &mut SubscriberConnection,
        doing: &str,
    ) -> Result<(), LockError> {
        let channels: Vec<String> = self
            .channels()
            .iter()
            .filter(|(_, c)| c.subscribed)
            .map(|(name, _)| name.clone())
            .collect();
        for channel in &channels {
            within(&self.config, doing, conn.subscribe(channel))
                .await?
                .map_err(|e| map_redis(doing, e))?;
        }
        Ok(())
    }

    fn conn(&self) -> SubscriberConnection {
        self.conn.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Move to the server `client` names (a Sentinel group's new master):
    /// a new connection, subscribed to every channel the old one was, then
    /// every waiter woken and every observer signalled, since messages on
    /// the new server may have been missed meanwhile.
    pub async fn repoint(&self, client: &redis::Client) -> Result<(), LockError> {
        let conn = SubscriberConnection::Node(
            connect_manager(client, &self.config, &self.observed, &self.wakeups).await?,
        );
        let _io = self.io.lock().await;
        let mut subscribing = conn.clone();
        self.subscribe_all_on(&mut subscribing, "subscribing on the new master")
            .await?;
        *self.conn.write().unwrap_or_else(|e| e.into_inner()) = conn;
        wake_everyone(&self.wakeups, &self.observed);
        Ok(())
    }

    fn channels(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn claim(self: &Arc<Self>, channel: &str) -> (Subscription, bool) {
        let mut channels = self.channels();
        let entry = channels.entry(channel.to_string()).or_default();
        entry.users += 1;
        entry.generation += 1;
        let subscribed = entry.subscribed;
        let claim = Subscription {
            subscriber: Arc::clone(self),
            channel: channel.to_string(),
        };
        (claim, subscribed)
    }

    /// A claim on `channel` if it is subscribed already (no round trip).
    pub fn join_subscribed(self: &Arc<Self>, channel: &str) -> Option<Subscription> {
        match self.claim(channel) {
            (claim, true) => Some(claim),
            (claim, false) => {
                drop(claim);
                None
            }
        }
    }

    /// A claim on `channel`, subscribing first if needed: when this returns,
    /// a message published from now on reaches us.
    pub async fn subscribe(self: &Arc<Self>, channel: &str) -> Result<Subscription, LockError> {
        let (claim, subscribed) = self.claim(channel);
        if subscribed {
            return Ok(claim);
        }
        let _io = self.io.lock().await;
        if self.channels().get(channel).is_some_and(|c| c.subscribed) {
            return Ok(claim);
        }
        let mut conn = self.conn();
        within(&self.config, "subscribing", conn.subscribe(channel))
            .await?
            .map_err(|e| map_redis("subscribing", e))?;
        if let Some(c) = self.channels().get_mut(channel) {
            c.subscribed = true;
        }
        Ok(claim)
    }

    /// Notifications of changes on `channel`: once subscribed (when this
    /// returns, a message published from now on reaches the stream), the
    /// stream yields after each message on it (several close together may
    /// yield once), after a disconnection and after each resubscription,
    /// when messages may have been missed. It does not end: the connection
    /// manager reconnects and resubscribes by itself.
    pub async fn observe(self: &Arc<Self>, channel: &str) -> Result<Changes, LockError> {
        let rx = lock_observed(&self.observed)
            .entry(channel.to_string())
            .or_insert_with(|| watch::channel(()).0)
            .subscribe();
        // Made before subscribing: a failed subscription drops it, which
        // forgets the signal if nobody else observes the channel.
        let observer = Observer {
            rx,
            observed: Arc::clone(&self.observed),
            channel: channel.to_string(),
        };
        let subscription = self.subscribe(channel).await?;
        Ok(Box::pin(
            futures_util::stream::unfold((observer, subscription), |(mut o, s)| async move {
                o.rx.changed().await.ok()?;
                Some((Ok(()), (o, s)))
            })
            .fuse(),
        ))
    }

    fn leave(self: &Arc<Self>, channel: &str) {
        let generation = {
            let mut channels = self.channels();
            let Some(c) = channels.get_mut(channel) else {
                return;
            };
            c.users -= 1;
            if c.users > 0 {
                return;
            }
            c.generation
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (this, channel) = (Arc::clone(self), channel.to_string());
        rt.spawn(async move {
            tokio::time::sleep(LINGER).await;
            let _io = this.io.lock().await;
            {
                let mut channels = this.channels();
                match channels.get(&channel) {
                    Some(c) if c.users == 0 && c.generation == generation => {
                        // Forget it before unsubscribing: a waiter arriving
                        // now subscribes afresh, after this UNSUBSCRIBE.
                        let was_subscribed = c.subscribed;
                        channels.remove(&channel);
                        if !was_subscribed {
                            return;
                        }
                    }
                    _ => return,
                }
            }
            let mut conn = this.conn();
            if !matches!(
                within(&this.config, "unsubscribing", conn.unsubscribe(&channel)).await,
                Ok(Ok(()))
            ) {
                tracing::debug!(target: "distlock", "unsubscribe failed; the channel stays subscribed until reconnect");
            }
        });
    }
}

/// A subscriber connection manager on `client`'s server. A message (a
/// waiter id) wakes that waiter ([`Wakeups::wake_one`]); a reconnect wakes
/// everyone. A message on an observed channel, and a subscription to one
/// being confirmed, signal its observers; a disconnection signals every
/// observer.
async fn connect_manager(
    client: &redis::Client,
    config: &RedisConfig,
    observed: &Observed,
    wakeups: &Wakeups,
) -> Result<ConnectionManager, LockError> {
    let on_push = push_handler(observed, wakeups);
    let on_push = move |info: PushInfo| {
        on_push(info);
        Ok::<(), std::convert::Infallible>(())
    };
    let manager = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.response_timeout))
        .set_automatic_resubscription()
        .set_push_sender(on_push);
    within(
        config,
        "connecting the subscriber",
        client.get_connection_manager_with_config(manager),
    )
    .await?
    .map_err(|e| map_redis("connecting the subscriber", e))
}

/// Wake every waiter and signal every observer: messages may have been
/// missed.
fn wake_everyone(wakeups: &Wakeups, observed: &Observed) {
    wakeups.wake_all();
    for tx in lock_observed(observed).values() {
        tx.send_replace(());
    }
}

/// What a subscriber does with a push message: a message (a waiter id)
/// wakes that waiter ([`Wakeups::wake_one`]); a message on an observed
/// channel, and a subscription to one being confirmed, signal its
/// observers; a disconnection wakes every waiter and signals every
/// observer.
fn push_handler(
    observed: &Observed,
    wakeups: &Wakeups,
) -> impl Fn(PushInfo) + Send + Sync + 'static {
    let (signals, wakeups) = (Arc::clone(observed), wakeups.clone());
    move |info: PushInfo| {
        let signal = |channel: Option<&str>| match channel {
            Some(c) => lock_observed(&signals)
                .get(c)
                .map(|tx| tx.send_replace(()))
                .is_some(),
            None => false,
        };
        match info.kind {
            PushKind::Message => {
                if !signal(push_channel(&info))
                    && let Some(Value::BulkString(waiter)) = info.data.get(1)
                    && let Ok(waiter) = std::str::from_utf8(waiter)
                {
                    wakeups.wake_one(waiter);
                }
            }
            PushKind::Subscribe => {
                signal(push_channel(&info));
            }
            PushKind::Disconnection => wake_everyone(&wakeups, &signals),
            _ => {}
        }
    }
}

/// How often a cluster subscriber tries to subscribe its channels again
/// after a node's connection dropped, and for how long.
const RESUBSCRIBE_RETRY: Duration = Duration::from_millis(250);
const RESUBSCRIBE_FOR: Duration = Duration::from_secs(30);

/// A cluster subscriber's channels after a node's connection dropped: the
/// node may have failed, and the cluster client moves a subscription to
/// the slot's new master only once a command tells it the slot map
/// changed. So each channel is subscribed again (the command that fails on
/// the dead node makes the client reload the slot map and send it to the
/// promoted replica), every [`RESUBSCRIBE_RETRY`] until all are confirmed
/// or [`RESUBSCRIBE_FOR`] has passed; then every waiter looks again. Ends
/// with the subscriber.
async fn resubscribe_after_node_drops(
    subscriber: std::sync::Weak<Subscriber>,
    dropped: Arc<tokio::sync::Notify>,
) {
    loop {
        dropped.notified().await;
        if subscriber.strong_count() == 0 {
            return;
        }
        let started = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(RESUBSCRIBE_RETRY).await;
            let Some(s) = subscriber.upgrade() else {
                return;
            };
            match s.subscribe_again().await {
                Ok(()) => break,
                Err(e) if started.elapsed() < RESUBSCRIBE_FOR => {
                    tracing::debug!(target: "distlock", error = %e.report(),
                        "a cluster node dropped; subscribing the channels again");
                }
                Err(e) => {
                    tracing::warn!(target: "distlock", error = %e.report(),
                        "the channels could not be subscribed again; waiters fall back to their backstop");
                    break;
                }
            }
        }
    }
}

/// One observer of a channel: its signal's receiver.
struct Observer {
    rx: watch::Receiver<()>,
    observed: Observed,
    channel: String,
}

impl Drop for Observer {
    /// The channel's signal goes with its last observer.
    fn drop(&mut self) {
        let mut observed = lock_observed(&self.observed);
        if observed
            .get(&self.channel)
            .is_some_and(|tx| tx.receiver_count() <= 1)
        {
            observed.remove(&self.channel);
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.subscriber.leave(&self.channel);
    }
}
