//! The semaphore conformance suite, run by every backend through
//! [`conformance_suite!`](crate::conformance_suite) in a module named
//! `semaphore`, on the same [`Harness`].
//!
//! A backend whose capabilities offer no semaphores
//! ([`Capabilities::semaphore`](lock_core::Capabilities::semaphore) is
//! `None`) must refuse them with [`LockError::Unsupported`]: each case
//! checks that instead.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use lock_core::{LockError, LockOptions, Semaphore, Wait};

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

/// The semaphore `case` of `limit` permits on both clients, or `None`
/// where the backend offers none; then every way in is refused, typed.
async fn semaphores(h: &Harness, case: &str, limit: u32) -> Option<(Semaphore, Semaphore)> {
    let name = unique_name(case);
    if h.lock.capabilities().semaphore.is_some() {
        let a = Semaphore::new(h.lock.clone(), name.clone(), limit).expect("semaphore");
        let b = Semaphore::new(h.other.clone(), name, limit).expect("semaphore");
        return Some((a, b));
    }
    let unsupported = |what: &str, e: Option<LockError>| {
        assert!(
            matches!(e, Some(LockError::Unsupported { .. })),
            "{what}: a backend without semaphores must refuse them: {e:?}"
        );
    };
    unsupported(
        "Semaphore::new",
        Semaphore::new(h.lock.clone(), name.clone(), limit).err(),
    );
    let o = opts(Duration::from_secs(5), Wait::No, false, h).permits(limit);
    unsupported("try_acquire", h.lock.try_acquire(&name, &o).await.err());
    unsupported("acquire", h.lock.acquire(&name, &o).await.err());
    unsupported(
        "inspect_semaphore",
        h.lock.inspect_semaphore(&name).await.err(),
    );
    None
}

/// Eight tasks on both clients take and give back permits of a semaphore
/// of three: never more than three are held, no two hold one slot, every
/// slot is below the limit, and each slot's tokens rise grant after grant.
pub async fn permits_never_exceed_the_limit(h: Harness) {
    const LIMIT: u32 = 3;
    const TASKS: usize = 8;
    const ROUNDS: usize = 6;
    let Some((a, b)) = semaphores(&h, "limit", LIMIT).await else {
        return;
    };
    let in_use = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let slots = Arc::new(Mutex::new(HashSet::new()));
    let tokens: Arc<Mutex<BTreeMap<u32, Vec<u64>>>> = Arc::default();
    let o = opts(
        Duration::from_secs(20),
        Wait::UpTo(Duration::from_secs(30)),
        true,
        &h,
    );
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let semaphore = if t % 2 == 0 { a.clone() } else { b.clone() };
        let (in_use, most, slots, tokens, o) = (
            in_use.clone(),
            most.clone(),
            slots.clone(),
            tokens.clone(),
            o.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let permit = semaphore.acquire(&o).await.expect("a permit");
                let slot = permit.slot().expect("a permit has a slot");
                assert!(slot < LIMIT, "slot {slot} of a semaphore of {LIMIT}");
                assert!(
                    slots.lock().expect("slots").insert(slot),
                    "two permits on slot {slot}"
                );
                if let Some(token) = permit.fencing_token() {
                    tokens
                        .lock()
                        .expect("tokens")
                        .entry(slot)
                        .or_default()
                        .push(token);
                }
                let now = in_use.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                in_use.fetch_sub(1, Ordering::SeqCst);
                assert!(slots.lock().expect("slots").remove(&slot));
                assert!(permit.release().await.expect("release"), "still ours");
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= LIMIT, "{most} permits held at once, limit {LIMIT}");
    assert!(
        most > 1,
        "eight contending tasks never held two permits at once"
    );
    for (slot, tokens) in tokens.lock().expect("tokens").iter() {
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "slot {slot}'s tokens do not rise: {tokens:?}"
        );
    }
}

