//! The wait of a lock whose waiters queue on Redis, written once for one
//! node ([`RedisLock`](crate::RedisLock)) and for Redlock's masters: the
//! waiter listens for hand-offs before it joins a queue, attempts as a
//! queued waiter, pauses until woken by a hand-off or the holder's lease
//! ends, and leaves the queues when it gives up.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::{Attempt, Pace, Request, WaitLoop};
use lock_core::{LockError, LockGuard, LockOptions};
use tokio::sync::Notify;
use tokio::time::Instant;

/// A queue lives this long after its last waiter's attempt, and no
/// waiter's entry lives longer ([`queue_entry_ttl`]).
pub const QUEUE_TTL: Duration = Duration::from_secs(30);

/// The shortest life of a waiter's queue entry.
const MIN_ENTRY_TTL: Duration = Duration::from_secs(1);

/// How long a waiter's queue entry counts (in `inspect`'s waiters, and as
/// the next in line for a hand-off) after its last attempt: the lease TTL
/// `ttl` it asks for, within 1 s and [`QUEUE_TTL`]. A waiter attempts
/// again at least every third of it, so a live waiter keeps its place,
/// and one whose process died or whose withdrawal never arrived stops
/// counting within about one lease.
pub fn queue_entry_ttl(ttl: Duration) -> Duration {
    ttl.clamp(MIN_ENTRY_TTL, QUEUE_TTL)
}

/// A waiting acquire gives up once the servers have been unreachable for
/// at least this many attempts in a row …
const UNREACHABLE_ATTEMPTS: u32 = 3;

/// … and for at least this long: a server that answers late for a moment
/// (a stalled host, a slow fsync, a client whose own threads were busy
/// past the request's bound) must not fail a wait that could ride it out.
const UNREACHABLE_GRACE: Duration = Duration::from_secs(2);

/// What [`wait_in_queue`] needs of a lock whose waiters queue on Redis.
pub trait QueuedLock: Send + Sync {
    /// A waiter's identity in the queues (the payload of the hand-off
    /// message that wakes it).
    type Waiter: Send + Sync;
    /// What keeps the waiter listening for hand-offs (its subscriptions to
    /// the lock's channel).
    type Listening: Send;

    /// Listening already, without a round trip, if this process is
    /// subscribed to `name`'s channel (the lock was busy lately).
    fn joined(&self, name: &str) -> Option<Self::Listening>;

    /// Start listening for hand-offs of `name`.
    fn listen(&self, name: &str)
    -> impl Future<Output = Result<Self::Listening, LockError>> + Send;

    /// One attempt at `name`, queued as `waiter` when given (the acquire
    /// script takes a queued waiter out of the queue when it grants).
    fn queue_attempt(
        &self,
        name: &str,
        opts: &LockOptions,
        waiter: Option<&Self::Waiter>,
    ) -> impl Future<Output = Result<Attempt, LockError>> + Send;

    /// Take `waiter` out of `name`'s queues, passing on a hand-off made to
    /// it; awaited by a wait that times out, spawned by one that is
    /// dropped.
    fn withdrawal(
        &self,
        name: &str,
        waiter: &Self::Waiter,
    ) -> impl Future<Output = ()> + Send + 'static;

    /// How long a held lock's waiter pauses before it attempts again (a
    /// hand-off wakes it sooner), given the holder's remaining lease if the
    /// attempt learnt it, and the pauses so far.
    fn pause_while_held(
        &self,
        holder_left: Option<Duration>,
        opts: &LockOptions,
        tries: u32,
    ) -> Duration;

    /// Whether `error` says the servers could not be reached for a moment
    /// (no majority answered in time), which a wait rides out for
    /// [`UNREACHABLE_ATTEMPTS`] attempts and [`UNREACHABLE_GRACE`]. By
    /// default no error is.
    fn unreachable(&self, error: &LockError) -> bool {
        let _ = error;
        false
    }
}

