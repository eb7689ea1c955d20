//! The layers over the in-memory backend: the spans and metrics carry the
//! documented names and labels, guard events (renewals, loss, release)
//! reach them, and retries stop where they should.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::raw::{GuardHandle, RawGuard, async_trait};
use lock_core::{
    Access, Capabilities, DistributedLock, LockError, LockGuard, LockOptions, MemoryLock,
    RwLockExt, Wait,
};
use lock_layers::{LayerExt, MetricsLayer, RetryLayer, TracingLayer, names};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::{Context, SubscriberExt};

/// A span's name and its fields.
type Span = (String, HashMap<String, String>);

/// Every span's name and fields, as recorded so far.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<HashMap<u64, Span>>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_string(),
            format!("{value:?}").replace('"', ""),
        );
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.into_u64(), (attrs.metadata().name().to_string(), fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some((_, fields)) = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&id.into_u64())
        {
            values.record(&mut Fields(fields));
        }
    }
}

impl Spans {
    fn named(&self, name: &str) -> Vec<HashMap<String, String>> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|(n, _)| n == name)
            .map(|(_, f)| f.clone())
            .collect()
    }
}

/// Whether a single attempt at `name` is refused (someone holds it).
async fn busy(locks: &dyn DistributedLock, name: &str, opts: &LockOptions) -> bool {
    locks.try_acquire(name, opts).await.expect("try").is_none()
}

fn opts(ttl_ms: u64) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_millis(ttl_ms))
        .wait(Wait::UpTo(Duration::from_secs(5)))
}

#[tokio::test]
async fn spans_carry_backend_outcome_and_token_and_the_name_only_at_debug() {
    for (level, name_shown) in [(tracing::Level::INFO, false), (tracing::Level::DEBUG, true)] {
        let spans = Spans::default();
        let filter = tracing_subscriber::filter::LevelFilter::from_level(level);
        let subscriber = tracing_subscriber::registry().with(spans.clone().with_filter(filter));
        let _default = tracing::subscriber::set_default(subscriber);
        let store = MemoryLock::new();
        // A concrete lock's `Arc` takes layers as it is.
        let locks = Arc::new(store.clone()).layer(TracingLayer);
        let g = locks.acquire("orders/42", &opts(300)).await.unwrap();
        let token = g.fencing_token().unwrap();
        assert!(busy(&locks, "orders/42", &opts(300)).await);
        tokio::time::sleep(Duration::from_millis(450)).await; // renewals
        assert!(g.release().await.unwrap());

        let acquires = spans.named("distlock.acquire");
        assert_eq!(acquires.len(), 2, "{acquires:?}");
        let granted = acquires
            .iter()
            .find(|f| f["outcome"] == "granted")
            .expect("a granted acquisition");
        assert_eq!(granted["backend"], "memory");
        assert_eq!(granted["token"], token.to_string());
        assert!(granted["waited_ms"].parse::<f64>().unwrap() >= 0.0);
        assert!(acquires.iter().any(|f| f["outcome"] == "busy"));
        assert_eq!(
            granted.contains_key("lock"),
            name_shown,
            "{level}: the name is shown only at debug: {granted:?}"
        );
        let releases = spans.named("distlock.release");
        assert_eq!(releases.len(), 1, "{releases:?}");
        assert_eq!(releases[0]["outcome"], "released");
        assert_eq!(releases[0]["backend"], "memory");
        let renewals = spans.named("distlock.renew");
        assert_eq!(
            !renewals.is_empty(),
            name_shown,
            "{level}: renewal spans are at debug: {renewals:?}"
        );
        if name_shown {
            assert!(renewals.iter().all(|f| f["outcome"] == "renewed"));
        }
    }
}

/// A recorded value: a counter's count, a gauge's level, a histogram's
/// number of samples.
#[derive(Debug, Clone, Copy, PartialEq)]
enum V {
    Counter(u64),
    Gauge(f64),
    Histogram(usize),
}

impl From<DebugValue> for V {
    fn from(v: DebugValue) -> V {
        match v {
            DebugValue::Counter(n) => V::Counter(n),
            DebugValue::Gauge(g) => V::Gauge(g.0),
            DebugValue::Histogram(h) => V::Histogram(h.len()),
        }
    }
}

/// A metric's name, its labels (sorted `key=value` pairs) and value.
type Sample = (String, Vec<(String, String)>, V);

