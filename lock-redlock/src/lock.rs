//! `Redlock`: the client, the quorum acquire with its fencing write-back
//! and the waiting loop.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::raw::{
    Attempt, GuardHandle, HolderRecord, Kind, LeaseState, OwnerToken, PendingGrant, RawGuard,
    RawLock, Request, Unrenewed, Wakeups, Watchdog, granted_too_late, validate_name,
};
use lock_core::{
    Capabilities, Changes, Fencing, Grade, LockError, LockGuard, LockInfo, LockOptions,
    RwLockCapabilities, RwLockInfo, Waiting,
};
use lock_redis::raw::{Keys, LockState, MAX_ATOMIC_SET, QueuedLock, Subscription, wait_in_queue};
use tokio::time::Instant;

use crate::config::{RedlockConfig, parse_url};
use crate::error::{BACKEND, causes, quorum_not_reached};
use crate::handle::RedlockHandle;
use crate::node::{LockRef, Node, NodeGrant, Waiter};
use crate::quorum::{Replies, Stragglers, count, failed, gather, gather_grants, majority};

pub(crate) const CAPABILITIES: Capabilities =
    // Safety rests on timing assumptions (bounded pauses, clock rates,
    // delayed restarts), not on consensus: see the crate documentation.
    Capabilities::new(BACKEND, Grade::Efficiency)
        // A majority-quorum counter: strictly increasing while no node loses
        // its counters (persistence with fsync); a node that restarts empty can
        // be the one node two majorities share.
        .with_fencing(Fencing::WhileServerKeepsData)
        // Waiters queue on every node by their arrival ticket (the client's
        // clock), so every node hands the lock to the same, earliest waiter.
        .with_fair_queue(true)
        .with_survives_server_failure(true)
        .with_waiting(Waiting::Notified)
        // Each node's acquire script writes the holder record with its grant.
        .with_holder(true)
        // Every node's scripts publish grants, releases, holder records and
        // terms on the lock's changes channel; an observer listens on a
        // majority, and reads again when the lease it read ends.
        .with_observers(Waiting::Notified)
        // PX on every node carries the delay; PEXPIRE sets a hold's end.
        .with_lock_delay(true)
        .with_hold_at_least(true)
        // One set script run per node, a majority granting it whole.
        .with_atomic_sets(MAX_ATOMIC_SET)
        // lock-redis's reader-writer script on every node, a majority
        // granting; a waiting writer's marks hold later readers back;
        // releases wake the waiters, unordered.
        .with_rw_lock(Some(
            RwLockCapabilities::new()
                .with_writer_preference(true)
                .with_waiting(Waiting::Notified),
        ));

