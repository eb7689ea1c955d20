//! The server a Redis lock client talks to: one fixed node, the master a
//! Sentinel group currently names, followed across failovers, or a Redis
//! Cluster (the cluster client routes each command to the master of its
//! keys' slot and follows `MOVED`, `ASK` and failovers by itself).
//!
//! A [`Server`] is what every command of the client goes through (it is a
//! [`ConnectionLike`]). For one node it is that node's connection manager.
//! For a Sentinel group it is the current master's connection manager,
//! replaced when the master changes: after the master's connection drops
//! (the manager reports a disconnection), or a command fails in a way a
//! demoted or dead master fails (`READONLY`, an I/O error, a refused
//! connection), the next command first asks the Sentinels for the master
//! (the one a majority of them stand for, see [`crate::sentinels`],
//! checked to answer `ROLE` as one). A new master means a new
//! connection manager and a [`Server::switches`] signal. A disconnection
//! also starts a background lookup, repeated every [`LOOKUP_RETRY`] until a
//! master answers, so that an idle client (one that only holds locks)
//! finds the new master as soon as the Sentinels name it. The client then
//! re-checks every lock it holds there (those whose keys did not reach the
//! new master fire `lost()`) and moves its subscriber.
//!
//! The command that met the failure is not sent again: it fails with
//! `Unavailable`, and the caller's retry finds the new master.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use lock_core::LockError;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::SentinelClient;
use redis::{Cmd, ErrorKind, Pipeline, PushKind, RedisError, RedisFuture, RedisResult, Value};
use tokio::sync::{Notify, watch};

use crate::config::{NodeMap, RedisConfig};
use crate::error::{map_redis, within};
use crate::sentinels::{self, Sentinels};

/// How often a master in doubt is looked up again while no Sentinel names
/// one that answers.
pub(crate) const LOOKUP_RETRY: Duration = Duration::from_millis(200);

/// Where a client's commands go.
#[derive(Clone)]
pub(crate) enum Server {
    /// One node, for the client's lifetime: its connection and its client
    /// (address, credentials, database and TLS set-up).
    Node(ConnectionManager, Box<redis::Client>),
    /// The current master of a Sentinel group.
    Sentinel(Arc<Follower>),
    /// A Redis Cluster: each command goes to the master of its keys' slot.
    Cluster(ClusterConnection, Arc<ClusterSeeds>),
}

/// A Redis Cluster's seed nodes and credentials, from which the client's
/// cluster connections are made. Not `Debug`: it carries the password.
pub(crate) struct ClusterSeeds {
    /// Each seed node's client URL (`redis://host:port/0?protocol=resp3`,
    /// `rediss://` for TLS), without credentials.
    pub(crate) nodes: Vec<String>,
    /// The nodes' user and password.
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    /// TLS to every node (`rediss+cluster://`).
    pub(crate) tls: bool,
    /// Addresses the nodes announce, each with the address the client
    /// reaches that node through (the URL's `node_map`).
    pub(crate) reached_through: crate::config::NodeMap,
}

/// How many times the cluster client sends a command again after a
/// redirection or a failed node, within the overall response bound.
const CLUSTER_RETRIES: u32 = 4;

impl ClusterSeeds {
    /// A cluster client builder on these seeds with `config`'s bounds:
    /// each reply within `response_timeout`, a whole request (its retries
    /// after `MOVED`, `ASK` or a failed node included) within a connect and
    /// a response timeout, RESP3.
    pub(crate) fn builder(&self, config: &RedisConfig) -> ClusterClientBuilder {
        let mut builder = ClusterClientBuilder::new(self.nodes.iter().map(String::as_str))
            .use_protocol(redis::ProtocolVersion::RESP3)
            .connection_timeout(config.connect_timeout)
            .response_timeout(config.response_timeout)
            .overall_response_timeout(Some(config.connect_timeout + config.response_timeout))
            .retries(CLUSTER_RETRIES)
            .min_retry_wait(50)
            .max_retry_wait(500);
        if let Some(user) = &self.user {
            builder = builder.username(user);
        }
        if let Some(password) = &self.password {
            builder = builder.password(password);
        }
        if self.tls {
            builder = builder.tls(redis::TlsMode::Secure);
        }
        if !self.reached_through.is_empty() {
            builder = builder.node_address_map(self.reached_through.iter().cloned().collect());
        }
        builder
    }

