//! A TCP proxy for fault tests (feature `testkit`): it forwards between a
//! client and one server, and on request loses the server's replies after
//! a chosen client request (or loses that request itself), then drops the
//! connection, as a network that fails around a write would; or it
//! partitions the client from the server: nothing is forwarded either way
//! and nothing is closed, as a cable pulled out would; or it makes new
//! connections slow to reach the server, as a loaded server or a long
//! handshake would.
//!
//! The proxy knows nothing of any protocol: the test gives a predicate over
//! the bytes the client sends (one read's worth, which is a whole request
//! for the small requests lock clients send).
//!
//! ```no_run
//! # async fn demo() {
//! use std::time::Duration;
//! use lock_testkit::tcp_proxy::TcpProxy;
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

/// What an armed fault loses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// The matching request reaches the server; its reply and every later
    /// one on that connection are lost.
    Replies,
    /// The matching request itself, and everything after it on that
    /// connection (both ways), is lost.
    Request,
}

/// The armed fault: at a client write matching `matches`, lose what `loss`
/// says and close the connection `hold` later.
struct Trigger {
    matches: Predicate,
    hold: Duration,
    loss: Loss,
}

#[derive(Default)]
struct Shared {
    trigger: Mutex<Option<Trigger>>,
    counters: Mutex<Vec<(Predicate, Arc<AtomicUsize>)>>,
    connections: AtomicUsize,
    fired: AtomicUsize,
    partitioned: AtomicBool,
    connect_delay: Mutex<Duration>,
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
            let mut cut_off = Vec::new();
            while let Ok((client, _)) = listener.accept().await {
                if accepting.partitioned.load(Ordering::SeqCst) {
                    // Across a partition nothing reaches the server: the
                    // client's connection stays open and unanswered.
                    cut_off.push(client);
                    continue;
                }
                let delay = *accepting
                    .connect_delay
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                let shared = Arc::clone(&accepting);
                let upstream = upstream.clone();
                pumps.retain(|p: &JoinHandle<()>| !p.is_finished());
                pumps.push(tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        return; // the client sees its connection closed
                    };
                    shared.connections.fetch_add(1, Ordering::SeqCst);
                    serve(client, server, shared).await;
                }));
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
        self.arm(Loss::Replies, matches, hold);
    }

    /// Arm a fault, once: at the next client write for which `matches`
    /// holds, lose what `loss` says, and `hold` later close the connection
    /// both ways.
    pub fn arm(
        &self,
        loss: Loss,
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
            loss,
        });
    }

    /// Cut every connection, present and future, off from the server:
    /// nothing is forwarded either way and nothing is closed, until
    /// [`heal`](Self::heal).
    pub fn partition(&self) {
        self.shared.partitioned.store(true, Ordering::SeqCst);
    }

    /// End a [`partition`](Self::partition): connections that lived
    /// through it forward again (what was sent meanwhile is lost), and new
    /// connections reach the server.
    pub fn heal(&self) {
        self.shared.partitioned.store(false, Ordering::SeqCst);
    }

    /// Connections accepted from now on reach the server only `delay`
    /// after the client connected (nothing they send is lost; it waits);
    /// `Duration::ZERO` forwards them at once again.
    pub fn delay_new_connections(&self, delay: Duration) {
        *self
            .shared
            .connect_delay
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = delay;
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
    let replies_shared = Arc::clone(&shared);
    let replies = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if replies_muted.load(Ordering::SeqCst)
                || replies_shared.partitioned.load(Ordering::SeqCst)
            {
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
            if shared.partitioned.load(Ordering::SeqCst) {
                continue;
            }
            let fired = {
                let mut trigger = shared.trigger.lock().unwrap_or_else(|e| e.into_inner());
                match trigger.as_ref() {
                    Some(t) if (t.matches)(&buf[..n]) => trigger.take(),
                    _ => None,
                }
            };
            let Some(Trigger { hold, loss, .. }) = fired else {
                if server_tx.write_all(&buf[..n]).await.is_err() {
                    return;
                }
                continue;
            };
            // Mute before forwarding, so not even a fast reply gets by.
            muted.store(true, Ordering::SeqCst);
            shared.fired.fetch_add(1, Ordering::SeqCst);
            if loss == Loss::Replies && server_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
            // Whatever the client sends until the connection closes is
            // lost too.
            let _ = tokio::time::timeout(hold, async {
                loop {
                    match client_rx.read(&mut buf).await {
                        Ok(0) | Err(_) => std::future::pending::<()>().await,
                        Ok(_) => {}
                    }
                }
            })
            .await;
            return;
        }
    };
    // Whichever direction ends first ends the connection: both halves of
    // both sockets are dropped with this task.
    tokio::select! {
        _ = replies => {}
        _ = requests => {}
    }
}