/// Locks over N independent Redis masters (the Redlock algorithm).
///
/// - **Acquire** sends lock-redis's acquire script (`SET NX PX` plus an
///   `INCR` of the node's fencing counter) to every node at once, each
///   request bounded by the node timeout, and succeeds with a majority
///   (⌊N/2⌋+1) if enough validity is left: validity = TTL − elapsed −
///   drift, drift = TTL × `drift_factor` + 2 ms. It does not wait for
///   stragglers once the outcome is decided. On failure it releases on every
///   node that did not refuse, including those that timed out.
/// - **Fencing tokens** come from a majority-quorum counter: the largest
///   counter among the granting nodes is the token, written back
///   (raise-only, and only where this owner still holds the key) until a
///   majority carries it, before the guard is returned. Any two majorities
///   share a node, so the next holder reads at least this token. When the
///   granting nodes already agree (the usual case) this costs nothing extra.
/// - **Release** runs on all nodes at once and reports whether a majority
///   still held the lock; **extend** (and the watchdog) needs a majority
///   within the current validity, else `lost()` fires by the deadline.
/// - **No majority reachable**: a single attempt (`try_acquire`, `Wait::No`)
///   fails with `QuorumNotReached` at once; a waiting acquire tries again
///   and fails with it only once a majority has stayed unreachable for
///   three attempts and at least two seconds (or its wait runs out first).
/// - **Waiting without polling**: a waiter subscribes to the lock's release
///   channel on every node and queues on every node that refuses it, in a
///   queue ordered by its arrival ticket (the client's clock when the wait
///   began, the same on every node). A release hands each node to the first
///   waiter in that node's queue, reserves it briefly and wakes only that
///   waiter; since every node orders its waiters alike, they pick the same
///   one, and the releaser cannot barge back in. A loser of a split vote
///   rejoins each queue by its ticket as it gives a node back, so the nodes
///   converge on the earliest waiter instead of splitting again. The
///   holders' remaining TTL is the backstop; a waiter that leaves (timeout,
///   cancellation) withdraws from every queue.
///
/// # Assumptions
///
/// Redlock is only as safe as its timing model: processes pause for less
/// than the validity left, clocks on the nodes advance at about the same
/// rate (no step changes: run them without NTP slewing jumps), and a node
/// that crashes either keeps its data (AOF with `appendfsync always`) or
/// stays down longer than the longest TTL before rejoining. Fencing tokens
/// need more: no node may lose its counters. If these cannot be promised,
/// use etcd or ZooKeeper (consensus, with safe fencing tokens) for
/// correctness; Redlock buys tolerance of a minority of failed nodes.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{DistributedLock, LockOptions};
/// let locks = lock_redlock::Redlock::connect(
///     "redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379?node_timeout_ms=50",
/// )
/// .await?;
/// let guard = locks.acquire("invoice-run", &LockOptions::new()).await?;
/// let token = guard.fencing_token(); // pass it to the protected resource
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Redlock {
    pub(crate) inner: Arc<Inner>,
    pub(crate) watchdog: Watchdog,
}

pub(crate) struct Inner {
    pub(crate) nodes: Vec<Arc<Node>>,
    /// Each node's `host:port/db`, for diagnostics.
    pub(crate) names: Vec<String>,
    pub(crate) keys: Keys,
    pub(crate) config: RedlockConfig,
    pub(crate) quorum: usize,
    pub(crate) wakeups: Wakeups,
}

impl Redlock {
    /// Connect to `redlock://[user:pass@]host:port[,host:port…][/db]` with
    /// options `prefix`, `node_timeout_ms`, `connect_timeout_ms`,
    /// `drift_factor`, `min_validity` and `tls`. Succeeds when a majority of
    /// the nodes answers; the others are connected when they come back.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let parsed = parse_url(url)?;
        parsed.config.validate()?;
        let nodes = parsed
            .nodes
            .iter()
            .map(|u| Node::new(u, &parsed.config).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        Self::with_nodes(nodes, parsed.config).await
    }

