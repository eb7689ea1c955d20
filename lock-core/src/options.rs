//! How to take a lock: lease length, how long to wait, auto-renewal, backoff.

use std::time::Duration;

use crate::capabilities::Capabilities;
use crate::error::LockError;
use crate::raw::{DEFAULT_SAFETY_MARGIN, drift_allowance};

/// The shortest TTL accepted: below this the drift allowance and one round
/// trip would eat the whole lease.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// How long `acquire` waits for a held lock.
///
/// Not waiting has two shapes, one per call: `try_acquire` answers a held
/// lock with `Ok(None)`, for code that expects it; `acquire` with
/// `Wait::No` makes one attempt too and answers `Err(Timeout)`, for code
/// that treats a held lock as a failure (as for a wait that ran out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// One attempt; a held lock gives [`LockError::Timeout`].
    No,
    /// Wait at most this long, then [`LockError::Timeout`]. A wait too
    /// long to represent as a deadline (`Duration::MAX`) waits forever.
    UpTo(Duration),
    /// Wait until the lock is granted (or the future is dropped).
    Forever,
    /// The former name of [`Wait::UpTo`]; [`LockOptions::wait`] turns it
    /// into `UpTo`.
    #[deprecated(note = "renamed `Wait::UpTo`")]
    Up(Duration),
}

