//! The reader-writer lock conformance suite, run by every backend through
//! [`conformance_suite!`](crate::conformance_suite) in a module named
//! `rw_lock`, on the same [`Harness`].
//!
//! A backend whose capabilities offer no reader-writer locks
//! ([`Capabilities::rw_lock`](lock_core::Capabilities::rw_lock) is `None`)
//! must refuse them with [`LockError::Unsupported`]: each case checks that
//! instead.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use lock_core::{
    Access, Fencing, LockError, LockOptions, LockSetExt, RwLockCapabilities, RwLockExt, Wait,
};

use crate::conformance::{Harness, unique_name};

/// Slack for scheduling and round trips.
const SLACK: Duration = Duration::from_millis(1500);

fn opts(ttl: Duration, wait: Wait, renew: bool, h: &Harness) -> LockOptions {
    LockOptions::new()
        .ttl(ttl.max(h.lock.capabilities().min_lease))
        .wait(wait)
        .auto_renew(renew)
        .backoff(
            lock_core::Backoff::default()
                .with_initial(Duration::from_millis(2))
                .with_max(Duration::from_millis(25)),
        )
}

/// Options for a grant held for the length of a case: a long, renewed
/// lease and no wait.
fn held(h: &Harness) -> LockOptions {
    opts(Duration::from_secs(20), Wait::No, true, h)
}

/// A name for `case` and the backend's reader-writer capabilities, or
/// `None` where it offers none; then every way in is refused, typed.
async fn rw_case(h: &Harness, case: &str) -> Option<(String, RwLockCapabilities)> {
    let name = unique_name(case);
    if let Some(caps) = h.lock.capabilities().rw_lock {
        return Some((name, caps));
    }
    let unsupported = |what: &str, e: Option<LockError>| {
        assert!(
            matches!(e, Some(LockError::Unsupported { .. })),
            "{what}: a backend without reader-writer locks must refuse them: {e:?}"
        );
    };
    let o = held(h);
    unsupported(
        "try_acquire_read",
        h.lock.try_acquire_read(&name, &o).await.err(),
    );
    unsupported(
        "try_acquire_write",
        h.lock.try_acquire_write(&name, &o).await.err(),
    );
    unsupported("acquire_read", h.lock.acquire_read(&name, &o).await.err());
    unsupported("acquire_write", h.lock.acquire_write(&name, &o).await.err());
    unsupported("inspect_rw", h.lock.inspect_rw(&name).await.err());
    None
}

/// Where the backend reports its waiting writers, wait (up to 10 s) until
/// `n` wait; elsewhere give them 300 ms to take their places.
async fn await_waiting_writers(h: &Harness, name: &str, n: usize) {
    await_waiters(h, name, n, Access::Write).await;
}