    /// Locks on Redis clients the application already has, one per
    /// independent master (their own credentials, TLS and connection
    /// settings), with `config` in place of a URL's options:
    /// `Redlock::with_clients(clients, RedlockConfig::default())`.
    ///
    /// A client may speak RESP2 (redis-rs's default) or RESP3: the lock's
    /// own connections always speak RESP3, since waiters are woken by push
    /// messages (each master must be Redis ≥ 6). The lock opens connections
    /// of its own from each client's settings (one multiplexed connection,
    /// and one for wake-ups), lazily, so a node that is down does not stop
    /// it; as with a URL, it succeeds when a majority answers. No client,
    /// or invalid settings, are [`LockError::InvalidOptions`].
    pub async fn with_clients(
        clients: Vec<redis::Client>,
        config: RedlockConfig,
    ) -> Result<Self, LockError> {
        config.validate()?;
        if clients.is_empty() {
            return Err(LockError::invalid_options(
                "Redlock needs at least one client",
            ));
        }
        let nodes = clients
            .into_iter()
            .map(|client| {
                let (client, display) = lock_redis::raw::client_for_lock(&client)?;
                Node::with_client(client, display, &config).map(Arc::new)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::with_nodes(nodes, config).await
    }

    async fn with_nodes(nodes: Vec<Arc<Node>>, config: RedlockConfig) -> Result<Self, LockError> {
        let names: Vec<String> = nodes.iter().map(|n| n.display.clone()).collect();
        let quorum = majority(nodes.len());
        let replies = gather(
            nodes
                .iter()
                .map(|n| Arc::clone(n).ping(config.connect_timeout)),
            Stragglers::Finish,
            |_| false,
        )
        .await;
        let up = count(&replies, |_| true);
        if up < quorum {
            return Err(LockError::Unavailable {
                backend: BACKEND,
                reason: format!(
                    "only {up} of {} nodes answered, {quorum} needed: {}",
                    nodes.len(),
                    causes(&replies, &names).join("; ")
                ),
                source: None,
            });
        }
        tracing::debug!(target: "distlock", nodes = ?names, up, "redlock client connected");
        Ok(Redlock {
            inner: Arc::new(Inner {
                nodes,
                names,
                keys: Keys::new(&config.prefix),
                config,
                quorum,
                wakeups: Wakeups::new(),
            }),
            watchdog: Watchdog::new(),
        })
    }

    /// The number of nodes and the majority needed.
    pub fn quorum(&self) -> (usize, usize) {
        (self.inner.nodes.len(), self.inner.quorum)
    }

    /// Every node's view of `name`, failing if fewer than a majority
    /// answer.
    async fn states(&self, name: &str, doing: &str) -> Result<Vec<LockState>, LockError> {
        let keys = Arc::new(self.inner.keys.all(name));
        let replies = gather(
            self.inner
                .nodes
                .iter()
                .map(|n| Arc::clone(n).state(Arc::clone(&keys))),
            Stragglers::Finish,
            |_| false,
        )
        .await;
        let answered = count(&replies, |_| true);
        if answered < self.inner.quorum {
            return Err(LockError::QuorumNotReached {
                acquired: answered,
                needed: self.inner.quorum,
                causes: causes(&replies, &self.inner.names)
                    .into_iter()
                    .map(|c| format!("{doing}: {c}"))
                    .collect(),
            });
        }
        Ok(replies
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .collect())
    }

    /// How many acquisitions of `name` wait in its queue: the most on any
    /// node that answered (a waiter queues on every node that refuses it).
    pub async fn queued(&self, name: &str) -> Result<usize, LockError> {
        let key: Arc<str> = self.inner.keys.all(name).queue.into();
        let replies = gather(
            self.inner
                .nodes
                .iter()
                .map(|n| Arc::clone(n).queue_len(Arc::clone(&key))),
            Stragglers::Finish,
            |_| false,
        )
        .await;
        let mut answered = replies
            .iter()
            .flatten()
            .filter_map(|r| r.as_ref().ok())
            .peekable();
        if answered.peek().is_none() {
            return Err(LockError::Unavailable {
                backend: BACKEND,
                reason: "counting a lock's waiters: no node answered".into(),
                source: None,
            });
        }
        Ok(answered.copied().max().unwrap_or(0))
    }

    /// One attempt on every node. `Held { expires_in: Some(_) }` means the
    /// lock is held (wait for a release); `None` means a split vote (retry
    /// after a random delay); `TooLate`, a majority granted but too late to
    /// be of use, and it was given back (retry at once). A `waiter`
    /// joins the queue of every node that refuses, and takes the
    /// reservations made for it.
    async fn attempt(
        &self,
        name: &str,
        opts: &LockOptions,
        waiter: Option<&Arc<Waiter>>,
    ) -> Result<Attempt, LockError> {
        let inner = &self.inner;
        let (n, q) = (inner.nodes.len(), inner.quorum);
        let handle = Arc::new(RedlockHandle {
            inner: Arc::clone(inner),
            lock: Arc::new(LockRef {
                keys: inner.keys.all(name),
                owner: OwnerToken::random().to_hex(),
                record: opts.holder_record().as_bytes().to_vec(),
            }),
        });
        // If this future is dropped mid-flight, the grant is released on all
        // nodes in the background.
        let pending = PendingGrant::new(Arc::clone(&handle) as Arc<dyn GuardHandle>);
        let start = Instant::now();
        let granted = |g: &NodeGrant| matches!(g, NodeGrant::Granted(_));
        let held = |g: &NodeGrant| matches!(g, NodeGrant::Held(_));
        let replies = gather_grants(
            inner.nodes.iter().map(|node| {
                Arc::clone(node).acquire(Arc::clone(&handle.lock), opts.ttl, waiter.cloned())
            }),
            q,
            granted,
            held,
        )
        .await;
        let grants: Vec<(usize, u64)> = replies
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Some(Ok(NodeGrant::Granted(t))) => Some((i, *t)),
                _ => None,
            })
            .collect();
        let mut too_late = None;
        if grants.len() >= q
            && let Some(token) = self.fence(&handle, &grants).await
        {
            let lease = self.lease(start, opts);
            if self.in_time(&lease, opts) {
                if let Some(waiter) = waiter {
                    self.leave_queues(&handle, waiter, &replies);
                }
                let handle = pending.disarm();
                let guard = LockGuard::new(name, Some(token), CAPABILITIES, lease, handle);
                return Ok(Attempt::Acquired(guard.kept_by(
                    &self.watchdog,
                    opts,
                    Unrenewed::Left,
                )));
            }
            tracing::debug!(target: "distlock", lock = %name, elapsed = ?start.elapsed(), "granted too late; giving it back");
            too_late = Some(start.elapsed());
        }
        // A queued waiter rejoins each queue by its ticket as it gives a node
        // back, and the node goes to the first in line: so every node ends
        // up reserved for the same, earliest waiter, and a split vote does
        // not repeat.
        self.give_back(
            std::slice::from_ref(&handle.lock),
            &replies,
            |g| matches!(g, NodeGrant::Granted(_)),
            |g| matches!(g, NodeGrant::Held(_)),
            waiter,
        )
        .await;
        pending.disarm();
        if let Some(took) = too_late {
            return Ok(Attempt::TooLate(granted_too_late(
                BACKEND, name, took, opts.ttl,
            )));
        }
        let down = failed(&replies);
        if n - down < q {
            return Err(quorum_not_reached(grants.len(), q, &replies, &inner.names));
        }
        Ok(Attempt::Held {
            expires_in: if grants.is_empty() {
                free_in(&replies, q)
            } else {
                None
            },
        })
    }

