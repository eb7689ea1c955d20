//! The shared watchdog, the lease state and guard drop, in isolation.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use lock_core::raw::{GuardHandle, LeaseState, RawGuard, Unrenewed, Watchdog, async_trait};
use lock_core::{
    Capabilities, DistributedLock, Grade, LockError, LockGuard, LockOptions, LossKind, LossReason,
    MemoryLock, Wait,
};
use tokio::time::Instant;

const CAPS: Capabilities = Capabilities::new("test", Grade::ProcessLocal)
    .with_depends_on_clocks(false)
    .with_max_ttl(Duration::from_secs(3600));

/// A handle whose renewals succeed, fail with `Unavailable`, or report the
/// lock gone, as the test says; it counts renewals and releases.
#[derive(Default)]
struct Scripted {
    unreachable: AtomicBool,
    gone: AtomicBool,
    renewals: AtomicUsize,
    releases: AtomicUsize,
}

#[async_trait]
impl GuardHandle for Scripted {
    async fn release(&self) -> Result<bool, LockError> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        Ok(!self.gone.load(Ordering::SeqCst))
    }

    async fn extend(&self, _ttl: Duration) -> Result<bool, LockError> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        if self.unreachable.load(Ordering::SeqCst) {
            return Err(LockError::Unavailable {
                backend: "test",
                reason: "down".into(),
                source: None,
            });
        }
        Ok(!self.gone.load(Ordering::SeqCst))
    }
}

fn guard(handle: &Arc<Scripted>, ttl: Duration, watchdog: &Watchdog) -> LockGuard {
    let lease = Arc::new(LeaseState::lease(Instant::now(), ttl));
    let h: Arc<dyn GuardHandle> = handle.clone();
    LockGuard::new("x", None, CAPS, lease, h).kept_by(
        watchdog,
        &LockOptions::new(),
        Unrenewed::Left,
    )
}

#[tokio::test(start_paused = true)]
async fn renews_about_every_third_of_the_ttl() {
    let handle = Arc::new(Scripted::default());
    let g = guard(&handle, Duration::from_secs(3), &Watchdog::new());
    tokio::time::sleep(Duration::from_millis(9_500)).await;
    let n = handle.renewals.load(Ordering::SeqCst);
    assert!(
        (9..=10).contains(&n),
        "expected ~9 renewals in 9.5 s at ttl/3, got {n}"
    );
    assert_eq!(g.is_lost(), None);
    assert!(g.validity_deadline().expect("lease") > Instant::now());
}

/// A grant whose request took most of its TTL (a slow quorum, a busy
/// database) arrives with little validity left: the first renewal must come
/// before that deadline, not a third of the TTL after the grant.
#[tokio::test(start_paused = true)]
async fn a_grant_with_little_validity_left_is_renewed_before_its_deadline() {
    let handle = Arc::new(Scripted::default());
    let ttl = Duration::from_secs(3);
    // The request was sent 2.4 s ago: 0.6 s of validity is left, less than
    // the 1 s renewal period.
    let sent_at = Instant::now() - Duration::from_millis(2_400);
    let lease = Arc::new(LeaseState::lease(sent_at, ttl));
    let h: Arc<dyn GuardHandle> = handle.clone();
    let g = LockGuard::new("x", None, CAPS, lease, h).kept_by(
        &Watchdog::new(),
        &LockOptions::new(),
        Unrenewed::Left,
    );
    tokio::time::sleep(Duration::from_millis(5_000)).await;
    assert_eq!(g.is_lost(), None, "lost before the first renewal");
    assert!(handle.renewals.load(Ordering::SeqCst) >= 5);
}

#[tokio::test(start_paused = true)]
async fn renewal_finding_the_lock_gone_fires_lost_at_once() {
    let handle = Arc::new(Scripted::default());
    let g = guard(&handle, Duration::from_secs(30), &Watchdog::new());
    handle.gone.store(true, Ordering::SeqCst);
    let start = Instant::now();
    let reason = g.lost().await;
    assert_eq!(reason, LossReason::TakenOver);
    assert_eq!(reason.kind(), LossKind::Confirmed);
    // Found at the first renewal (ttl/3), long before the deadline.
    assert!(
        start.elapsed() <= Duration::from_secs(11),
        "{:?}",
        start.elapsed()
    );
}

