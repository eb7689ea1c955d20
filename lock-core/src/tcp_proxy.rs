//! A TCP proxy for fault tests (feature `testkit`): it forwards between a
//! client and one server, and on request loses the server's replies after
//! a chosen client request, then drops the connection, as a network that
//! fails right after a write would.
//!
//! The proxy knows nothing of any protocol: the test gives a predicate over
//! the bytes the client sends (one read's worth, which is a whole request
//! for the small requests lock clients send).
//!
//! ```no_run
//! # async fn demo() {
//! use std::time::Duration;
//! use lock_core::tcp_proxy::TcpProxy;
//! let proxy = TcpProxy::start("127.0.0.1:2181").await;
//! // Point the client at `proxy.addr()`, then:
//! proxy.lose_replies_after(|bytes| bytes.starts_with(b"SET"), Duration::from_millis(200));
//! # }
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

type Predicate = Box<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// The armed fault: after a client write matching `matches`, lose every
/// reply and close the connection `hold` later.
struct Trigger {
    matches: Predicate,
    hold: Duration,
}

#[derive(Default)]
struct Shared {
    trigger: Mutex<Option<Trigger>>,
    counters: Mutex<Vec<(Predicate, Arc<AtomicUsize>)>>,
    connections: AtomicUsize,
    fired: AtomicUsize,
}

/// A running proxy; it stops (and drops its connections) when dropped.
pub struct TcpProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl TcpProxy {
    /// Listen on `127.0.0.1:0` and forward every connection to `upstream`
    /// (`host:port`). Panics if it cannot listen (a test utility).
    pub async fn start(upstream: &str) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let shared = Arc::new(Shared::default());
        let upstream = upstream.to_string();
        let accepting = Arc::clone(&shared);
        let accept = tokio::spawn(async move {
            let mut pumps = Vec::new();
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue; // the client sees its connection closed
                };
                accepting.connections.fetch_add(1, Ordering::SeqCst);
                pumps.retain(|p: &JoinHandle<()>| !p.is_finished());
                pumps.push(tokio::spawn(serve(client, server, Arc::clone(&accepting))));
            }
            for pump in pumps {
                pump.abort();
            }
        });
        TcpProxy {
            addr,
            shared,
            accept,
        }
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Arm the fault, once: the next client write for which `matches`
    /// holds is forwarded, every server reply on that connection from then
    /// on is dropped, and `hold` later the connection is closed both ways.
    pub fn lose_replies_after(
        &self,
        matches: impl Fn(&[u8]) -> bool + Send + Sync + 'static,
        hold: Duration,
    ) {
        *self
            .shared
            .trigger
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Trigger {
            matches: Box::new(matches),
            hold,
        });
    }

    /// Count the client writes for which `matches` holds, from now on (to
    /// see how many requests of a kind a client sends).
    pub fn count_requests(
        &self,
        matches: impl Fn(&[u8]) -> bool + Send + Sync + 'static,
    ) -> RequestCount {
        let count = Arc::new(AtomicUsize::new(0));
        self.shared
            .counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((Box::new(matches), Arc::clone(&count)));
        RequestCount(count)
    }

    /// How many times the armed fault has fired (0 or 1 per arming).
    pub fn fired(&self) -> usize {
        self.shared.fired.load(Ordering::SeqCst)
    }

    /// How many client connections the proxy has forwarded so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }
}

/// The number of matching client writes so far; see
/// [`TcpProxy::count_requests`].
pub struct RequestCount(Arc<AtomicUsize>);

impl RequestCount {
    /// The count now.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Forward one connection until either side closes or the fault fires.
async fn serve(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let muted = Arc::new(AtomicBool::new(false));
    let replies_muted = Arc::clone(&muted);
    let replies = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if replies_muted.load(Ordering::SeqCst) {
                continue;
            }
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let requests = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            for (matches, count) in shared
                .counters
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
            {
                if matches(&buf[..n]) {
                    count.fetch_add(1, Ordering::SeqCst);
                }
            }
            let hold = {
                let mut trigger = shared.trigger.lock().unwrap_or_else(|e| e.into_inner());
                match trigger.as_ref() {
                    Some(t) if (t.matches)(&buf[..n]) => trigger.take().map(|t| t.hold),
                    _ => None,
                }
            };
            if hold.is_some() {
                // Mute before forwarding, so not even a fast reply gets by.
                muted.store(true, Ordering::SeqCst);
                shared.fired.fetch_add(1, Ordering::SeqCst);
            }
            if server_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
            if let Some(hold) = hold {
                tokio::time::sleep(hold).await;
                return;
            }
        }
    };
    // Whichever direction ends first ends the connection: both halves of
    // both sockets are dropped with this task.
    tokio::select! {
        _ = replies => {}
        _ = requests => {}
    }
}