    /// The lease of a grant whose requests went out at `start`: the TTL
    /// less the clock drift and the safety margin.
    pub(crate) fn lease(&self, start: Instant, opts: &LockOptions) -> Arc<LeaseState> {
        Arc::new(
            LeaseState::lease_with_drift(start, opts.ttl, self.inner.config.drift_factor)
                .with_margin(opts.safety_margin)
                .delaying(opts.lock_delay),
        )
    }

    /// Whether `lease` (of a TTL of `opts.ttl`) still has more than
    /// `min_validity` of the TTL left: a grant that took longer is given
    /// back.
    pub(crate) fn in_time(&self, lease: &LeaseState, opts: &LockOptions) -> bool {
        let enough = opts.ttl.mul_f64(self.inner.config.min_validity);
        lease
            .deadline()
            .is_some_and(|d| d.saturating_duration_since(Instant::now()) > enough)
    }

    /// Give `locks` back wherever they may have landed: on every node
    /// whose reply was not a refusal (`refused`), including those that
    /// failed or were not waited for. Waits for the nodes that granted
    /// (`granted`: they answer); the rest finish in the background. A
    /// `rejoin` waiter takes its place in each queue again as it gives a
    /// node back.
    pub(crate) async fn give_back<T>(
        &self,
        locks: &[Arc<LockRef>],
        replies: &Replies<T>,
        granted: impl Fn(&T) -> bool,
        refused: impl Fn(&T) -> bool,
        rejoin: Option<&Arc<Waiter>>,
    ) {
        let maybe_ours: Vec<(&Arc<Node>, bool)> = self
            .inner
            .nodes
            .iter()
            .zip(replies)
            .filter(|(_, r)| !matches!(r, Some(Ok(g)) if refused(g)))
            .map(|(node, r)| (node, matches!(r, Some(Ok(g)) if granted(g))))
            .collect();
        let each: Vec<(&Arc<Node>, bool, &Arc<LockRef>)> = maybe_ours
            .iter()
            .flat_map(|&(node, granting)| locks.iter().map(move |lock| (node, granting, lock)))
            .collect();
        gather(
            each.iter().map(|&(node, _, lock)| {
                Arc::clone(node).release(Arc::clone(lock), rejoin.cloned())
            }),
            Stragglers::Finish,
            |r| r.iter().zip(&each).all(|(r, &(_, g, _))| r.is_some() || !g),
        )
        .await;
    }