    /// A cluster connection on these seeds, within the connect and
    /// response bounds, with `push` receiving its push messages if given.
    pub(crate) async fn connect(
        &self,
        config: &RedisConfig,
        push: Option<Arc<dyn Fn(redis::PushInfo) + Send + Sync>>,
        doing: &str,
    ) -> Result<ClusterConnection, LockError> {
        if self.tls {
            crate::config::install_tls_provider();
        }
        let mut builder = self.builder(config);
        if let Some(push) = push {
            builder = builder.push_sender(move |info: redis::PushInfo| {
                push(info);
                Ok::<(), std::convert::Infallible>(())
            });
        }
        let client = builder.build().map_err(|e| LockError::InvalidUrl {
            url: "redis+cluster://…".to_string(),
            reason: format!(
                "rejected by the redis cluster client: {}",
                e.detail().unwrap_or("invalid")
            ),
        })?;
        within(config, doing, client.get_async_connection())
            .await?
            .map_err(|e| map_redis(doing, e))
    }
}

impl Server {
    /// The client of the server commands go to now (its address,
    /// credentials, database and TLS set-up), for connections of their own.
    pub(crate) fn connector(&self) -> Connector {
        match self {
            Server::Node(_, client) => Connector::Node(client.clone()),
            Server::Sentinel(f) => Connector::Node(Box::new(f.master().client.clone())),
            Server::Cluster(_, seeds) => Connector::Cluster(Arc::clone(seeds)),
        }
    }

    /// Signals each change of master (`None` for one node and for a
    /// cluster, whose client follows its masters by itself).
    pub(crate) fn switches(&self) -> Option<watch::Receiver<u64>> {
        match self {
            Server::Node(..) | Server::Cluster(..) => None,
            Server::Sentinel(f) => Some(f.switches.subscribe()),
        }
    }

    /// Whether a master may change under the client's locks.
    pub(crate) fn follows_failovers(&self) -> bool {
        !matches!(self, Server::Node(..))
    }

    /// Whether commands go to a Redis Cluster, where one script run only
    /// touches the keys of one slot.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Server::Cluster(..))
    }
}

/// How to open connections of their own to the server commands go to now
/// (a release at shutdown, the subscriber). Not `Debug`: it carries
/// credentials.
#[derive(Clone)]
pub(crate) enum Connector {
    /// One node's client (for a Sentinel group, its current master's).
    Node(Box<redis::Client>),
    /// A cluster's seeds.
    Cluster(Arc<ClusterSeeds>),
}

impl Connector {
    /// A connection of its own, bounded by `config`'s timeouts.
    pub(crate) async fn connect(&self, config: &RedisConfig) -> Result<OwnConnection, LockError> {
        let doing = "connecting to release at shutdown";
        match self {
            Connector::Node(client) => {
                let connection = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(config.connect_timeout))
                    .set_response_timeout(Some(config.response_timeout));
                client
                    .get_multiplexed_async_connection_with_config(&connection)
                    .await
                    .map(OwnConnection::Node)
                    .map_err(|e| map_redis(doing, e))
            }
            Connector::Cluster(seeds) => seeds
                .connect(config, None, doing)
                .await
                .map(OwnConnection::Cluster),
        }
    }
}

/// A connection of its own (see [`Connector::connect`]).
#[derive(Clone)]
pub(crate) enum OwnConnection {
    /// To one node.
    Node(redis::aio::MultiplexedConnection),
    /// To a cluster.
    Cluster(ClusterConnection),
}

impl ConnectionLike for OwnConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            OwnConnection::Node(conn) => conn.req_packed_command(cmd),
            OwnConnection::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            OwnConnection::Node(conn) => conn.req_packed_commands(pipeline, offset, count),
            OwnConnection::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            OwnConnection::Node(conn) => conn.get_db(),
            OwnConnection::Cluster(conn) => conn.get_db(),
        }
    }
}

