//! How to take a lock: lease length, how long to wait, auto-renewal, backoff.

use std::time::Duration;

use crate::capabilities::Capabilities;
use crate::error::LockError;
use crate::loss::{DEFAULT_SAFETY_MARGIN, drift_allowance};

/// The shortest TTL accepted: below this the drift allowance and one round
/// trip would eat the whole lease.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// How long `acquire` waits for a held lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// One attempt; a held lock gives [`LockError::Timeout`].
    No,
    /// Wait at most this long, then [`LockError::Timeout`]. A wait too
    /// long to represent as a deadline (`Duration::MAX`) waits forever.
    Up(Duration),
    /// Wait until the lock is granted (or the future is dropped).
    Forever,
}

/// Retry delays for backends that must poll: exponential growth from
/// `initial` to `max`, each delay shortened by up to `jitter` (a fraction in
/// `0.0..=1.0`) at random so that waiters spread out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// First delay.
    pub initial: Duration,
    /// Largest delay.
    pub max: Duration,
    /// Growth factor per attempt (≥ 1).
    pub multiplier: f64,
    /// Random fraction removed from each delay (0 = none, 1 = full jitter).
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(250),
            multiplier: 2.0,
            jitter: 0.5,
        }
    }
}

impl Backoff {
    /// The delay before retry number `attempt` (0-based), jitter applied.
    ///
    /// ```
    /// use lock_core::Backoff;
    /// let b = Backoff::default();
    /// assert!(b.delay(0) <= b.initial);
    /// assert!(b.delay(30) <= b.max);
    /// ```
    pub fn delay(&self, attempt: u32) -> Duration {
        let grown = self.initial.as_secs_f64() * self.multiplier.powi(attempt.min(64) as i32);
        let capped = grown.min(self.max.as_secs_f64());
        let cut = self.jitter * rand::random::<f64>();
        Duration::from_secs_f64((capped * (1.0 - cut)).max(0.0))
    }

    fn validate(&self) -> Result<(), LockError> {
        if self.initial.is_zero() || self.max < self.initial {
            return Err(LockError::invalid_options(format!(
                "backoff needs 0 < initial ≤ max, got initial {:?}, max {:?}",
                self.initial, self.max
            )));
        }
        if !(self.multiplier.is_finite() && self.multiplier >= 1.0) {
            return Err(LockError::invalid_options(format!(
                "backoff multiplier must be a finite number ≥ 1, got {}",
                self.multiplier
            )));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(LockError::invalid_options(format!(
                "backoff jitter must be within 0.0..=1.0, got {}",
                self.jitter
            )));
        }
        Ok(())
    }
}

/// Options for one acquisition.
///
/// Defaults: a 30 s lease renewed by the watchdog while the guard lives,
/// waiting forever, the default [`Backoff`], a 100 ms safety margin.
///
/// ```
/// use std::time::Duration;
/// use lock_core::{LockOptions, Wait};
/// let opts = LockOptions::new()
///     .ttl(Duration::from_secs(10))
///     .wait(Wait::Up(Duration::from_secs(2)))
///     .auto_renew(false);
/// assert_eq!(opts.ttl, Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct LockOptions {
    /// Lease length: how long the server keeps the lock if the holder stops
    /// renewing it (crash, pause, partition).
    pub ttl: Duration,
    /// How long `acquire` waits.
    pub wait: Wait,
    /// Renew the lease in the background (about every `ttl / 3`) while the
    /// guard lives.
    pub auto_renew: bool,
    /// Retry delays for polling backends.
    pub backoff: Backoff,
    /// How far ahead of the server's earliest possible expiry `lost()`
    /// fires and the validity deadline falls, at least: room for a timer
    /// that fires late on a loaded host. The margin used is this or the
    /// clock-drift allowance (1 % of the TTL + 2 ms), whichever is larger,
    /// and never more than a quarter of the TTL (see
    /// [`safety_margin`](crate::raw::safety_margin)).
    pub safety_margin: Duration,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(30),
            wait: Wait::Forever,
            auto_renew: true,
            backoff: Backoff::default(),
            safety_margin: DEFAULT_SAFETY_MARGIN,
        }
    }
}

impl LockOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set the lease TTL.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Set how long `acquire` waits.
    pub fn wait(mut self, wait: Wait) -> Self {
        self.wait = wait;
        self
    }

    /// Shorthand for `wait(Wait::Up(timeout))`.
    pub fn wait_timeout(self, timeout: Duration) -> Self {
        self.wait(Wait::Up(timeout))
    }

    /// Turn background renewal on or off.
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    /// Set the retry backoff for polling backends.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Set the safety margin (default [`DEFAULT_SAFETY_MARGIN`], 100 ms):
    /// raise it on hosts where timers may fire later than that.
    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = margin;
        self
    }

    /// Check the options against what a backend can represent.
    pub fn validate(&self, caps: &Capabilities) -> Result<(), LockError> {
        validate_ttl(self.ttl, caps)?;
        self.backoff.validate()
    }
}

/// Check a TTL: at least [`MIN_TTL`], at most the backend's `max_ttl`, and
/// longer than its own drift allowance.
pub fn validate_ttl(ttl: Duration, caps: &Capabilities) -> Result<(), LockError> {
    if ttl < MIN_TTL {
        return Err(LockError::invalid_options(format!(
            "ttl must be at least {MIN_TTL:?}, got {ttl:?}"
        )));
    }
    if ttl > caps.max_ttl {
        return Err(LockError::invalid_options(format!(
            "ttl {ttl:?} exceeds the {} backend's maximum of {:?}",
            caps.backend, caps.max_ttl
        )));
    }
    debug_assert!(drift_allowance(ttl) < ttl);
    Ok(())
}