/// A full semaphore refuses a try; a release frees that permit's slot for
/// the next holder, whose token on the slot is higher; a permit's release
/// says it was ours.
pub async fn a_release_frees_its_slot_for_the_next(h: Harness) {
    let Some((a, b)) = semaphores(&h, "full", 2).await else {
        return;
    };
    let o = opts(Duration::from_secs(20), Wait::No, true, &h);
    let first = a.acquire(&o).await.expect("first");
    let second = a.acquire(&o).await.expect("second");
    let taken: HashSet<_> = [first.slot(), second.slot()].into_iter().collect();
    assert_eq!(taken, HashSet::from([Some(0), Some(1)]));
    assert!(b.try_acquire(&o).await.expect("try").is_none(), "full");
    match b.acquire(&o).await {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("Wait::No on a full semaphore: {other:?}"),
    }
    let (slot, token) = (first.slot(), first.fencing_token());
    assert!(first.release().await.expect("release"));
    let next = b
        .try_acquire(&o)
        .await
        .expect("try")
        .expect("a free permit");
    assert_eq!(next.slot(), slot, "the freed slot");
    if let (Some(before), Some(after)) = (token, next.fencing_token()) {
        assert!(after > before, "slot token {after} after {before}");
    }
    assert!(next.release().await.expect("release"));
    assert!(second.release().await.expect("release"));
}

/// Asking for a name with another limit than its holders' is a typed
/// error naming both; once they are gone, the new limit is taken.
pub async fn another_limit_is_refused_naming_both(h: Harness) {
    let Some((two, _)) = semaphores(&h, "mismatch", 2).await else {
        return;
    };
    let three = Semaphore::new(h.other.clone(), two.name(), 3).expect("semaphore");
    let o = opts(Duration::from_secs(20), Wait::No, true, &h);
    let held = two.acquire(&o).await.expect("acquire");
    for attempt in [
        three.try_acquire(&o).await.err(),
        three.acquire(&o).await.err(),
    ] {
        match attempt {
            Some(LockError::InvalidOptions { reason }) => {
                assert!(reason.contains('2') && reason.contains('3'), "{reason}")
            }
            other => panic!("a limit of 3 on a semaphore held with 2: {other:?}"),
        }
    }
    assert!(held.release().await.expect("release"));
    let now_three = three.acquire(&o).await.expect("no holders: the new limit");
    assert!(now_three.release().await.expect("release"));
    for bad in [0, u32::MAX] {
        assert!(
            matches!(
                Semaphore::new(h.lock.clone(), two.name(), bad),
                Err(LockError::InvalidOptions { .. })
            ),
            "limit {bad}"
        );
    }
}

/// Clients asking for a new name with two limits at once (2 and 3, on
/// both clients, in rounds): every permit granted carries one limit, no
/// more than that limit are held, no two share a slot, and every refusal
/// is the typed mismatch.
pub async fn racing_limits_grant_under_one(h: Harness) {
    if semaphores(&h, "racing-limits", 2).await.is_none() {
        return;
    }
    let o = opts(Duration::from_secs(20), Wait::No, true, &h);
    for round in 0..4 {
        let name = unique_name(&format!("racing-limits-{round}"));
        let mut tasks = Vec::new();
        for i in 0..8u32 {
            let lock = if i % 2 == 0 {
                h.lock.clone()
            } else {
                h.other.clone()
            };
            let limit = 2 + (i / 2) % 2;
            let semaphore = Semaphore::new(lock, name.clone(), limit).expect("semaphore");
            let o = o.clone();
            tasks.push(tokio::spawn(async move {
                (limit, semaphore.try_acquire(&o).await)
            }));
        }
        let mut granted = Vec::new();
        for task in tasks {
            match task.await.expect("task") {
                (limit, Ok(Some(permit))) => granted.push((limit, permit)),
                (_, Ok(None)) => {}
                (_, Err(LockError::InvalidOptions { .. })) => {}
                (limit, Err(e)) => panic!("a permit of {limit}: {e:?}"),
            }
        }
        let limits: Vec<u32> = granted.iter().map(|(l, _)| *l).collect();
        let Some(&limit) = limits.first() else {
            panic!("nobody was granted a permit of a new name");
        };
        assert!(
            limits.iter().all(|&l| l == limit),
            "permits granted under two limits at once: {limits:?}"
        );
        assert!(
            granted.len() <= limit as usize,
            "{} permits held of {limit}",
            granted.len()
        );
        let slots: HashSet<Option<u32>> = granted.iter().map(|(_, p)| p.slot()).collect();
        assert_eq!(slots.len(), granted.len(), "two permits on one slot");
        for (_, permit) in granted {
            assert!(permit.release().await.expect("release"));
        }
    }
}