/// One metric's values by its labels.
fn values(snapshot: &[Sample], name: &str) -> HashMap<Vec<(String, String)>, V> {
    snapshot
        .iter()
        .filter(|(n, _, _)| n == name)
        .map(|(_, labels, v)| (labels.clone(), *v))
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut l: Vec<_> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.sort();
    l
}

#[test]
fn metrics_have_the_documented_names_and_labels_and_see_guard_events() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let store = MemoryLock::new();
            let locks = (Arc::new(store.clone()) as Arc<dyn DistributedLock>).layer(MetricsLayer);
            let g = locks.acquire("orders/42", &opts(300)).await.unwrap();
            assert!(busy(&*locks, "orders/42", &opts(300)).await);
            tokio::time::sleep(Duration::from_millis(450)).await; // renewals
            // An operator takes it away: the next renewal finds it gone.
            assert!(store.force_release("orders/42").await.unwrap());
            tokio::time::timeout(Duration::from_secs(2), g.lost())
                .await
                .expect("lost() fires");
            drop(g);
            let again = locks.acquire("orders/42", &opts(300)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(again.release().await.unwrap());
            tokio::task::yield_now().await;
        });
    });
    let snapshot: Vec<Sample> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let mut l: Vec<_> = key
                .key()
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            l.sort();
            (key.key().name().to_string(), l, V::from(value))
        })
        .collect();
    let names_seen: Vec<&str> = snapshot.iter().map(|(n, _, _)| n.as_str()).collect();
    let acquire = values(&snapshot, names::ACQUIRE_DURATION);
    let granted = &acquire[&labels(&[("backend", "memory"), ("outcome", "granted")])];
    assert_eq!(*granted, V::Histogram(2));
    assert!(acquire.contains_key(&labels(&[("backend", "memory"), ("outcome", "busy")])));
    let renew = values(&snapshot, names::RENEW);
    assert!(
        matches!(renew.get(&labels(&[("backend", "memory"), ("outcome", "renewed")])), Some(V::Counter(n)) if *n >= 1),
        "{renew:?}"
    );
    let lost = values(&snapshot, names::LOST);
    assert!(
        matches!(
            lost.get(&labels(&[("backend", "memory"), ("kind", "confirmed")])),
            Some(V::Counter(1))
        ),
        "{lost:?} in {names_seen:?}"
    );
    let held = values(&snapshot, names::HELD_DURATION);
    assert!(
        matches!(held.get(&labels(&[("backend", "memory")])), Some(V::Histogram(n)) if *n >= 1),
        "{held:?}"
    );
    let waiters = values(&snapshot, names::WAITERS);
    assert!(
        matches!(waiters.get(&labels(&[("backend", "memory")])), Some(V::Gauge(g)) if *g == 0.0),
        "every waiter counted in was counted out: {waiters:?}"
    );
    assert!(
        snapshot
            .iter()
            .all(|(_, l, _)| l.iter().all(|(_, v)| !v.contains("orders"))),
        "no label carries a lock name"
    );
}

/// Fails its first `failures` attempts with `Unavailable`, then is the
/// in-memory backend.
struct Flaky {
    inner: MemoryLock,
    failures: usize,
    attempts: AtomicUsize,
}

impl Flaky {
    fn attempt(&self) -> Result<(), LockError> {
        if self.attempts.fetch_add(1, Ordering::SeqCst) < self.failures {
            return Err(LockError::Unavailable {
                backend: "flaky",
                reason: "down for a moment".to_string(),
                source: None,
            });
        }
        Ok(())
    }
}

