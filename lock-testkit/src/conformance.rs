//! The conformance suite every backend runs against its real server.
//!
//! Each case is a plain async function taking a [`Harness`]; the
//! [`conformance_suite!`](crate::conformance_suite) macro turns every case into
//! its own `#[tokio::test]` in a module named `conformance`, so
//! `cargo test conformance` runs exactly the suite and the output names each
//! case per backend. The same macro adds the election suite
//! ([`crate::election`]) in a module named `election`.
//!
//! ```text
//! async fn harness() -> lock_testkit::conformance::Harness { /* connect two clients */ }
//! lock_testkit::conformance_suite!(harness());
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use lock_core::{
    Backoff, DistributedLock, Fencing, LockError, LockGuard, LockOptions, LockOwner, LossReason,
    MAX_NAME_BYTES, Wait, Waiting,
};

/// Fault injection a backend provides to the suite.
#[async_trait]
pub trait FaultHook: Send + Sync {
    /// Make the current holder of `name` lose its lock on the server, as if
    /// its lease had expired or an operator had deleted it, without telling
    /// the holder's client.
    async fn take_away(&self, name: &str) -> Result<(), LockError>;

    /// How many acquisitions of `name` wait on the server right now (queue
    /// entries, waiting sessions, waiter nodes or ticket rows), where the
    /// backend can tell; `None` where it cannot.
    async fn queued(&self, name: &str) -> Result<Option<usize>, LockError> {
        let _ = name;
        Ok(None)
    }
}

/// Poll the fault hook until the number of queued acquisitions of `name`
/// satisfies `done`, failing with `what` (given the last count) after
/// `limit`; `false` at once where the backend cannot tell.
async fn poll_queued(
    h: &Harness,
    name: &str,
    done: impl Fn(usize) -> bool,
    limit: Duration,
    what: impl Fn(usize) -> String,
) -> bool {
    let start = Instant::now();
    loop {
        match h.hook.queued(name).await.expect("fault hook") {
            None => return false,
            Some(q) if done(q) => return true,
            Some(q) => assert!(start.elapsed() < limit, "{}", what(q)),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A handshake instead of a sleep: where the backend can tell, wait until
/// at least `n` acquisitions of `name` are queued (failing after 10 s);
/// elsewhere give the waiters 300 ms to take their places.
async fn await_queued(h: &Harness, name: &str, n: usize) {
    let seen = poll_queued(
        h,
        name,
        |q| q >= n,
        Duration::from_secs(10),
        |q| format!("only {q} of {n} waiters ever queued"),
    )
    .await;
    if !seen {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Where the backend can tell, wait (up to 2 s: a withdrawal may finish in
/// the background) until no acquisition of `name` is queued any more;
/// `false` at once where it cannot tell.
async fn assert_queue_drains(h: &Harness, name: &str, after: &str) -> bool {
    poll_queued(
        h,
        name,
        |q| q == 0,
        Duration::from_secs(2),
        |q| format!("{q} acquisitions still queued {after}"),
    )
    .await
}

/// The tokens of successive grants, all present and strictly increasing.
fn assert_strictly_increasing(tokens: &[Option<u64>], what: &str) {
    let t: Vec<u64> = tokens
        .iter()
        .map(|t| t.expect("fencing backend returned no token"))
        .collect();
    assert!(t.windows(2).all(|w| w[0] < w[1]), "{what}: {t:?}");
}

/// For a [`FaultHook::take_away`] built on a backend call that reports
/// whether there was a holder: `Ok` if there was, `NotHeld` if not.
pub fn taken_away(name: &str, had_holder: bool) -> Result<(), LockError> {
    if had_holder {
        Ok(())
    } else {
        Err(LockError::NotHeld {
            name: name.to_string(),
        })
    }
}

/// What each case gets: two independent clients of the same lock service
/// (separate connections or sessions where the backend has them) and the
/// backend's fault hook.
#[derive(Clone)]
pub struct Harness {
    /// The first client.
    pub lock: Arc<dyn DistributedLock>,
    /// A second, independent client of the same service.
    pub other: Arc<dyn DistributedLock>,
    /// Fault injection on the service.
    pub hook: Arc<dyn FaultHook>,
}

impl Harness {
    /// The harness of a backend from its connect function: two clients for
    /// the cases, and a third, the operator, as the fault hook (see
    /// [`OperatorHook`]). Panics if a client cannot connect (a test utility).
    pub async fn of<L, F>(connect: F) -> Harness
    where
        L: DistributedLock + 'static,
        F: AsyncFn() -> L,
    {
        Harness {
            lock: Arc::new(connect().await),
            other: Arc::new(connect().await),
            hook: Arc::new(OperatorHook(Arc::new(connect().await))),
        }
    }
}

/// The fault hook every backend has through its operator API, on a client
/// of its own: a lock is taken away with
/// [`force_release`](DistributedLock::force_release) and its queue read
/// with [`inspect`](DistributedLock::inspect).
pub struct OperatorHook(pub Arc<dyn DistributedLock>);

#[async_trait]
impl FaultHook for OperatorHook {
    async fn take_away(&self, name: &str) -> Result<(), LockError> {
        taken_away(name, self.0.force_release(name).await?)
    }

    async fn queued(&self, name: &str) -> Result<Option<usize>, LockError> {
        Ok(self.0.inspect(name).await?.waiters)
    }
}

/// A lock name no other case (or concurrent test run) uses.
pub fn unique_name(case: &str) -> String {
    format!("conformance/{case}/{:016x}", rand::random::<u64>())
}

/// Short polling delays so that polling backends hand over quickly in tests.
fn quick_backoff() -> Backoff {
    Backoff::default()
        .with_initial(Duration::from_millis(2))
        .with_max(Duration::from_millis(25))
}

fn opts(ttl_ms: u64, wait: Wait, auto_renew: bool) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_millis(ttl_ms))
        .wait(wait)
        .auto_renew(auto_renew)
        .backoff(quick_backoff())
}

/// Slack for scheduling and round trips when a case waits for a TTL.
const SLACK: Duration = Duration::from_millis(1500);

/// `ms` as a TTL, raised to the backend's shortest lease (etcd leases are
/// whole seconds): cases about expiry measure from the TTL really granted.
fn short_ttl(h: &Harness, ms: u64) -> Duration {
    Duration::from_millis(ms).max(h.lock.capabilities().min_lease)
}

fn ttl_opts(ttl: Duration, wait: Wait, auto_renew: bool) -> LockOptions {
    opts(ttl.as_millis() as u64, wait, auto_renew)
}

/// The first grant of `name`, which nobody else holds, on a short lease
/// (`ttl`, no renewal), and the moment just before the request that got
/// it. A machine stalled for most of such a lease makes the backend give
/// the grant back as a transient error ([`lock_core::raw::granted_too_late`]),
/// which is asked again, three attempts at most; any other error fails.
async fn acquire_unheld(
    lock: &Arc<dyn DistributedLock>,
    name: &str,
    ttl: Duration,
) -> (Instant, LockGuard) {
    let mut attempt = 1;
    loop {
        let asked = Instant::now();
        match lock.acquire(name, &ttl_opts(ttl, Wait::No, false)).await {
            Ok(g) => return (asked, g),
            Err(e) if e.is_transient() && attempt < 3 => {
                tracing::info!(lock = name, error = %e.report(), "a short lease's first grant failed transiently (a grant too late for it); asking again");
                attempt += 1;
            }
            Err(e) => panic!("acquire {name:?}: {e:?}"),
        }
    }
}

/// The names every case registers, in order; used by the macro.
#[macro_export]
macro_rules! conformance_suite {
    ($harness:expr) => {
        $crate::lock_conformance_suite!($harness);

        /// The election suite (and the holder record) against this backend.
        mod election {
            #[allow(unused_imports)]
            use super::*;
            $crate::__election_cases!($harness);
        }

        /// The semaphore suite against this backend (or its refusal).
        mod semaphore {
            #[allow(unused_imports)]
            use super::*;
            $crate::__semaphore_cases!($harness);
        }

        /// The reader-writer lock suite against this backend (or its
        /// refusal).
        mod rw_lock {
            #[allow(unused_imports)]
            use super::*;
            $crate::__rw_lock_cases!($harness);
        }

        /// The lock-set suite against this backend.
        mod lock_set {
            #[allow(unused_imports)]
            use super::*;
            $crate::__lock_set_cases!($harness);
        }

        /// The lock-timing suite (lock delay, hold) against this backend
        /// (or its refusals).
        mod lock_timing {
            #[allow(unused_imports)]
            use super::*;
            $crate::__lock_timing_cases!($harness);
        }
    };
}

/// The lock cases of the suite alone (module `conformance`), for a second
/// way of building a backend's lock whose other primitives run the same
/// code as the first's (a lock made from the application's own client).
#[macro_export]
macro_rules! lock_conformance_suite {
    ($harness:expr) => {
        /// The shared lock-core conformance suite against this backend.
        mod conformance {
            #[allow(unused_imports)]
            use super::*;
            $crate::__conformance_cases!($harness;
                exclusion_under_contention,
                waiters_on_a_busy_lock_are_all_served,
                try_acquire_while_held,
                waiter_gets_lock_after_release,
                a_release_reaches_the_waiter_when_its_client_goes_at_once,
                releaser_does_not_overtake_a_waiter,
                wait_timeout,
                cancelled_waiter_leaves_nothing_behind,
                stale_release_is_refused,
                abandoned_lock_expires,
                watchdog_keeps_lock_alive,
                lost_fires_when_taken_away,
                fencing_tokens_increase,
                extend_prolongs_and_fails_when_gone,
                drop_releases,
                names_are_independent_and_distinct,
                invalid_input_is_typed,
                options_at_their_limits_never_panic,
                reentrant_owner_counts,
                grant_after_long_wait_is_valid,
                very_long_waits_work,
                lost_fires_ahead_of_expiry,
                racing_on_a_new_name,
                validity_never_outlasts_the_lease,
                waiters_are_served_in_arrival_order,
                a_waiter_behind_a_cancelled_one_waits_for_the_holder,
                notified_waiters_do_not_poll,
                cancellation_at_any_point_leaves_the_lock_free,
                many_locks_held_at_once,
                inspect_and_force_release,
            );
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($harness:expr; $($case:ident),* $(,)?) => {
        $crate::__conformance_cases!(@module conformance; $harness; $($case),*);
    };
    (@module $module:ident; $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let harness = $harness.await;
                $crate::$module::$case(harness).await;
            }
        )*
    };
}

/// 16 tasks × 50 acquisitions, alternating between the two clients, update
/// a shared counter non-atomically (read, sleep 1 ms, write) inside the lock; the
/// total is exact and no two tasks are ever inside at once.
pub async fn exclusion_under_contention(h: Harness) {
    const TASKS: u64 = 16;
    const ROUNDS: u64 = 50;
    let name = unique_name("exclusion");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let lock = if t % 2 == 0 {
            h.lock.clone()
        } else {
            h.other.clone()
        };
        let (name, counter, inside, tokens) = (
            name.clone(),
            counter.clone(),
            inside.clone(),
            tokens.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let o = opts(10_000, Wait::UpTo(Duration::from_secs(120)), false);
            for _ in 0..ROUNDS {
                let guard = lock
                    .acquire(&name, &o)
                    .await
                    .expect("acquire under contention");
                assert!(
                    !inside.swap(true, Ordering::SeqCst),
                    "two holders inside the lock at once"
                );
                // Recorded inside the lock: in grant order.
                tokens
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(guard.fencing_token());
                let seen = counter.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
                counter.store(seen + 1, Ordering::SeqCst);
                inside.store(false, Ordering::SeqCst);
                assert!(
                    guard.release().await.expect("release"),
                    "lock was not ours at release"
                );
            }
        }));
    }
    for t in tasks {
        t.await.expect("contending task panicked");
    }
    assert_eq!(counter.load(Ordering::SeqCst), TASKS * ROUNDS);
    if h.lock.capabilities().fencing != Fencing::None {
        let tokens = tokens.lock().unwrap_or_else(|e| e.into_inner());
        assert_strictly_increasing(&tokens, "tokens not strictly increasing in grant order");
    }
    eprintln!(
        "exclusion: {} acquisitions in {:?}",
        TASKS * ROUNDS,
        started.elapsed()
    );
}

/// Eight tasks, alternating between the two clients, each take one lock
/// ten times with the default options (backoff included) and a bounded
/// wait, holding it for a moment: every one of the 80 acquisitions is
/// served within its wait (the holders' releases reach the waiters; no
/// waiter sleeps through a free lock until its wait runs out).
pub async fn waiters_on_a_busy_lock_are_all_served(h: Harness) {
    const TASKS: usize = 8;
    const CYCLES: usize = 10;
    let name = unique_name("busy");
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let lock = if t % 2 == 0 {
            h.lock.clone()
        } else {
            h.other.clone()
        };
        let name = name.clone();
        tasks.push(tokio::spawn(async move {
            let o = LockOptions::new()
                .ttl(Duration::from_secs(10))
                .wait(Wait::UpTo(Duration::from_secs(10)));
            for cycle in 0..CYCLES {
                let waited = Instant::now();
                let guard = lock.acquire(&name, &o).await.unwrap_or_else(|e| {
                    panic!(
                        "task {t}, cycle {cycle}: not served in {:?} of waiting on a busy lock: {e}",
                        waited.elapsed()
                    )
                });
                tokio::time::sleep(Duration::from_millis(5)).await;
                assert!(guard.release().await.expect("release"));
            }
        }));
    }
    for t in tasks {
        t.await.expect("a busy lock's task panicked");
    }
    eprintln!(
        "busy lock: {} acquisitions by {TASKS} tasks in {:?}",
        TASKS * CYCLES,
        started.elapsed()
    );
}

