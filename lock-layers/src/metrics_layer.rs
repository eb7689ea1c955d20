//! Metrics through the `metrics` facade.

use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::RenewalOutcome;
use lock_core::{DistributedLock, LockError, LossKind, LossReason};

use crate::Layer;
use crate::events::{Events, Observed, Outcome};

/// The metric names [`MetricsLayer`] records, defined once. Labels are
/// never per lock name (names are unbounded and can carry user data).
pub mod names {
    /// Histogram, seconds an acquisition took; labels `backend`, `outcome`
    /// (`granted`, `busy`, `timeout`, `error`).
    pub const ACQUIRE_DURATION: &str = "distlock_acquire_duration_seconds";
    /// Histogram, seconds a lock was held, recorded at its release; label
    /// `backend`.
    pub const HELD_DURATION: &str = "distlock_held_duration_seconds";
    /// Counter, held locks lost; labels `backend`, `kind` (`suspected`,
    /// `confirmed`).
    pub const LOST: &str = "distlock_lost_total";
    /// Counter, renewals the watchdog made; labels `backend`, `outcome`
    /// (`renewed`, `not_held`, `failed`).
    pub const RENEW: &str = "distlock_renew_total";
    /// Gauge, acquisitions of this process waiting right now; label
    /// `backend`.
    pub const WAITERS: &str = "distlock_waiters";
}

/// Records [`names`] through whatever recorder the application installed
/// (`metrics-exporter-prometheus`, a statsd exporter, …); without one, the
/// calls cost next to nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct MetricsLayer;

impl Layer for MetricsLayer {
    fn layer(&self, inner: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
        Arc::new(Observed::new(inner, Metrics))
    }
}

struct Metrics;

impl Events for Metrics {
    fn acquiring(&self, backend: &'static str, waits: bool) {
        if waits {
            metrics::gauge!(names::WAITERS, "backend" => backend).increment(1.0);
        }
    }

    fn acquired(
        &self,
        _span: &tracing::Span,
        backend: &'static str,
        waits: bool,
        waited: Duration,
        outcome: Outcome,
        _token: Option<u64>,
    ) {
        if waits {
            metrics::gauge!(names::WAITERS, "backend" => backend).decrement(1.0);
        }
        metrics::histogram!(
            names::ACQUIRE_DURATION,
            "backend" => backend,
            "outcome" => outcome.as_str()
        )
        .record(waited.as_secs_f64());
    }

    fn released(
        &self,
        _span: &tracing::Span,
        backend: &'static str,
        held: Duration,
        _result: &Result<bool, LockError>,
    ) {
        metrics::histogram!(names::HELD_DURATION, "backend" => backend).record(held.as_secs_f64());
    }

    fn renewal(&self, backend: &'static str, outcome: RenewalOutcome) {
        metrics::counter!(names::RENEW, "backend" => backend, "outcome" => outcome.as_str())
            .increment(1);
    }

    fn lost(&self, backend: &'static str, reason: &LossReason) {
        let kind = match reason.kind() {
            LossKind::Suspected => "suspected",
            LossKind::Confirmed => "confirmed",
        };
        metrics::counter!(names::LOST, "backend" => backend, "kind" => kind).increment(1);
    }
}