    /// After winning: leave the queue of every node that did not grant, in
    /// the background, passing on any reservation made for us there
    /// meanwhile (else it would hold that node up for the hand-off window).
    fn leave_queues(
        &self,
        handle: &RedlockHandle,
        waiter: &Arc<Waiter>,
        replies: &Replies<NodeGrant>,
    ) {
        let behind: Vec<_> = self
            .inner
            .nodes
            .iter()
            .zip(replies)
            .filter(|(_, r)| !matches!(r, Some(Ok(NodeGrant::Granted(_)))))
            .map(|(node, _)| {
                Arc::clone(node).withdraw(Arc::clone(&handle.lock), Arc::clone(waiter))
            })
            .collect();
        if !behind.is_empty()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move {
                gather(behind, Stragglers::Finish, |_| false).await;
            });
        }
    }

    /// The fencing token for a majority `grants` (node index, counter after
    /// its increment): the largest counter, once a majority carries it.
    /// `None` if it could not be written to a majority.
    pub(crate) async fn fence(
        &self,
        handle: &RedlockHandle,
        grants: &[(usize, u64)],
    ) -> Option<u64> {
        let q = self.inner.quorum;
        let token = grants.iter().map(|&(_, t)| t).max()?;
        let carried = grants.iter().filter(|&&(_, t)| t == token).count();
        if carried >= q {
            return Some(token);
        }
        let behind = grants.iter().filter(|&&(_, t)| t < token);
        let replies = gather(
            behind.map(|&(i, _)| {
                Arc::clone(&self.inner.nodes[i]).fence(Arc::clone(&handle.lock), token)
            }),
            Stragglers::Finish,
            |r| carried + count(r, |&ok| ok) >= q,
        )
        .await;
        (carried + count(&replies, |&ok| ok) >= q).then_some(token)
    }

    /// Subscribe to `channel` on the nodes, concurrently; done once a
    /// majority has subscribed (or every node answered). Failures only cost
    /// promptness: the backstop timer still runs.
    pub(crate) async fn subscribe_all(&self, channel: &str) -> Vec<Subscription> {
        let inner = &self.inner;
        let channel: Arc<str> = channel.into();
        let replies = gather(
            inner.nodes.iter().map(|node| {
                Arc::clone(node).subscribe(Arc::clone(&channel), inner.wakeups.clone())
            }),
            Stragglers::Finish,
            |r| count(r, |_| true) >= inner.quorum,
        )
        .await;
        for cause in causes(&replies, &inner.names) {
            tracing::debug!(target: "distlock", %cause, "waiting without this node's release messages");
        }
        replies
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .collect()
    }
}