impl ConnectionLike for Server {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Server::Node(conn, _) => conn.req_packed_command(cmd),
            Server::Cluster(conn, _) => conn.req_packed_command(cmd),
            Server::Sentinel(f) => Box::pin(async move {
                let (mut conn, generation) = f.connection().await?;
                let reply = conn.req_packed_command(cmd).await;
                f.after(generation, reply)
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Server::Node(conn, _) => conn.req_packed_commands(pipeline, offset, count),
            Server::Cluster(conn, _) => conn.req_packed_commands(pipeline, offset, count),
            Server::Sentinel(f) => Box::pin(async move {
                let (mut conn, generation) = f.connection().await?;
                let reply = conn.req_packed_commands(pipeline, offset, count).await;
                f.after(generation, reply)
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Server::Node(conn, _) => conn.get_db(),
            Server::Cluster(conn, _) => conn.get_db(),
            Server::Sentinel(f) => f.master().conn.get_db(),
        }
    }
}

/// The connection-manager settings of a client's command connection:
/// every reply within `response_timeout`, one reconnect attempt within
/// `connect_timeout`, so an outage fails fast.
pub(crate) fn manager_config(config: &RedisConfig) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.response_timeout))
        .set_number_of_retries(1)
        .set_max_delay(config.connect_timeout)
}

/// One master of the group, as found.
pub(crate) struct Master {
    pub(crate) client: redis::Client,
    pub(crate) conn: ConnectionManager,
    /// `host:port`, for logs and equality.
    address: String,
    /// Counts the masters this client has followed.
    generation: u64,
    /// The Sentinels' configuration epoch this master was named at (0 for
    /// a node not found through Sentinels).
    epoch: u64,
}

/// Follows a Sentinel group's master.
pub(crate) struct Follower {
    /// Asks the Sentinels; held while a master is looked up, so that one
    /// lookup runs at a time.
    sentinel: tokio::sync::Mutex<SentinelClient>,
    /// The same Sentinels, asked directly: their majority decides.
    sentinels: Sentinels,
    current: RwLock<Arc<Master>>,
    /// Set when the current master may no longer be the master.
    doubt: Arc<AtomicBool>,
    /// Starts the background lookup (see [`Follower::doubted`]).
    wake: Arc<Notify>,
    switches: watch::Sender<u64>,
    config: RedisConfig,
    /// The group's name, for logs and errors.
    group: String,
    /// Where the nodes the Sentinels name are reached.
    node_map: NodeMap,
}

impl Follower {
    /// Find the group's master through `sentinel` and connect to it,
    /// reaching the nodes the Sentinels name through `node_map`.
    pub(crate) async fn connect(
        (sentinel, sentinels): (SentinelClient, Sentinels),
        group: String,
        config: RedisConfig,
        node_map: NodeMap,
    ) -> Result<Arc<Self>, LockError> {
        let sentinel = tokio::sync::Mutex::new(sentinel);
        let doubt = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(Notify::new());
        let first = {
            let mut asking = sentinel.lock().await;
            let group = Group {
                name: &group,
                sentinels: &sentinels,
                node_map: &node_map,
            };
            find_master(&mut asking, group, &config, (&doubt, &wake)).await?
        };
        tracing::debug!(target: "distlock", group = %group, master = %first.address,
            "redis lock client follows the sentinel group's master");
        let follower = Arc::new(Follower {
            sentinel,
            sentinels,
            current: RwLock::new(Arc::new(first)),
            doubt,
            wake,
            switches: watch::channel(0).0,
            config,
            group,
            node_map,
        });
        tokio::spawn(look_up_when_doubted(
            Arc::downgrade(&follower),
            Arc::clone(&follower.wake),
        ));
        Ok(follower)
    }

    /// Doubt the current master: the next command, and a background
    /// lookup now, ask the Sentinels first.
    fn doubted(&self) {
        doubt(&self.doubt, &self.wake);
    }

