//! Retries of one request, split as tower splits them: a [`RetryPolicy`]
//! says which failures are worth another try, a [`Backoff`] how long to
//! pause before it, a [`RetryBudget`] how many retries a client may add to
//! its traffic, and [`Retry`] runs a request under the three, within a
//! number of attempts and a deadline.

use std::fmt;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::options::Backoff;

/// Which failures of a request are worth sending it again. Any
/// `Fn(&E) -> bool` is one.
pub trait RetryPolicy<E> {
    /// Whether a request that failed with `error` may be sent again (it is
    /// safe to repeat, and the failure may pass).
    fn retry(&self, error: &E) -> bool;
}

impl<E, F: Fn(&E) -> bool> RetryPolicy<E> for F {
    fn retry(&self, error: &E) -> bool {
        self(error)
    }
}

/// How many retries a client may add to its traffic: each first attempt
/// deposits `ratio` of a retry, each retry withdraws one, and `min_per_sec`
/// retries a second are always allowed, over a sliding window of `window`
/// (as tower's `TpsBudget`). During an outage every request fails, and a
/// budget keeps the retries from multiplying the load on the servers
/// that come back.
pub struct RetryBudget {
    ratio: f64,
    min_per_sec: u32,
    window: Duration,
    state: Mutex<BudgetWindows>,
}

/// Deposits and withdrawals of the current window and the one before it.
#[derive(Debug)]
struct BudgetWindows {
    started: Instant,
    deposits: [u64; 2],
    withdrawals: [u64; 2],
}

impl RetryBudget {
    /// A budget of `ratio` retries per first attempt (clamped to 0–1000)
    /// plus `min_per_sec` a second, over `window` (at least a millisecond).
    pub fn new(window: Duration, min_per_sec: u32, ratio: f64) -> Self {
        let ratio = if ratio.is_finite() {
            ratio.clamp(0.0, 1000.0)
        } else {
            0.0
        };
        RetryBudget {
            ratio,
            min_per_sec,
            window: window.max(Duration::from_millis(1)),
            state: Mutex::new(BudgetWindows {
                started: Instant::now(),
                deposits: [0; 2],
                withdrawals: [0; 2],
            }),
        }
    }

    /// Count a first attempt.
    pub fn deposit(&self) {
        let mut state = self.windows();
        state.deposits[0] = state.deposits[0].saturating_add(1);
    }

    /// Take one retry from the budget: `false` if it is spent.
    pub fn withdraw(&self) -> bool {
        let mut state = self.windows();
        let deposits = (state.deposits[0] + state.deposits[1]) as f64;
        let withdrawals = (state.withdrawals[0] + state.withdrawals[1]) as f64;
        let floor = f64::from(self.min_per_sec) * self.window.as_secs_f64();
        if withdrawals + 1.0 > deposits * self.ratio + floor {
            return false;
        }
        state.withdrawals[0] = state.withdrawals[0].saturating_add(1);
        true
    }

    /// The windows, moved on to now.
    fn windows(&self) -> std::sync::MutexGuard<'_, BudgetWindows> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let passed = state.started.elapsed();
        if passed >= self.window * 2 {
            state.deposits = [0; 2];
            state.withdrawals = [0; 2];
            state.started = Instant::now();
        } else if passed >= self.window {
            state.deposits = [0, state.deposits[0]];
            state.withdrawals = [0, state.withdrawals[0]];
            state.started += self.window;
        }
        state
    }
}

impl Default for RetryBudget {
    /// 20 % of first attempts plus 10 retries a second, over 10 s
    /// (tower's defaults).
    fn default() -> Self {
        RetryBudget::new(Duration::from_secs(10), 10, 0.2)
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("ratio", &self.ratio)
            .field("min_per_sec", &self.min_per_sec)
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

/// How one request is retried: at most `attempts` sends, a pause from the
/// backoff between them (or none), no retry that would start after the
/// deadline or the patience, each retry paid for from a budget if there is
/// one.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// use lock_core::Backoff;
/// use lock_core::raw::Retry;
/// let retry = Retry::with_backoff(Backoff::default()).attempts(3);
/// let mut sent = 0;
/// let answer: Result<u32, &str> = retry
///     .run("reading", |e: &&str| *e == "busy", |_| {
///         sent += 1;
///         let reply = if sent < 3 { Err("busy") } else { Ok(7) };
///         async move { reply }
///     })
///     .await;
/// assert_eq!((answer, sent), (Ok(7), 3));
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Retry<'b> {
    backoff: Option<Backoff>,
    attempts: u32,
    patience: Option<Duration>,
    deadline: Option<Instant>,
    budget: Option<&'b RetryBudget>,
}

impl<'b> Retry<'b> {
    /// Send again after a pause from `backoff`; any number of attempts
    /// until a limit is set.
    pub fn with_backoff(backoff: Backoff) -> Self {
        Retry {
            backoff: Some(backoff),
            attempts: u32::MAX,
            patience: None,
            deadline: None,
            budget: None,
        }
    }

    /// Send again at once: for a client that waits for its connection to
    /// come back inside the request itself.
    pub fn immediately() -> Self {
        Retry {
            backoff: None,
            ..Retry::with_backoff(Backoff::default())
        }
    }

    /// At most `attempts` sends in all (the first included; at least one).
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts.max(1);
        self
    }

    /// No retry starts more than `patience` after the first send.
    pub fn patience(mut self, patience: Duration) -> Self {
        self.patience = Some(patience);
        self
    }