/// How long until a majority of nodes may be free, from the remaining TTLs
/// that the refusing nodes reported (`None` if unknown).
fn free_in(replies: &Replies<NodeGrant>, q: usize) -> Option<Duration> {
    let free_now = count(replies, |g| matches!(g, NodeGrant::Granted(_)));
    let mut left: Vec<Option<Duration>> = replies
        .iter()
        .filter_map(|r| match r {
            Some(Ok(NodeGrant::Held(left))) => Some(*left),
            _ => None,
        })
        .collect();
    left.sort_by_key(|l| l.unwrap_or(Duration::MAX));
    let more = q.checked_sub(free_now)?.checked_sub(1)?;
    left.get(more).copied().flatten()
}

/// What a permit's request gets: Redlock offers no semaphores (its
/// capabilities say so, and the request's checks refuse one before it
/// reaches the backend).
fn no_semaphores() -> LockError {
    LockError::Unsupported {
        backend: "redlock",
        operation: "semaphores",
    }
}

#[async_trait]
impl RawLock for Redlock {
    async fn attempt_once(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        match req.kind() {
            Kind::Rw(access) => self.try_rw(req, access).await,
            Kind::Permit(_) => Err(no_semaphores()),
            Kind::Lock => self.attempt(req.name, req.opts, None).await?.into_guard(),
        }
    }

    /// The set script on every node at once; a majority granting the
    /// whole set takes it; split votes are tried again a few times.
    async fn attempt_set_once(
        &self,
        reqs: &[Request<'_>],
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        self.try_set(reqs).await
    }

    async fn wait(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        match req.kind() {
            Kind::Rw(access) => return self.wait_for_rw(req, access).await,
            Kind::Permit(_) => return Err(no_semaphores()),
            Kind::Lock => {}
        }
        let ticket = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        let waiter = Arc::new(Waiter {
            id: OwnerToken::random().to_hex(),
            ticket: ticket.to_string(),
            entry_ttl: lock_redis::raw::queue_entry_ttl(req.opts.ttl),
        });
        let wake = self.inner.wakeups.subscribe(&waiter.id);
        wait_in_queue(&Queue(self), req, waiter, wake).await
    }

    fn raw_capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    /// Held when one owner holds the key on a majority of nodes; its token
    /// is the counter a majority of those nodes carry (see
    /// `majority_token`), its lease the time until fewer than a majority
    /// still hold it, and the waiters the longest queue on any node.
    async fn raw_inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        validate_name(name)?;
        let states = self.states(name, "reading a lock's state").await?;
        let waiters = states.iter().map(|s| s.queued).max();
        let Some(owner) = majority_owner(&states, self.inner.quorum) else {
            return Ok(LockInfo::free().with_waiters(waiters));
        };
        let holding: Vec<&LockState> = states
            .iter()
            .filter(|s| s.owner.as_deref() == Some(owner))
            .collect();
        let token = majority_token(&holding, self.inner.quorum);
        let mut left: Vec<Duration> = holding.iter().filter_map(|s| s.left).collect();
        left.sort_unstable_by(|a, b| b.cmp(a));
        // The record most holding nodes carry: a `set_value` that
        // succeeded reached a majority of them (one that failed may have
        // reached a few).
        let records: Vec<&[u8]> = holding.iter().filter_map(|s| s.holder.as_deref()).collect();
        let holder = records
            .iter()
            .max_by_key(|r| records.iter().filter(|o| o == r).count())
            .map(|r| HolderRecord::decode_for(BACKEND, name, r))
            .transpose()?;
        Ok(LockInfo::held()
            .with_fencing_token(token)
            .with_expires_in(left.get(self.inner.quorum - 1).copied())
            .with_waiters(waiters)
            .with_holder(holder))
    }

    /// Every node's view of reader-writer lock `name`: the mode a
    /// majority shows and its holders, the counter a majority carries.
    async fn raw_inspect_rw(&self, name: &str) -> Result<RwLockInfo, LockError> {
        self.inspect_rw_lock(name).await
    }