/// One client holds many auto-renewed locks at once: `max_held` where the
/// backend bounds it, else 64. Beyond the bound an acquire with a long wait is refused at
/// once with `LimitReached` naming the bound (not left to time out on a
/// pool), and a release makes room again.
pub async fn many_locks_held_at_once(h: Harness) {
    let caps = h.lock.capabilities();
    let count = caps.max_held.unwrap_or(64);
    let prefix = unique_name("many");
    // Renewed, so that the watchdog carries them all meanwhile.
    let o = opts(5_000, Wait::UpTo(Duration::from_secs(10)), true);
    let mut guards = Vec::with_capacity(count);
    for i in 0..count {
        let name = format!("{prefix}/{i}");
        let guard = h
            .lock
            .acquire(&name, &o)
            .await
            .unwrap_or_else(|e| panic!("lock {i} of {count}: {e}"));
        guards.push(guard);
    }
    assert!(guards.iter().all(|g| g.is_lost().is_none()), "all held");
    if caps.fencing != Fencing::None {
        assert!(
            guards.iter().all(|g| g.fencing_token().is_some()),
            "every grant has a token"
        );
    }
    if let Some(limit) = caps.max_held {
        let beyond = format!("{prefix}/beyond");
        let long = opts(5_000, Wait::UpTo(Duration::from_secs(300)), true);
        let refused = tokio::time::timeout(Duration::from_secs(60), h.lock.acquire(&beyond, &long))
            .await
            .expect("refused before a minute of its five-minute wait");
        match refused {
            Err(LockError::LimitReached {
                limit: l, advice, ..
            }) => {
                assert_eq!(l, limit);
                assert!(advice.contains("max_connections"), "{advice}");
            }
            other => panic!(
                "lock {} of a client limited to {limit}: {other:?}",
                limit + 1
            ),
        }
        let freed = guards.pop().expect("at least one held");
        assert!(freed.release().await.expect("release"), "still ours");
        guards.push(
            h.lock
                .acquire(&beyond, &o)
                .await
                .expect("a release makes room"),
        );
    }
    for guard in guards {
        let name = guard.name().to_string();
        assert!(
            guard.release().await.expect("release"),
            "{name} was still ours"
        );
    }
}

