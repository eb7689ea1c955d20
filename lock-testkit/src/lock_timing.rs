//! The lock-timing conformance suite ([`LockOptions::lock_delay`],
//! [`LockOptions::hold_at_least`]), run by every backend through
//! [`conformance_suite!`](crate::conformance_suite) in a module named
//! `lock_timing`, on the same [`Harness`]. A backend that does not offer an
//! option ([`Capabilities::lock_delay`](lock_core::Capabilities::lock_delay),
//! [`Capabilities::hold_at_least`](lock_core::Capabilities::hold_at_least))
//! must refuse it with [`LockError::Unsupported`]: each case checks that
//! instead.

use std::time::Duration;

use tokio::time::Instant;

use lock_core::{LockError, LockOptions, Wait};

use crate::conformance::{Harness, unique_name};

/// Slack for scheduling and round trips.
const SLACK: Duration = Duration::from_millis(1500);

/// How much earlier than asked a server may free a lock by the client's
/// clock (millisecond expiries, a node's clock running a little fast).
const EARLY: Duration = Duration::from_millis(100);

fn opts(h: &Harness, ttl: Duration) -> LockOptions {
    LockOptions::new()
        .ttl(ttl.max(h.lock.capabilities().min_lease))
        .wait(Wait::No)
        .backoff(
            lock_core::Backoff::default()
                .with_initial(Duration::from_millis(2))
                .with_max(Duration::from_millis(25)),
        )
}

/// `true` when the backend offers the option (the case goes on); else
/// checks that asking for it is refused, typed.
async fn offered_or_refused(h: &Harness, offered: bool, asking: LockOptions) -> bool {
    if offered {
        return true;
    }
    let refused = h.lock.try_acquire(&unique_name("refused"), &asking).await;
    assert!(
        matches!(refused, Err(LockError::Unsupported { .. })),
        "{}: an option the capabilities do not offer must be refused: {refused:?}",
        h.lock.capabilities().backend
    );
    false
}

/// A holder that fails (stops renewing) learns of it at its lease's end,
/// as always; the server keeps the lock closed for the delay after that,
/// and frees it then.
pub async fn lock_delay_keeps_a_failed_holders_lock_closed(h: Harness) {
    let delay = Duration::from_secs(2);
    let o = opts(&h, Duration::from_secs(1)).auto_renew(false);
    let caps = h.lock.capabilities();
    if !offered_or_refused(&h, caps.lock_delay, o.clone().lock_delay(delay)).await {
        return;
    }
    let name = unique_name("delay-failed");
    let sent = Instant::now();
    let failed = h
        .lock
        .try_acquire(&name, &o.clone().lock_delay(delay))
        .await
        .expect("try")
        .expect("free");
    let deadline = failed.validity_deadline().expect("a lease");
    assert!(
        deadline <= sent + o.ttl,
        "the holder's deadline counts with its TTL alone, not the delay"
    );
    tokio::time::timeout(o.ttl + SLACK, failed.lost())
        .await
        .expect("lost() fires at the lease's end");
    // The lease has ended; the delay has not.
    tokio::time::sleep_until(sent + o.ttl + delay / 2).await;
    let during = h.other.try_acquire(&name, &o).await.expect("try");
    assert!(
        during.is_none() || sent.elapsed() >= o.ttl + delay - EARLY,
        "{}: granted {:?} after a failed holder's grant, inside its lease and delay ({:?})",
        caps.backend,
        sent.elapsed(),
        o.ttl + delay
    );
    drop(during);
    let next = h
        .other
        .acquire(
            &name,
            &o.clone().wait(Wait::UpTo(o.ttl + delay + SLACK * 2)),
        )
        .await
        .expect("granted once the delay is over");
    let after = sent.elapsed();
    assert!(
        after >= o.ttl + delay - EARLY,
        "{}: granted {after:?} after a failed holder's grant, before its lease and delay ({:?}) were over",
        caps.backend,
        o.ttl + delay
    );
    assert!(next.release().await.expect("release"));
    assert!(!failed.release().await.expect("release"), "long gone");
}

/// The delay is for a holder that fails: a release frees the lock at
/// once, and a renewed lock stays held with its deadline counted without
/// the delay.
pub async fn lock_delay_spares_a_release_and_a_renewed_lock(h: Harness) {
    let delay = Duration::from_secs(5);
    let o = opts(&h, Duration::from_secs(1)).lock_delay(delay);
    if !offered_or_refused(&h, h.lock.capabilities().lock_delay, o.clone()).await {
        return;
    }
    let name = unique_name("delay-released");
    let held = h
        .lock
        .try_acquire(&name, &o)
        .await
        .expect("try")
        .expect("free");
    // Renewed across several TTLs (renewals come every third of the TTL,
    // not of the TTL and the delay).
    tokio::time::sleep(o.ttl * 5 / 2).await;
    held.ensure_held().expect("renewed, still held");
    let deadline = held.validity_deadline().expect("a lease");
    assert!(
        deadline <= Instant::now() + o.ttl,
        "the deadline counts with the TTL alone"
    );
    assert!(held.release().await.expect("release"));
    let next = h.other.try_acquire(&name, &o).await.expect("try");
    assert!(next.is_some(), "a released lock is free at once");
    assert!(next.expect("held").release().await.expect("release"));
}

