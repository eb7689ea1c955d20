//! The network fault matrix (feature `testkit`): every networked backend
//! runs the same scenarios with its holder reaching the servers through
//! [`TcpProxy`]s, and its competitor reaching them directly.
//!
//! - **Partition of the holder**: the holder alone is cut off (nothing
//!   forwarded, nothing closed). Its `lost()` must fire before any other
//!   client is granted the lock, and the server must free the lock within
//!   the backend's bound, so the other client is granted it.
//! - **Partition of a waiter**: a waiter alone is cut off; it stops
//!   counting among the waiters within the backend's bound, and does not
//!   hold the lock back from the next acquisition.
//! - **Lost grant, release and renewal**: the reply to the request is lost
//!   (it reached the server), or the request itself is lost; either way the
//!   connection closes a little later, as a failing network closes it. A
//!   lock is never held by two clients, never left held by nobody beyond
//!   the backend's bound, errors are transient, and the client recovers.
//!
//! A backend's test file describes itself as a [`NetworkTarget`] and
//! instantiates every scenario with
//! [`network_fault_matrix!`](crate::network_fault_matrix):
//!
//! ```text
//! fn target() -> lock_testkit::network::NetworkTarget {
//!     NetworkTarget::new(upstreams_of(&url()), |hosts| async move {
//!         RedisLock::connect(&with_upstreams(&url(), &hosts)).await.expect("connect")
//!     })
//!     .freed_within(Duration::from_secs(3))
//! }
//! lock_testkit::network_fault_matrix!(target());
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::faults::unique;
use crate::tcp_proxy::{Loss, TcpProxy};
use lock_core::{DistributedLock, LockError, LockGuard, LockOptions, Wait};

/// Builds a client that reaches the backend's servers at the given
/// `host:port` list (the [`NetworkTarget::upstreams`], in order, or proxies
/// standing in for them).
pub type Connect = Arc<
    dyn Fn(Vec<String>) -> Pin<Box<dyn Future<Output = Arc<dyn DistributedLock>> + Send>>
        + Send
        + Sync,
>;

/// A networked backend under the matrix: where its servers are, how to
/// build a client for a given list of server addresses, and the bounds its
/// capabilities promise.
#[derive(Clone)]
pub struct NetworkTarget {
    /// The servers' `host:port`, in the order the client's URL lists them.
    pub upstreams: Vec<String>,
    /// Builds a client for a list of `host:port`.
    pub connect: Connect,
    /// The TTL the scenarios ask for.
    pub ttl: Duration,
    /// How long the server may keep a lock once its holder's client has
    /// gone silent (the TTL, the session timeout, the idle bound).
    pub freed_within: Duration,
    /// Whether a release request carries the lock's name (otherwise the
    /// scenarios lose the first request the client sends once the release
    /// starts; such a client must send nothing else meanwhile).
    pub release_names_the_lock: bool,
}

