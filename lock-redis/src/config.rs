//! Client settings and the `redis://` / `rediss://` URL form.

use std::fmt;
use std::time::Duration;

use lock_core::LockError;
use lock_core::raw::{HostPort, LockUrl};

/// Settings for a [`RedisLock`](crate::RedisLock).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisConfig {
    /// Prepended to every key and channel; default `distlock:`. Printable
    /// ASCII without `{`, `}` or spaces (the braces delimit the Redis Cluster
    /// hash tag that keeps a lock's keys in one slot), at most 64 bytes.
    pub prefix: String,
    /// Bound on establishing a connection; default 2 s.
    pub connect_timeout: Duration,
    /// Bound on each command's reply, after which the call fails with
    /// `Unavailable`; default 2 s.
    pub response_timeout: Duration,
    /// How long a release reserves the lock for the waiter it hands it to.
    /// Only matters when that waiter died or cannot reach Redis: the others
    /// then wait this long. Default 1 s.
    pub handoff_window: Duration,
    /// Replicas that must acknowledge a grant or a renewal (`WAIT`) before
    /// it counts; default 0 (none asked). A grant that fewer replicas
    /// acknowledge within [`replicas_timeout`](Self::replicas_timeout) is
    /// given back and the attempt fails with `Unavailable`; a renewal is
    /// retried, as after a network error. It makes a failover that loses
    /// the lock rarer, not impossible: a replica that did not acknowledge
    /// can still be promoted. At most 16.
    pub replicas: u8,
    /// How long a grant or renewal waits for [`replicas`](Self::replicas)
    /// to acknowledge it; default 500 ms, below `response_timeout`. The
    /// client's other commands on the same connection wait behind it.
    pub replicas_timeout: Duration,
}

impl RedisConfig {
    /// With [`prefix`](Self::prefix).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// With [`connect_timeout`](Self::connect_timeout).
    pub fn with_connect_timeout(mut self, connect_timeout: Duration) -> Self {
        self.connect_timeout = connect_timeout;
        self
    }

    /// With [`response_timeout`](Self::response_timeout).
    pub fn with_response_timeout(mut self, response_timeout: Duration) -> Self {
        self.response_timeout = response_timeout;
        self
    }

    /// With [`handoff_window`](Self::handoff_window).
    pub fn with_handoff_window(mut self, handoff_window: Duration) -> Self {
        self.handoff_window = handoff_window;
        self
    }

    /// With [`replicas`](Self::replicas) and
    /// [`replicas_timeout`](Self::replicas_timeout).
    pub fn with_replicas(mut self, replicas: u8, timeout: Duration) -> Self {
        self.replicas = replicas;
        self.replicas_timeout = timeout;
        self
    }

    /// The acknowledgement grants and renewals ask for, if any.
    pub(crate) fn acknowledgement(&self) -> Option<crate::script_call::Acknowledge> {
        (self.replicas > 0).then_some(crate::script_call::Acknowledge {
            replicas: self.replicas,
            timeout: self.replicas_timeout,
        })
    }
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            prefix: "distlock:".to_string(),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(2),
            handoff_window: Duration::from_secs(1),
            replicas: 0,
            replicas_timeout: Duration::from_millis(500),
        }
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("handoff_window", &self.handoff_window)
            .field("replicas", &self.replicas)
            .field("replicas_timeout", &self.replicas_timeout)
            .finish()
    }
}

