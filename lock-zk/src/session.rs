//! One ZooKeeper session, the guards whose nodes live in it, and how its
//! state changes become loss signals.

use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lock_core::raw::{LeaseState, Retry};
use lock_core::{LockError, LossKind, LossReason};
use zookeeper_client::{Acls, Client, SessionState};

use crate::config::{TlsFiles, ZkUrl};
use crate::error::{connection_dropped, connection_failed, zk_error};
use crate::lock::BACKEND;

/// How long a connection attempt to one member may take.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);

/// How many times in a row an idempotent request is sent again after its
/// connection dropped. A request sent while the client reconnects waits for
/// the new connection (or fails with the session), so each attempt is one
/// connection's worth, not a busy loop.
const CONNECTION_LOSS_RETRIES: u32 = 8;

/// One ZooKeeper session and the guards whose nodes live in it.
pub(crate) struct Session {
    pub client: Client,
    /// The ACL of the nodes we create: anyone may use them, or, with digest
    /// credentials, only clients holding the same credentials.
    pub acls: Acls<'static>,
    guards: Mutex<Guards>,
}

/// The leases of the session's guards; ended ones are pruned once the list
/// has doubled since the last pruning, so attaching stays O(1) amortised.
#[derive(Default)]
struct Guards {
    leases: Vec<Weak<LeaseState>>,
    prune_at: usize,
}

impl Session {
    /// Connect, and watch the session's state: a disconnection fires every
    /// guard's `lost()` as *suspected* (the session, and so the node, may
    /// still be alive: the holder cannot know until it reconnects); an
    /// expiry or a close as *confirmed*.
    pub(crate) async fn connect(url: &ZkUrl) -> Result<Arc<Self>, LockError> {
        let (hosts, timeout) = (url.hosts.as_str(), url.session_timeout);
        let mut connector = Client::connector()
            .with_session_timeout(timeout)
            .with_connection_timeout(CONNECTION_TIMEOUT);
        if let Some(digest) = &url.digest {
            connector = connector.with_auth("digest", digest.as_bytes());
        }
        let tls = url.tls.as_ref().map(tls_options).transpose()?;
        let connect = async move {
            match tls {
                Some(tls) => connector.with_tls(tls).secure_connect(hosts).await,
                None => connector.connect(hosts).await,
            }
        };
        let client = tokio::time::timeout(timeout + CONNECTION_TIMEOUT, connect)
            .await
            .map_err(|_| LockError::Unavailable {
                backend: BACKEND,
                reason: format!("connecting to {hosts}: no answer in time"),
                source: None,
            })?
            .map_err(|e| zk_error(&format!("connecting to {hosts}"), e))?;
        let acls = if url.digest.is_some() {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        };
        Ok(Self::watch(client, acls))
    }

    /// A session on a client the application made, whose lock nodes get
    /// `acls`; watched as [`connect`](Self::connect)'s are.
    pub(crate) fn watch(client: Client, acls: Acls<'static>) -> Arc<Self> {
        let session = Arc::new(Session {
            client,
            acls,
            guards: Mutex::new(Guards::default()),
        });
        let mut states = session.client.state_watcher();
        let watched = Arc::downgrade(&session);
        tokio::spawn(async move {
            loop {
                let state = states.changed().await;
                let Some(session) = watched.upgrade() else {
                    return;
                };
                let Some((kind, detail)) = loss_of(state) else {
                    continue;
                };
                tracing::warn!(target: "distlock",
                    ?state,
                    "zookeeper session state; its locks are {kind:?} lost"
                );
                session.lose_all(kind, detail);
                if state.is_terminated() {
                    return;
                }
            }
        });
        session
    }

    /// Whether the session has ended (expired, closed, refused).
    pub(crate) fn is_terminated(&self) -> bool {
        self.client.state().is_terminated()
    }