impl NetworkTarget {
    /// A target whose clients `connect` builds; TTL 3 s, freed within the
    /// TTL, release requests naming the lock.
    pub fn new<L, F, Fut>(upstreams: Vec<String>, connect: F) -> Self
    where
        L: DistributedLock + 'static,
        F: Fn(Vec<String>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = L> + Send + 'static,
    {
        let connect = Arc::new(connect);
        NetworkTarget {
            upstreams,
            connect: Arc::new(move |hosts| {
                let connect = Arc::clone(&connect);
                Box::pin(async move { Arc::new(connect(hosts).await) as Arc<dyn DistributedLock> })
            }),
            ttl: Duration::from_secs(3),
            freed_within: Duration::from_secs(3),
            release_names_the_lock: true,
        }
    }

    /// Set the TTL the scenarios ask for.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Set how long the server may keep a silent holder's lock.
    pub fn freed_within(mut self, bound: Duration) -> Self {
        self.freed_within = bound;
        self
    }

    /// Say that release requests do not carry the lock's name.
    pub fn release_is_anonymous(mut self) -> Self {
        self.release_names_the_lock = false;
        self
    }

    fn opts(&self, wait: Wait) -> LockOptions {
        LockOptions::new().ttl(self.ttl).wait(wait)
    }

    /// Proxies for every server, a holder connected through them, and a
    /// competitor connected directly.
    async fn setup(
        &self,
    ) -> (
        Vec<TcpProxy>,
        Arc<dyn DistributedLock>,
        Arc<dyn DistributedLock>,
    ) {
        let mut proxies = Vec::new();
        for upstream in &self.upstreams {
            proxies.push(TcpProxy::start(upstream).await);
        }
        let via = proxies.iter().map(|p| p.addr().to_string()).collect();
        let holder = (self.connect)(via).await;
        let other = (self.connect)(self.upstreams.clone()).await;
        (proxies, holder, other)
    }
}

/// Slack for scheduling, reconnects and round trips.
const SLACK: Duration = Duration::from_secs(5);

/// How long a failed connection stays open, unanswered, before the proxy
/// closes it: longer than the clients' request timeouts, so that what a
/// client sends right after a failed request (a clean-up) fails too.
const HOLD: Duration = Duration::from_secs(2);

/// The random part of a [`unique`] name: it appears verbatim in every
/// request that names the lock, whatever the backend's encoding.
fn marker(name: &str) -> Vec<u8> {
    name.rsplit('/').next().unwrap_or(name).as_bytes().to_vec()
}

fn names(marker: Vec<u8>) -> impl Fn(&[u8]) -> bool + Send + Sync + 'static {
    move |bytes: &[u8]| bytes.windows(marker.len()).any(|w| w == marker.as_slice())
}

fn fired(proxies: &[TcpProxy]) -> usize {
    proxies.iter().map(TcpProxy::fired).sum()
}

/// Wait (up to `limit`) until another client is granted `name`; then the
/// holder's guard must already know it lost the lock. If nobody else is
/// granted it in time, the holder must still hold it (its `lost()` silent,
/// its release answered "held").
async fn nobody_else_while_the_holder_believes(
    t: &NetworkTarget,
    other: &dyn DistributedLock,
    name: &str,
    guard: LockGuard,
    limit: Duration,
) -> bool {
    match other.acquire(name, &t.opts(Wait::UpTo(limit))).await {
        Ok(next) => {
            let loss = guard.is_lost();
            assert!(
                loss.is_some(),
                "another client was granted the lock while the holder still believed in it"
            );
            if let (Some(old), Some(new)) = (guard.fencing_token(), next.fencing_token()) {
                assert!(new > old, "token {new} granted after {old}");
            }
            assert!(next.release().await.expect("release the next grant"));
            drop(guard);
            true
        }
        Err(LockError::Timeout { .. }) => {
            // Nobody else was granted it: the holder still holds it, or it
            // suspects a loss that did not happen (safe). Either way its
            // release must free the lock.
            let suspected = guard.is_lost();
            let released = guard.release().await;
            if suspected.is_none() {
                assert!(
                    matches!(released, Ok(true)),
                    "the holder had lost the lock without knowing it: {released:?}"
                );
            }
            eprintln!(
                "nobody else was granted the lock; the holder suspected {suspected:?}, its release gave {released:?}"
            );
            let next = other
                .acquire(name, &t.opts(Wait::UpTo(SLACK)))
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "the holder ({suspected:?}) released ({released:?}) but left it held: {e:?}"
                    )
                });
            assert!(next.release().await.expect("release"));
            false
        }
        Err(e) => panic!("the other client failed: {e:?}"),
    }
}

/// The client that saw the fault acquires again, without being rebuilt,
/// once its connection is back (transient errors meanwhile).
async fn recovers(client: &dyn DistributedLock, t: &NetworkTarget) {
    let within = t.ttl + HOLD + SLACK;
    crate::faults::acquires_again(client, &t.opts(Wait::No), within).await;
}

/// The holder alone is partitioned from the servers (nothing forwarded,
/// nothing closed): its `lost()` fires before anyone else is granted the
/// lock, and the servers free the lock within the target's bound.
pub async fn partitioned_holder(t: NetworkTarget) {
    let (proxies, holder, other) = t.setup().await;
    let name = unique("partition");
    let guard = holder
        .acquire(&name, &t.opts(Wait::No))
        .await
        .expect("the holder's acquire");
    for p in &proxies {
        p.partition();
    }
    let cut = Instant::now();
    let limit = t.freed_within + SLACK;
    let granted = nobody_else_while_the_holder_believes(&t, other.as_ref(), &name, guard, limit);
    assert!(
        granted.await,
        "the servers kept a partitioned holder's lock past {limit:?}"
    );
    eprintln!(
        "partition: granted to another client {:?} after the cut",
        cut.elapsed()
    );
    for p in &proxies {
        p.heal();
    }
}