    pub(crate) fn master(&self) -> Arc<Master> {
        Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The connection to send on, and its master's generation: the current
    /// master's, after asking the Sentinels if it is in doubt.
    async fn connection(&self) -> RedisResult<(ConnectionManager, u64)> {
        if self.doubt.load(Ordering::Acquire) {
            self.follow().await?;
        }
        let master = self.master();
        Ok((master.conn.clone(), master.generation))
    }

    /// Doubt the master if `reply` is how a demoted or unreachable master
    /// answers.
    fn after<T>(&self, generation: u64, reply: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &reply
            && (e.kind() == ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
                || e.is_io_error()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || e.is_timeout())
            && self.master().generation == generation
        {
            tracing::debug!(target: "distlock", group = %self.group, error = %e,
                "the master failed a command; asking the sentinels before the next one");
            self.doubted();
        }
        reply
    }

    /// Ask the Sentinels for the master; switch to it if it is another.
    async fn follow(&self) -> RedisResult<()> {
        let mut asking = self.sentinel.lock().await;
        if !self.doubt.load(Ordering::Acquire) {
            // Another command asked meanwhile.
            return Ok(());
        }
        let current = self.master();
        // Cleared first: a disconnection from here on doubts again.
        self.doubt.store(false, Ordering::Release);
        let group = Group {
            name: &self.group,
            sentinels: &self.sentinels,
            node_map: &self.node_map,
        };
        let found = lookup(&mut asking, group, &self.config, current.epoch).await;
        let (client, epoch) = match found {
            Ok(found) => found,
            Err(e) => {
                self.doubted();
                return Err(e);
            }
        };
        let address = client.get_connection_info().addr().to_string();
        if address == current.address {
            return Ok(());
        }
        let generation = current.generation + 1;
        let opened = open(
            client,
            address,
            &self.config,
            (&self.doubt, &self.wake),
            (generation, epoch),
        );
        let master = match opened.await {
            Ok(master) => master,
            Err(e) => {
                self.doubted();
                return Err(e);
            }
        };
        tracing::info!(target: "distlock", group = %self.group, from = %current.address,
            to = %master.address, "the sentinel group's master changed; following it");
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(master);
        self.switches.send_replace(generation);
        Ok(())
    }
}

impl Drop for Follower {
    /// Ends the background lookup task.
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

/// Set `doubt` and start the background lookup.
fn doubt(doubt: &AtomicBool, wake: &Notify) {
    doubt.store(true, Ordering::Release);
    wake.notify_one();
}

/// The background lookup: each time the master is doubted, look it up
/// every [`LOOKUP_RETRY`] until the doubt is settled. Ends with the
/// follower.
async fn look_up_when_doubted(follower: std::sync::Weak<Follower>, wake: Arc<Notify>) {
    loop {
        wake.notified().await;
        loop {
            let Some(f) = follower.upgrade() else {
                return;
            };
            if !f.doubt.load(Ordering::Acquire) {
                break;
            }
            if let Err(e) = f.follow().await {
                tracing::debug!(target: "distlock", group = %f.group, error = %e,
                    "no master found yet; asking the sentinels again");
            }
            let settled = !f.doubt.load(Ordering::Acquire);
            drop(f);
            if settled {
                break;
            }
            tokio::time::sleep(LOOKUP_RETRY).await;
        }
    }
}

/// A Sentinel group, as a lookup of its master needs it.
#[derive(Clone, Copy)]
struct Group<'a> {
    /// Its name (`SENTINEL MONITOR`'s).
    name: &'a str,
    /// Its Sentinels, asked directly.
    sentinels: &'a Sentinels,
    /// Where the nodes they name are reached.
    node_map: &'a NodeMap,
}

/// Ask the Sentinels which node is the master, within the connect and
/// response timeouts: the one a majority of them stand for (see
/// [`crate::sentinels`]), of a configuration epoch not below `floor`,
/// checked to answer `ROLE` as a master; with that epoch. redis-rs's
/// lookup runs beside it and gives the client for the node (credentials,
/// database, TLS); where the first Sentinel it asked named another node,
/// the same client is pointed at the one chosen.
async fn lookup(
    sentinel: &mut SentinelClient,
    group: Group<'_>,
    config: &RedisConfig,
    floor: u64,
) -> RedisResult<(redis::Client, u64)> {
    let limit = config.connect_timeout + config.response_timeout;
    let (found, answers) = tokio::join!(
        tokio::time::timeout(limit, sentinel.async_get_client()),
        group.sentinels.ask(group.name, limit),
    );
    let named = match found {
        Ok(found) => found?,
        Err(_) => {
            return Err(RedisError::from((
                ErrorKind::Io,
                "no sentinel named a master in time",
                format!("group {:?}, {limit:?}", group.name),
            )));
        }
    };
    let chosen = sentinels::choose(&answers, floor).map_err(|why| {
        RedisError::from((
            ErrorKind::Io,
            "the sentinels do not agree on a master",
            format!("group {:?}: {why}", group.name),
        ))
    })?;
    let (host, port) = host_port(named.get_connection_info().addr()).unwrap_or_default();
    if host == chosen.host && port == chosen.port {
        // redis-rs checked its role.
        return Ok((reached(named, group.node_map)?, chosen.epoch));
    }
    tracing::debug!(target: "distlock", group = %group.name, first = %format!("{host}:{port}"),
        chosen = %format!("{}:{}", chosen.host, chosen.port), epoch = chosen.epoch,
        "a sentinel named a master the majority's newest configuration does not");
    let client = reached(at(&named, &chosen.host, chosen.port)?, group.node_map)?;
    let role = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("ROLE")
            .query_async::<Vec<Value>>(&mut conn)
            .await
    };
    match tokio::time::timeout(limit, role).await {
        Ok(Ok(role)) if matches!(role.first(), Some(Value::BulkString(r)) if r == b"master") => {
            Ok((client, chosen.epoch))
        }
        Ok(Err(e)) => Err(e),
        _ => Err(RedisError::from((
            ErrorKind::Io,
            "the master the sentinels name does not answer as one yet",
            format!("group {:?}: {}:{}", group.name, chosen.host, chosen.port),
        ))),
    }
}