    fn guards(&self) -> std::sync::MutexGuard<'_, Guards> {
        self.guards.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fire `lease`'s `lost()` with the session's.
    pub(crate) fn attach(&self, lease: &Arc<LeaseState>) {
        let mut guards = self.guards();
        if guards.leases.len() >= guards.prune_at {
            guards.leases.retain(|g| g.strong_count() > 0);
            guards.prune_at = (2 * guards.leases.len()).max(64);
        }
        guards.leases.push(Arc::downgrade(lease));
    }

    /// The session ended, as a request's answer (`SessionExpired`,
    /// `ClientClosed`) shows, perhaps before the state watcher has seen
    /// it: every guard's `lost()` fires with the session's reason,
    /// confirmed, whichever of the two reports first.
    pub(crate) fn ended(&self, e: &zookeeper_client::Error) {
        let state = match e {
            zookeeper_client::Error::SessionExpired => SessionState::Expired,
            _ => SessionState::Closed,
        };
        if let Some((kind, detail)) = loss_of(state) {
            self.lose_all(kind, detail);
        }
    }

    fn lose_all(&self, kind: LossKind, detail: &str) {
        for lease in self.guards().leases.iter().filter_map(Weak::upgrade) {
            lease.mark_lost(LossReason::ConnectionLost {
                kind,
                detail: detail.to_string(),
            });
        }
    }
}

/// The client's TLS options from PEM files. The files are read here, so a
/// missing or malformed one is an `InvalidOptions` naming it.
fn tls_options(files: &TlsFiles) -> Result<zookeeper_client::TlsOptions, LockError> {
    // The client builds its rustls configuration from the process's default
    // crypto provider; with more than one compiled in, there is none until
    // one is installed. Installing fails harmlessly if the application
    // already chose.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path).map_err(|e| {
            LockError::invalid_options(format!("reading TLS file {}: {e}", path.display()))
        })
    };
    let bad =
        |what: &str, e: zookeeper_client::Error| LockError::invalid_options(format!("{what}: {e}"));
    let mut options = zookeeper_client::TlsOptions::new()
        .with_pem_ca(&read(&files.ca)?)
        .map_err(|e| bad(&format!("CA certificates in {}", files.ca.display()), e))?;
    if let Some((cert, key)) = &files.identity {
        options = options
            .with_pem_identity(&read(cert)?, &read(key)?)
            .map_err(|e| bad(&format!("client identity in {}", cert.display()), e))?;
    }
    Ok(options)
}

/// What a session state means for the session's locks: lost, suspected
/// or confirmed, and why; `None` for a state that loses nothing.
fn loss_of(state: SessionState) -> Option<(LossKind, &'static str)> {
    match state {
        SessionState::Disconnected => Some((LossKind::Suspected, "disconnected from ZooKeeper")),
        SessionState::Expired => Some((LossKind::Confirmed, "ZooKeeper session expired")),
        SessionState::Closed | SessionState::AuthFailed => {
            Some((LossKind::Confirmed, "ZooKeeper session closed"))
        }
        _ => None,
    }
}

/// Run the idempotent request `send` again while it fails with a dropped
/// connection (the client reconnects within the session meanwhile).
pub(crate) async fn retrying<T, F, Fut>(send: F) -> Result<T, zookeeper_client::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, zookeeper_client::Error>>,
{
    retrying_on(send, connection_failed).await
}

/// [`retrying`] for a request that is also safe to send again after the
/// client itself gave up on its connection (no reply in time), whatever
/// became of the session, because a session that ended meanwhile answers
/// it with `SessionExpired`: a read (a waiter keeps its place in the queue
/// through a connection the client dropped), or a delete that takes a
/// missing node on its second sending as done.
pub(crate) async fn retrying_resendable<T, F, Fut>(send: F) -> Result<T, zookeeper_client::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, zookeeper_client::Error>>,
{
    retrying_on(send, connection_dropped).await
}

async fn retrying_on<T, F, Fut>(
    mut send: F,
    again: impl Fn(&zookeeper_client::Error) -> bool,
) -> Result<T, zookeeper_client::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, zookeeper_client::Error>>,
{
    Retry::immediately()
        .attempts(CONNECTION_LOSS_RETRIES + 1)
        .run("a zookeeper request", again, |_| send())
        .await
}