/// A waiter alone is partitioned from the servers while it waits (its
/// wait, then its withdrawal, cannot reach them): within the target's
/// bound (plus slack) it no longer counts among the lock's waiters (where
/// the backend counts them), and once the holder leaves, the next
/// acquisition is granted promptly, not held back for the lost waiter.
pub async fn partitioned_waiter(t: NetworkTarget) {
    let (proxies, waiter_client, other) = t.setup().await;
    let name = unique("partitioned-waiter");
    let holder = other
        .acquire(&name, &t.opts(Wait::No).auto_renew(true))
        .await
        .expect("the holder's acquire");
    let long = t.opts(Wait::UpTo(Duration::from_secs(60)));
    let waiting = tokio::spawn({
        let (client, name) = (Arc::clone(&waiter_client), name.clone());
        async move { client.acquire(&name, &long).await }
    });
    // Where waiters are counted, until the waiter is; else a moment.
    let start = Instant::now();
    let counted = loop {
        match other.inspect(&name).await.expect("inspect").waiters {
            Some(n) if n >= 1 => break true,
            Some(_) => assert!(start.elapsed() < SLACK, "the waiter never queued"),
            None => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                break false;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    for p in &proxies {
        p.partition();
    }
    // Its wait gives up (or is given up) while cut off: the withdrawal
    // cannot reach the servers either.
    waiting.abort();
    let cut = Instant::now();
    let bound = t.freed_within + SLACK;
    if counted {
        loop {
            let n = other.inspect(&name).await.expect("inspect").waiters;
            if n == Some(0) {
                break;
            }
            assert!(
                cut.elapsed() < bound,
                "a waiter cut off {:?} ago still counts: {n:?} waiters",
                cut.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!(
            "partitioned waiter: uncounted {:?} after the cut",
            cut.elapsed()
        );
    }
    assert!(holder.release().await.expect("release"));
    let next = other
        .acquire(&name, &t.opts(Wait::UpTo(bound)))
        .await
        .expect("the lock went to the next acquisition despite the lost waiter");
    assert!(next.release().await.expect("release"));
    for p in &proxies {
        p.heal();
    }
}

/// The first request of an acquisition that names the lock is lost (its
/// reply, or the request itself): the acquisition is granted (after a
/// retry, and then exclusively) or fails with a transient error; the lock
/// is never left held by nobody beyond the target's bound; the client
/// acquires again afterwards.
pub async fn lost_grant(t: NetworkTarget, loss: Loss) {
    let (proxies, holder, other) = t.setup().await;
    let name = unique("lost-grant");
    for p in &proxies {
        p.arm(loss, names(marker(&name)), HOLD);
    }
    let wait = t.freed_within + SLACK;
    let outcome = tokio::time::timeout(
        wait + SLACK,
        holder.acquire(&name, &t.opts(Wait::UpTo(wait))),
    )
    .await
    .expect("the acquisition outlived its wait");
    assert!(fired(&proxies) > 0, "no request named the lock");
    eprintln!(
        "lost {loss:?} at the grant: {:?}",
        outcome.as_ref().map(|_| "granted")
    );
    match outcome {
        Ok(g) => {
            let probe = other
                .try_acquire(&name, &t.opts(Wait::No))
                .await
                .expect("the other client's attempt");
            assert!(probe.is_none(), "granted to two clients at once");
            assert!(
                g.release().await.expect("release"),
                "a grant that was not held"
            );
        }
        Err(e) => assert!(e.is_transient(), "a lost {loss:?} at the grant gave {e:?}"),
    }
    let next = other
        .acquire(&name, &t.opts(Wait::UpTo(t.freed_within + SLACK)))
        .await
        .unwrap_or_else(|e| panic!("the lock was left held by nobody: {e:?}"));
    assert!(next.release().await.expect("release"));
    recovers(holder.as_ref(), &t).await;
}

/// The release's request is lost (its reply, or the request itself): the
/// release answers or fails with a transient error, and the lock is free
/// again: at once when the release reached the server (within the proxy's
/// hold, when the connection's end is what frees it), within the target's
/// bound otherwise.
pub async fn lost_release(t: NetworkTarget, loss: Loss) {
    let (proxies, holder, other) = t.setup().await;
    let name = unique("lost-release");
    let opts = t.opts(Wait::No).auto_renew(false);
    let guard = holder.acquire(&name, &opts).await.expect("acquire");
    let released_at = Instant::now();
    for p in &proxies {
        if t.release_names_the_lock {
            p.arm(loss, names(marker(&name)), HOLD);
        } else {
            p.arm(loss, |_| true, HOLD);
        }
    }
    let outcome = tokio::time::timeout(SLACK * 2, guard.release())
        .await
        .expect("the release hung");
    assert!(fired(&proxies) > 0, "the release sent nothing");
    eprintln!("lost {loss:?} at the release: {outcome:?}");
    if let Err(e) = outcome {
        assert!(
            e.is_transient(),
            "a lost {loss:?} at the release gave {e:?}"
        );
    }
    let bound = match loss {
        Loss::Replies => HOLD + SLACK,
        Loss::Request => t.freed_within + SLACK,
    };
    let next = other
        .acquire(&name, &t.opts(Wait::UpTo(bound)))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "not free {:?} after a release whose {loss:?} was lost: {e:?}",
                released_at.elapsed()
            )
        });
    assert!(next.release().await.expect("release"));
    recovers(holder.as_ref(), &t).await;
}

/// An auto-renewed holder's next request (a renewal, a keep-alive or a
/// ping) is lost (its reply, or the request itself) and its connection
/// stays silent for a TTL before it closes: either the holder keeps the
/// lock throughout (it reconnected in time), or its `lost()` fires before
/// anyone else is granted the lock.
pub async fn lost_renewal(t: NetworkTarget, loss: Loss) {
    let (proxies, holder, other) = t.setup().await;
    let name = unique("lost-renewal");
    let guard = holder
        .acquire(&name, &t.opts(Wait::No))
        .await
        .expect("acquire");
    for p in &proxies {
        p.arm(loss, |_| true, t.ttl);
    }
    let armed = Instant::now();
    while fired(&proxies) == 0 {
        assert!(
            armed.elapsed() < t.ttl * 2,
            "the holder sent nothing for two TTLs"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let kept = !nobody_else_while_the_holder_believes(
        &t,
        other.as_ref(),
        &name,
        guard,
        t.ttl + t.freed_within + SLACK,
    )
    .await;
    eprintln!(
        "lost {loss:?} while renewing: the holder {}",
        if kept {
            "kept the lock"
        } else {
            "lost the lock first"
        }
    );
    recovers(holder.as_ref(), &t).await;
}

/// Every scenario of the matrix as its own `#[tokio::test]`, in a module
/// named `network_faults`, for the [`NetworkTarget`] that `$target` builds.
#[macro_export]
macro_rules! network_fault_matrix {
    ($target:expr) => {
        /// The shared network fault matrix against this backend.
        mod network_faults {
            #[allow(unused_imports)]
            use super::*;
            use $crate::tcp_proxy::Loss;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn partitioned_holder_is_lost_before_anyone_else_is_granted() {
                $crate::network::partitioned_holder($target).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn partitioned_waiter_stops_counting() {
                $crate::network::partitioned_waiter($target).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn lost_grant_reply() {
                $crate::network::lost_grant($target, Loss::Replies).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn lost_grant_request() {
                $crate::network::lost_grant($target, Loss::Request).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn lost_release_reply() {
                $crate::network::lost_release($target, Loss::Replies).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn lost_release_request() {
                $crate::network::lost_release($target, Loss::Request).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn lost_renewal_reply() {
                $crate::network::lost_renewal($target, Loss::Replies).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn lost_renewal_request() {
                $crate::network::lost_renewal($target, Loss::Request).await;
            }
        }
    };
}