#[async_trait]
impl DistributedLock for Flaky {
    async fn try_acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.attempt()?;
        self.inner.try_acquire(name, opts).await
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        self.attempt()?;
        self.inner.acquire(name, opts).await
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

#[tokio::test]
async fn retries_transient_failures_but_not_refusals_or_timeouts() {
    let flaky = Arc::new(Flaky {
        inner: MemoryLock::new(),
        failures: 3,
        attempts: AtomicUsize::new(0),
    });
    let locks = (Arc::clone(&flaky) as Arc<dyn DistributedLock>).layer(RetryLayer::default());
    let g = locks
        .acquire("job", &opts(1_000))
        .await
        .expect("granted after retries");
    assert_eq!(flaky.attempts.load(Ordering::SeqCst), 4);
    // Held: a single attempt is refused at once, not retried.
    assert!(
        locks
            .try_acquire("job", &opts(1_000))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(flaky.attempts.load(Ordering::SeqCst), 5);
    // A wait that runs out is not retried either.
    let short = opts(1_000).wait(Wait::UpTo(Duration::from_millis(100)));
    let e = locks.acquire("job", &short).await.unwrap_err();
    assert!(matches!(e, LockError::Timeout { .. }), "{e:?}");
    assert_eq!(flaky.attempts.load(Ordering::SeqCst), 6);
    assert!(g.release().await.unwrap());
    // A server that stays down is given up on within the caller's wait
    // (on a paused clock, so the bound is exact, not a guess at latency).
    tokio::time::pause();
    let down = Arc::new(Flaky {
        inner: MemoryLock::new(),
        failures: usize::MAX,
        attempts: AtomicUsize::new(0),
    });
    let locks = (Arc::clone(&down) as Arc<dyn DistributedLock>).layer(RetryLayer::default());
    let started = tokio::time::Instant::now();
    let e = locks
        .acquire(
            "job",
            &opts(1_000).wait(Wait::UpTo(Duration::from_millis(500))),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, LockError::Unavailable { .. }), "{e:?}");
    let took = started.elapsed();
    assert!(
        took <= Duration::from_millis(500),
        "retried past the caller's 500 ms wait: {took:?}"
    );
    assert!(down.attempts.load(Ordering::SeqCst) > 1);
}

/// A guard handle that fails its first `failures` extends and releases
/// with `Unavailable`; with `lost_reply`, a failed release has released
/// the lock all the same (its answer was lost on the way back).
struct FlakyHandle {
    inner: Arc<dyn GuardHandle>,
    failures: usize,
    lost_reply: bool,
    calls: Arc<AtomicUsize>,
}

impl FlakyHandle {
    fn unavailable() -> LockError {
        LockError::Unavailable {
            backend: "flaky",
            reason: "no answer".to_string(),
            source: None,
        }
    }