    /// No retry starts at or after `deadline` (`None`: no deadline).
    pub fn deadline(mut self, deadline: Option<Instant>) -> Self {
        self.deadline = deadline;
        self
    }

    /// Pay for each retry from `budget` (and count the first send in it).
    pub fn budget(mut self, budget: &'b RetryBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Run `send` (given the number of earlier sends) until it succeeds,
    /// fails in a way `policy` does not retry, or the attempts, the
    /// deadline, the patience or the budget run out; the last answer is
    /// returned. `doing` names the request in the diagnostics.
    pub async fn run<T, E, P, F, Fut>(&self, doing: &str, policy: P, mut send: F) -> Result<T, E>
    where
        E: fmt::Display,
        P: RetryPolicy<E>,
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let started = Instant::now();
        let give_up_at = match (
            self.patience.and_then(|p| started.checked_add(p)),
            self.deadline,
        ) {
            (Some(p), Some(d)) => Some(p.min(d)),
            (p, d) => p.or(d),
        };
        if let Some(budget) = self.budget {
            budget.deposit();
        }
        let mut sent: u32 = 0;
        loop {
            let error = match send(sent).await {
                Ok(answer) => return Ok(answer),
                Err(e) => e,
            };
            sent = sent.saturating_add(1);
            if sent >= self.attempts || !policy.retry(&error) {
                return Err(error);
            }
            let pause = self.backoff.map_or(Duration::ZERO, |b| b.delay(sent - 1));
            let next = Instant::now() + pause;
            if give_up_at.is_some_and(|at| next >= at) || self.budget.is_some_and(|b| !b.withdraw())
            {
                tracing::debug!(target: "distlock", doing, error = %error, sent, "not retrying: out of time or retry budget");
                return Err(error);
            }
            tracing::debug!(target: "distlock", doing, error = %error, sent, ?pause, "retrying");
            if !pause.is_zero() {
                tokio::time::sleep_until(next).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fails(times: u32) -> impl FnMut(u32) -> std::future::Ready<Result<u32, String>> {
        move |sent| {
            std::future::ready(if sent < times {
                Err(format!("failure {sent}"))
            } else {
                Ok(sent)
            })
        }
    }

    fn any(_: &String) -> bool {
        true
    }

    #[tokio::test(start_paused = true)]
    async fn retries_until_the_request_succeeds() {
        let backoff = Backoff::default().with_jitter(0.0);
        let started = Instant::now();
        let answer = Retry::with_backoff(backoff).run("x", any, fails(3)).await;
        assert_eq!(answer, Ok(3));
        // Three pauses: the backoff's first three delays.
        let slept: Duration = (0..3).map(|i| backoff.delay(i)).sum();
        assert_eq!(started.elapsed(), slept);
    }

    #[tokio::test(start_paused = true)]
    async fn gives_the_last_error_after_the_attempts() {
        let answer = Retry::immediately()
            .attempts(2)
            .run("x", any, fails(5))
            .await;
        assert_eq!(answer, Err("failure 1".to_string()));
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_the_policy_refuses_is_returned_at_once() {
        let mut sent = 0;
        let answer: Result<(), &str> = Retry::immediately()
            .run(
                "x",
                |_: &&str| false,
                |_| {
                    sent += 1;
                    std::future::ready(Err("fatal"))
                },
            )
            .await;
        assert_eq!((answer, sent), (Err("fatal"), 1));
    }

    #[tokio::test(start_paused = true)]
    async fn no_retry_starts_past_the_deadline_or_the_patience() {
        let backoff = Backoff::default()
            .with_initial(Duration::from_millis(100))
            .with_multiplier(1.0)
            .with_jitter(0.0);
        let started = Instant::now();
        let deadline = Some(started + Duration::from_millis(350));
        let answer = Retry::with_backoff(backoff)
            .deadline(deadline)
            .run("x", any, fails(10))
            .await;
        assert_eq!(answer, Err("failure 3".to_string()));
        assert_eq!(started.elapsed(), Duration::from_millis(300));

        let started = Instant::now();
        let answer = Retry::with_backoff(backoff)
            .patience(Duration::from_millis(250))
            .run("x", any, fails(10))
            .await;
        assert_eq!(answer, Err("failure 2".to_string()));
        assert_eq!(started.elapsed(), Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn a_spent_budget_stops_retries_until_first_attempts_refill_it() {
        // No free retries: one retry per two first attempts.
        let budget = RetryBudget::new(Duration::from_secs(10), 0, 0.5);
        let retry = Retry::immediately().attempts(10).budget(&budget);
        // First request: its deposit is half a retry, not enough for one.
        assert_eq!(
            retry.run("x", any, fails(10)).await,
            Err("failure 0".into())
        );
        // Second: one whole retry now, then spent.
        assert_eq!(
            retry.run("x", any, fails(10)).await,
            Err("failure 1".into())
        );
        assert_eq!(
            retry.run("x", any, fails(10)).await,
            Err("failure 0".into())
        );
        // Two windows later the history is gone.
        tokio::time::advance(Duration::from_secs(20)).await;
        assert_eq!(
            retry.run("x", any, fails(10)).await,
            Err("failure 0".into())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_always_allows_its_floor() {
        let budget = RetryBudget::new(Duration::from_secs(1), 3, 0.0);
        let retry = Retry::immediately().budget(&budget);
        // Three retries in the window, then no more.
        assert_eq!(
            retry.run("x", any, fails(10)).await,
            Err("failure 3".into())
        );
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(retry.run("x", any, fails(2)).await, Ok(2));
    }
}
