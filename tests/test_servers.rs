//! The real servers that backend tests use are running and answer.
//!
//! `scripts/test.sh` starts them (`scripts/services.sh up`) and exports their
//! URLs. A missing variable or a server that does not answer is a failure,
//! never a skip: run the suite through `scripts/test.sh`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const VARS: &[&str] = &[
    "DISTLOCK_TEST_REDIS_URL",
    "DISTLOCK_TEST_REDLOCK_URL",
    "DISTLOCK_TEST_POSTGRES_URL",
    "DISTLOCK_TEST_MYSQL_URL",
    "DISTLOCK_TEST_ETCD_URL",
    "DISTLOCK_TEST_ETCD_CLUSTER_URL",
    "DISTLOCK_TEST_ZK_URL",
    "DISTLOCK_TEST_ZK_ENSEMBLE_URL",
    "DISTLOCK_TEST_NATS_URL",
    "DISTLOCK_TEST_NATS_TLS_URL",
    "DISTLOCK_TEST_NATS_CLUSTER_URL",
];

fn url_of(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run the tests through scripts/test.sh, which starts the servers")
    })
}

/// The `host:port` list of a URL: `scheme://[user:pass@]h1:p1,h2:p2[/…][?…]`.
fn hosts(url: &str) -> Vec<SocketAddr> {
    lock_testkit::faults::upstreams_of(url)
        .iter()
        .map(|h| {
            h.parse()
                .unwrap_or_else(|e| panic!("{h} in {}: {e}", distlock::redact_url(url)))
        })
        .collect()
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))
        .unwrap_or_else(|e| panic!("server at {addr} does not accept connections: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    s
}

fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = connect(addr);
    s.write_all(request).expect("write");
    let mut buf = vec![0; 4096];
    let n = s
        .read(&mut buf)
        .unwrap_or_else(|e| panic!("no reply from {addr}: {e}"));
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn every_server_url_is_set_and_accepts_connections() {
    for var in VARS {
        let url = url_of(var);
        let addrs = hosts(&url);
        assert!(!addrs.is_empty(), "{var} names no host");
        for addr in addrs {
            connect(addr);
        }
    }
    assert_eq!(
        hosts(&url_of("DISTLOCK_TEST_REDLOCK_URL")).len(),
        5,
        "Redlock needs five masters"
    );
    assert_eq!(hosts(&url_of("DISTLOCK_TEST_ETCD_CLUSTER_URL")).len(), 3);
    assert_eq!(hosts(&url_of("DISTLOCK_TEST_ZK_ENSEMBLE_URL")).len(), 3);
    assert_eq!(hosts(&url_of("DISTLOCK_TEST_NATS_CLUSTER_URL")).len(), 3);
}

#[test]
fn nats_servers_greet_with_jetstream() {
    for var in ["DISTLOCK_TEST_NATS_URL", "DISTLOCK_TEST_NATS_CLUSTER_URL"] {
        for addr in hosts(&url_of(var)) {
            // A NATS server speaks first: its INFO line.
            let mut s = connect(addr);
            let mut buf = vec![0; 4096];
            let n = s
                .read(&mut buf)
                .unwrap_or_else(|e| panic!("no greeting from {addr}: {e}"));
            let info = String::from_utf8_lossy(&buf[..n]);
            assert!(
                info.starts_with("INFO ") && info.contains("\"jetstream\":true"),
                "nats at {addr}: {info}"
            );
        }
    }
    // The single server offers TLS to the clients that ask for it.
    for addr in hosts(&url_of("DISTLOCK_TEST_NATS_TLS_URL")) {
        let mut s = connect(addr);
        let mut buf = vec![0; 4096];
        let n = s.read(&mut buf).expect("a greeting");
        let info = String::from_utf8_lossy(&buf[..n]);
        assert!(
            info.contains("\"tls_available\":true"),
            "nats (TLS) at {addr}: {info}"
        );
    }
}

#[test]
fn redis_masters_answer_ping() {
    for var in ["DISTLOCK_TEST_REDIS_URL", "DISTLOCK_TEST_REDLOCK_URL"] {
        for addr in hosts(&url_of(var)) {
            assert_eq!(exchange(addr, b"PING\r\n"), "+PONG\r\n", "redis at {addr}");
        }
    }
}

#[test]
fn etcd_members_are_healthy() {
    for var in ["DISTLOCK_TEST_ETCD_URL", "DISTLOCK_TEST_ETCD_CLUSTER_URL"] {
        for addr in hosts(&url_of(var)) {
            let reply = exchange(addr, b"GET /health HTTP/1.0\r\n\r\n");
            assert!(
                reply.contains("\"health\":\"true\""),
                "etcd at {addr}: {reply}"
            );
        }
    }
}

#[test]
fn zookeeper_servers_serve() {
    for var in ["DISTLOCK_TEST_ZK_URL", "DISTLOCK_TEST_ZK_ENSEMBLE_URL"] {
        let modes: Vec<String> = hosts(&url_of(var))
            .into_iter()
            .map(|addr| {
                let reply = exchange(addr, b"srvr");
                reply
                    .lines()
                    .find_map(|l| l.strip_prefix("Mode: ").map(str::to_string))
                    .unwrap_or_else(|| panic!("zookeeper at {addr} is not serving: {reply}"))
            })
            .collect();
        if var == "DISTLOCK_TEST_ZK_URL" {
            assert_eq!(modes, ["standalone"]);
        } else {
            assert_eq!(
                modes.iter().filter(|m| *m == "leader").count(),
                1,
                "ensemble modes: {modes:?}"
            );
        }
    }
}