/// try_acquire on a held lock gives `None`; after release it succeeds.
pub async fn try_acquire_while_held(h: Harness) {
    let name = unique_name("try");
    let o = opts(10_000, Wait::No, false);
    let g = h
        .lock
        .try_acquire(&name, &o)
        .await
        .expect("try")
        .expect("free lock");
    assert!(h.other.try_acquire(&name, &o).await.expect("try").is_none());
    assert!(
        h.lock.try_acquire(&name, &o).await.expect("try").is_none(),
        "not reentrant by default"
    );
    assert!(
        matches!(
            h.other.acquire(&name, &o).await,
            Err(LockError::Timeout { .. })
        ),
        "acquire with Wait::No on a held lock must time out at once"
    );
    assert!(g.release().await.expect("release"));
    let g2 = h
        .other
        .try_acquire(&name, &o)
        .await
        .expect("try")
        .expect("lock free after release");
    assert!(g2.release().await.expect("release"));
}

/// A waiting acquire is granted soon after the holder releases (the
/// hand-off time is printed, not asserted tightly).
pub async fn waiter_gets_lock_after_release(h: Harness) {
    let name = unique_name("handoff");
    let o = opts(10_000, Wait::UpTo(Duration::from_secs(30)), false);
    let holder = h.lock.acquire(&name, &o).await.expect("acquire");
    let waiter = {
        let (other, name, o) = (h.other.clone(), name.clone(), o.clone());
        tokio::spawn(async move {
            let g = other.acquire(&name, &o).await;
            (Instant::now(), g)
        })
    };
    await_queued(&h, &name, 1).await;
    assert!(
        !waiter.is_finished(),
        "waiter got the lock while it was held"
    );
    let released_at = Instant::now();
    assert!(holder.release().await.expect("release"));
    let (granted_at, g) = waiter.await.expect("waiter task");
    let g = g.expect("waiter acquires after release");
    let handoff = granted_at - released_at;
    eprintln!("hand-off: {:.2} ms", handoff.as_secs_f64() * 1e3);
    assert!(
        handoff < Duration::from_secs(5),
        "hand-off took {handoff:?}"
    );
    assert!(g.release().await.expect("release"));
}