/// A hundred acquirers on both clients (default options) take and give
/// back permits of a semaphore of ten, each held 30 ms: every one is
/// served within its wait, and the limit is reached, so contention does
/// not keep permits out of reach. Until ten are held at once, holders
/// keep their permits (up to 5 s): on a loaded machine a replicated
/// backend's grant can take longer than a tenth of a hold. At most 24
/// acquirers of each client wait or hold at once: a SQL client keeps a
/// pooled connection per waiting acquisition (32 by default).
pub async fn contention_reaches_the_limit(h: Harness) {
    const LIMIT: u32 = 10;
    const ACQUIRERS: usize = 100;
    const PER_CLIENT: usize = 24;
    let Some((a, b)) = semaphores(&h, "contention", LIMIT).await else {
        return;
    };
    let o = LockOptions::new()
        .ttl(Duration::from_secs(10).max(h.lock.capabilities().min_lease))
        .wait(Wait::UpTo(Duration::from_secs(30)));
    let in_use = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let gates = [
        Arc::new(tokio::sync::Semaphore::new(PER_CLIENT)),
        Arc::new(tokio::sync::Semaphore::new(PER_CLIENT)),
    ];
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..ACQUIRERS {
        let semaphore = if i % 2 == 0 { a.clone() } else { b.clone() };
        let gate = Arc::clone(&gates[i % 2]);
        let (o, in_use, most) = (o.clone(), in_use.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let _in = gate.acquire_owned().await.expect("gate");
            let permit = semaphore.acquire(&o).await.expect("a permit");
            let now = in_use.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            assert!(now <= LIMIT, "{now} permits of {LIMIT} held");
            let until = Instant::now() + Duration::from_secs(5);
            while most.load(Ordering::SeqCst) < LIMIT && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
            in_use.fetch_sub(1, Ordering::SeqCst);
            assert!(permit.release().await.expect("release"));
        }));
    }
    for task in tasks {
        task.await.expect("acquirer");
    }
    let most = most.load(Ordering::SeqCst);
    eprintln!(
        "semaphore contention: {ACQUIRERS} acquirers served in {:?}, at most {most} held",
        started.elapsed()
    );
    assert_eq!(most, LIMIT, "contention kept the limit out of reach");
}

