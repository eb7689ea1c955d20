//! The one mechanism the observing layers share: a lock that reports what
//! happens to its acquisitions and to the guards it hands out (renewals
//! from the watchdog, loss, release) to an [`Events`] sink.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::raw::{
    GuardHandle, Layered, LayeredLock, RawGuard, RenewalObserver, RenewalOutcome, async_trait,
};
use lock_core::{
    Capabilities, DistributedLock, LockError, LockGuard, LockOptions, LossReason, Wait,
};
use tokio::sync::Notify;
use tokio::time::Instant;

/// What became of an acquisition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Granted.
    Granted,
    /// A single attempt found the lock held.
    Busy,
    /// The wait ran out.
    Timeout,
    /// Any other error.
    Error,
}

impl Outcome {
    pub(crate) fn of<T>(result: &Result<Option<T>, LockError>) -> Outcome {
        match result {
            Ok(Some(_)) => Outcome::Granted,
            Ok(None) => Outcome::Busy,
            Err(LockError::Timeout { .. }) => Outcome::Timeout,
            Err(_) => Outcome::Error,
        }
    }

    /// The label: `granted`, `busy`, `timeout`, `error`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Granted => "granted",
            Outcome::Busy => "busy",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
        }
    }
}

/// Where an observing layer sends what it sees. Every method has a no-op
/// default.
pub(crate) trait Events: Send + Sync + 'static {
    /// An acquisition is about to start (`waits`: it may wait).
    fn acquiring(&self, _backend: &'static str, _waits: bool) {}
    /// An acquisition, run in `span`, ended after `waited`.
    fn acquired(
        &self,
        _span: &tracing::Span,
        _backend: &'static str,
        _waits: bool,
        _waited: Duration,
        _outcome: Outcome,
        _token: Option<u64>,
    ) {
    }
    /// The span the acquisition runs in.
    fn acquire_span(&self, _backend: &'static str, _name: &str) -> tracing::Span {
        tracing::Span::none()
    }
    /// The span a release runs in.
    fn release_span(&self, _backend: &'static str) -> tracing::Span {
        tracing::Span::none()
    }
    /// A release, run in `span`, came back after the lock was held for
    /// `held`.
    fn released(
        &self,
        _span: &tracing::Span,
        _backend: &'static str,
        _held: Duration,
        _result: &Result<bool, LockError>,
    ) {
    }
    /// The watchdog renewed (or failed to renew) the lock.
    fn renewal(&self, _backend: &'static str, _outcome: RenewalOutcome) {}
    /// The lock was lost (or is suspected lost).
    fn lost(&self, _backend: &'static str, _reason: &LossReason) {}
}

/// A lock whose acquisitions and guards report to `events`.
pub(crate) struct Observed<E: Events> {
    inner: Arc<dyn DistributedLock>,
    events: Arc<E>,
}

impl<E: Events> Observed<E> {
    pub(crate) fn new(inner: Arc<dyn DistributedLock>, events: E) -> Layered<Self> {
        Layered::new(Observed {
            inner,
            events: Arc::new(events),
        })
    }

    async fn observe(
        &self,
        name: &str,
        waits: bool,
        attempt: impl Future<Output = Result<Option<LockGuard>, LockError>>,
    ) -> Result<Option<LockGuard>, LockError> {
        let result = self
            .observe_granted(name, waits, attempt, LockGuard::fencing_token)
            .await;
        let caps = self.inner.capabilities();
        Ok(result?.map(|g| watch(g, caps, &self.events)))
    }

    /// One acquisition, of a lock or a set (`name`: the set's names), as
    /// an event; `token` reads the fencing token reported of a grant.
    async fn observe_granted<T>(
        &self,
        name: &str,
        waits: bool,
        attempt: impl Future<Output = Result<Option<T>, LockError>>,
        token: impl Fn(&T) -> Option<u64>,
    ) -> Result<Option<T>, LockError> {
        use tracing::Instrument;
        let backend = self.inner.capabilities().backend;
        self.events.acquiring(backend, waits);
        let span = self.events.acquire_span(backend, name);
        let started = Instant::now();
        let result = attempt.instrument(span.clone()).await;
        let token = result.as_ref().ok().and_then(|g| token(g.as_ref()?));
        self.events.acquired(
            &span,
            backend,
            waits,
            started.elapsed(),
            Outcome::of(&result),
            token,
        );
        result
    }
}

/// The guard handed to the caller: the inner guard behind a handle that
/// reports its release, with the lease's renewals and loss reported too.
fn watch<E: Events>(inner: LockGuard, caps: Capabilities, events: &Arc<E>) -> LockGuard {
    let backend = caps.backend;
    let lease = Arc::clone(inner.lease());
    lease.observe(Arc::new(Renewals {
        backend,
        events: Arc::clone(events),
    }));
    let released = Arc::new(Notify::new());
    let (watched, stop, sink) = (
        Arc::clone(&lease),
        Arc::clone(&released),
        Arc::clone(events),
    );
    tokio::spawn(async move {
        tokio::select! {
            reason = watched.lost() => sink.lost(backend, &reason),
            () = stop.notified() => {}
        }
    });
    let (name, token) = (inner.name().to_string(), inner.fencing_token());
    let (slot, access) = (inner.slot(), inner.access());
    let handle = Arc::new(ObservedHandle {
        inner: Mutex::new(Some(inner)),
        granted: Instant::now(),
        backend,
        events: Arc::clone(events),
        released,
    });
    LockGuard::new(name, token, caps, lease, handle)
        .with_slot(slot)
        .with_access(access)
}

struct Renewals<E: Events> {
    backend: &'static str,
    events: Arc<E>,
}

impl<E: Events> RenewalObserver for Renewals<E> {
    fn renewal(&self, outcome: RenewalOutcome) {
        self.events.renewal(self.backend, outcome);
    }
}

struct ObservedHandle<E: Events> {
    inner: Mutex<Option<LockGuard>>,
    granted: Instant,
    backend: &'static str,
    events: Arc<E>,
    released: Arc<Notify>,
}

impl<E: Events> ObservedHandle<E> {
    fn take(&self) -> Option<LockGuard> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

#[async_trait]
impl<E: Events> GuardHandle for ObservedHandle<E> {
    async fn release(&self) -> Result<bool, LockError> {
        use tracing::Instrument;
        let Some(inner) = self.take() else {
            return Ok(false);
        };
        let span = self.events.release_span(self.backend);
        let result = inner.release().instrument(span.clone()).await;
        self.released.notify_one();
        self.events
            .released(&span, self.backend, self.granted.elapsed(), &result);
        result
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        // The inner guard is taken out only by the release, which ends the
        // outer guard too; hold it across the call without the mutex.
        let inner = self.take();
        let Some(guard) = inner else {
            return Ok(false);
        };
        let result = guard.extend(ttl).await;
        *self.inner.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard);
        match result {
            Ok(_) => Ok(true),
            Err(LockError::Lost { .. } | LockError::NotHeld { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn set_value(&self, value: &[u8]) -> Result<bool, LockError> {
        let Some(guard) = self.take() else {
            return Ok(false);
        };
        let result = guard.set_value(value).await;
        *self.inner.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard);
        match result {
            Ok(()) => Ok(true),
            Err(LockError::Lost { .. } | LockError::NotHeld { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[async_trait]
impl<E: Events> LayeredLock for Observed<E> {
    async fn try_acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.observe(name, false, self.inner.try_acquire(name, opts))
            .await
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard, LockError> {
        let waits = opts.wait != Wait::No;
        let attempt = async { self.inner.acquire(name, opts).await.map(Some) };
        match self.observe(name, waits, attempt).await? {
            Some(g) => Ok(g),
            None => Err(LockError::Timeout {
                name: name.to_string(),
                waited: Duration::ZERO,
            }),
        }
    }

    /// One acquisition event for the set (its names joined by commas, no
    /// token); each member's guard reports its release, renewals and loss
    /// as a lock's does.
    async fn try_acquire_set(
        &self,
        names: &[&str],
        opts: &LockOptions,
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        let label = names.join(",");
        let attempt = self.inner.try_acquire_set(names, opts);
        let result = self.observe_granted(&label, false, attempt, |_| None).await;
        let caps = self.inner.capabilities();
        Ok(result?.map(|guards| {
            guards
                .into_iter()
                .map(|g| watch(g, caps, &self.events))
                .collect()
        }))
    }

    fn inner(&self) -> &Arc<dyn DistributedLock> {
        &self.inner
    }
}