/// Wait for `req` as `waiter`, woken by `wake` (the signal its hand-off
/// messages notify): until granted (`Some`), or the wait's deadline passes
/// (`None`, the waiter withdrawn before it returns).
pub async fn wait_in_queue<L: QueuedLock>(
    lock: &L,
    req: Request<'_>,
    waiter: L::Waiter,
    wake: Arc<Notify>,
) -> Result<Option<LockGuard>, LockError> {
    let (name, opts) = (req.name, req.opts);
    // A waiter joins a queue only while listening, so that a hand-off to
    // it cannot be published before it listens. If this process listens
    // already, the first attempt may queue; otherwise it is a plain
    // attempt, and an uncontended acquire stays one round trip.
    let mut listening = lock.joined(name);
    // Listening before each attempt: a hand-off published while the
    // attempt is in flight is not missed.
    let mut wait = WaitLoop::new(req, Some(wake));
    let mut queued = Queued {
        lock,
        name,
        waiter: &waiter,
        in_queues: false,
    };
    let mut unreachable = Unreachable::default();
    loop {
        // Set when the last grant came too late: a wait that ends now
        // reports it (the lock was free), as `acquire_by_polling` does.
        let mut too_late = None;
        let as_waiter = listening.is_some().then_some(&waiter);
        queued.in_queues |= as_waiter.is_some();
        let holder_left = match lock.queue_attempt(name, opts, as_waiter).await {
            Ok(Attempt::Acquired(guard)) => {
                // The granting script took us out of the queue.
                queued.in_queues = false;
                return Ok(Some(guard));
            }
            Ok(Attempt::Held { expires_in }) => {
                unreachable = Unreachable::default();
                expires_in
            }
            // Free, but granted too late: again at once.
            Ok(Attempt::TooLate(e)) => {
                unreachable = Unreachable::default();
                too_late = Some(e);
                Some(Duration::ZERO)
            }
            Err(e) if lock.unreachable(&e) && unreachable.tolerate() => {
                tracing::debug!(target: "distlock", lock = %name, error = %e.report(), "servers unreachable; trying again");
                None
            }
            Err(e) => return Err(e),
        };
        if wait.expired() {
            queued.withdraw().await;
            return too_late.map_or(Ok(None), Err);
        }
        if listening.is_none() {
            // Listen first, then attempt again at once as a queued waiter.
            listening = Some(lock.listen(name).await?);
            continue;
        }
        let pause = lock
            .pause_while_held(holder_left, opts, wait.tries())
            .min(queue_entry_ttl(opts.ttl) / 3);
        if !wait.pause(Pace::For(pause)).await {
            queued.withdraw().await;
            return too_late.map_or(Ok(None), Err);
        }
    }
}

/// A waiter in the queues. A wait that times out withdraws it before the
/// caller hears of the timeout (the caller's process may exit right after,
/// taking any background task with it); leaving otherwise (an error,
/// cancellation) withdraws it in the background.
struct Queued<'a, L: QueuedLock> {
    lock: &'a L,
    name: &'a str,
    waiter: &'a L::Waiter,
    in_queues: bool,
}

impl<L: QueuedLock> Queued<'_, L> {
    /// Withdraw now.
    async fn withdraw(mut self) {
        if std::mem::take(&mut self.in_queues) {
            self.lock.withdrawal(self.name, self.waiter).await;
        }
    }
}

impl<L: QueuedLock> Drop for Queued<'_, L> {
    fn drop(&mut self) {
        if !self.in_queues {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(self.lock.withdrawal(self.name, self.waiter));
        }
    }
}

/// How long a waiting acquire has found the servers unreachable.
#[derive(Default)]
struct Unreachable {
    attempts: u32,
    since: Option<Instant>,
}

impl Unreachable {
    /// Count one more attempt that reached no server (or no majority);
    /// `true` while the wait should still try again
    /// ([`UNREACHABLE_ATTEMPTS`] attempts and [`UNREACHABLE_GRACE`] have
    /// not both passed).
    fn tolerate(&mut self) -> bool {
        let since = *self.since.get_or_insert_with(Instant::now);
        self.attempts += 1;
        self.attempts < UNREACHABLE_ATTEMPTS || since.elapsed() < UNREACHABLE_GRACE
    }
}
