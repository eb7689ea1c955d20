//! One clock for every process of a run: `CLOCK_MONOTONIC` in nanoseconds,
//! which Linux keeps system-wide, so timestamps from different processes
//! compare directly.

use std::time::{Duration, Instant};

/// Now, in nanoseconds of `CLOCK_MONOTONIC`.
pub fn now_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// An `Instant` (which is `CLOCK_MONOTONIC` on Linux) in the same
/// nanoseconds as [`now_ns`].
pub fn instant_ns(at: Instant) -> u64 {
    let (now, now_ns) = (Instant::now(), now_ns());
    if at >= now {
        now_ns.saturating_add(nanos(at - now))
    } else {
        now_ns.saturating_sub(nanos(now - at))
    }
}

/// A duration in nanoseconds, saturating.
pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Nanoseconds as milliseconds with a fraction, for reports.
pub fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_map_onto_the_shared_clock() {
        let before = now_ns();
        let later = Instant::now() + Duration::from_secs(2);
        let mapped = instant_ns(later);
        let after = now_ns();
        assert!(mapped >= before + 2_000_000_000 && mapped <= after + 2_000_000_000);
    }
}