    /// The lock's changes channel on the nodes, merged: each node's
    /// acquire, release, holder and fencing scripts publish on it. Done
    /// once a majority has subscribed (a node that answers later is left
    /// out); fails unless a majority did. Every grant and release is made
    /// on a majority, so at least one subscribed node hears of it.
    async fn raw_changes(&self, name: &str) -> Result<Option<Changes>, LockError> {
        validate_name(name)?;
        let inner = &self.inner;
        let channel: Arc<str> = inner.keys.all(name).changes.into();
        let replies = gather(
            inner
                .nodes
                .iter()
                .map(|node| Arc::clone(node).observe(Arc::clone(&channel), inner.wakeups.clone())),
            Stragglers::Finish,
            |r| count(r, |_| true) >= inner.quorum,
        )
        .await;
        let subscribed = count(&replies, |_| true);
        if subscribed < inner.quorum {
            return Err(LockError::QuorumNotReached {
                acquired: subscribed,
                needed: inner.quorum,
                causes: causes(&replies, &inner.names)
                    .into_iter()
                    .map(|c| format!("watching a lock for observers: {c}"))
                    .collect(),
            });
        }
        let streams = replies.into_iter().flatten().filter_map(Result::ok);
        Ok(Some(Box::pin(futures_util::stream::select_all(streams))))
    }

    /// Release `name` on every node on behalf of each owner found there,
    /// with the release script, so each node hands itself to the first
    /// waiter in its queue as on a normal release. `true` if an owner held
    /// it on a majority. The holder's next renewal fails and its `lost()`
    /// fires.
    async fn raw_force_release(&self, name: &str) -> Result<bool, LockError> {
        validate_name(name)?;
        let states = self.states(name, "reading a lock's holder").await?;
        let held = majority_owner(&states, self.inner.quorum).is_some();
        let mut owners: Vec<String> = states.into_iter().filter_map(|s| s.owner).collect();
        owners.sort_unstable();
        owners.dedup();
        for owner in owners {
            let lock = Arc::new(LockRef {
                keys: self.inner.keys.all(name),
                owner,
                record: Vec::new(),
            });
            gather(
                self.inner
                    .nodes
                    .iter()
                    .map(|node| Arc::clone(node).release(Arc::clone(&lock), None)),
                Stragglers::Finish,
                |_| false,
            )
            .await;
        }
        Ok(held)
    }
}

/// The holder's fencing token, from the nodes that hold the key for it: the
/// counter that at least `quorum` of them carry. A grant's token is the
/// largest counter of the majority that decided it, written back to that
/// majority, so those nodes carry exactly the token. A node that granted
/// after the decision (a straggler) keeps its own counter, which earlier
/// partial grants may have raised above the token: the largest counter is
/// not the holder's. No value other than the token can be on a majority
/// (fewer than a majority of nodes are left). `None` while a grant is still
/// writing its token back.
fn majority_token(holding: &[&LockState], quorum: usize) -> Option<u64> {
    let mut counters: Vec<u64> = holding.iter().filter_map(|s| s.fence).collect();
    counters.sort_unstable();
    counters
        .chunk_by(|a, b| a == b)
        .find(|same| same.len() >= quorum)
        .map(|same| same[0])
}

/// The owner token that holds the key on at least `quorum` nodes, if any.
fn majority_owner(states: &[LockState], quorum: usize) -> Option<&str> {
    states
        .iter()
        .filter_map(|s| s.owner.as_deref())
        .find(|owner| {
            states
                .iter()
                .filter(|s| s.owner.as_deref() == Some(*owner))
                .count()
                >= quorum
        })
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redlock")
            .field("nodes", &self.inner.names)
            .field("quorum", &self.inner.quorum)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

fn report_withdrawals<T>(replies: Replies<T>) {
    if failed(&replies) > 0 {
        tracing::debug!(target: "distlock",
            "withdrawing a waiter failed on some nodes; its entries expire by themselves"
        );
    }
}

/// The lock as its queued wait sees it.
struct Queue<'a>(&'a Redlock);