/// Where the backend reports the waiters of `side` (writers, or readers),
/// wait (up to 10 s) until `n` wait; elsewhere give them 300 ms to take
/// their places.
async fn await_waiters(h: &Harness, name: &str, n: usize, side: Access) {
    let start = Instant::now();
    loop {
        let info = h.lock.inspect_rw(name).await.expect("inspect_rw");
        let waiting = match side {
            Access::Write => info.waiting_writers,
            _ => info.waiting_readers,
        };
        match waiting {
            None => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                return;
            }
            Some(w) if w >= n => return,
            Some(w) => assert!(
                start.elapsed() < Duration::from_secs(10),
                "only {w} of {n} {side:?} waiters ever waited"
            ),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Readers on both clients hold together; nobody writes while they do;
/// a writer holds alone, on either client.
pub async fn readers_share_and_a_writer_holds_alone(h: Harness) {
    let Some((name, _)) = rw_case(&h, "share").await else {
        return;
    };
    let o = held(&h);
    let a = h
        .lock
        .try_acquire_read(&name, &o)
        .await
        .expect("read")
        .expect("free");
    let b = h
        .other
        .try_acquire_read(&name, &o)
        .await
        .expect("read")
        .expect("readers share");
    assert_eq!(
        (a.access(), b.access()),
        (Some(Access::Read), Some(Access::Read))
    );
    for (who, client) in [("lock", &h.lock), ("other", &h.other)] {
        assert!(
            client
                .try_acquire_write(&name, &o)
                .await
                .expect("write")
                .is_none(),
            "{who}: a writer got in beside two readers"
        );
    }
    assert!(a.release().await.expect("release"));
    assert!(
        h.other
            .try_acquire_write(&name, &o)
            .await
            .expect("write")
            .is_none(),
        "a writer got in beside the remaining reader"
    );
    assert!(b.release().await.expect("release"));
    let w = h
        .other
        .try_acquire_write(&name, &o)
        .await
        .expect("write")
        .expect("free");
    assert_eq!(w.access(), Some(Access::Write));
    for (who, client) in [("lock", &h.lock), ("other", &h.other)] {
        assert!(
            client
                .try_acquire_read(&name, &o)
                .await
                .expect("read")
                .is_none(),
            "{who}: a reader got in beside the writer"
        );
        assert!(
            client
                .try_acquire_write(&name, &o)
                .await
                .expect("write")
                .is_none(),
            "{who}: a second writer got in"
        );
    }
    assert!(w.release().await.expect("release"));
    let again = h.lock.try_acquire_read(&name, &o).await.expect("read");
    assert!(again.is_some(), "free again once the writer released");
}

/// A writer waits behind a reader; a reader that comes after it is not let
/// in (where the backend gives writers preference), the writer is served
/// once the reader leaves, and the later reader once the writer leaves.
pub async fn a_waiting_writer_is_served_before_later_readers(h: Harness) {
    let Some((name, caps)) = rw_case(&h, "preference").await else {
        return;
    };
    let o = held(&h);
    let first = h
        .lock
        .try_acquire_read(&name, &o)
        .await
        .expect("read")
        .expect("free");
    let long = opts(
        Duration::from_secs(20),
        Wait::UpTo(Duration::from_secs(20)),
        true,
        &h,
    );
    let writer = tokio::spawn({
        let (other, name, long) = (h.other.clone(), name.clone(), long.clone());
        async move {
            let w = other.acquire_write(&name, &long).await;
            (w, Instant::now())
        }
    });
    await_waiting_writers(&h, &name, 1).await;
    if caps.writer_preference {
        assert!(
            h.lock
                .try_acquire_read(&name, &o)
                .await
                .expect("read")
                .is_none(),
            "a reader that came after a waiting writer got in ahead of it"
        );
    }
    let later = tokio::spawn({
        let (lock, name, long) = (h.lock.clone(), name.clone(), long.clone());
        async move {
            let r = lock.acquire_read(&name, &long).await;
            (r, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!writer.is_finished(), "the writer got in beside a reader");
    let released = Instant::now();
    assert!(first.release().await.expect("release"));
    let (w, written) = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the writer was served once the reader left")
        .expect("writer task");
    let w = w.expect("write");
    assert!(
        written.duration_since(released) < SLACK,
        "the writer waited {:?} after the reader left",
        written.duration_since(released)
    );
    if caps.writer_preference {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !later.is_finished(),
            "the later reader got in beside the writer"
        );
    }
    let freed = Instant::now();
    assert!(w.release().await.expect("release"));
    let (r, read) = tokio::time::timeout(Duration::from_secs(10), later)
        .await
        .expect("the later reader was served")
        .expect("reader task");
    let r = r.expect("read");
    if caps.writer_preference {
        assert!(
            read >= freed,
            "the later reader was served before the writer left"
        );
    }
    assert!(r.release().await.expect("release"));
}

/// Readers that wait behind a writer keep their place before a writer
/// that comes after them: W1 holds, R1 and R2 wait to read, W2 waits to
/// write; once W1 leaves, both readers are served (together) before W2.
pub async fn readers_that_queued_before_a_waiting_writer_keep_their_place(h: Harness) {
    let Some((name, _)) = rw_case(&h, "earlier-readers").await else {
        return;
    };
    let o = held(&h);
    let first = h
        .lock
        .try_acquire_write(&name, &o)
        .await
        .expect("write")
        .expect("free");
    let long = opts(
        Duration::from_secs(20),
        Wait::UpTo(Duration::from_secs(10)),
        true,
        &h,
    );
    // Each waiter reports when it was served, holds a while and leaves.
    let waiter = |client: &Arc<dyn lock_core::DistributedLock>, access: Access| {
        let (client, name, long) = (Arc::clone(client), name.clone(), long.clone());
        tokio::spawn(async move {
            let g = match access {
                Access::Write => client.acquire_write(&name, &long).await,
                _ => client.acquire_read(&name, &long).await,
            }
            .unwrap_or_else(|e| panic!("{access:?}: {e}"));
            let served = Instant::now();
            tokio::time::sleep(Duration::from_millis(300)).await;
            let left = Instant::now();
            assert!(g.release().await.expect("release"));
            (served, left)
        })
    };
    let r1 = waiter(&h.lock, Access::Read);
    let r2 = waiter(&h.other, Access::Read);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let w2 = waiter(&h.other, Access::Write);
    await_waiting_writers(&h, &name, 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !r1.is_finished() && !r2.is_finished() && !w2.is_finished(),
        "a waiter got in beside the writer"
    );
    let released = Instant::now();
    assert!(first.release().await.expect("release"));
    let (r1, r2, w2) = tokio::time::timeout(Duration::from_secs(15), async {
        (r1.await, r2.await, w2.await)
    })
    .await
    .expect("every waiter was served");
    let ((r1_in, r1_out), (r2_in, r2_out), (w2_in, _)) =
        (r1.expect("r1"), r2.expect("r2"), w2.expect("w2"));
    for (who, served) in [("R1", r1_in), ("R2", r2_in)] {
        assert!(
            served < w2_in,
            "{who} queued before the writer W2 but was served {:?} after it",
            served.duration_since(w2_in)
        );
        assert!(
            served.duration_since(released) < SLACK,
            "{who} waited {:?} after the writer left",
            served.duration_since(released)
        );
    }
    assert!(
        w2_in >= r1_out.max(r2_out),
        "W2 was served while a reader held"
    );
}

/// Waiters queued one after another behind a writer (on alternating
/// clients): W1, W2, R3, W4, W5, so that writers queue behind writers as
/// well as behind a reader. Where the capabilities promise a fair queue
/// they are served in that order; elsewhere each is still served once.
pub async fn waiters_are_served_in_arrival_order(h: Harness) {
    let Some((name, caps)) = rw_case(&h, "rw-fifo").await else {
        return;
    };
    let o = held(&h);
    let first = h
        .lock
        .try_acquire_write(&name, &o)
        .await
        .expect("write")
        .expect("free");
    let long = opts(
        Duration::from_secs(20),
        Wait::UpTo(Duration::from_secs(20)),
        true,
        &h,
    );
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    let (mut writers, mut readers) = (0, 0);
    for i in 1..=5 {
        let access = match i {
            3 => Access::Read,
            _ => Access::Write,
        };
        let client = match i % 2 {
            1 => Arc::clone(&h.other),
            _ => Arc::clone(&h.lock),
        };
        let (queued_name, long, order) = (name.clone(), long.clone(), Arc::clone(&order));
        waiters.push(tokio::spawn(async move {
            let g = match access {
                Access::Write => client.acquire_write(&queued_name, &long).await,
                _ => client.acquire_read(&queued_name, &long).await,
            }
            .unwrap_or_else(|e| panic!("waiter {i} ({access:?}): {e}"));
            order.lock().unwrap_or_else(|e| e.into_inner()).push(i);
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(g.release().await.expect("release"));
        }));
        // Let this waiter take its place before the next one arrives.
        match access {
            Access::Write => writers += 1,
            _ => readers += 1,
        }
        let (side, n) = match access {
            Access::Write => (Access::Write, writers),
            _ => (Access::Read, readers),
        };
        await_waiters(&h, &name, n, side).await;
    }
    assert!(
        order.lock().unwrap_or_else(|e| e.into_inner()).is_empty(),
        "a waiter got in beside the writer"
    );
    assert!(first.release().await.expect("release"));
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(20), w)
            .await
            .expect("every waiter is served")
            .expect("waiter task");
    }
    let order = order.lock().unwrap_or_else(|e| e.into_inner()).clone();
    match caps.fair_queue {
        true => assert_eq!(order, [1, 2, 3, 4, 5], "a fair queue served out of order"),
        false => {
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(
                sorted,
                [1, 2, 3, 4, 5],
                "each waiter is served once: {order:?}"
            );
        }
    }
}

/// Twenty readers queued behind a writer (default options, on both
/// clients) all enter within 1.5 s of its release, and at least fifteen
/// hold together: a release lets every queued reader in, not a few per
/// round.
pub async fn queued_readers_enter_together(h: Harness) {
    const READERS: usize = 20;
    const HOLD: Duration = Duration::from_millis(800);
    let Some((name, _)) = rw_case(&h, "readers-together").await else {
        return;
    };
    let writer = h
        .lock
        .try_acquire_write(&name, &held(&h))
        .await
        .expect("write")
        .expect("free");
    let o = LockOptions::new()
        .ttl(Duration::from_secs(20).max(h.lock.capabilities().min_lease))
        .wait(Wait::UpTo(Duration::from_secs(20)));
    let inside = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let mut readers = Vec::new();
    for r in 0..READERS {
        let lock = if r % 2 == 0 {
            h.lock.clone()
        } else {
            h.other.clone()
        };
        let (name, o, inside, most) = (name.clone(), o.clone(), inside.clone(), most.clone());
        readers.push(tokio::spawn(async move {
            let g = lock.acquire_read(&name, &o).await.expect("a queued read");
            let entered = Instant::now();
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(HOLD).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            assert!(g.release().await.expect("release"));
            entered
        }));
    }
    await_waiters(&h, &name, READERS, Access::Read).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        inside.load(Ordering::SeqCst),
        0,
        "a reader beside the writer"
    );
    let released = Instant::now();
    assert!(writer.release().await.expect("release"));
    let mut last = Duration::ZERO;
    for r in readers {
        let entered = r.await.expect("reader");
        last = last.max(entered.duration_since(released));
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        last < Duration::from_millis(1500),
        "the last of {READERS} queued readers entered {last:?} after the writer left \
         (at most {most} together)"
    );
    assert!(
        most >= 15,
        "at most {most} of {READERS} queued readers held together"
    );
}

/// Each write grant takes a new, larger token; a read grant carries the
/// token of the latest write grant before it.
pub async fn tokens_rise_per_write_and_readers_carry_the_latest(h: Harness) {
    let Some((name, _)) = rw_case(&h, "tokens").await else {
        return;
    };
    if h.lock.capabilities().fencing == Fencing::None {
        return;
    }
    let o = held(&h);
    let w1 = h
        .lock
        .try_acquire_write(&name, &o)
        .await
        .expect("write")
        .expect("free");
    let t1 = w1.fencing_token().expect("a write grant's token");
    assert!(w1.release().await.expect("release"));
    let r1 = h
        .other
        .try_acquire_read(&name, &o)
        .await
        .expect("read")
        .expect("free");
    let r2 = h
        .lock
        .try_acquire_read(&name, &o)
        .await
        .expect("read")
        .expect("free");
    assert_eq!(
        r1.fencing_token(),
        Some(t1),
        "a reader carries the latest write's token"
    );
    assert_eq!(
        r2.fencing_token(),
        Some(t1),
        "so does every reader after it"
    );
    assert!(r1.release().await.expect("release"));
    assert!(r2.release().await.expect("release"));
    let w2 = h
        .other
        .try_acquire_write(&name, &o)
        .await
        .expect("write")
        .expect("free");
    let t2 = w2.fencing_token().expect("a write grant's token");
    assert!(t2 > t1, "write tokens rise: {t1} then {t2}");
    assert!(w2.release().await.expect("release"));
    let r3 = h
        .lock
        .try_acquire_read(&name, &o)
        .await
        .expect("read")
        .expect("free");
    assert_eq!(r3.fencing_token(), Some(t2));
    assert!(r3.release().await.expect("release"));
}

/// Readers and writers on both clients take turns on one name: never a
/// writer beside anyone, every write's token above the one before, and
/// every reader's token at least that of the latest write.
pub async fn readers_and_writers_under_contention(h: Harness) {
    const TASKS: u32 = 8;
    const ROUNDS: u32 = 12;
    let Some((name, _)) = rw_case(&h, "contention").await else {
        return;
    };
    let fenced = h.lock.capabilities().fencing != Fencing::None;
    let readers = Arc::new(AtomicU32::new(0));
    let writing = Arc::new(AtomicBool::new(false));
    let most_readers = Arc::new(AtomicU32::new(0));
    let last_write: Arc<Mutex<Option<u64>>> = Arc::default();
    let o = opts(
        Duration::from_secs(20),
        Wait::UpTo(Duration::from_secs(120)),
        true,
        &h,
    );
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let lock = if t % 2 == 0 {
            h.lock.clone()
        } else {
            h.other.clone()
        };
        let (name, o) = (name.clone(), o.clone());
        let (readers, writing, most_readers, last_write) = (
            readers.clone(),
            writing.clone(),
            most_readers.clone(),
            last_write.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                // One task in four writes each round, in turn.
                if (t + round) % 4 == 0 {
                    let g = lock.acquire_write(&name, &o).await.expect("write");
                    assert!(!writing.swap(true, Ordering::SeqCst), "two writers at once");
                    assert_eq!(readers.load(Ordering::SeqCst), 0, "a writer beside readers");
                    if fenced {
                        let token = g.fencing_token().expect("token");
                        let mut last = last_write.lock().unwrap_or_else(|e| e.into_inner());
                        assert!(
                            last.is_none_or(|l| l < token),
                            "write tokens went {last:?} then {token}"
                        );
                        *last = Some(token);
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    writing.store(false, Ordering::SeqCst);
                    assert!(g.release().await.expect("release"));
                } else {
                    let g = lock.acquire_read(&name, &o).await.expect("read");
                    let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                    most_readers.fetch_max(now, Ordering::SeqCst);
                    assert!(!writing.load(Ordering::SeqCst), "a reader beside a writer");
                    if fenced {
                        // At least the latest write's: on a quorum backend
                        // a write refused by the majority may have raised
                        // some nodes' counters above it.
                        let last = *last_write.lock().unwrap_or_else(|e| e.into_inner());
                        let token = g.fencing_token().expect("a reader's token");
                        assert!(
                            last.is_none_or(|l| token >= l),
                            "a reader's token {token} is below the latest write's {last:?}"
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    readers.fetch_sub(1, Ordering::SeqCst);
                    assert!(g.release().await.expect("release"));
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("contending task panicked");
    }
    eprintln!(
        "rw contention: at most {} readers at once",
        most_readers.load(Ordering::SeqCst)
    );
}

/// A writer's wait that is given up (its future dropped) while readers
/// hold leaves nothing behind: new readers get in, and a writer once they
/// leave.
pub async fn a_cancelled_wait_leaves_nothing_behind(h: Harness) {
    let Some((name, _)) = rw_case(&h, "cancelled").await else {
        return;
    };
    let o = held(&h);
    let reader = h
        .lock
        .try_acquire_read(&name, &o)
        .await
        .expect("read")
        .expect("free");
    let long = opts(
        Duration::from_secs(20),
        Wait::UpTo(Duration::from_secs(20)),
        true,
        &h,
    );
    let gave_up = tokio::time::timeout(
        Duration::from_millis(400),
        h.other.acquire_write(&name, &long),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "the writer got in beside a reader: {gave_up:?}"
    );
    // The dropped wait's last request may still be on its way.
    let start = Instant::now();
    let late = loop {
        if let Some(g) = h.other.try_acquire_read(&name, &o).await.expect("read") {
            break g;
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "a cancelled writer still keeps readers out"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(reader.release().await.expect("release"));
    assert!(late.release().await.expect("release"));
    let start = Instant::now();
    loop {
        if let Some(w) = h.lock.try_acquire_write(&name, &o).await.expect("write") {
            assert!(w.release().await.expect("release"));
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "the lock is not free for a writer after everyone left"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How soon a reader gets in once a waiting writer's wait is dropped: well
/// inside a mark's own lifetime (1.5 s), so that a mark left behind shows.
const UNMARKED: Duration = Duration::from_secs(1);

/// A waiting writer whose wait is dropped at any moment, here swept over
/// the first 6 ms after the reader it waits for starts to leave (while its
/// attempts, marks and their removals are on their way), leaves nothing
/// that keeps readers out: a reader gets in within [`UNMARKED`].
pub async fn a_writer_dropped_at_any_moment_leaves_no_mark(h: Harness) {
    dropped_waiter_leaves_no_mark(h, Access::Write).await;
}

/// The same for a waiting reader, dropped as the writer it waits for
/// leaves: nothing keeps writers out.
pub async fn a_reader_dropped_at_any_moment_leaves_no_mark(h: Harness) {
    dropped_waiter_leaves_no_mark(h, Access::Read).await;
}

/// A waiter for `access` held back by the other side, its wait dropped at
/// a moment swept over the first 6 ms after the holder starts to leave;
/// then the other side gets in within [`UNMARKED`].
async fn dropped_waiter_leaves_no_mark(h: Harness, access: Access) {
    const LOOPS: u64 = 40;
    let Some((name, _)) = rw_case(&h, "dropped-waiter").await else {
        return;
    };
    let o = held(&h);
    let wait = opts(
        Duration::from_secs(20),
        Wait::UpTo(Duration::from_secs(10)),
        true,
        &h,
    );
    let write = access == Access::Write;
    let (side, other_side) = match write {
        true => ("writer", "readers"),
        false => ("reader", "writers"),
    };
    for i in 0..LOOPS {
        let holder = match write {
            true => h.lock.try_acquire_read(&name, &o).await,
            false => h.lock.try_acquire_write(&name, &o).await,
        }
        .expect("the holder")
        .expect("free");
        let (other, n, w) = (Arc::clone(&h.other), name.clone(), wait.clone());
        let waiter = tokio::spawn(async move {
            match write {
                true => other.acquire_write(&n, &w).await,
                false => other.acquire_read(&n, &w).await,
            }
        });
        match write {
            true => await_waiting_writers(&h, &name, 1).await,
            false => await_waiters(&h, &name, 1, Access::Read).await,
        }
        let leaving = tokio::spawn(async move { holder.release().await });
        // Blocks this worker only: the waiter and the release go on on
        // the others, and the drop lands at this moment, to the
        // microsecond, wherever the waiter's wait then is.
        let after = Duration::from_micros(i * 6_000 / LOOPS);
        std::thread::sleep(after);
        waiter.abort();
        if let Ok(Ok(granted)) = waiter.await {
            granted.release().await.expect("release");
        }
        assert!(leaving.await.expect("join").expect("release"));
        let start = Instant::now();
        loop {
            let probe = match write {
                true => h.lock.try_acquire_read(&name, &o).await,
                false => h.lock.try_acquire_write(&name, &o).await,
            };
            if let Some(g) = probe.expect("probe") {
                assert!(g.release().await.expect("release"));
                break;
            }
            assert!(
                start.elapsed() < UNMARKED,
                "a {side} dropped {after:?} after the holder began to leave still keeps \
                 {other_side} out after {UNMARKED:?} (loop {i})"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A wait for either side ends with `Timeout` when its bound passes, not
/// much later.
pub async fn waits_are_bounded(h: Harness) {
    let Some((name, _)) = rw_case(&h, "bounded").await else {
        return;
    };
    let w = h
        .lock
        .try_acquire_write(&name, &held(&h))
        .await
        .expect("write")
        .expect("free");
    let bound = Duration::from_millis(300);
    let o = opts(Duration::from_secs(10), Wait::UpTo(bound), true, &h);
    for access in [Access::Read, Access::Write] {
        let start = Instant::now();
        let refused = match access {
            Access::Read => h.other.acquire_read(&name, &o).await,
            _ => h.other.acquire_write(&name, &o).await,
        };
        let waited = start.elapsed();
        assert!(
            matches!(refused, Err(LockError::Timeout { .. })),
            "{access}: {refused:?}"
        );
        assert!(waited >= bound, "{access}: gave up after {waited:?}");
        assert!(waited < bound + SLACK, "{access}: waited {waited:?}");
    }
    assert!(w.release().await.expect("release"));
}

/// A reader that stops renewing loses its grant by its validity deadline
/// (its `lost()` fires), and a writer gets in after its lease.
pub async fn an_abandoned_grant_expires(h: Harness) {
    let Some((name, _)) = rw_case(&h, "abandoned").await else {
        return;
    };
    let ttl = Duration::from_millis(1000).max(h.lock.capabilities().min_lease);
    let short = opts(ttl, Wait::No, false, &h);
    let reader = h
        .lock
        .try_acquire_read(&name, &short)
        .await
        .expect("read")
        .expect("free");
    let deadline = reader.validity_deadline().expect("a lease");
    tokio::time::timeout(ttl + SLACK, reader.lost())
        .await
        .expect("lost() fired");
    assert!(
        Instant::now() >= deadline,
        "lost() fired before the deadline"
    );
    let wait = opts(Duration::from_secs(10), Wait::UpTo(ttl + SLACK), true, &h);
    let w = h
        .other
        .acquire_write(&name, &wait)
        .await
        .expect("a writer after the lease");
    assert!(w.release().await.expect("release"));
    drop(reader);
}

/// A renewed grant outlives its TTL; `extend` keeps a grant that is ours.
pub async fn renewed_grants_stay_held(h: Harness) {
    let Some((name, _)) = rw_case(&h, "renewed").await else {
        return;
    };
    let ttl = Duration::from_millis(1000).max(h.lock.capabilities().min_lease);
    let renewed = opts(ttl, Wait::No, true, &h);
    let reader = h
        .lock
        .try_acquire_read(&name, &renewed)
        .await
        .expect("read")
        .expect("free");
    tokio::time::sleep(ttl * 2).await;
    assert_eq!(reader.is_lost(), None, "a renewed reader lost its grant");
    assert!(
        h.other
            .try_acquire_write(&name, &held(&h))
            .await
            .expect("write")
            .is_none(),
        "a writer got in beside a renewed reader"
    );
    reader
        .extend(ttl)
        .await
        .expect("extend a grant that is ours");
    assert!(reader.release().await.expect("release"));
}

/// A name's reader-writer lock, its lock and its semaphore are apart.
pub async fn rw_locks_locks_and_permits_are_apart(h: Harness) {
    let Some((name, _)) = rw_case(&h, "apart").await else {
        return;
    };
    let o = held(&h);
    let w = h
        .lock
        .try_acquire_write(&name, &o)
        .await
        .expect("write")
        .expect("free");
    let lock = h.other.try_acquire(&name, &o).await.expect("lock");
    assert!(lock.is_some(), "a writer held the name's lock");
    if h.lock.capabilities().semaphore.is_some() {
        let permit = h
            .other
            .try_acquire(&name, &o.clone().permits(2))
            .await
            .expect("permit");
        assert!(permit.is_some(), "a writer held the name's permits");
    }
    let plain = lock.expect("held");
    assert!(plain.release().await.expect("release"));
    assert!(w.release().await.expect("release"));
}

/// `inspect_rw` shows the mode, the holders with their access and the
/// waiting writers (where the backend can tell).
pub async fn inspect_shows_the_mode_holders_and_waiting_writers(h: Harness) {
    let Some((name, _)) = rw_case(&h, "inspect").await else {
        return;
    };
    let fenced = h.lock.capabilities().fencing != Fencing::None;
    let free = h.other.inspect_rw(&name).await.expect("inspect");
    assert_eq!(free.mode, None);
    assert!(free.holders.is_empty());
    let o = held(&h);
    let w = h
        .lock
        .try_acquire_write(&name, &o)
        .await
        .expect("write")
        .expect("free");
    let info = h.other.inspect_rw(&name).await.expect("inspect");
    assert_eq!(info.mode, Some(Access::Write));
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(info.holders[0].access, Access::Write);
    if fenced && let Some(token) = info.holders[0].fencing_token {
        assert_eq!(Some(token), w.fencing_token());
    }
    assert!(w.release().await.expect("release"));
    let a = h
        .lock
        .try_acquire_read(&name, &o)
        .await
        .expect("read")
        .expect("free");
    let b = h
        .other
        .try_acquire_read(&name, &o)
        .await
        .expect("read")
        .expect("free");
    let long = opts(
        Duration::from_secs(20),
        Wait::UpTo(Duration::from_secs(20)),
        true,
        &h,
    );
    let writer = tokio::spawn({
        let (other, name) = (h.other.clone(), name.clone());
        async move { other.acquire_write(&name, &long).await }
    });
    await_waiting_writers(&h, &name, 1).await;
    let info = h.other.inspect_rw(&name).await.expect("inspect");
    assert_eq!(info.mode, Some(Access::Read));
    // Where the backend lists its readers (a row lock shared by several
    // transactions is not), both.
    if !info.holders.is_empty() {
        assert_eq!(info.holders.len(), 2, "{info:?}");
    }
    assert!(info.holders.iter().all(|x| x.access == Access::Read));
    if let Some(waiting) = info.waiting_writers {
        assert_eq!(waiting, 1, "{info:?}");
    }
    assert!(a.release().await.expect("release"));
    assert!(b.release().await.expect("release"));
    let w = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the writer was served")
        .expect("writer task")
        .expect("write");
    let info = h.other.inspect_rw(&name).await.expect("inspect");
    assert_eq!(info.mode, Some(Access::Write), "{info:?}");
    if let Some(waiting) = info.waiting_writers {
        assert_eq!(waiting, 0, "{info:?}");
    }
    assert!(w.release().await.expect("release"));
}

/// Requests that mix a reader-writer lock with what it does not take are
/// refused, typed: with a semaphore's permits, in a lock set, with lock
/// timing; a bad name as for a lock.
pub async fn invalid_requests_are_typed(h: Harness) {
    let Some((name, _)) = rw_case(&h, "invalid").await else {
        return;
    };
    let o = held(&h);
    let both = o.clone().permits(2).access(Access::Read);
    assert!(
        matches!(
            h.lock.try_acquire(&name, &both).await,
            Err(LockError::InvalidOptions { .. } | LockError::Unsupported { .. })
        ),
        "access with permits"
    );
    let set = h
        .lock
        .try_acquire_all(&[name.as_str()], &o.clone().access(Access::Write))
        .await;
    assert!(
        matches!(set, Err(LockError::InvalidOptions { .. })),
        "{set:?}"
    );
    let timed = o.clone().hold_at_least(Duration::from_secs(1));
    assert!(
        matches!(
            h.lock.try_acquire_write(&name, &timed).await,
            Err(LockError::InvalidOptions { .. } | LockError::Unsupported { .. })
        ),
        "hold_at_least with a write"
    );
    assert!(matches!(
        h.lock.try_acquire_read("", &o).await,
        Err(LockError::InvalidName { .. })
    ));
    assert!(matches!(
        h.lock.inspect_rw("").await,
        Err(LockError::InvalidName { .. })
    ));
}

/// A name for an upgradeable-read `case`, or `None` where the backend
/// offers no upgradeable reads; then they are refused, typed, and a read
/// guard's upgrade is refused as invalid.
async fn upgradeable_case(h: &Harness, case: &str) -> Option<String> {
    let (name, caps) = rw_case(h, case).await?;
    let o = held(h);
    let mut reader = h
        .lock
        .try_acquire_read(&name, &o)
        .await
        .expect("read")
        .expect("free");
    let refused = reader.upgrade(Wait::No).await;
    assert!(
        matches!(refused, Err(LockError::InvalidOptions { .. })),
        "a plain read's upgrade must be refused as invalid: {refused:?}"
    );
    assert_eq!(reader.access(), Some(Access::Read));
    assert!(reader.release().await.expect("release"));
    if caps.upgradeable {
        return Some(name);
    }
    let e = h.lock.try_acquire_upgradeable(&name, &o).await.err();
    assert!(
        matches!(e, Some(LockError::Unsupported { .. })),
        "a backend without upgradeable reads must refuse them: {e:?}"
    );
    let e = h.lock.acquire_upgradeable(&name, &o).await.err();
    assert!(
        matches!(e, Some(LockError::Unsupported { .. })),
        "a backend without upgradeable reads must refuse them: {e:?}"
    );
    None
}

/// An upgradeable reader reads beside readers, on either client, and
/// excludes writers and other upgradeable readers until it leaves;
/// `inspect_rw` shows it as one.
pub async fn an_upgradeable_read_shares_with_readers_only(h: Harness) {
    let Some(name) = upgradeable_case(&h, "upgradeable").await else {
        return;
    };
    let o = held(&h);
    let u = h
        .lock
        .try_acquire_upgradeable(&name, &o)
        .await
        .expect("upgradeable")
        .expect("free");
    assert_eq!(u.access(), Some(Access::Upgradeable));
    let reader = h
        .other
        .try_acquire_read(&name, &o)
        .await
        .expect("read")
        .expect("a reader shares with an upgradeable reader");
    for (what, lock) in [("this client", &h.lock), ("the other client", &h.other)] {
        assert!(
            lock.try_acquire_write(&name, &o)
                .await
                .expect("write")
                .is_none(),
            "a writer on {what} got in beside an upgradeable reader"
        );
        assert!(
            lock.try_acquire_upgradeable(&name, &o)
                .await
                .expect("upgradeable")
                .is_none(),
            "a second upgradeable reader on {what} got in"
        );
    }
    let info = h.other.inspect_rw(&name).await.expect("inspect");
    assert_eq!(info.mode, Some(Access::Read), "{info:?}");
    if !info.holders.is_empty() {
        let upgradeable = info
            .holders
            .iter()
            .filter(|x| x.access == Access::Upgradeable)
            .count();
        assert_eq!(upgradeable, 1, "{info:?}");
    }
    assert!(u.release().await.expect("release"));
    let again = h
        .other
        .try_acquire_upgradeable(&name, &o)
        .await
        .expect("upgradeable")
        .expect("free for an upgradeable reader once the first left");
    assert!(reader.release().await.expect("release"));
    assert!(again.release().await.expect("release"));
    let w = h
        .lock
        .try_acquire_write(&name, &o)
        .await
        .expect("write")
        .expect("free for a writer once everyone left");
    assert!(w.release().await.expect("release"));
}

/// An upgrade waits for the other readers to leave, keeps readers that
/// come later out, and lets no waiting writer in before it; the upgraded
/// guard writes alone with a new, larger token, and the waiting writer is
/// served after it with a larger one still.
pub async fn an_upgrade_waits_for_readers_and_no_writer_gets_in_between(h: Harness) {
    let Some(name) = upgradeable_case(&h, "upgrade").await else {
        return;
    };
    let fenced = h.lock.capabilities().fencing != Fencing::None;
    let o = held(&h);
    let long = opts(
        Duration::from_secs(20),
        Wait::UpTo(Duration::from_secs(20)),
        true,
        &h,
    );
    let first = h
        .lock
        .try_acquire_write(&name, &o)
        .await
        .expect("write")
        .expect("free");
    let first_token = first.fencing_token();
    assert!(first.release().await.expect("release"));
    let mut u = h
        .lock
        .try_acquire_upgradeable(&name, &o)
        .await
        .expect("upgradeable")
        .expect("free");
    if fenced {
        assert_eq!(
            u.fencing_token(),
            first_token,
            "an upgradeable reader carries the latest write's token"
        );
    }
    let reader = h
        .other
        .try_acquire_read(&name, &o)
        .await
        .expect("read")
        .expect("a reader shares");
    let writer = tokio::spawn({
        let (other, name, long) = (h.other.clone(), name.clone(), long.clone());
        async move { other.acquire_write(&name, &long).await }
    });
    await_waiting_writers(&h, &name, 1).await;
    let upgrade = tokio::spawn(async move {
        let outcome = u.upgrade(Wait::UpTo(Duration::from_secs(20))).await;
        (outcome, u, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !upgrade.is_finished(),
        "the upgrade went through beside a reader"
    );
    assert!(
        h.lock
            .try_acquire_read(&name, &o)
            .await
            .expect("read")
            .is_none(),
        "a reader got in while an upgrade waited"
    );
    let released = Instant::now();
    assert!(reader.release().await.expect("release"));
    let (outcome, u, upgraded) = tokio::time::timeout(Duration::from_secs(10), upgrade)
        .await
        .expect("the upgrade went through once the reader left")
        .expect("upgrade task");
    outcome.expect("upgrade");
    assert!(
        upgraded.duration_since(released) < SLACK,
        "the upgrade waited {:?} after the reader left",
        upgraded.duration_since(released)
    );
    assert_eq!(u.access(), Some(Access::Write));
    if fenced {
        assert!(
            u.fencing_token() > first_token,
            "the upgrade's token {:?} is not above the last write's {first_token:?}",
            u.fencing_token()
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !writer.is_finished(),
        "a writer got in beside the upgraded writer"
    );
    for lock in [&h.lock, &h.other] {
        assert!(
            lock.try_acquire_read(&name, &o)
                .await
                .expect("read")
                .is_none(),
            "a reader got in beside the upgraded writer"
        );
    }
    u.ensure_held().expect("the upgraded grant is held");
    u.extend(o.ttl).await.expect("the upgraded grant extends");
    let upgraded_token = u.fencing_token();
    assert!(u.release().await.expect("release the upgraded grant"));
    let w = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the waiting writer was served after the upgraded one")
        .expect("writer task")
        .expect("write");
    if fenced {
        assert!(
            w.fencing_token() > upgraded_token,
            "the next writer's token {:?} is not above the upgrade's {upgraded_token:?}",
            w.fencing_token()
        );
    }
    assert!(w.release().await.expect("release"));
}

/// An upgrade whose wait runs out (or is cancelled) leaves an upgradeable
/// read, still held, and lets readers in again; the upgrade can be asked
/// again and goes through once the readers are gone.
pub async fn an_upgrade_that_gives_up_leaves_an_upgradeable_read(h: Harness) {
    let Some(name) = upgradeable_case(&h, "upgrade-timeout").await else {
        return;
    };
    let o = held(&h);
    let mut u = h
        .lock
        .try_acquire_upgradeable(&name, &o)
        .await
        .expect("upgradeable")
        .expect("free");
    let reader = h
        .other
        .try_acquire_read(&name, &o)
        .await
        .expect("read")
        .expect("a reader shares");
    let at_once = u.upgrade(Wait::No).await;
    assert!(
        matches!(at_once, Err(LockError::Timeout { .. })),
        "an upgrade beside a reader without waiting: {at_once:?}"
    );
    let started = Instant::now();
    let timed = u.upgrade(Wait::UpTo(Duration::from_millis(400))).await;
    assert!(
        matches!(timed, Err(LockError::Timeout { .. })),
        "an upgrade beside a reader: {timed:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(400) + SLACK,
        "the upgrade waited {:?} for a 400 ms bound",
        started.elapsed()
    );
    assert_eq!(u.access(), Some(Access::Upgradeable));
    u.ensure_held()
        .expect("still held after the upgrade gave up");
    let cancelled =
        tokio::time::timeout(Duration::from_millis(300), u.upgrade(Wait::Forever)).await;
    assert!(
        cancelled.is_err(),
        "the upgrade went through beside a reader"
    );
    assert_eq!(u.access(), Some(Access::Upgradeable));
    // Readers are let in again, writers still kept out.
    let second = tokio::time::timeout(
        SLACK,
        h.other.acquire_read(
            &name,
            &opts(Duration::from_secs(20), Wait::UpTo(SLACK), true, &h),
        ),
    )
    .await
    .expect("a reader got in after the upgrade gave up")
    .expect("read");
    assert!(
        h.other
            .try_acquire_write(&name, &o)
            .await
            .expect("write")
            .is_none(),
        "a writer got in beside an upgradeable reader"
    );
    assert!(reader.release().await.expect("release"));
    assert!(second.release().await.expect("release"));
    u.upgrade(Wait::UpTo(Duration::from_secs(10)))
        .await
        .expect("the upgrade goes through once the readers left");
    assert_eq!(u.access(), Some(Access::Write));
    assert!(u.release().await.expect("release"));
    let free = h
        .other
        .try_acquire_upgradeable(&name, &o)
        .await
        .expect("upgradeable")
        .expect("free once the upgraded writer left");
    assert!(free.release().await.expect("release"));
}

/// An upgradeable reader that stops renewing loses its grant at the end of
/// its lease, as any grant does: another upgradeable reader, and a writer,
/// are let in, and the lost guard's upgrade is refused.
pub async fn an_abandoned_upgradeable_read_expires(h: Harness) {
    let Some(name) = upgradeable_case(&h, "upgradeable-expiry").await else {
        return;
    };
    let ttl = Duration::from_millis(1500).max(h.lock.capabilities().min_lease);
    let mut u = h
        .lock
        .try_acquire_upgradeable(&name, &opts(ttl, Wait::No, false, &h))
        .await
        .expect("upgradeable")
        .expect("free");
    let wait = opts(
        Duration::from_secs(20),
        Wait::UpTo(ttl * 2 + SLACK * 2),
        true,
        &h,
    );
    let next = h
        .other
        .acquire_upgradeable(&name, &wait)
        .await
        .expect("another upgradeable reader once the lease ended");
    let lost = tokio::time::timeout(SLACK, u.lost()).await;
    assert!(lost.is_ok(), "the abandoned grant's lost() fired");
    assert!(
        u.upgrade(Wait::No).await.is_err(),
        "an expired upgradeable read upgraded"
    );
    assert!(next.release().await.expect("release"));
}

#[doc(hidden)]
#[macro_export]
macro_rules! __rw_lock_cases {
    ($harness:expr) => {
        $crate::__conformance_cases!(@module rw_lock; $harness;
            readers_share_and_a_writer_holds_alone,
            a_waiting_writer_is_served_before_later_readers,
            readers_that_queued_before_a_waiting_writer_keep_their_place,
            queued_readers_enter_together,
            waiters_are_served_in_arrival_order,
            tokens_rise_per_write_and_readers_carry_the_latest,
            readers_and_writers_under_contention,
            a_cancelled_wait_leaves_nothing_behind,
            a_writer_dropped_at_any_moment_leaves_no_mark,
            a_reader_dropped_at_any_moment_leaves_no_mark,
            waits_are_bounded,
            an_abandoned_grant_expires,
            renewed_grants_stay_held,
            rw_locks_locks_and_permits_are_apart,
            inspect_shows_the_mode_holders_and_waiting_writers,
            invalid_requests_are_typed,
            an_upgradeable_read_shares_with_readers_only,
            an_upgrade_waits_for_readers_and_no_writer_gets_in_between,
            an_upgrade_that_gives_up_leaves_an_upgradeable_read,
            an_abandoned_upgradeable_read_expires,
        );
    };
}