    fn failing(&self) -> bool {
        self.calls.fetch_add(1, Ordering::SeqCst) < self.failures
    }
}

#[async_trait]
impl GuardHandle for FlakyHandle {
    async fn release(&self) -> Result<bool, LockError> {
        if self.failing() {
            if self.lost_reply {
                self.inner.release().await?;
            }
            return Err(Self::unavailable());
        }
        self.inner.release().await
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        if self.failing() {
            return Err(Self::unavailable());
        }
        self.inner.extend(ttl).await
    }
}

/// The in-memory backend whose guards' handles are [`FlakyHandle`]s.
struct FlakyGuards {
    inner: MemoryLock,
    failures: usize,
    lost_reply: bool,
    calls: Arc<AtomicUsize>,
}

impl FlakyGuards {
    fn flaky(&self, guard: LockGuard) -> LockGuard {
        guard.map_handle(|inner| {
            Arc::new(FlakyHandle {
                inner,
                failures: self.failures,
                lost_reply: self.lost_reply,
                calls: Arc::clone(&self.calls),
            })
        })
    }
}

#[async_trait]
impl DistributedLock for FlakyGuards {
    async fn try_acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let guard = self.inner.try_acquire(name, opts).await?;
        Ok(guard.map(|g| self.flaky(g)))
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        Ok(self.flaky(self.inner.acquire(name, opts).await?))
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

fn flaky_guards(failures: usize, lost_reply: bool) -> (Arc<dyn DistributedLock>, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let lock = Arc::new(FlakyGuards {
        inner: MemoryLock::new(),
        failures,
        lost_reply,
        calls: Arc::clone(&calls),
    });
    (lock, calls)
}

/// "job" held through the retry layer over [`flaky_guards`].
async fn held_with_retries(
    failures: usize,
    lost_reply: bool,
) -> (Arc<dyn DistributedLock>, LockGuard, Arc<AtomicUsize>) {
    let (flaky, calls) = flaky_guards(failures, lost_reply);
    let locks = flaky.layer(RetryLayer::default());
    let guard = locks.try_acquire("job", &opts(1_000)).await.expect("try");
    (locks, guard.expect("free"), calls)
}

#[tokio::test]
async fn a_guards_extend_and_release_are_retried() {
    // Without the layer, a transient failure reaches the caller.
    let (bare, _) = flaky_guards(1, false);
    let g = bare
        .try_acquire("job", &opts(1_000))
        .await
        .unwrap()
        .unwrap();
    let e = g.extend(Duration::from_secs(1)).await.unwrap_err();
    assert!(e.is_transient(), "{e:?}");

    // With it: two failed extends, then one that lands.
    let (_locks, g, calls) = held_with_retries(2, false).await;
    g.extend(Duration::from_secs(1))
        .await
        .expect("extended after retries");
    assert_eq!(calls.swap(0, Ordering::SeqCst), 3);
    // A release after a failure that left the lock in place: it was ours.
    calls.store(1, Ordering::SeqCst);
    assert!(g.release().await.expect("released after a retry"));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_retried_release_that_finds_the_lock_gone_is_not_reported_as_lost() {
    // The first release landed but its answer was lost: the retry finds
    // the lock gone, which must not read as "it was no longer ours".
    let (locks, g, calls) = held_with_retries(1, true).await;
    let e = g.release().await.unwrap_err();
    assert!(matches!(e, LockError::Unavailable { .. }), "{e:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // And the lock is free.
    assert!(
        locks
            .try_acquire("job", &opts(1_000))
            .await
            .unwrap()
            .is_some()
    );
}

/// A layer that counts the acquisitions that pass through it.
#[derive(Clone, Default)]
struct Counting(Arc<AtomicUsize>);

struct Counted {
    inner: Arc<dyn DistributedLock>,
    seen: Arc<AtomicUsize>,
}

#[async_trait]
impl lock_core::raw::LayeredLock for Counted {
    fn inner(&self) -> &Arc<dyn DistributedLock> {
        &self.inner
    }

    async fn try_acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.seen.fetch_add(1, Ordering::SeqCst);
        self.inner.try_acquire(name, opts).await
    }
}

impl lock_layers::Layer for Counting {
    fn layer(&self, inner: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
        Arc::new(lock_core::raw::Layered::new(Counted {
            inner,
            seen: Arc::clone(&self.0),
        }))
    }
}

#[tokio::test]
async fn a_concrete_lock_under_layers_stays_reachable_as_its_type() {
    let (inner, outer) = (Counting::default(), Counting::default());
    let store = Arc::new(MemoryLock::new());
    let locks = Arc::clone(&store)
        .layer(inner.clone())
        .layer(TracingLayer)
        .layer(outer.clone());
    let g = locks
        .try_acquire("orders/7", &opts(10_000))
        .await
        .expect("try_acquire")
        .expect("free");
    // Through every layer, once each.
    assert_eq!(inner.0.load(Ordering::SeqCst), 1);
    assert_eq!(outer.0.load(Ordering::SeqCst), 1);
    // The lock underneath, as its own type, sees the same lock.
    let memory: &MemoryLock = locks.get_ref();
    assert!(memory.inspect("orders/7").await.expect("inspect").held);
    assert!(Arc::ptr_eq(locks.inner(), &store));
    // Erased, it still goes through the layers.
    let erased: Arc<dyn DistributedLock> = locks.clone().into_dyn();
    assert!(busy(&*erased, "orders/7", &opts(10_000)).await);
    assert_eq!(inner.0.load(Ordering::SeqCst), 2);
    assert!(g.release().await.expect("release"));
    // Unwrapped, the layers are gone.
    let unwrapped = locks.into_inner();
    assert!(!busy(&*unwrapped, "orders/7", &opts(10_000)).await);
    assert_eq!(inner.0.load(Ordering::SeqCst), 2);
}

/// A guard through the tracing, metrics and retry layers is the backend's
/// grant as it was: a permit keeps its slot, a reader-writer grant its
/// access, and both their tokens.
#[tokio::test]
async fn layered_guards_keep_their_slot_and_access() {
    let locks = Arc::new(MemoryLock::new())
        .layer(TracingLayer)
        .layer(MetricsLayer)
        .layer(RetryLayer::default())
        .into_dyn();
    let sem =
        lock_core::Semaphore::new(Arc::clone(&locks), "layered/permits", 2).expect("semaphore");
    let first = sem.acquire(&opts(10_000)).await.expect("permit");
    let second = sem.acquire(&opts(10_000)).await.expect("permit");
    let mut slots = [first.slot(), second.slot()];
    slots.sort();
    assert_eq!(
        slots,
        [Some(0), Some(1)],
        "each permit's slot, through the layers"
    );
    let writer = locks
        .acquire_write("layered/rw", &opts(10_000))
        .await
        .expect("write");
    assert_eq!(writer.access(), Some(Access::Write));
    let token = writer.fencing_token();
    assert!(writer.release().await.expect("release"));
    let reader = locks
        .acquire_read("layered/rw", &opts(10_000))
        .await
        .expect("read");
    assert_eq!(reader.access(), Some(Access::Read));
    assert_eq!(
        reader.fencing_token(),
        token,
        "a reader carries the latest write's token"
    );
}