/// Retry delays for backends that must poll: exponential growth from
/// `initial` to `max`, each delay shortened by up to `jitter` (a fraction in
/// `0.0..=1.0`) at random so that waiters spread out.
///
/// Built from [`Backoff::default`] (5 ms to 250 ms, doubling, half jitter)
/// with the `with_*` methods, so that a field added later is not a
/// breaking change:
///
/// ```
/// use std::time::Duration;
/// let b = lock_core::Backoff::default()
///     .with_initial(Duration::from_millis(1))
///     .with_max(Duration::from_millis(50));
/// assert_eq!(b.max, Duration::from_millis(50));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
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
    /// Set the first delay.
    pub fn with_initial(mut self, initial: Duration) -> Self {
        self.initial = initial;
        self
    }

    /// Set the largest delay.
    pub fn with_max(mut self, max: Duration) -> Self {
        self.max = max;
        self
    }

    /// Set the growth factor per attempt (≥ 1).
    pub fn with_multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = multiplier;
        self
    }

    /// Set the random fraction removed from each delay (0 to 1).
    pub fn with_jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

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
        // Seconds as `f64` round `Duration::MAX` up past itself, and a
        // growth factor can reach infinity: anything not representable
        // (or not a number) is the largest delay.
        Duration::try_from_secs_f64((capped * (1.0 - cut)).max(0.0))
            .map_or(self.max, |d| d.min(self.max))
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
///     .wait(Wait::UpTo(Duration::from_secs(2)))
///     .auto_renew(false);
/// assert_eq!(opts.ttl, Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
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
    /// Who the grant records as its holder, shown by
    /// [`inspect`](crate::DistributedLock::inspect) and `distlock status`
    /// (at most [`MAX_IDENTITY_BYTES`](crate::MAX_IDENTITY_BYTES)); `None`:
    /// this process's [`default_identity`](crate::default_identity),
    /// `host (pid N, program)`.
    pub identity: Option<String>,
    /// A small value the grant records beside its holder (at most
    /// [`MAX_VALUE_BYTES`](crate::MAX_VALUE_BYTES); empty by default): an
    /// address, a shard map's version. An election's value.
    pub value: Vec<u8>,
    /// Take one of `limit` permits of the name (a semaphore, see
    /// [`Semaphore`](crate::Semaphore)) instead of its lock; `None`, the
    /// default: the lock. Semaphores and locks of one name are apart.
    pub permits: Option<u32>,
    /// Chubby's and Consul's lock-delay: when the holder *fails* (crashes,
    /// is cut off, stops renewing), the server keeps the lock closed for
    /// this long after the holder's lease ends, so a resource that cannot
    /// check fencing tokens is not written by a late request of the dead
    /// holder; a normal release frees it at once. `lost()` fires at the
    /// lease's end as usual. `None` (the default): no delay. Where
    /// [`Capabilities::lock_delay`](crate::Capabilities::lock_delay).
    pub lock_delay: Option<Duration>,
    /// ShedLock's `lockAtLeastFor`: a normal release within this long of
    /// the grant leaves the lock taken on the server until then (the
    /// holder need not stay alive), so a job started on several machines
    /// at once runs once per period. `None` (the default): a release frees
    /// at once. Where [`Capabilities::hold_at_least`](crate::Capabilities::hold_at_least).
    pub hold_at_least: Option<Duration>,
    /// Take the name's reader-writer lock for reading or writing (see
    /// [`RwLockExt`](crate::RwLockExt)) instead of its lock; `None`, the
    /// default: the lock. Reader-writer locks and locks of one name are
    /// apart. Where [`Capabilities::rw_lock`](crate::Capabilities::rw_lock).
    pub access: Option<crate::rw_lock::Access>,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(30),
            wait: Wait::Forever,
            auto_renew: true,
            backoff: Backoff::default(),
            safety_margin: DEFAULT_SAFETY_MARGIN,
            identity: None,
            value: Vec::new(),
            permits: None,
            lock_delay: None,
            hold_at_least: None,
            access: None,
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
        #[allow(deprecated)]
        let wait = match wait {
            Wait::Up(d) => Wait::UpTo(d),
            other => other,
        };
        self.wait = wait;
        self
    }

    /// Shorthand for `wait(Wait::UpTo(timeout))`.
    pub fn wait_timeout(self, timeout: Duration) -> Self {
        self.wait(Wait::UpTo(timeout))
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

    /// Keep the lock closed for `delay` after the lease of a holder that
    /// failed ([`lock_delay`](Self::lock_delay)).
    pub fn lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = Some(delay);
        self
    }

    /// Keep the lock taken until `at_least` after the grant, released or
    /// not ([`hold_at_least`](Self::hold_at_least)).
    pub fn hold_at_least(mut self, at_least: Duration) -> Self {
        self.hold_at_least = Some(at_least);
        self
    }

    /// Set the safety margin (default [`DEFAULT_SAFETY_MARGIN`], 100 ms):
    /// raise it on hosts where timers may fire later than that.
    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = margin;
        self
    }

    /// Set the holder identity the grant records (default: this
    /// process's [`default_identity`](crate::default_identity)).
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = Some(identity.into());
        self
    }

    /// Set the value the grant records beside its holder.
    pub fn value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.value = value.into();
        self
    }

    /// Ask for one of `limit` permits of the name (a semaphore) instead of
    /// its lock ([`permits`](Self::permits)).
    pub fn permits(mut self, limit: u32) -> Self {
        self.permits = Some(limit);
        self
    }

    /// Ask for the name's reader-writer lock, for reading or writing,
    /// instead of its lock ([`access`](Self::access)).
    pub fn access(mut self, access: crate::rw_lock::Access) -> Self {
        self.access = Some(access);
        self
    }

    /// The holder identity the grant records: [`identity`](Self::identity)
    /// or this process's default.
    pub fn holder_identity(&self) -> &str {
        match &self.identity {
            Some(identity) => identity,
            None => crate::holder::default_identity(),
        }
    }

    /// The record a grant asked for now under these options stores
    /// ([`HolderRecord`](crate::raw::HolderRecord)).
    pub fn holder_record(&self) -> crate::raw::HolderRecord {
        crate::raw::HolderRecord::new(self.holder_identity(), &self.value)
    }

    /// Check the options against what a backend can represent.
    pub fn validate(&self, caps: &Capabilities) -> Result<(), LockError> {
        validate_ttl(self.ttl, caps)?;
        if let Some(limit) = self.permits {
            validate_limit(limit, caps)?;
        }
        crate::rw_lock::validate_access(self, caps.rw_lock, caps.backend)?;
        validate_timing(self, caps)?;
        crate::holder::validate_holder(self.identity.as_deref(), &self.value)?;
        self.backoff.validate()
    }
}