/// A holder whose client goes away as soon as its release returns (a
/// process that releases and exits) still hands the lock to the waiter
/// soon after, not when the released lease would have ended.
pub async fn a_release_reaches_the_waiter_when_its_client_goes_at_once(h: Harness) {
    let Harness { lock, other, .. } = h;
    let name = unique_name("release-then-exit");
    let o = opts(20_000, Wait::UpTo(Duration::from_secs(20)), true);
    let holder = other.acquire(&name, &o).await.expect("acquire");
    let waiter = {
        let (lock, name, o) = (lock.clone(), name.clone(), o.clone());
        tokio::spawn(async move { lock.acquire(&name, &o).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the waiter got in beside the holder");
    let released = Instant::now();
    assert!(holder.release().await.expect("release"));
    // The holder's client goes with its last reference.
    drop(other);
    let g = waiter.await.expect("waiter").expect("the waiter is served");
    assert!(
        released.elapsed() < SLACK,
        "the waiter was served {:?} after the release",
        released.elapsed()
    );
    assert!(g.release().await.expect("release"));
}

/// A holder that releases and at once asks again does not overtake a
/// waiter, on backends that claim a fair queue; on the others both still get
/// the lock, with increasing fencing tokens.
pub async fn releaser_does_not_overtake_a_waiter(h: Harness) {
    let name = unique_name("barging");
    let fair = h.lock.capabilities().fair_queue;
    let o = opts(10_000, Wait::UpTo(Duration::from_secs(20)), false);
    let holder = h.lock.acquire(&name, &o).await.expect("acquire");
    let first_token = holder.fencing_token();
    let waiter = {
        let (other, name, o) = (h.other.clone(), name.clone(), o.clone());
        tokio::spawn(async move { other.acquire(&name, &o).await.expect("waiter acquires") })
    };
    await_queued(&h, &name, 1).await;
    assert!(!waiter.is_finished(), "waiter got a held lock");
    assert!(holder.release().await.expect("release"));
    let again = {
        let (lock, name, o) = (h.lock.clone(), name.clone(), o.clone());
        tokio::spawn(async move {
            lock.acquire(&name, &o)
                .await
                .expect("releaser acquires again")
        })
    };
    if fair {
        let g = waiter.await.expect("waiter task");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!again.is_finished(), "the releaser overtook the waiter");
        let waiter_token = g.fencing_token();
        assert!(g.release().await.expect("release"));
        let g2 = again.await.expect("releaser task");
        assert!(
            first_token < waiter_token && waiter_token < g2.fencing_token()
                || first_token.is_none()
        );
        assert!(g2.release().await.expect("release"));
    } else {
        // Whoever won, the other follows once it is released.
        let (mut waiter, mut again) = (waiter, again);
        let (first, second) = tokio::select! {
            g = &mut waiter => (g.expect("waiter task"), again),
            g = &mut again => (g.expect("releaser task"), waiter),
        };
        let first_token = first.fencing_token();
        assert!(first.release().await.expect("release"));
        let second = second.await.expect("task");
        assert!(second.fencing_token() > first_token || first_token.is_none());
        assert!(second.release().await.expect("release"));
    }
}

/// acquire with a wait timeout on a held lock gives `Timeout` after about that time.
pub async fn wait_timeout(h: Harness) {
    const HOLDER_LEASE: Duration = Duration::from_secs(10);
    let name = unique_name("timeout");
    let holder = h
        .lock
        .acquire(
            &name,
            &opts(HOLDER_LEASE.as_millis() as u64, Wait::No, false),
        )
        .await
        .expect("acquire");
    let wait = Duration::from_millis(400);
    let start = Instant::now();
    let r = h
        .other
        .acquire(&name, &opts(10_000, Wait::UpTo(wait), false))
        .await;
    let took = start.elapsed();
    match r {
        Err(LockError::Timeout { name: n, .. }) => assert_eq!(n, name),
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(took >= wait, "gave up early: {took:?}");
    // Half the holder's lease: a wait that ignored its timeout and ran
    // towards the lease's end fails here, a slow machine does not (a
    // Postgres wait took 2.1 s under the soak: a pooled connection
    // opened under load).
    assert!(took < HOLDER_LEASE / 2, "gave up late: {took:?}");
    // Withdrawn before the timeout is reported, not in the background: a
    // process that exits on the timeout (a command-line tool) leaves no
    // waiter behind to be handed the lock.
    if let Some(q) = h.hook.queued(&name).await.expect("fault hook") {
        assert_eq!(q, 0, "still queued when the timed-out acquire returned");
    }
    assert!(holder.release().await.expect("release"));
    let next = h
        .lock
        .try_acquire(&name, &opts(10_000, Wait::No, false))
        .await
        .expect("try")
        .expect("the released lock goes to a newcomer at once, not to the timed-out waiter");
    assert!(next.release().await.expect("release"));
}

/// Dropping a waiting acquire leaves no waiter behind: where the backend
/// can tell, the queue empties, and a newcomer gets the released lock at
/// once (not after a reservation for a cancelled waiter runs out).
pub async fn cancelled_waiter_leaves_nothing_behind(h: Harness) {
    let name = unique_name("cancel");
    let holder = h
        .lock
        .acquire(&name, &opts(10_000, Wait::No, false))
        .await
        .expect("acquire");
    for _ in 0..3 {
        let r = tokio::time::timeout(
            Duration::from_millis(150),
            h.other.acquire(&name, &opts(10_000, Wait::Forever, false)),
        )
        .await;
        assert!(r.is_err(), "waiter must still be waiting when cancelled");
    }
    let spawned = {
        let (other, name) = (h.other.clone(), name.clone());
        tokio::spawn(async move {
            other
                .acquire(&name, &opts(10_000, Wait::Forever, false))
                .await
        })
    };
    // A handshake, not a sleep: the waiter is queued before it is
    // cancelled (a loaded machine can take far longer than 100 ms).
    await_queued(&h, &name, 1).await;
    spawned.abort();
    assert!(spawned.await.is_err_and(|e| e.is_cancelled()));
    let drained = assert_queue_drains(&h, &name, "after every waiter was cancelled").await;
    assert!(holder.release().await.expect("release"));
    let g = if drained {
        // Nobody is queued, so nothing may be reserved for a cancelled
        // waiter either: a newcomer on the other client gets the lock at
        // once.
        h.lock
            .try_acquire(&name, &opts(10_000, Wait::No, false))
            .await
            .expect("try")
            .expect("the released lock goes to a newcomer at once, not to a cancelled waiter")
    } else {
        // Where the queue cannot be seen (MySQL), a cancelled wait is ended
        // on the server in the background and may still hold the lock for
        // the moment it takes the server to notice.
        h.other
            .acquire(
                &name,
                &opts(10_000, Wait::UpTo(Duration::from_secs(2)), false),
            )
            .await
            .expect("no cancelled waiter may hold or block the lock")
    };
    assert!(g.release().await.expect("release"));
}

/// A release after the lease ran out reports not-held and leaves the new
/// owner's lock in place.
pub async fn stale_release_is_refused(h: Harness) {
    let name = unique_name("stale");
    let ttl = short_ttl(&h, 400);
    let (_, old) = acquire_unheld(&h.lock, &name, ttl).await;
    let new = h
        .other
        .acquire(&name, &opts(10_000, Wait::UpTo(ttl + SLACK), false))
        .await
        .expect("acquire after expiry");
    assert!(old.is_lost().is_some(), "old holder's deadline has passed");
    assert!(
        !old.release().await.expect("stale release"),
        "stale release must report not-held"
    );
    assert!(
        h.lock
            .try_acquire(&name, &opts(10_000, Wait::No, false))
            .await
            .expect("try")
            .is_none(),
        "stale release removed the new owner's lock"
    );
    assert!(new.release().await.expect("release"));
    // Releasing a lock that expired with nobody else taking it is not-held too.
    let (_, lapsed) = acquire_unheld(&h.lock, &name, ttl).await;
    // A server may notice an expiry a little late (etcd checks leases
    // twice a second).
    tokio::time::sleep(ttl + SLACK).await;
    assert!(
        !lapsed.release().await.expect("release"),
        "expired lock reported as still held"
    );
}

/// A leaked guard (no release, no renewal) frees its lock after the TTL.
pub async fn abandoned_lock_expires(h: Harness) {
    let name = unique_name("abandoned");
    let ttl = short_ttl(&h, 800);
    // The server's lease starts after the request was sent: measured from
    // before it, nobody may be granted the lock before a full TTL.
    let (start, g) = acquire_unheld(&h.lock, &name, ttl).await;
    std::mem::forget(g);
    // Refused while the TTL runs; a grant may only come once it has run
    // out (a loaded machine can take that long to ask).
    let probe = h
        .other
        .try_acquire(&name, &opts(10_000, Wait::No, false))
        .await
        .expect("try");
    if let Some(early) = probe {
        let took = start.elapsed();
        assert!(took >= ttl, "granted to another client after {took:?}");
        assert!(early.release().await.expect("release"));
    }
    let g2 = h
        .other
        .acquire(&name, &opts(10_000, Wait::UpTo(ttl + SLACK * 2), false))
        .await
        .expect("abandoned lock is acquirable after its TTL");
    let took = start.elapsed();
    assert!(took >= ttl, "granted before the TTL ran out: {took:?}");
    assert!(g2.release().await.expect("release"));
}

/// With auto-renew, a holder keeps a short-TTL lock for several TTLs and
/// nobody else gets it meanwhile. The TTL (1.5 s) leaves the watchdog room
/// for a renewal slowed by a busy machine: a stall longer than what is left
/// of the lease must (rightly) lose the lock, which is not this case's
/// subject.
pub async fn watchdog_keeps_lock_alive(h: Harness) {
    let name = unique_name("watchdog");
    let ttl = short_ttl(&h, 1500);
    let g = h
        .lock
        .acquire(&name, &ttl_opts(ttl, Wait::No, true))
        .await
        .expect("acquire");
    let end = Instant::now() + ttl * 3;
    while Instant::now() < end {
        tokio::time::sleep(ttl / 4).await;
        assert!(
            h.other
                .try_acquire(&name, &opts(10_000, Wait::No, false))
                .await
                .expect("try")
                .is_none(),
            "another client got a renewed lock"
        );
        assert_eq!(g.is_lost(), None, "renewed lock reported lost");
    }
    assert!(
        g.release().await.expect("release"),
        "renewed lock was not ours at release"
    );
}

/// `lost()` fires when the lock is taken away on the server, by the
/// backend's own signal (a renewal refused, the connection or session
/// ended), well before the validity deadline would have fired it anyway.
pub async fn lost_fires_when_taken_away(h: Harness) {
    let name = unique_name("lost");
    let ttl = Duration::from_secs(6).max(h.lock.capabilities().min_lease);
    let g = h
        .lock
        .acquire(&name, &ttl_opts(ttl, Wait::No, true))
        .await
        .expect("acquire");
    h.hook.take_away(&name).await.expect("fault hook");
    let reason = tokio::time::timeout(ttl, g.lost())
        .await
        .expect("lost() must fire once the lock is taken away");
    let deadline = g.validity_deadline();
    assert_ne!(
        reason,
        LossReason::DeadlinePassed,
        "only the deadline timer noticed the take-away"
    );
    if let Some(d) = deadline {
        assert!(Instant::now() < d, "lost() fired only at the deadline");
    }
    assert!(g.is_lost().is_some());
    let g2 = h
        .other
        .acquire(&name, &opts(10_000, Wait::UpTo(SLACK), false))
        .await
        .expect("lock is free after being taken away");
    assert!(
        !g.release().await.expect("release"),
        "release of a taken lock reports not-held"
    );
    assert!(g2.release().await.expect("release"));
}

/// Successive holders (across clients, across an expiry, and across an idle
/// gap in which the server may clean up the lock's state) get strictly
/// increasing fencing tokens, when the backend offers them.
pub async fn fencing_tokens_increase(h: Harness) {
    let name = unique_name("fencing");
    let fencing = h.lock.capabilities().fencing;
    let mut tokens = Vec::new();
    for i in 0..6 {
        let lock = if i % 2 == 0 { &h.lock } else { &h.other };
        let g = lock
            .acquire(
                &name,
                &opts(10_000, Wait::UpTo(Duration::from_secs(5)), false),
            )
            .await
            .expect("acquire");
        tokens.push(g.fencing_token());
        assert!(g.release().await.expect("release"));
    }
    // A grant that follows an expiry, not a release.
    let ttl = short_ttl(&h, 300);
    let (_, lapsed) = acquire_unheld(&h.lock, &name, ttl).await;
    tokens.push(lapsed.fencing_token());
    std::mem::forget(lapsed);
    let g = h
        .other
        .acquire(&name, &opts(10_000, Wait::UpTo(ttl + SLACK), false))
        .await
        .expect("acquire after expiry");
    tokens.push(g.fencing_token());
    assert!(g.release().await.expect("release"));
    // An idle gap longer than the servers' clean-up of empty lock state
    // (ZooKeeper removes empty container nodes every second here): a
    // counter kept in that state would start again from the beginning.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let g = h
        .lock
        .acquire(&name, &opts(10_000, Wait::No, false))
        .await
        .expect("acquire after an idle gap");
    tokens.push(g.fencing_token());
    assert!(g.release().await.expect("release"));
    if fencing == Fencing::None {
        assert!(
            tokens.iter().all(Option::is_none),
            "backend without fencing returned tokens: {tokens:?}"
        );
    } else {
        assert_strictly_increasing(&tokens, "tokens not strictly increasing");
    }
}

/// extend keeps a lock past its original TTL; extending a lock that was
/// taken over (its guard's deadline still far ahead) is refused by the
/// server's owner check, fires `lost()`, and leaves the new owner's lease
/// as it was.
pub async fn extend_prolongs_and_fails_when_gone(h: Harness) {
    let name = unique_name("extend");
    // Long enough that a loaded machine's stall between the grant and the
    // extend does not end the lease first (500 ms did, on SQLite, with a
    // build and four other suites beside it).
    let ttl = short_ttl(&h, 1000);
    let (_, g) = acquire_unheld(&h.lock, &name, ttl).await;
    g.extend(ttl * 6).await.expect("extend a held lock");
    tokio::time::sleep(ttl * 9 / 5).await;
    assert_eq!(g.is_lost(), None, "extended lock reported lost");
    assert!(
        h.other
            .try_acquire(&name, &opts(10_000, Wait::No, false))
            .await
            .expect("try")
            .is_none(),
        "extended lock was granted to another client"
    );
    assert!(g.release().await.expect("release"));

    // The stale extend must reach the server: its guard's own deadline is
    // far ahead, so only the server's owner check can refuse it. It asks
    // for a short lease, so that an extend without an owner check (a bare
    // PEXPIRE, an UPDATE by name) would cut the new owner's lease short.
    let long = opts(60_000, Wait::No, true);
    let gone = h.lock.acquire(&name, &long).await.expect("acquire");
    h.hook.take_away(&name).await.expect("fault hook");
    let next = h
        .other
        .acquire(&name, &long.clone().wait(Wait::UpTo(SLACK * 2)))
        .await
        .expect("acquire after the take-away");
    let short = short_ttl(&h, 500);
    assert!(
        gone.validity_deadline()
            .is_none_or(|d| d > Instant::now() + short + SLACK),
        "the stale guard's deadline must still be far ahead"
    );
    match gone.extend(short).await {
        // The server refused it, or the backend had already learnt of the
        // take-away (its connection or session said so).
        Err(LockError::NotHeld { .. }) => {}
        Err(LockError::Lost { reason, .. }) if reason != LossReason::DeadlinePassed => {}
        other => panic!("extend of a lock taken over must fail with NotHeld, got {other:?}"),
    }
    assert!(gone.is_lost().is_some());
    tokio::time::sleep(short + SLACK).await;
    assert!(
        h.lock
            .try_acquire(&name, &opts(10_000, Wait::No, false))
            .await
            .expect("try")
            .is_none(),
        "the stale extend shortened the new owner's lease"
    );
    assert!(next.is_lost().is_none(), "the new owner lost its lock");
    assert!(next.release().await.expect("release"));
}

/// Dropping a guard releases the lock well before its TTL.
pub async fn drop_releases(h: Harness) {
    let name = unique_name("drop");
    let g = h
        .lock
        .acquire(&name, &opts(30_000, Wait::No, true))
        .await
        .expect("acquire");
    drop(g);
    let start = Instant::now();
    let g2 = h
        .other
        .acquire(
            &name,
            &opts(10_000, Wait::UpTo(Duration::from_secs(10)), false),
        )
        .await
        .expect("dropped guard's lock is released");
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(g2.release().await.expect("release"));
}

/// Distinct names never block each other, however alike they look after
/// escaping; awkward characters are accepted.
pub async fn names_are_independent_and_distinct(h: Harness) {
    let base = unique_name("names");
    let suffixes = [
        "plain",
        "with space",
        "ünïcødé",
        "emoji 🔒",
        "a/b",
        "a%2Fb",
        "a:b",
        "a_b",
        "'quote'",
        "\"dq\"",
        "%",
        "*",
        "?",
        "..",
        ".",
        "/",
        "\\",
        "a\nb",
        "\n",
        "\u{1}",
        "\t",
        "\r\n",
        "\u{7f}",
        "\u{1b}[0m",
        "{tag}",
        "semi;colon",
        "--",
        "a/b/",
    ];
    // Renewed, so that no lease runs out while a loaded machine works
    // through every name.
    let o = opts(10_000, Wait::No, true);
    let mut held = Vec::new();
    for s in suffixes {
        let name = format!("{base}/{s}");
        let g = h
            .lock
            .try_acquire(&name, &o)
            .await
            .unwrap_or_else(|e| panic!("name {name:?} rejected: {e}"))
            .unwrap_or_else(|| panic!("name {name:?} collided with an earlier one"));
        assert_eq!(g.name(), name);
        held.push(g);
    }
    for g in &held {
        assert!(
            h.other
                .try_acquire(g.name(), &o)
                .await
                .expect("try")
                .is_none(),
            "{:?} not held as seen from the other client",
            g.name()
        );
    }
    // Unique like every other name here: cases running side by side (one
    // backend's several suites) must not meet on it.
    let longest = format!("{base}/{}", "x".repeat(MAX_NAME_BYTES - base.len() - 1));
    assert_eq!(longest.len(), MAX_NAME_BYTES);
    let g = h
        .lock
        .try_acquire(&longest, &o)
        .await
        .expect("longest name")
        .expect("free");
    assert!(g.release().await.expect("release"));
    for g in held {
        assert!(g.release().await.expect("release"));
    }
}

/// Empty and over-long names, zero and over-long TTLs and bad backoffs are
/// typed errors from both try_acquire and acquire.
pub async fn invalid_input_is_typed(h: Harness) {
    let o = opts(10_000, Wait::No, false);
    let too_long = "x".repeat(MAX_NAME_BYTES + 1);
    for bad in ["", too_long.as_str(), "nul\0byte"] {
        assert!(
            matches!(
                h.lock.try_acquire(bad, &o).await,
                Err(LockError::InvalidName { .. })
            ),
            "{bad:?}"
        );
        assert!(
            matches!(
                h.lock.acquire(bad, &o).await,
                Err(LockError::InvalidName { .. })
            ),
            "{bad:?}"
        );
    }
    let name = unique_name("invalid");
    let max = h.lock.capabilities().max_ttl;
    let bad_opts = [
        o.clone().ttl(Duration::ZERO),
        o.clone().ttl(Duration::from_millis(1)),
        o.clone().ttl(max + Duration::from_secs(1)),
        o.clone()
            .backoff(Backoff::default().with_initial(Duration::ZERO)),
        o.clone().backoff(Backoff::default().with_jitter(2.0)),
    ];
    for bad in &bad_opts {
        assert!(
            matches!(
                h.lock.try_acquire(&name, bad).await,
                Err(LockError::InvalidOptions { .. })
            ),
            "{bad:?}"
        );
        assert!(
            matches!(
                h.lock.acquire(&name, bad).await,
                Err(LockError::InvalidOptions { .. })
            ),
            "{bad:?}"
        );
    }
    let g = h
        .lock
        .try_acquire(&name, &o)
        .await
        .expect("try")
        .expect("nothing was left held");
    assert!(matches!(
        g.extend(Duration::ZERO).await,
        Err(LockError::InvalidOptions { .. })
    ));
    assert!(g.release().await.expect("release"));
}

/// Options at the edges of their types (the largest durations, a backoff
/// that grows past what a `Duration` holds, no jitter and full jitter)
/// give a lock, a timeout or a typed error, never a panic, both while the
/// lock is held (the waits poll or are woken with those backoffs) and when
/// it is free.
pub async fn options_at_their_limits_never_panic(h: Harness) {
    let name = unique_name("limits");
    let max_ttl = h.lock.capabilities().max_ttl;
    let huge = [
        Backoff::default()
            .with_initial(Duration::from_nanos(1))
            .with_max(Duration::MAX)
            .with_multiplier(1e10)
            .with_jitter(0.0),
        Backoff::default()
            .with_initial(Duration::from_millis(1))
            .with_max(Duration::MAX)
            .with_multiplier(f64::MAX)
            .with_jitter(1.0),
        Backoff::default()
            .with_initial(Duration::MAX)
            .with_max(Duration::MAX)
            .with_multiplier(1.0)
            .with_jitter(0.5),
    ];
    let mut edge = Vec::new();
    for backoff in huge {
        for ttl in [max_ttl, Duration::from_secs(10)] {
            for margin in [Duration::MAX, Duration::ZERO] {
                edge.push(
                    LockOptions::new()
                        .ttl(ttl)
                        .backoff(backoff)
                        .safety_margin(margin)
                        .auto_renew(false),
                );
            }
        }
    }
    let held = h
        .lock
        .acquire(&name, &opts(10_000, Wait::No, false))
        .await
        .expect("the holder");
    for o in &edge {
        let waited = o.clone().wait(Wait::UpTo(Duration::from_millis(150)));
        match h.other.acquire(&name, &waited).await {
            Err(LockError::Timeout { .. } | LockError::InvalidOptions { .. }) => {}
            other => panic!("a held lock, {o:?}: {other:?}"),
        }
        match h.other.try_acquire(&name, o).await {
            Ok(None) | Err(LockError::InvalidOptions { .. }) => {}
            other => panic!("a held lock, {o:?}: {other:?}"),
        }
    }
    assert!(held.release().await.expect("release"));
    for o in &edge {
        let o = o.clone().wait(Wait::UpTo(Duration::MAX));
        match h.lock.acquire(&name, &o).await {
            Ok(g) => assert!(g.release().await.expect("release")),
            Err(LockError::InvalidOptions { .. }) => {}
            Err(e) => panic!("a free lock, {o:?}: {e:?}"),
        }
    }
}

/// One owner may nest acquisitions; another owner waits until the count
/// returns to zero.
pub async fn reentrant_owner_counts(h: Harness) {
    let name = unique_name("reentrant");
    let o = opts(10_000, Wait::UpTo(Duration::from_secs(10)), true);
    let a = LockOwner::new(h.lock.clone());
    let b = LockOwner::new(h.other.clone());
    let outer = a.acquire(&name, &o).await.expect("outer");
    let inner = a
        .acquire(&name, &o)
        .await
        .expect("nested acquire by the same owner");
    let inner2 = a
        .try_acquire(&name, &o)
        .await
        .expect("try")
        .expect("nested try_acquire");
    assert_eq!(a.hold_count(&name), 3);
    assert_eq!(outer.fencing_token(), inner.fencing_token());
    assert!(b.try_acquire(&name, &o).await.expect("try").is_none());
    let waiter = {
        let (b, name, o) = (b.clone(), name.clone(), o.clone());
        tokio::spawn(async move { b.acquire(&name, &o).await })
    };
    drop(inner);
    assert!(inner2.release().await.expect("inner release"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "other owner got the lock while the count was above zero"
    );
    assert_eq!(a.hold_count(&name), 1);
    assert!(outer.release().await.expect("last release"));
    let g = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("other owner acquires once the count is zero")
        .expect("task")
        .expect("acquire");
    assert_eq!(b.hold_count(&name), 1);
    assert!(g.release().await.expect("release"));
}

/// A waiter granted after waiting longer than the TTL gets a full lease:
/// the time it spent queued does not count against it. Its guard is not
/// lost on arrival, its validity deadline lies most of a TTL ahead, and it
/// can be extended.
pub async fn grant_after_long_wait_is_valid(h: Harness) {
    let name = unique_name("long-wait");
    let ttl = short_ttl(&h, 1_500);
    let o = ttl_opts(ttl, Wait::UpTo(ttl * 6), true);
    let holder = h.lock.acquire(&name, &o).await.expect("holder");
    let waiter = {
        let (other, name, o) = (h.other.clone(), name.clone(), o.clone());
        tokio::spawn(async move {
            let g = other.acquire(&name, &o).await;
            (g, Instant::now())
        })
    };
    // Hold (renewed) for longer than the TTL while the waiter queues.
    tokio::time::sleep(ttl * 3 / 2).await;
    assert!(!waiter.is_finished(), "waiter got a held lock");
    assert!(
        holder.is_lost().is_none(),
        "the renewed holder lost its lock"
    );
    assert!(holder.release().await.expect("release"));
    let (g, returned) = tokio::time::timeout(ttl * 2 + SLACK, waiter)
        .await
        .expect("waiter is granted after the release")
        .expect("task");
    let g = g.expect("acquire after a long wait");
    assert!(
        g.is_lost().is_none(),
        "granted already lost: {:?}",
        g.is_lost()
    );
    // A lease kept alive every third of the TTL while waiting (etcd's own
    // or shared session lease) is granted with two thirds of it left at
    // worst, less a round trip; a lease counted from the wait's start
    // would have none left.
    if let Some(deadline) = g.validity_deadline() {
        let left = deadline.saturating_duration_since(returned);
        assert!(
            left >= ttl.mul_f64(0.6),
            "granted with {left:?} of a {ttl:?} lease left"
        );
    }
    g.extend(ttl).await.expect("extend after a long wait");
    assert!(g.release().await.expect("release"));
}

/// Waits too long for a deadline (`Duration::MAX`, `u64::MAX` seconds) or
/// for a server's own timeout (30 days) neither panic nor fail: on a free
/// lock they are granted without waiting, and on a held lock they wait for
/// the release. (The bounds only tell a hang from an answer: how fast a
/// grant comes is not this case's subject, and a loaded machine can take a
/// second or more to open a connection.)
pub async fn very_long_waits_work(h: Harness) {
    const HANG: Duration = Duration::from_secs(10);
    let name = unique_name("long-waits");
    for wait in [
        Duration::MAX,
        Duration::from_secs(u64::MAX),
        Duration::from_secs(30 * 86_400),
    ] {
        let o = opts(10_000, Wait::UpTo(wait), false);
        let g = tokio::time::timeout(HANG, h.lock.acquire(&name, &o))
            .await
            .expect("a free lock is granted")
            .unwrap_or_else(|e| panic!("free lock with a wait of {wait:?}: {e:?}"));
        let waiter = {
            let (other, name, o) = (h.other.clone(), name.clone(), o.clone());
            tokio::spawn(async move { other.acquire(&name, &o).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiter.is_finished(), "waiter got a held lock");
        assert!(g.release().await.expect("release"));
        let g2 = tokio::time::timeout(HANG, waiter)
            .await
            .expect("the waiter is granted after the release")
            .expect("task")
            .unwrap_or_else(|e| panic!("held lock with a wait of {wait:?}: {e:?}"));
        assert!(g2.release().await.expect("release"));
    }
}

/// Without renewal, the holder's validity ends well ahead (the safety
/// margin, 100 ms by default) of the moment anyone else can be granted the
/// lock, even with a core kept busy: `is_lost()` reports the loss from the
/// deadline itself, so a late timer does not let the holder believe past
/// its lease, and `lost()` has fired before the lock is granted again. (The
/// margin is measured from the deadline, not from the moment this task
/// was woken: on a loaded machine a wake-up can come tens of
/// milliseconds late.)
pub async fn lost_fires_ahead_of_expiry(h: Harness) {
    let name = unique_name("margin");
    let ttl = short_ttl(&h, 2_000).max(Duration::from_secs(2));
    let stop = Arc::new(AtomicBool::new(false));
    let spinner = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut x = 0u64;
            while !stop.load(Ordering::Relaxed) {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        })
    };
    let g = h
        .lock
        .acquire(&name, &ttl_opts(ttl, Wait::No, false))
        .await
        .expect("acquire");
    let deadline = g
        .validity_deadline()
        .expect("a lock with a TTL has a validity deadline");
    // The holder waits for lost() while, from the deadline on, the other
    // client tries for the lock: both in this task, so both are woken
    // equally late on a loaded machine.
    let lost = async {
        tokio::time::timeout(ttl + SLACK, g.lost())
            .await
            .expect("lost() fires without renewal");
        Instant::now()
    };
    let probe = opts(10_000, Wait::No, false);
    let freed = async {
        tokio::time::sleep_until(deadline).await;
        assert!(
            g.is_lost().is_some(),
            "the holder still believes past its validity deadline"
        );
        tokio::time::timeout(ttl + SLACK * 2, async {
            loop {
                if let Some(g2) = h.other.try_acquire(&name, &probe).await.expect("try") {
                    let at = Instant::now();
                    assert!(g2.release().await.expect("release"));
                    return at;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the unrenewed lock expires")
    };
    let (lost_at, freed_at) = tokio::join!(lost, freed);
    stop.store(true, Ordering::Relaxed);
    let _ = spinner.join();
    assert!(
        lost_at <= freed_at,
        "lost() fired {:?} after the lock was granted again",
        lost_at - freed_at
    );
    let ahead = freed_at.saturating_duration_since(deadline);
    assert!(
        ahead >= Duration::from_millis(40),
        "the holder's validity ended only {ahead:?} before the lock could be granted again"
    );
    drop(g);
}

/// Many tasks racing on a name that was never used: never more than one
/// wins, the others see `Ok(None)` (one attempt) or `Timeout` (a wait),
/// never an error from creating the name's state on the server. With a
/// wait, exactly one wins; single attempts may all lose at once on a
/// backend that needs a quorum (Redlock's split votes).
pub async fn racing_on_a_new_name(h: Harness) {
    const TASKS: usize = 10;
    for round in 0..5 {
        let name = unique_name(&format!("race-{round}"));
        let start = Arc::new(tokio::sync::Barrier::new(TASKS));
        let wait = round % 2 == 1;
        let tasks: Vec<_> = (0..TASKS)
            .map(|i| {
                let lock = if i % 2 == 0 {
                    h.lock.clone()
                } else {
                    h.other.clone()
                };
                let (name, start) = (name.clone(), Arc::clone(&start));
                tokio::spawn(async move {
                    let o = if wait {
                        opts(10_000, Wait::UpTo(Duration::from_millis(1500)), false)
                    } else {
                        opts(10_000, Wait::No, false)
                    };
                    start.wait().await;
                    if wait {
                        match lock.acquire(&name, &o).await {
                            Ok(g) => Ok(Some(g)),
                            Err(LockError::Timeout { .. }) => Ok(None),
                            Err(e) => Err(e),
                        }
                    } else {
                        lock.try_acquire(&name, &o).await
                    }
                })
            })
            .collect();
        let mut winners = Vec::new();
        for t in tasks {
            match t.await.expect("task") {
                Ok(Some(g)) => winners.push(g),
                Ok(None) => {}
                Err(e) => panic!("round {round}: a loser got {e:?} instead of Ok(None)/Timeout"),
            }
        }
        // The winner's guard is held until every task has returned.
        if wait {
            assert_eq!(winners.len(), 1, "round {round}: exactly one winner");
        } else {
            assert!(
                winners.len() <= 1,
                "round {round}: {} winners",
                winners.len()
            );
        }
        for g in winners {
            assert!(g.release().await.expect("release"));
        }
    }
}

/// A guard's validity deadline never lies further ahead than the lease that
/// carries the lock: at most a TTL (less the safety margin) after the
/// request that granted or last renewed it, on the grant, after `extend`
/// and across the watchdog's renewals.
pub async fn validity_never_outlasts_the_lease(h: Harness) {
    let name = unique_name("deadline-bound");
    let ttl = short_ttl(&h, 1_500);
    let g = h
        .lock
        .acquire(&name, &ttl_opts(ttl, Wait::No, true))
        .await
        .expect("acquire");
    let within = |what: &str| {
        if let Some(d) = g.validity_deadline() {
            let ahead = d.saturating_duration_since(Instant::now());
            assert!(
                ahead <= ttl,
                "{what}: deadline {ahead:?} ahead of a {ttl:?} lease"
            );
        }
    };
    within("granted");
    let extended_to = g.extend(ttl).await.expect("extend");
    // What extend says it gave is the guard's deadline (the watchdog may
    // have moved it on since, never back).
    assert_eq!(extended_to.is_some(), g.validity_deadline().is_some());
    if let (Some(said), Some(now)) = (extended_to, g.validity_deadline()) {
        assert!(said <= now, "extend said {said:?}, the guard has {now:?}");
        assert!(said.saturating_duration_since(Instant::now()) <= ttl);
    }
    within("extended");
    for _ in 0..3 {
        tokio::time::sleep(ttl / 2).await;
        assert!(g.is_lost().is_none(), "renewed lock lost");
        within("renewed");
    }
    assert!(g.release().await.expect("release"));
}

/// How many waiters [`waiters_are_served_in_arrival_order`] queues: a long
/// queue, whose waiters mostly wait behind a waiter, not the holder.
const QUEUED_WAITERS: usize = 12;

/// With twelve waiters queued one after another (alternating clients),
/// the lock goes to them in arrival order on every backend that claims a
/// fair queue; on the others each still gets it exactly once.
pub async fn waiters_are_served_in_arrival_order(h: Harness) {
    let name = unique_name("fifo");
    let fair = h.lock.capabilities().fair_queue;
    let o = opts(10_000, Wait::UpTo(Duration::from_secs(20)), false);
    let holder = h.lock.acquire(&name, &o).await.expect("holder");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..QUEUED_WAITERS {
        let lock = if i % 2 == 0 {
            h.other.clone()
        } else {
            h.lock.clone()
        };
        let (queued_name, o, order) = (name.clone(), o.clone(), Arc::clone(&order));
        waiters.push(tokio::spawn(async move {
            let g = lock
                .acquire(&queued_name, &o)
                .await
                .expect("waiter acquires");
            order.lock().unwrap_or_else(|e| e.into_inner()).push(i);
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(g.release().await.expect("release"));
        }));
        // Let this waiter take its place before the next one arrives.
        await_queued(&h, &name, i + 1).await;
    }
    assert!(
        order.lock().unwrap_or_else(|e| e.into_inner()).is_empty(),
        "a waiter got a held lock"
    );
    assert!(holder.release().await.expect("release"));
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(20), w)
            .await
            .expect("every waiter is served")
            .expect("waiter task");
    }
    let order = order.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let arrival: Vec<usize> = (0..QUEUED_WAITERS).collect();
    if fair {
        assert_eq!(order, arrival, "a fair queue served out of order");
    } else {
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, arrival, "each waiter is served once: {order:?}");
    }
}

/// A waiter that gives up leaves the one behind it waiting for the holder,
/// not granted: the holder, then two waiters queued one after the other
/// (alternating clients), the first cancelled; the second is still waiting
/// while the holder holds, and is served once it releases.
pub async fn a_waiter_behind_a_cancelled_one_waits_for_the_holder(h: Harness) {
    let name = unique_name("behind-cancelled");
    let o = opts(10_000, Wait::UpTo(Duration::from_secs(20)), false);
    let holder = h.lock.acquire(&name, &o).await.expect("holder");
    let first = {
        let (other, name, o) = (h.other.clone(), name.clone(), o.clone());
        tokio::spawn(async move { other.acquire(&name, &o).await })
    };
    await_queued(&h, &name, 1).await;
    let second = {
        let (lock, name, o) = (h.lock.clone(), name.clone(), o.clone());
        tokio::spawn(async move { lock.acquire(&name, &o).await })
    };
    await_queued(&h, &name, 2).await;
    first.abort();
    assert!(first.await.is_err_and(|e| e.is_cancelled()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the waiter behind a cancelled one was served while the lock was held"
    );
    assert!(holder.release().await.expect("release"));
    let g = tokio::time::timeout(Duration::from_secs(20), second)
        .await
        .expect("the waiter is served once the holder releases")
        .expect("waiter task")
        .expect("the waiter acquires");
    assert!(g.release().await.expect("release"));
}

/// Where capabilities say waiters are notified, a release wakes the waiter
/// even when its polling fallback would not look again for 30 s: the
/// hand-off is bounded by the notification, not by the backoff.
pub async fn notified_waiters_do_not_poll(h: Harness) {
    if h.lock.capabilities().waiting != Waiting::Notified {
        return;
    }
    let name = unique_name("notified");
    let slow = Backoff::default()
        .with_initial(Duration::from_secs(30))
        .with_max(Duration::from_secs(30));
    let o = opts(10_000, Wait::UpTo(Duration::from_secs(60)), false).backoff(slow);
    let holder = h.lock.acquire(&name, &o).await.expect("holder");
    let waiter = {
        let (other, name, o) = (h.other.clone(), name.clone(), o.clone());
        tokio::spawn(async move { other.acquire(&name, &o).await })
    };
    await_queued(&h, &name, 1).await;
    assert!(!waiter.is_finished(), "waiter got a held lock");
    assert!(holder.release().await.expect("release"));
    let released = Instant::now();
    let g = tokio::time::timeout(SLACK * 2, waiter)
        .await
        .expect("a notified waiter is woken by the release, not by its 30 s backoff")
        .expect("task")
        .expect("acquire");
    eprintln!(
        "notified hand-off {:?} after the release",
        released.elapsed()
    );
    assert!(g.release().await.expect("release"));
}

/// Acquisitions cancelled at random points (before, during and after the
/// request reaches the server) leave nothing behind: afterwards another
/// client is granted the lock within moments, and a cancelled grant never
/// keeps it.
pub async fn cancellation_at_any_point_leaves_the_lock_free(h: Harness) {
    let name = unique_name("cancel-anywhere");
    let o = opts(10_000, Wait::UpTo(Duration::from_secs(5)), false);
    let mut completed = 0;
    for _ in 0..40 {
        let after = Duration::from_micros(rand::random::<u64>() % 3_000);
        if let Ok(granted) = tokio::time::timeout(after, h.lock.acquire(&name, &o)).await {
            let g = granted.expect("acquire");
            completed += 1;
            assert!(g.release().await.expect("release"));
        }
    }
    let started = Instant::now();
    let g = h
        .other
        .acquire(&name, &opts(10_000, Wait::UpTo(SLACK * 2), false))
        .await
        .expect("the lock is free after the cancelled acquisitions");
    eprintln!(
        "cancellation: {completed} of 40 acquisitions completed; another client granted after {:?}",
        started.elapsed()
    );
    assert!(g.release().await.expect("release"));
}

/// `inspect` (asked by a second client) tells a free lock from a held one
/// (auto-renewed),
/// reports the holder's fencing token on every backend that has tokens and
/// a lease no longer than the TTL where it reports one, and counts a
/// waiter where it counts waiters. `force_release` frees a held lock for
/// the next acquisition at once, long before its lease would end, and the
/// old holder cannot release it afterwards; on a free lock it answers
/// `false`. A waiter queued behind a force-released holder gets the lock
/// at once, not when the lease would have run out.
pub async fn inspect_and_force_release(h: Harness) {
    const TTL_MS: u64 = 30_000;
    let name = unique_name("inspect");
    let caps = h.lock.capabilities();
    let free = h.other.inspect(&name).await.expect("inspect a new name");
    assert!(!free.held, "a new name: {free:?}");
    assert!(free.waiters.unwrap_or(0) == 0, "a new name: {free:?}");
    assert!(
        !h.other.force_release(&name).await.expect("force_release"),
        "force_release of a free lock found a holder"
    );

    let held = h
        .lock
        .acquire(&name, &opts(TTL_MS, Wait::No, true))
        .await
        .expect("acquire");
    let info = h.other.inspect(&name).await.expect("inspect");
    assert!(info.held, "held: {info:?}");
    if caps.fencing != Fencing::None {
        assert_eq!(
            info.fencing_token,
            held.fencing_token(),
            "the holder's token"
        );
    } else {
        assert_eq!(info.fencing_token, None, "a token without fencing");
    }
    if let Some(left) = info.expires_in {
        assert!(
            left <= Duration::from_millis(TTL_MS) && left > Duration::from_millis(TTL_MS / 2),
            "lease left {left:?} of {TTL_MS} ms"
        );
    }

    // Freed for a newcomer at once, whatever the lease says.
    assert!(h.other.force_release(&name).await.expect("force_release"));
    let after = h.other.inspect(&name).await.expect("inspect");
    assert!(!after.held, "after force_release: {after:?}");
    let next = h
        .other
        .acquire(&name, &opts(TTL_MS, Wait::UpTo(SLACK), true))
        .await
        .expect("acquire after force_release");
    if let (Some(old), Some(new)) = (held.fencing_token(), next.fencing_token()) {
        assert!(new > old, "token {new} after force-released {old}");
    }
    assert!(
        !matches!(held.release().await, Ok(true)),
        "the force-released holder released the new holder's lock"
    );
    let info = h.lock.inspect(&name).await.expect("inspect");
    assert!(info.held, "the new holder: {info:?}");

    // A queued waiter is served at once when the holder is force-released.
    let waiter = tokio::spawn({
        let (lock, name) = (h.lock.clone(), name.clone());
        async move {
            lock.acquire(
                &name,
                &opts(TTL_MS, Wait::UpTo(Duration::from_secs(60)), true),
            )
            .await
        }
    });
    if info.waiters.is_some() {
        let start = Instant::now();
        loop {
            let now = h.other.inspect(&name).await.expect("inspect");
            if now.waiters == Some(1) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the waiter was not counted: {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    } else {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(h.lock.force_release(&name).await.expect("force_release"));
    let served = tokio::time::timeout(SLACK * 4, waiter)
        .await
        .expect("the waiter was not served after force_release")
        .expect("waiter task")
        .expect("waiter");
    let info = h.other.inspect(&name).await.expect("inspect");
    assert!(info.held, "the waiter holds it: {info:?}");
    if caps.fencing != Fencing::None {
        assert_eq!(
            info.fencing_token,
            served.fencing_token(),
            "the waiter's token"
        );
    }
    assert!(served.release().await.expect("release"));
    drop(next);
    let end = h.other.inspect(&name).await.expect("inspect");
    assert!(!end.held, "after the last release: {end:?}");
}