impl QueuedLock for Queue<'_> {
    type Waiter = Arc<Waiter>;
    type Listening = Vec<Subscription>;

    /// Listening already if a majority of nodes has the lock's channel
    /// subscribed.
    fn joined(&self, name: &str) -> Option<Vec<Subscription>> {
        let channel = self.0.inner.keys.channel(name);
        let joined: Vec<Subscription> = self
            .0
            .inner
            .nodes
            .iter()
            .filter_map(|node| node.join_subscribed(&channel))
            .collect();
        (joined.len() >= self.0.inner.quorum).then_some(joined)
    }

    async fn listen(&self, name: &str) -> Result<Vec<Subscription>, LockError> {
        Ok(self.0.subscribe_all(&self.0.inner.keys.channel(name)).await)
    }

    async fn queue_attempt(
        &self,
        name: &str,
        opts: &LockOptions,
        waiter: Option<&Arc<Waiter>>,
    ) -> Result<Attempt, LockError> {
        self.0.attempt(name, opts, waiter).await
    }

    /// From every node at once, each bounded by the node timeout.
    fn withdrawal(
        &self,
        name: &str,
        waiter: &Arc<Waiter>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let lock = Arc::new(LockRef {
            keys: self.0.inner.keys.all(name),
            owner: String::new(),
            record: Vec::new(),
        });
        let withdrawals: Vec<_> = self
            .0
            .inner
            .nodes
            .iter()
            .map(|node| Arc::clone(node).withdraw(Arc::clone(&lock), Arc::clone(waiter)))
            .collect();
        async move {
            report_withdrawals(gather(withdrawals, Stragglers::Finish, |_| false).await);
        }
    }

    /// Until the holders' leases end (a node hands the lock over sooner).
    /// A split vote (contenders each holding a minority) or no majority
    /// reachable: after a random delay.
    fn pause_while_held(
        &self,
        holder_left: Option<Duration>,
        opts: &LockOptions,
        tries: u32,
    ) -> Duration {
        match holder_left {
            Some(left) => left + Duration::from_millis(1),
            None => opts.backoff.delay(tries),
        }
    }

    /// A node that answers late for a moment (a slow disk, a busy host)
    /// must not fail a waiting acquire; a majority that stays unreachable
    /// fails it in bounded time.
    fn unreachable(&self, error: &LockError) -> bool {
        matches!(error, LockError::QuorumNotReached { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(ms: u64) -> Option<Result<NodeGrant, LockError>> {
        Some(Ok(NodeGrant::Held(Some(Duration::from_millis(ms)))))
    }

    fn holding(fence: u64) -> LockState {
        LockState {
            owner: Some("owner".into()),
            left: Some(Duration::from_secs(1)),
            fence: Some(fence),
            queued: 0,
            holder: None,
        }
    }

    #[test]
    fn the_token_is_the_counter_a_majority_carries() {
        let states = [holding(7), holding(7), holding(12), holding(7), holding(3)];
        let refs: Vec<&LockState> = states.iter().collect();
        assert_eq!(majority_token(&refs, 3), Some(7));
        let split = [holding(7), holding(12), holding(7), holding(12)];
        let refs: Vec<&LockState> = split.iter().collect();
        assert_eq!(majority_token(&refs, 3), None, "no value on a majority");
    }

    #[test]
    fn a_majority_is_free_when_the_quorum_th_lease_ends() {
        let replies: Replies<NodeGrant> = vec![held(300), held(100), held(200), None, None];
        assert_eq!(free_in(&replies, 3), Some(Duration::from_millis(300)));
        let replies: Replies<NodeGrant> = vec![
            held(300),
            held(100),
            held(200),
            Some(Ok(NodeGrant::Granted(4))),
            None,
        ];
        assert_eq!(free_in(&replies, 3), Some(Duration::from_millis(200)));
        let replies: Replies<NodeGrant> = vec![held(300), None, None];
        assert_eq!(free_in(&replies, 2), None, "not enough nodes answered");
    }
}