/// Check the lock delay and the hold: offered by the backend, for a lock
/// (not a permit), not zero, and the lease with its delay (the server's
/// TTL) and the hold within the backend's longest TTL.
fn validate_timing(opts: &LockOptions, caps: &Capabilities) -> Result<(), LockError> {
    let asked = [
        ("lock_delay", "lock delay", opts.lock_delay, caps.lock_delay),
        (
            "hold_at_least",
            "hold at least",
            opts.hold_at_least,
            caps.hold_at_least,
        ),
    ];
    for (option, operation, asked, offered) in asked {
        let Some(d) = asked else { continue };
        if !offered {
            return Err(LockError::Unsupported {
                backend: caps.backend,
                operation,
            });
        }
        if let Some(limit) = opts.permits {
            return Err(LockError::invalid_options(format!(
                "{option} is for locks: options asking for one of {limit} permits are refused"
            )));
        }
        if let Some(access) = opts.access {
            return Err(LockError::invalid_options(format!(
                "{option} is for locks: options asking for a {access} lock are refused"
            )));
        }
        if d.is_zero() {
            return Err(LockError::invalid_options(format!(
                "{option} must be more than zero (leave it unset for none)"
            )));
        }
    }
    if let Some(delay) = opts.lock_delay {
        validate_ttl(opts.ttl.saturating_add(delay), caps).map_err(|_| {
            LockError::invalid_options(format!(
                "ttl {:?} with lock_delay {delay:?} exceeds the {} backend's maximum of {:?}",
                opts.ttl, caps.backend, caps.max_ttl
            ))
        })?;
    }
    if let Some(hold) = opts.hold_at_least
        && hold > caps.max_ttl
    {
        return Err(LockError::invalid_options(format!(
            "hold_at_least {hold:?} exceeds the {} backend's maximum TTL of {:?}",
            caps.backend, caps.max_ttl
        )));
    }
    Ok(())
}

/// Check a semaphore's limit: offered by the backend, from 1 to its
/// largest.
fn validate_limit(limit: u32, caps: &Capabilities) -> Result<(), LockError> {
    let Some(semaphore) = caps.semaphore else {
        return Err(LockError::Unsupported {
            backend: caps.backend,
            operation: "semaphores",
        });
    };
    if limit == 0 || limit > semaphore.max_limit {
        return Err(LockError::invalid_options(format!(
            "a semaphore's limit must be from 1 to {} on the {} backend, got {limit}",
            semaphore.max_limit, caps.backend
        )));
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The former name still builds the same wait.
    #[test]
    #[allow(deprecated)]
    fn wait_up_is_the_former_name_of_up_to() {
        let d = Duration::from_millis(700);
        assert_eq!(LockOptions::new().wait(Wait::Up(d)).wait, Wait::UpTo(d));
    }

    fn duration() -> impl Strategy<Value = Duration> {
        prop_oneof![
            Just(Duration::ZERO),
            Just(Duration::MAX),
            any::<u64>().prop_map(Duration::from_nanos),
            (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        ]
    }

    fn factor() -> impl Strategy<Value = f64> {
        prop_oneof![
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(f64::MAX),
            Just(0.0),
            Just(1.0),
            any::<f64>(),
            0.0f64..=1.0,
            1.0f64..1e12,
        ]
    }

    proptest! {
        /// Any backoff, valid or not, at any attempt: a delay no longer
        /// than its `max`, never a panic.
        #[test]
        fn a_delay_never_panics_and_never_passes_max(
            initial in duration(),
            max in duration(),
            multiplier in factor(),
            jitter in factor(),
            attempt in any::<u32>(),
        ) {
            let b = Backoff { initial, max, multiplier, jitter };
            prop_assert!(b.delay(attempt) <= max);
        }
    }

    #[test]
    fn a_growth_past_what_a_duration_holds_is_the_largest_delay() {
        let b = Backoff {
            initial: Duration::from_millis(1),
            max: Duration::MAX,
            multiplier: 1e10,
            jitter: 0.0,
        };
        assert!(b.validate().is_ok());
        assert_eq!(b.delay(40), Duration::MAX);
    }
}