/// A waiter for a permit gets the one given back, soon after.
pub async fn a_waiter_gets_a_released_permit(h: Harness) {
    let Some((a, b)) = semaphores(&h, "waiter", 1).await else {
        return;
    };
    let o = opts(Duration::from_secs(20), Wait::No, true, &h);
    let held = a.acquire(&o).await.expect("acquire");
    let waiting = tokio::spawn({
        let o = o.clone().wait(Wait::UpTo(Duration::from_secs(20)));
        async move { b.acquire(&o).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "granted while the only permit was held"
    );
    let released = Instant::now();
    assert!(held.release().await.expect("release"));
    let got = waiting.await.expect("task").expect("the released permit");
    assert!(
        released.elapsed() < SLACK * 2,
        "handed over after {:?}",
        released.elapsed()
    );
    assert_eq!(got.slot(), Some(0));
    assert!(got.release().await.expect("release"));
}

/// An unrenewed permit ends with its lease: the next holder of the slot
/// is granted after it, and the frozen holder knows it lost the permit by
/// then; the token on the slot rises.
pub async fn an_abandoned_permit_expires_and_its_holder_knows_first(h: Harness) {
    let Some((a, b)) = semaphores(&h, "abandoned", 1).await else {
        return;
    };
    let ttl = Duration::from_secs(1).max(h.lock.capabilities().min_lease);
    let frozen = a
        .acquire(&opts(ttl, Wait::No, false, &h))
        .await
        .expect("acquire");
    let next = b
        .acquire(&opts(ttl, Wait::UpTo(ttl * 3 + SLACK), true, &h))
        .await
        .expect("the slot is free once the lease ran out");
    assert!(
        frozen.is_lost().is_some(),
        "the frozen holder still believed it held the permit when the next was granted"
    );
    if let (Some(before), Some(after)) = (frozen.fencing_token(), next.fencing_token()) {
        assert!(after > before);
    }
    assert!(!frozen.release().await.expect("release"), "no longer ours");
    assert!(next.release().await.expect("release"));
}

/// `inspect_semaphore` shows the limit and each permit held (slot, token,
/// lease left, holder), and nothing once they are released.
pub async fn inspect_shows_the_limit_and_the_permits(h: Harness) {
    let Some((a, b)) = semaphores(&h, "inspect", 3).await else {
        return;
    };
    let ttl = Duration::from_secs(20);
    let o = opts(ttl, Wait::No, true, &h);
    let first = a.acquire(&o.clone().identity("sem-a")).await.expect("a");
    let second = b.acquire(&o.clone().identity("sem-b")).await.expect("b");
    let info = a.inspect().await.expect("inspect");
    assert_eq!(info.limit, Some(3));
    assert_eq!(info.permits.len(), 2, "{info:?}");
    for (guard, identity) in [(&first, "sem-a"), (&second, "sem-b")] {
        let permit = info
            .permits
            .iter()
            .find(|p| Some(p.slot) == guard.slot())
            .expect("the permit's slot");
        assert_eq!(permit.fencing_token, guard.fencing_token());
        if let Some(left) = permit.expires_in {
            assert!(left <= ttl, "{left:?}");
        }
        if h.lock.capabilities().holder {
            let holder = permit.holder.as_ref().expect("a holder record");
            assert_eq!(holder.identity, identity);
        }
    }
    assert!(first.release().await.expect("release"));
    assert!(second.release().await.expect("release"));
    let info = b.inspect().await.expect("inspect");
    assert_eq!((info.limit, info.permits.len()), (None, 0), "{info:?}");
}

/// A wait for a permit dropped midway leaves nothing behind: once the
/// holder releases, the permit is free within a moment, far sooner than
/// the 20 s lease anything left behind would keep it. Not at once: the
/// dropped wait's last attempt may still be on its way to the server
/// (Postgres and MySQL: a statement sent on the connection the drop
/// closes), and it is undone in the background, as a cancelled lock's
/// wait is.
pub async fn a_cancelled_wait_for_a_permit_leaves_nothing_behind(h: Harness) {
    let Some((a, b)) = semaphores(&h, "cancelled", 1).await else {
        return;
    };
    let o = opts(Duration::from_secs(20), Wait::No, true, &h);
    let held = a.acquire(&o).await.expect("acquire");
    let waiting = o.clone().wait(Wait::UpTo(Duration::from_secs(20)));
    let cancelled = tokio::time::timeout(Duration::from_millis(300), b.acquire(&waiting)).await;
    assert!(cancelled.is_err(), "granted while held: {cancelled:?}");
    assert!(held.release().await.expect("release"));
    let again = a
        .acquire(&o.clone().wait(Wait::UpTo(Duration::from_secs(2))))
        .await
        .expect("free within a moment once the holder released");
    assert!(again.release().await.expect("release"));
}

/// Where the capabilities say waiters for permits are served in arrival
/// order, they are.
pub async fn waiters_for_permits_are_served_in_arrival_order(h: Harness) {
    let Some((a, b)) = semaphores(&h, "fair", 1).await else {
        return;
    };
    let fair = h
        .lock
        .capabilities()
        .semaphore
        .is_some_and(|s| s.fair_queue);
    if !fair {
        return;
    }
    let o = opts(Duration::from_secs(20), Wait::No, true, &h);
    let held = a.acquire(&o).await.expect("acquire");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3 {
        let semaphore = if i % 2 == 0 { b.clone() } else { a.clone() };
        let (order, o) = (
            order.clone(),
            o.clone().wait(Wait::UpTo(Duration::from_secs(20))),
        );
        waiters.push(tokio::spawn(async move {
            let permit = semaphore.acquire(&o).await.expect("a permit");
            order.lock().expect("order").push(i);
            tokio::time::sleep(Duration::from_millis(30)).await;
            assert!(permit.release().await.expect("release"));
        }));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(held.release().await.expect("release"));
    for waiter in waiters {
        waiter.await.expect("waiter");
    }
    assert_eq!(*order.lock().expect("order"), vec![0, 1, 2]);
}

#[doc(hidden)]
#[macro_export]
macro_rules! __semaphore_cases {
    ($harness:expr) => {
        $crate::__conformance_cases!(@module semaphore; $harness;
            permits_never_exceed_the_limit,
            a_release_frees_its_slot_for_the_next,
            another_limit_is_refused_naming_both,
            racing_limits_grant_under_one,
            contention_reaches_the_limit,
            a_waiter_gets_a_released_permit,
            an_abandoned_permit_expires_and_its_holder_knows_first,
            inspect_shows_the_limit_and_the_permits,
            a_cancelled_wait_for_a_permit_leaves_nothing_behind,
            waiters_for_permits_are_served_in_arrival_order,
        );
    };
}
