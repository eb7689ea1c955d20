//! A `tracing` span per acquisition, release and renewal.

use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::RenewalOutcome;
use lock_core::{DistributedLock, LockError, LossReason};
use tracing::field::Empty;

use crate::Layer;
use crate::events::{Events, Observed, Outcome};

/// Spans on target `distlock`:
///
/// - `distlock.acquire` (`info`): `backend`, `outcome` (`granted`, `busy`,
///   `timeout`, `error`), `waited_ms`, `token`; the lock's name as `lock`
///   only when `debug` is enabled for the target (names can carry user
///   data);
/// - `distlock.release` (`info`): `backend`, `held_ms`, `outcome`
///   (`released`, `not_held`, `error`);
/// - `distlock.renew` (`debug`): `backend`, `outcome` (`renewed`,
///   `not_held`, `failed`), one per renewal the watchdog makes;
/// - a `warn` event `distlock.lost` with `backend` and `reason` when a
///   held lock is lost or suspected lost.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingLayer;

impl Layer for TracingLayer {
    fn layer(&self, inner: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
        Arc::new(Observed::new(inner, Spans))
    }
}

struct Spans;

impl Events for Spans {
    fn acquire_span(&self, backend: &'static str, name: &str) -> tracing::Span {
        let span = tracing::info_span!(
            target: "distlock",
            "distlock.acquire",
            backend,
            lock = Empty,
            outcome = Empty,
            waited_ms = Empty,
            token = Empty,
        );
        if tracing::enabled!(target: "distlock", tracing::Level::DEBUG) {
            span.record("lock", name);
        }
        span
    }

    fn acquired(
        &self,
        span: &tracing::Span,
        _backend: &'static str,
        _waits: bool,
        waited: Duration,
        outcome: Outcome,
        token: Option<u64>,
    ) {
        span.record("outcome", outcome.as_str());
        span.record("waited_ms", waited.as_secs_f64() * 1e3);
        if let Some(token) = token {
            span.record("token", token);
        }
    }

    fn release_span(&self, backend: &'static str) -> tracing::Span {
        tracing::info_span!(
            target: "distlock",
            "distlock.release",
            backend,
            held_ms = Empty,
            outcome = Empty,
        )
    }

    fn released(
        &self,
        span: &tracing::Span,
        _backend: &'static str,
        held: Duration,
        result: &Result<bool, LockError>,
    ) {
        let outcome = match result {
            Ok(true) => "released",
            Ok(false) => "not_held",
            Err(_) => "error",
        };
        span.record("held_ms", held.as_secs_f64() * 1e3);
        span.record("outcome", outcome);
    }

    fn renewal(&self, backend: &'static str, outcome: RenewalOutcome) {
        tracing::debug_span!(
            target: "distlock",
            "distlock.renew",
            backend,
            outcome = outcome.as_str()
        )
        .in_scope(|| {});
    }

    fn lost(&self, backend: &'static str, reason: &LossReason) {
        tracing::warn!(target: "distlock", backend, reason = %reason, "distlock.lost");
    }
}