/// What a `fmt` subscriber wrote, kept for the test to read.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A lock found gone is a warning under the `distlock` target, which a
/// plain subscriber filtered on `distlock=warn` shows.
#[tokio::test(start_paused = true)]
async fn a_loss_is_a_warning_under_the_distlock_target() {
    let logged = Captured::default();
    let writer = logged.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("distlock=warn"))
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let handle = Arc::new(Scripted::default());
    let g = guard(&handle, Duration::from_secs(30), &Watchdog::new());
    handle.gone.store(true, Ordering::SeqCst);
    assert_eq!(g.lost().await, LossReason::TakenOver);
    let text = String::from_utf8_lossy(&logged.0.lock().expect("log")).into_owned();
    assert!(
        text.contains("WARN") && text.contains("distlock") && text.contains("gone"),
        "no warning of the loss: {text:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn unreachable_server_fires_lost_at_the_validity_deadline_not_before() {
    let handle = Arc::new(Scripted::default());
    let start = Instant::now();
    let ttl = Duration::from_secs(3);
    let g = guard(&handle, ttl, &Watchdog::new());
    handle.unreachable.store(true, Ordering::SeqCst);
    let reason = g.lost().await;
    let took = start.elapsed();
    assert_eq!(reason, LossReason::DeadlinePassed);
    let deadline = ttl
        - lock_core::raw::safety_margin(
            ttl,
            lock_core::raw::DEFAULT_DRIFT_FACTOR,
            lock_core::raw::DEFAULT_SAFETY_MARGIN,
        );
    assert!(
        took >= deadline && took <= deadline + Duration::from_millis(5),
        "{took:?}"
    );
    assert!(
        handle.renewals.load(Ordering::SeqCst) > 1,
        "failed renewals are retried"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_renewal_that_recovers_keeps_the_lock() {
    let handle = Arc::new(Scripted::default());
    let g = guard(&handle, Duration::from_secs(3), &Watchdog::new());
    handle.unreachable.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    handle.unreachable.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(g.is_lost(), None);
}

#[tokio::test(start_paused = true)]
async fn release_and_drop_stop_renewals() {
    let wd = Watchdog::new();
    let released = Arc::new(Scripted::default());
    assert!(
        guard(&released, Duration::from_secs(3), &wd)
            .release()
            .await
            .expect("release")
    );
    let dropped = Arc::new(Scripted::default());
    drop(guard(&dropped, Duration::from_secs(3), &wd));
    tokio::time::sleep(Duration::from_secs(10)).await;
    for h in [&released, &dropped] {
        assert_eq!(h.renewals.load(Ordering::SeqCst), 0);
        assert_eq!(h.releases.load(Ordering::SeqCst), 1);
    }
}

#[test]
fn dropping_a_guard_outside_a_runtime_does_not_panic() {
    let handle = Arc::new(Scripted::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let g = rt.block_on(async { guard(&handle, Duration::from_secs(3), &Watchdog::new()) });
    drop(rt);
    drop(g);
    assert_eq!(
        handle.releases.load(Ordering::SeqCst),
        0,
        "no runtime: left to the TTL"
    );
}

#[tokio::test]
async fn loss_is_sticky_and_confirmed_beats_suspected() {
    let lease = LeaseState::lease(Instant::now(), Duration::from_secs(10));
    let suspected = LossReason::ConnectionLost {
        kind: LossKind::Suspected,
        detail: "disconnected".into(),
    };
    lease.mark_lost(suspected.clone());
    assert_eq!(lease.lost_now(), Some(suspected));
    lease.mark_lost(LossReason::TakenOver);
    assert_eq!(lease.lost_now(), Some(LossReason::TakenOver));
    lease.mark_lost(LossReason::DeadlinePassed);
    assert_eq!(lease.lost_now(), Some(LossReason::TakenOver));
    lease.renewed(Instant::now(), Duration::from_secs(10));
    assert_eq!(
        lease.lost().await,
        LossReason::TakenOver,
        "a renewal cannot undo a loss"
    );
}

/// One client renews thousands of locks with one driver task and a task
/// only per renewal in flight, not a task and a timer per lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_renewed_locks_cost_no_task_per_lock() {
    const LOCKS: usize = 2_000;
    let locks = MemoryLock::new();
    let opts = LockOptions::new()
        .ttl(Duration::from_millis(900))
        .wait(Wait::No);
    let mut guards = Vec::with_capacity(LOCKS);
    for i in 0..LOCKS {
        guards.push(
            locks
                .acquire(&format!("many/{i}"), &opts)
                .await
                .expect("acquire"),
        );
    }
    let metrics = tokio::runtime::Handle::current().metrics();
    let mut most_tasks = 0;
    let end = Instant::now() + Duration::from_millis(2_700);
    while Instant::now() < end {
        most_tasks = most_tasks.max(metrics.num_alive_tasks());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lost = guards.iter().filter(|g| g.is_lost().is_some()).count();
    assert_eq!(lost, 0, "{lost} of {LOCKS} renewed locks were lost");
    assert!(
        most_tasks < 16,
        "{most_tasks} tasks alive for {LOCKS} locks"
    );
    eprintln!("{LOCKS} renewed locks over 3 TTLs: at most {most_tasks} tasks alive");
    for g in guards {
        assert!(g.release().await.expect("release"));
    }
}

/// A handle whose extend takes longer than the lease's validity.
struct Slow;

#[async_trait]
impl GuardHandle for Slow {
    async fn release(&self) -> Result<bool, LockError> {
        Ok(true)
    }

    async fn extend(&self, _ttl: Duration) -> Result<bool, LockError> {
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(true)
    }
}

#[tokio::test(start_paused = true)]
async fn an_extend_landing_after_the_deadline_reports_the_loss() {
    let lease = Arc::new(LeaseState::lease(Instant::now(), Duration::from_secs(1)));
    let g = LockGuard::new("x", None, CAPS, lease, Arc::new(Slow));
    match g.extend(Duration::from_secs(10)).await {
        Err(LockError::Lost {
            reason: LossReason::DeadlinePassed,
            ..
        }) => {}
        other => panic!("expected Lost(DeadlinePassed), got {other:?}"),
    }
    assert_eq!(g.lost().await, LossReason::DeadlinePassed);
}

fn expiring(handle: &Arc<Scripted>, ttl: Duration, grace: Duration, w: &Watchdog) -> LockGuard {
    let lease = Arc::new(LeaseState::lease(Instant::now(), ttl));
    let h: Arc<dyn GuardHandle> = handle.clone();
    LockGuard::new("x", None, CAPS, lease, h).kept_by(
        w,
        &LockOptions::new().auto_renew(false),
        Unrenewed::ReleasedAfter(grace),
    )
}

/// A lock registered to expire is released `grace` after its deadline (a
/// leaked guard included), later if an extension moved the deadline, and
/// never once its guard released it.
#[tokio::test(start_paused = true)]
async fn expiring_locks_are_released_after_their_deadline_unless_extended() {
    let w = Watchdog::new();
    let grace = Duration::from_millis(100);
    let ttl = Duration::from_secs(2);

    let leaked = Arc::new(Scripted::default());
    std::mem::forget(expiring(&leaked, ttl, grace, &w));

    let extended = Arc::new(Scripted::default());
    let g = expiring(&extended, ttl, grace, &w);
    tokio::time::sleep(Duration::from_secs(1)).await;
    g.extend(ttl).await.expect("extend");
    std::mem::forget(g);

    let released = Arc::new(Scripted::default());
    let r = expiring(&released, ttl, grace, &w);
    assert!(r.release().await.expect("release"));

    // The deadline is the TTL less the drift allowance: just under 2 s.
    let count = |n: &AtomicUsize| n.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(850)).await; // 1.85 s
    assert_eq!(
        count(&leaked.releases),
        0,
        "not before the deadline + grace"
    );
    tokio::time::sleep(Duration::from_millis(400)).await; // 2.25 s
    assert_eq!(
        count(&leaked.releases),
        1,
        "released after the deadline + grace"
    );
    assert_eq!(count(&extended.releases), 0, "its deadline moved");
    tokio::time::sleep(Duration::from_secs(1)).await; // 3.25 s
    assert_eq!(count(&extended.releases), 1);
    assert_eq!(count(&released.releases), 1, "only its own release");
    assert_eq!(count(&extended.renewals), 1, "expiry never renews");
}

/// A busy client's acquire–release cycle leaves nothing behind in the
/// schedule: after many short-lived registrations the watchdog still
/// renews a long-lived lock on time.
#[tokio::test(start_paused = true)]
async fn short_lived_registrations_do_not_disturb_the_schedule() {
    let w = Watchdog::new();
    let long = Arc::new(Scripted::default());
    let _g = guard(&long, Duration::from_secs(3), &w);
    for _ in 0..10_000 {
        let h = Arc::new(Scripted::default());
        drop(guard(&h, Duration::from_secs(30), &w));
    }
    tokio::time::sleep(Duration::from_millis(3_100)).await;
    assert_eq!(long.renewals.load(Ordering::SeqCst), 3);
}