impl RedisConfig {
    /// The settings a `redis://` or `rediss://` URL carries (its options),
    /// read as [`RedisLock::connect`](crate::RedisLock::connect) reads them,
    /// for [`RedisLock::with_client`](crate::RedisLock::with_client): code
    /// and URL configure the same thing.
    ///
    /// ```
    /// let config = lock_redis::RedisConfig::from_url("redis://h?prefix=app:&response_timeout=2s")?;
    /// assert_eq!(config.prefix, "app:");
    /// # Ok::<(), lock_core::LockError>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        Ok(parse_url(url)?.config)
    }

    /// Check the settings; [`LockError::InvalidOptions`] says what is wrong.
    pub fn validate(&self) -> Result<(), LockError> {
        let p = &self.prefix;
        if p.len() > 64
            || !p
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
        {
            return Err(LockError::invalid_options(format!(
                "redis key prefix {:?} must be at most 64 printable ASCII characters without `{{`, `}}` or spaces",
                p.chars().take(80).collect::<String>()
            )));
        }
        for (what, d) in [
            ("connect_timeout", self.connect_timeout),
            ("response_timeout", self.response_timeout),
            ("handoff_window", self.handoff_window),
            ("replicas_timeout", self.replicas_timeout),
        ] {
            if d.is_zero() || d > Duration::from_secs(3600) {
                return Err(LockError::invalid_options(format!(
                    "redis {what} must be between 1 ms and 1 h, got {d:?}"
                )));
            }
        }
        if self.replicas > 16 {
            return Err(LockError::invalid_options(format!(
                "redis replicas must be at most 16, got {}",
                self.replicas
            )));
        }
        if self.replicas > 0 && self.replicas_timeout >= self.response_timeout {
            return Err(LockError::invalid_options(format!(
                "redis replicas_timeout ({:?}) must be below response_timeout ({:?}): a grant's reply waits for the replicas",
                self.replicas_timeout, self.response_timeout
            )));
        }
        Ok(())
    }
}

/// What a URL connects to. Not `Debug`: it carries credentials.
pub(crate) enum Target {
    /// One node: the URL for `redis::Client::open`, credentials included.
    Node(String),
    /// The master of a Sentinel group, looked up through `sentinels`.
    Sentinel {
        /// The Sentinels' addresses, in the URL's order.
        sentinels: Vec<redis::ConnectionAddr>,
        /// The group's name (`SENTINEL MONITOR`'s master name).
        group: String,
        /// The data nodes' database, user and password.
        db: u16,
        user: Option<String>,
        password: Option<String>,
        /// TLS to the Sentinels and to the nodes (`rediss+sentinel://`).
        tls: bool,
        /// Where the client reaches the nodes the Sentinels name.
        node_map: NodeMap,
    },
    /// A Redis Cluster, found through `seeds`.
    Cluster(crate::server::ClusterSeeds),
}

/// A parsed connection URL: what to connect to (our own query options
/// removed, RESP3 requested) and our settings. Not `Debug`: the target
/// carries the password.
pub(crate) struct ParsedUrl {
    /// What to connect to, credentials included.
    pub(crate) target: Target,
    /// Our settings, from the query options.
    pub(crate) config: RedisConfig,
    /// `scheme://host:port/db`, safe to show.
    pub(crate) display: String,
}

