//! The client's session: one lease, kept alive by one background task,
//! shared by every lock acquired with the session's TTL and auto-renewal.
//!
//! Each keep-alive that lands moves the validity deadline of every guard on
//! the session; a keep-alive answered with TTL 0 (the lease expired or was
//! revoked) fires `lost()` on all of them at once and ends the session, and
//! so does a session whose keep-alives fail past its validity deadline. The
//! client then grants a fresh session for later acquisitions.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use lock_core::raw::LeaseState;
use lock_core::{LockError, LossReason};
use tokio::time::Instant;

use crate::requests;

pub(crate) struct Session {
    pub(crate) lease: i64,
    pub(crate) ttl: Duration,
    inner: Mutex<State>,
}

struct State {
    /// When the last keep-alive that landed was sent (or the grant).
    renewed_at: Instant,
    /// Guards on this session.
    guards: Vec<Weak<LeaseState>>,
    /// Set once the session is known or presumed dead.
    ended: Option<LossReason>,
}

impl Session {
    /// Grant a lease of `ttl` and start keeping it alive.
    pub(crate) async fn start(client: &Client, ttl: Duration) -> Result<Arc<Self>, LockError> {
        let sent_at = Instant::now();
        let granted = requests::grant(client, ttl.as_secs(), "granting the session lease").await?;
        let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0).max(1));
        let session = Arc::new(Session {
            lease: granted.id(),
            ttl,
            inner: Mutex::new(State {
                renewed_at: sent_at,
                guards: Vec::new(),
                ended: None,
            }),
        });
        tokio::spawn(keep_alive(
            client.clone(),
            Arc::downgrade(&session),
            granted.id(),
            ttl,
        ));
        tracing::debug!(target: "distlock", lease = granted.id(), ?ttl, "etcd session started");
        Ok(session)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the session can still carry locks: not ended, and its
    /// validity deadline not passed.
    pub(crate) fn usable(&self) -> bool {
        let s = self.state();
        s.ended.is_none()
            && Instant::now() < lock_core::raw::validity_deadline(s.renewed_at, self.ttl)
    }

    /// A lease state for a guard on this session, renewed with it.
    pub(crate) fn attach(&self) -> Arc<LeaseState> {
        let mut s = self.state();
        let lease = Arc::new(LeaseState::lease(s.renewed_at, self.ttl));
        if let Some(reason) = &s.ended {
            lease.mark_lost(reason.clone());
        }
        s.guards.retain(|g| g.strong_count() > 0);
        s.guards.push(Arc::downgrade(&lease));
        lease
    }

    fn renewed(&self, sent_at: Instant) {
        let mut s = self.state();
        s.renewed_at = sent_at;
        s.guards.retain(|g| match g.upgrade() {
            Some(lease) => {
                lease.renewed(sent_at, self.ttl);
                true
            }
            None => false,
        });
    }

    /// End the session: its lease is gone. Its guards are lost, and the
    /// next acquisition starts a new session.
    pub(crate) fn end(&self, reason: LossReason) {
        let mut s = self.state();
        if s.ended.is_none() {
            s.ended = Some(reason.clone());
        }
        for lease in s.guards.drain(..).filter_map(|g| g.upgrade()) {
            lease.mark_lost(reason.clone());
        }
    }
}

/// The keep-alive loop: a round every TTL/3; retries faster after a
/// failure; ends the session when the lease is gone or its deadline passed.
async fn keep_alive(client: Client, session: Weak<Session>, lease: i64, ttl: Duration) {
    let period = ttl / 3;
    let mut stream: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    let mut next = Instant::now() + period;
    loop {
        tokio::time::sleep_until(next).await;
        let Some(session) = session.upgrade() else {
            // The client is gone: give the lease back rather than let it run out.
            let _ = client.lease_client().revoke(lease).await;
            return;
        };
        let sent_at = Instant::now();
        let round = async {
            match stream.as_mut() {
                Some((keeper, s)) => {
                    keeper.keep_alive().await?;
                    Ok::<_, etcd_client::Error>(s.message().await?.map(|r| r.ttl()))
                }
                None => {
                    // Opening the stream sends the first keep-alive itself
                    // (and fails if the lease is gone).
                    let opened = client.lease_client().keep_alive(lease).await?;
                    stream = Some(opened);
                    Ok(Some(ttl.as_secs() as i64))
                }
            }
        };
        match tokio::time::timeout(period, round).await {
            Ok(Ok(Some(left))) if left > 0 => {
                session.renewed(sent_at);
                next = sent_at + period;
            }
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(reason)))
                if reason.contains("not found") =>
            {
                tracing::warn!(target: "distlock", lease, "etcd session lease is gone; its locks are lost");
                session.end(LossReason::TakenOver);
                return;
            }
            Ok(Ok(Some(_))) => {
                tracing::warn!(target: "distlock",
                    lease,
                    "etcd session lease expired or was revoked; its locks are lost"
                );
                session.end(LossReason::TakenOver);
                return;
            }
            failed => {
                stream = None;
                if !session.usable() {
                    tracing::warn!(target: "distlock",
                        lease,
                        "etcd session could not be kept alive past its deadline"
                    );
                    session.end(LossReason::DeadlinePassed);
                    return;
                }
                tracing::debug!(target: "distlock", lease, outcome = ?failed.map(|r| r.map(|_| ())), "etcd keep-alive failed; retrying");
                next = Instant::now() + period.min(Duration::from_millis(250));
            }
        }
    }
}