/// A release within the hold leaves the lock taken on the server until
/// the hold ends (no holder needed); one after it frees the lock at once.
pub async fn hold_at_least_keeps_a_released_lock_taken(h: Harness) {
    let hold = Duration::from_secs(2);
    let o = opts(&h, Duration::from_secs(10));
    let caps = h.lock.capabilities();
    if !offered_or_refused(&h, caps.hold_at_least, o.clone().hold_at_least(hold)).await {
        return;
    }
    let name = unique_name("hold");
    let sent = Instant::now();
    let g = h
        .lock
        .try_acquire(&name, &o.clone().hold_at_least(hold))
        .await
        .expect("try")
        .expect("free");
    assert!(g.release().await.expect("release"), "it was ours");
    let during = h.other.try_acquire(&name, &o).await.expect("try");
    assert!(
        during.is_none() || sent.elapsed() >= hold - EARLY,
        "{}: granted {:?} after a grant held at least {hold:?}",
        caps.backend,
        sent.elapsed()
    );
    drop(during);
    assert!(h.other.inspect(&name).await.expect("inspect").held || sent.elapsed() >= hold);
    let next = h
        .other
        .acquire(&name, &o.clone().wait(Wait::UpTo(hold + SLACK * 2)))
        .await
        .expect("granted once the hold is over");
    let after = sent.elapsed();
    assert!(
        after >= hold - EARLY,
        "{}: granted {after:?} after a grant held at least {hold:?}",
        caps.backend
    );
    assert!(next.release().await.expect("release"));

    // Released after its hold: free at once.
    let short = Duration::from_millis(300);
    let g = h
        .lock
        .try_acquire(&name, &o.clone().hold_at_least(short))
        .await
        .expect("try")
        .expect("free");
    tokio::time::sleep(short * 2).await;
    assert!(g.release().await.expect("release"));
    let again = h.other.try_acquire(&name, &o).await.expect("try");
    assert!(again.is_some(), "released after its hold: free at once");
    assert!(again.expect("held").release().await.expect("release"));
}

/// Bad timing options are typed errors, and a refused request takes
/// nothing.
pub async fn bad_timing_options_are_typed_errors(h: Harness) {
    let caps = h.lock.capabilities();
    let o = opts(&h, Duration::from_secs(5));
    let name = unique_name("bad-timing");
    let refused = |r: &Result<Option<lock_core::LockGuard>, LockError>, offered: bool| {
        if offered {
            matches!(r, Err(LockError::InvalidOptions { .. }))
        } else {
            matches!(r, Err(LockError::Unsupported { .. }))
        }
    };
    let zero_delay = h
        .lock
        .try_acquire(&name, &o.clone().lock_delay(Duration::ZERO))
        .await;
    assert!(refused(&zero_delay, caps.lock_delay), "{zero_delay:?}");
    let zero_hold = h
        .lock
        .try_acquire(&name, &o.clone().hold_at_least(Duration::ZERO))
        .await;
    assert!(refused(&zero_hold, caps.hold_at_least), "{zero_hold:?}");
    let too_long = h
        .lock
        .try_acquire(&name, &o.clone().lock_delay(caps.max_ttl))
        .await;
    assert!(refused(&too_long, caps.lock_delay), "{too_long:?}");
    let hold_too_long = h
        .lock
        .try_acquire(
            &name,
            &o.clone()
                .hold_at_least(caps.max_ttl + Duration::from_secs(1)),
        )
        .await;
    assert!(
        refused(&hold_too_long, caps.hold_at_least),
        "{hold_too_long:?}"
    );
    if caps.semaphore.is_some() {
        let permit = h
            .lock
            .try_acquire(
                &name,
                &o.clone().permits(2).lock_delay(Duration::from_secs(1)),
            )
            .await;
        assert!(refused(&permit, caps.lock_delay), "{permit:?}");
    }
    let free = h.lock.try_acquire(&name, &o).await.expect("try");
    assert!(
        free.expect("nothing was taken")
            .release()
            .await
            .expect("release")
    );
}

#[doc(hidden)]
#[macro_export]
macro_rules! __lock_timing_cases {
    ($harness:expr) => {
        $crate::__conformance_cases!(@module lock_timing; $harness;
            lock_delay_keeps_a_failed_holders_lock_closed,
            lock_delay_spares_a_release_and_a_renewed_lock,
            hold_at_least_keeps_a_released_lock_taken,
            bad_timing_options_are_typed_errors,
        );
    };
}