/// Parse `redis://[user:pass@]host[:port][/db][?prefix=…&connect_timeout=…&response_timeout=…&handoff_window=…&replicas=…&replicas_timeout=…]`
/// (or `rediss://` for TLS), or a Sentinel group's
/// `redis+sentinel://[user:pass@]s1[:26379],s2[:26379],…/GROUP[/db][?…]`
/// (`rediss+sentinel://` for TLS to the Sentinels and the nodes; the
/// credentials are the data nodes'), or a Redis Cluster's
/// `redis+cluster://[user:pass@]h1[:6379],h2[:6379],…[?…]` (`rediss+cluster://`
/// for TLS; any reachable nodes of the cluster, which has one database).
/// On both, `node_map=ANNOUNCED>VIA,…` makes the client reach a node that
/// announces (or is named by) `ANNOUNCED` through `VIA`, for servers
/// behind port forwarding.
/// Durations carry their unit (`250ms`,
/// `2s`); the older `*_ms` names (whole milliseconds) are accepted too.
pub(crate) fn parse_url(raw: &str) -> Result<ParsedUrl, LockError> {
    let url = LockUrl::parse(raw)?;
    url.expect_scheme(&[
        "redis",
        "rediss",
        "redis+sentinel",
        "rediss+sentinel",
        "redis+cluster",
        "rediss+cluster",
    ])?;
    let sentinel = url.scheme().ends_with("+sentinel");
    let cluster = url.scheme().ends_with("+cluster");
    let tls = url.scheme().starts_with("rediss");
    let mut config = RedisConfig::default();
    let mut options = url.options()?;
    if let Some(prefix) = options.text("prefix")? {
        config.prefix = prefix;
    }
    for (key, setting) in [
        ("connect_timeout", &mut config.connect_timeout),
        ("response_timeout", &mut config.response_timeout),
        ("handoff_window", &mut config.handoff_window),
        ("replicas_timeout", &mut config.replicas_timeout),
    ] {
        if let Some(d) = options.duration(key)? {
            *setting = d;
        }
    }
    if let Some(n) = options.number("replicas")? {
        config.replicas = n;
    }
    // Always RESP3 (waiters are woken by push messages): `protocol` is
    // accepted and replaced.
    options.text("protocol")?;
    let node_map = match options.text("node_map")? {
        Some(map) if cluster || sentinel => node_map(&url, &map)?,
        Some(_) => {
            return Err(url.invalid(
                "`node_map` is an option of redis+cluster:// and redis+sentinel:// URLs",
            ));
        }
        None => NodeMap::default(),
    };
    options.finish()?;
    config.validate()?;
    if cluster {
        return cluster_target(&url, tls, config, node_map);
    }
    if !sentinel {
        let host = url.single_host()?;
        let db = database(&url)?;
        return Ok(ParsedUrl {
            target: Target::Node(client_url(&url, tls, host, db)),
            config,
            display: format!("{}://{}/{db}", url.scheme(), host.with_default_port(6379)),
        });
    }
    if url.hosts().is_empty() {
        return Err(url.invalid("a Sentinel URL names at least one Sentinel"));
    }
    let path = url.path().trim_start_matches('/');
    let (group, db) = path.split_once('/').unwrap_or((path, ""));
    if group.is_empty() {
        return Err(url.invalid("the path must name the Sentinel group: /GROUP[/db]"));
    }
    let db = if db.is_empty() {
        0
    } else {
        db.parse()
            .map_err(|_| url.invalid(format!("the database must be a number, got {db:?}")))?
    };
    let mut sentinels = Vec::with_capacity(url.hosts().len());
    for host in url.hosts() {
        let port = host.port.unwrap_or(26379);
        let name = host
            .host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        sentinels.push(if tls {
            redis::ConnectionAddr::TcpTls {
                host: name,
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            redis::ConnectionAddr::Tcp(name, port)
        });
    }
    let shown: Vec<String> = url
        .hosts()
        .iter()
        .map(|h| h.with_default_port(26379))
        .collect();
    Ok(ParsedUrl {
        display: format!("{}://{}/{group}/{db}", url.scheme(), shown.join(",")),
        target: Target::Sentinel {
            sentinels,
            group: group.to_string(),
            db,
            user: url.user().filter(|u| !u.is_empty()).map(str::to_string),
            password: url.password().map(str::to_string),
            tls,
            node_map,
        },
        config,
    })
}

/// Addresses nodes announce (in `CLUSTER SLOTS`, or as the Sentinels name
/// them), each with the address the client reaches that node through.
pub(crate) type NodeMap = Vec<(redis::cluster::NodeAddress, redis::cluster::NodeAddress)>;

/// The URL's `node_map=ANNOUNCED>VIA[,ANNOUNCED>VIA…]`, each side
/// `HOST:PORT`.
fn node_map(url: &LockUrl, map: &str) -> Result<NodeMap, LockError> {
    let address = |a: &str| {
        a.parse::<redis::cluster::NodeAddress>()
            .map_err(|_| url.invalid(format!("`node_map`: {a:?} is not HOST:PORT")))
    };
    map.split(',')
        .map(|pair| {
            let (announced, via) = pair
                .split_once('>')
                .ok_or_else(|| url.invalid(format!("`node_map`: {pair:?} is not ANNOUNCED>VIA")))?;
            Ok((address(announced)?, address(via)?))
        })
        .collect()
}

/// A Redis Cluster's URL: its seed nodes (port 6379 where none is written),
/// no database (a cluster has only database 0), and the node map.
fn cluster_target(
    url: &LockUrl,
    tls: bool,
    config: RedisConfig,
    reached_through: NodeMap,
) -> Result<ParsedUrl, LockError> {
    if url.hosts().is_empty() {
        return Err(url.invalid("a Cluster URL names at least one node"));
    }
    if !url.path().trim_start_matches('/').is_empty() {
        return Err(url.invalid("a Redis Cluster has one database: the URL takes no path"));
    }
    let nodes: Vec<String> = url
        .hosts()
        .iter()
        .map(|h| h.with_default_port(6379))
        .collect();
    Ok(ParsedUrl {
        display: format!("{}://{}", url.scheme(), nodes.join(",")),
        target: Target::Cluster(crate::server::ClusterSeeds {
            nodes: nodes
                .iter()
                .map(|node| {
                    format!(
                        "{}://{node}/0?protocol=resp3",
                        if tls { "rediss" } else { "redis" }
                    )
                })
                .collect(),
            user: url.user().filter(|u| !u.is_empty()).map(str::to_string),
            password: url.password().map(str::to_string),
            tls,
            reached_through,
        }),
        config,
    })
}

/// The database number a Redis URL's path names (`/3`); 0 without a path.
pub fn database(url: &LockUrl) -> Result<u16, LockError> {
    let db = url.path().trim_start_matches('/');
    if db.is_empty() {
        return Ok(0);
    }
    db.parse()
        .map_err(|_| url.invalid(format!("the path must be a database number, got {db:?}")))
}

/// The URL `redis::Client::open` takes for one server: `url`'s
/// credentials, `host` (port 6379 if none), database `db`, RESP3, TLS
/// (`rediss://`) if `tls`. Not for display: it holds the password.
pub fn client_url(url: &LockUrl, tls: bool, host: &HostPort, db: u16) -> String {
    format!(
        "{}://{}{}/{db}?protocol=resp3",
        if tls { "rediss" } else { "redis" },
        url.userinfo_for_client(),
        host.with_default_port(6379)
    )
}

/// Before a TLS client connects, make sure rustls has a process-wide
/// crypto provider: the redis client builds its TLS configuration from the
/// default provider, and when a program links more than one (another
/// backend's client may bring its own) there is none until one is
/// installed. Nothing is installed for a client without TLS, nor when the
/// application has installed a provider already, so that an application
/// that installs its own (aws-lc-rs, say) after connecting a plain
/// `redis://` lock still can.
pub fn ensure_tls_provider(client: &redis::Client) {
    let tls = matches!(
        client.get_connection_info().addr(),
        redis::ConnectionAddr::TcpTls { .. }
    );
    if tls {
        install_tls_provider();
    }
}

/// Install rustls's ring provider as the process default unless one is
/// installed already (see [`ensure_tls_provider`]).
pub(crate) fn install_tls_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The client a lock uses for a client the application made, and its
/// address as shown in errors, without credentials. Waiters are woken by
/// RESP3 push messages: a client that speaks RESP2 (redis-rs's default) is
/// copied with RESP3 asked for, the same address, credentials, database and
/// TLS set-up; the application's client is left as it is. The server must
/// speak RESP3 (Redis ≥ 6). A client whose settings the redis crate
/// refuses is [`LockError::InvalidOptions`].
pub fn client_for_lock(client: &redis::Client) -> Result<(redis::Client, String), LockError> {
    let info = client.get_connection_info();
    let scheme = match info.addr() {
        redis::ConnectionAddr::TcpTls { .. } => "rediss",
        redis::ConnectionAddr::Unix(_) => "redis+unix",
        _ => "redis",
    };
    let display = format!("{scheme}://{}/{}", info.addr(), info.redis_settings().db());
    if info.redis_settings().protocol() == redis::ProtocolVersion::RESP3 {
        return Ok((client.clone(), display));
    }
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    let resp3 = redis::Client::open(info.clone().set_redis_settings(settings)).map_err(|e| {
        LockError::invalid_options(format!(
            "the redis client's settings, with RESP3, are refused by the redis crate: {}",
            e.detail().unwrap_or("invalid")
        ))
    })?;
    Ok((resp3, display))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_read_and_removed() {
        let p = parse_url("redis://:pw@127.0.0.1:7000/3?prefix=app:&response_timeout_ms=150")
            .expect("valid");
        assert_eq!(p.config.prefix, "app:");
        assert_eq!(p.config.response_timeout, Duration::from_millis(150));
        assert_eq!(p.display, "redis://127.0.0.1:7000/3");
        let Target::Node(client_url) = &p.target else {
            panic!("one node");
        };
        assert!(client_url.ends_with("/3?protocol=resp3"), "{client_url}");
        assert!(client_url.contains(":pw@"), "credentials go to the client");
        let p = parse_url("redis://h?response_timeout=2s&handoff_window=150ms").expect("valid");
        assert_eq!(p.config.response_timeout, Duration::from_secs(2));
        assert_eq!(p.config.handoff_window, Duration::from_millis(150));
    }

    #[test]
    fn a_sentinel_url_names_its_sentinels_group_and_database() {
        let p = parse_url(
            "redis+sentinel://app:pw@s1,s2:26380,[::1]/main/2?replicas=1&replicas_timeout=250ms",
        )
        .expect("valid");
        assert_eq!(
            p.display,
            "redis+sentinel://s1:26379,s2:26380,[::1]:26379/main/2"
        );
        assert_eq!(p.config.replicas, 1);
        assert_eq!(p.config.replicas_timeout, Duration::from_millis(250));
        let Target::Sentinel {
            sentinels,
            group,
            db,
            user,
            password,
            tls,
            ..
        } = p.target
        else {
            panic!("a sentinel group");
        };
        assert_eq!(group, "main");
        assert_eq!(db, 2);
        assert_eq!(user.as_deref(), Some("app"));
        assert_eq!(password.as_deref(), Some("pw"));
        assert!(!tls);
        assert_eq!(sentinels[1], redis::ConnectionAddr::Tcp("s2".into(), 26380));
        assert_eq!(
            sentinels[2],
            redis::ConnectionAddr::Tcp("::1".into(), 26379)
        );
        let p = parse_url("rediss+sentinel://s1/main").expect("valid");
        assert!(matches!(
            p.target,
            Target::Sentinel {
                tls: true,
                db: 0,
                ..
            }
        ));
    }

    #[test]
    fn a_cluster_url_names_its_seed_nodes() {
        let p = parse_url("redis+cluster://app:pw@c1,c2:7001,[::1]?prefix=x:&replicas=1")
            .expect("valid");
        assert_eq!(p.display, "redis+cluster://c1:6379,c2:7001,[::1]:6379");
        assert_eq!((p.config.prefix.as_str(), p.config.replicas), ("x:", 1));
        let Target::Cluster(seeds) = p.target else {
            panic!("a cluster");
        };
        assert_eq!(
            seeds.nodes,
            [
                "redis://c1:6379/0?protocol=resp3",
                "redis://c2:7001/0?protocol=resp3",
                "redis://[::1]:6379/0?protocol=resp3"
            ]
        );
        assert_eq!(seeds.user.as_deref(), Some("app"));
        assert_eq!(seeds.password.as_deref(), Some("pw"));
        assert!(!seeds.tls);
        let Target::Cluster(seeds) = parse_url("rediss+cluster://c1/").expect("valid").target
        else {
            panic!("a cluster");
        };
        assert!(seeds.tls && seeds.nodes[0].starts_with("rediss://c1:6379/"));
        let Target::Cluster(seeds) = parse_url(
            "redis+cluster://p1:7000?node_map=10.0.0.1:6379>p1:7000,10.0.0.2:6379>p2:7001",
        )
        .expect("valid")
        .target
        else {
            panic!("a cluster");
        };
        let pairs: Vec<String> = seeds
            .reached_through
            .iter()
            .map(|(a, n)| format!("{a}>{n}"))
            .collect();
        assert_eq!(pairs, ["10.0.0.1:6379>p1:7000", "10.0.0.2:6379>p2:7001"]);
    }

    #[test]
    fn bad_urls_are_typed_and_redacted() {
        for bad in [
            "redis://:secretpw@",
            "http://:secretpw@h",
            "redis://:secretpw@h/notadb",
            "redis://:secretpw@h?nope=1",
            "redis://:secretpw@h?prefix=a{b}",
            "redis://:secretpw@h?connect_timeout_ms=0",
            "redis://:secretpw@h?response_timeout_ms=soon",
            "redis://:secretpw@h?replicas=17",
            "redis://:secretpw@h?replicas=1&replicas_timeout=3s",
            "redis+sentinel://:secretpw@s1,s2",
            "redis+sentinel://:secretpw@s1/group/notadb",
            "redis+sentinel://:secretpw@/group",
            "redis+cluster://:secretpw@/",
            "redis+cluster://:secretpw@h1,h2/1",
            "redis+cluster://:secretpw@h1,h2?node_map=a:1",
            "redis+cluster://:secretpw@h1?node_map=nohostport>h:1",
            "redis://:secretpw@h1?node_map=a:1>b:2",
        ] {
            match parse_url(bad) {
                Err(e @ (LockError::InvalidUrl { .. } | LockError::InvalidOptions { .. })) => {
                    assert!(!format!("{e} {e:?}").contains("secretpw"), "{bad}: {e}");
                }
                Err(other) => panic!("{bad}: unexpected {other}"),
                Ok(_) => panic!("{bad}: accepted"),
            }
        }
    }
}