/// The host and port of a TCP address.
fn host_port(addr: &redis::ConnectionAddr) -> Option<(String, u16)> {
    match addr {
        redis::ConnectionAddr::Tcp(host, port)
        | redis::ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port)),
        _ => None,
    }
}

/// `client`'s settings (credentials, database, TLS) on `host:port`.
fn at(client: &redis::Client, host: &str, port: u16) -> RedisResult<redis::Client> {
    let info = client.get_connection_info();
    let addr = match info.addr().clone() {
        redis::ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => redis::ConnectionAddr::TcpTls {
            host: host.to_string(),
            port,
            insecure,
            tls_params,
        },
        _ => redis::ConnectionAddr::Tcp(host.to_string(), port),
    };
    redis::Client::open(info.clone().set_addr(addr))
}

/// `client`, or, if `node_map` names its address, the same client on the
/// address it maps it to.
fn reached(client: redis::Client, node_map: &NodeMap) -> RedisResult<redis::Client> {
    let Some((host, port)) = host_port(client.get_connection_info().addr()) else {
        return Ok(client);
    };
    let Some((_, via)) = node_map
        .iter()
        .find(|(named, _)| named.host() == host && named.port() == port)
    else {
        return Ok(client);
    };
    at(&client, via.host(), via.port())
}

/// A connection manager on the master `client` names, whose disconnection
/// doubts the master (`doubting`: the flag and the lookup's wake-up).
async fn open(
    client: redis::Client,
    address: String,
    config: &RedisConfig,
    doubting: (&Arc<AtomicBool>, &Arc<Notify>),
    (generation, epoch): (u64, u64),
) -> RedisResult<Master> {
    crate::config::ensure_tls_provider(&client);
    let (flag, wake) = (Arc::clone(doubting.0), Arc::clone(doubting.1));
    let on_push = move |info: redis::PushInfo| {
        if info.kind == PushKind::Disconnection {
            doubt(&flag, &wake);
        }
        Ok::<(), std::convert::Infallible>(())
    };
    let manager = manager_config(config).set_push_sender(on_push);
    let limit = config.connect_timeout + config.response_timeout;
    let conn = match tokio::time::timeout(limit, client.get_connection_manager_with_config(manager))
        .await
    {
        Ok(conn) => conn?,
        Err(_) => {
            return Err(RedisError::from((
                ErrorKind::Io,
                "the master did not answer in time",
                address,
            )));
        }
    };
    Ok(Master {
        client,
        conn,
        address,
        generation,
        epoch,
    })
}

/// The first master: looked up and connected, failures as `LockError`.
async fn find_master(
    sentinel: &mut SentinelClient,
    group: Group<'_>,
    config: &RedisConfig,
    doubting: (&Arc<AtomicBool>, &Arc<Notify>),
) -> Result<Master, LockError> {
    let doing = format!("finding the master of sentinel group {:?}", group.name);
    let (client, epoch) = within(config, &doing, lookup(sentinel, group, config, 0))
        .await?
        .map_err(|e| map_redis(&doing, e))?;
    let address = client.get_connection_info().addr().to_string();
    open(client, address, config, doubting, (0, epoch))
        .await
        .map_err(|e| map_redis(&doing, e))
}
