//! The lock-set conformance suite ([`LockSetExt`]), run by every backend
//! through [`conformance_suite!`](crate::conformance_suite) in a module
//! named `lock_set`, on the same [`Harness`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use lock_core::{DistributedLock, LockError, LockOptions, LockSetExt, Wait};

use crate::conformance::{Harness, unique_name};

/// Slack for scheduling and round trips.
const SLACK: Duration = Duration::from_millis(1500);

fn opts(h: &Harness, wait: Wait) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(10).max(h.lock.capabilities().min_lease))
        .wait(wait)
        .backoff(
            lock_core::Backoff::default()
                .with_initial(Duration::from_millis(2))
                .with_max(Duration::from_millis(25)),
        )
}

/// `count` names of a case.
fn names(case: &str, count: usize) -> Vec<String> {
    let base = unique_name(case);
    (0..count).map(|i| format!("{base}/{i}")).collect()
}

/// Ten tries race for one set of three names, alternating between the two
/// clients, over 20 rounds: every round has exactly one winner. (Where a
/// set is one request to several servers, racing tries can each win a
/// minority and all lose; a try resolves that among its contenders.)
pub async fn racing_tries_for_one_set_have_one_winner(h: Harness) {
    const ROUNDS: usize = 20;
    const RACERS: usize = 10;
    let o = opts(&h, Wait::No);
    for round in 0..ROUNDS {
        let set = Arc::new(names("race", 3));
        let start = Arc::new(tokio::sync::Barrier::new(RACERS));
        let racers: Vec<_> = (0..RACERS)
            .map(|i| {
                let lock = match i % 2 {
                    0 => Arc::clone(&h.lock),
                    _ => Arc::clone(&h.other),
                };
                let (set, start, o) = (Arc::clone(&set), Arc::clone(&start), o.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    lock.try_acquire_all(&set[..], &o).await
                })
            })
            .collect();
        let mut won = Vec::new();
        for racer in racers {
            if let Some(held) = racer.await.expect("racer").expect("try_acquire_all") {
                won.push(held);
            }
        }
        assert_eq!(
            won.len(),
            1,
            "round {round}: {} of {RACERS} racing tries took the set",
            won.len()
        );
        for held in won {
            held.release().await.expect("release");
        }
    }
}

/// Eight tasks on both clients take overlapping sets of two or three of
/// four names, each naming its set in its own order (half of them in the
/// reverse order of the others): every set is granted (no deadlock, within
/// a bound), no name is ever inside two sets at once, and every release
/// finds its members still held.
pub async fn overlapping_sets_in_opposite_orders_never_deadlock_or_overlap(h: Harness) {
    const TASKS: usize = 8;
    const ROUNDS: usize = 8;
    let pool = names("opposite-orders", 4);
    let inside: Arc<BTreeMap<String, AtomicBool>> = Arc::new(
        pool.iter()
            .map(|n| (n.clone(), AtomicBool::new(false)))
            .collect(),
    );
    let o = opts(&h, Wait::UpTo(Duration::from_secs(60)));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let lock = if t % 2 == 0 {
            h.lock.clone()
        } else {
            h.other.clone()
        };
        let (pool, inside, o) = (pool.clone(), inside.clone(), o.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let size = 2 + (t + round) % 2;
                let mut set: Vec<String> = (0..size)
                    .map(|i| pool[(t + round + i) % pool.len()].clone())
                    .collect();
                if t % 2 == 1 {
                    set.reverse();
                }
                let held = lock.acquire_all(&set, &o).await.expect("a set");
                assert_eq!(held.len(), set.len());
                for name in held.names() {
                    assert!(
                        !inside[name].swap(true, Ordering::SeqCst),
                        "{name} inside two sets at once"
                    );
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                for name in held.names() {
                    inside[name].store(false, Ordering::SeqCst);
                }
                assert!(held.release().await.expect("release"), "a member was lost");
            }
        }));
    }
    let all = async {
        for task in tasks {
            task.await.expect("task");
        }
    };
    tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("the sets were not all granted within 120 s: a deadlock");
}

/// Names given twice are taken once, and the set is in the names' order
/// with a token per name where the backend fences.
pub async fn duplicates_are_taken_once(h: Harness) {
    let n = names("duplicates", 3);
    let asked = [&n[2], &n[0], &n[2], &n[1], &n[0]];
    let set = h
        .lock
        .acquire_all(&asked, &opts(&h, Wait::No))
        .await
        .expect("a set");
    assert_eq!(set.len(), 3);
    assert_eq!(set.names().collect::<Vec<_>>(), [&n[0], &n[1], &n[2]]);
    if h.lock.capabilities().fencing != lock_core::Fencing::None {
        for name in &n {
            assert!(set.fencing_token(name).is_some(), "no token for {name}");
        }
    }
    assert!(set.get("not a member").is_none());
    assert!(set.release().await.expect("release"));
}

/// A `try_acquire_all` that finds one member held gives back those it took:
/// the others are free at once.
pub async fn a_failed_try_leaves_no_member_held(h: Harness) {
    let n = names("failed-try", 3);
    let o = opts(&h, Wait::No);
    let middle = h.other.acquire(&n[1], &o).await.expect("acquire");
    let none = h.lock.try_acquire_all(&n, &o).await.expect("try");
    assert!(none.is_none(), "a set granted with a member held elsewhere");
    let nowait = h.lock.acquire_all(&n, &o).await;
    assert!(
        matches!(&nowait, Err(LockError::Timeout { name, .. }) if *name == n[1]),
        "{nowait:?}"
    );
    for name in [&n[0], &n[2]] {
        let free = h.other.try_acquire(name, &o).await.expect("try");
        let free = free.unwrap_or_else(|| panic!("{name} still held by the failed set"));
        assert!(free.release().await.expect("release"));
    }
    assert!(middle.release().await.expect("release"));
}

/// Where the backend takes sets in one request
/// ([`atomic_sets`](lock_core::Capabilities::atomic_sets)), a set refused
/// because one member is held never holds another, not even for a moment:
/// a client trying that other member all the while always gets it; a
/// member held by the set's own client refuses it too. The
/// request itself (`try_acquire_set`) grants in the names' order with a
/// token each, and refuses a set over the limit; where the backend says 0,
/// it is not offered.
pub async fn a_refused_atomic_set_never_holds_a_member(h: Harness) {
    let caps = h.lock.capabilities();
    let lock: &dyn DistributedLock = &*h.lock;
    let o = opts(&h, Wait::No);
    let n = names("atomic", 3);
    let refs: Vec<&str> = n.iter().rev().map(String::as_str).collect();
    if caps.atomic_sets == 0 {
        let refused = lock.try_acquire_set(&refs, &o).await;
        assert!(
            matches!(refused, Err(LockError::Unsupported { .. })),
            "{refused:?}"
        );
        return;
    }
    if caps.atomic_sets < lock_core::MAX_SET_NAMES {
        let over = names("atomic-over", caps.atomic_sets + 1);
        let over: Vec<&str> = over.iter().map(String::as_str).collect();
        let refused = lock.try_acquire_set(&over, &o).await;
        assert!(
            matches!(refused, Err(LockError::InvalidOptions { .. })),
            "{refused:?}"
        );
    }
    let set = lock.try_acquire_set(&refs, &o).await.expect("set");
    let set = set.expect("three free names granted");
    let held: Vec<&str> = set.iter().map(|g| g.name()).collect();
    assert_eq!(held, [n[0].as_str(), n[1].as_str(), n[2].as_str()]);
    if caps.fencing != lock_core::Fencing::None {
        assert!(set.iter().all(|g| g.fencing_token().is_some()));
    }
    for guard in set {
        assert!(guard.release().await.expect("release"));
    }

    // A member held by the same client refuses the set too (a server lock
    // re-entrant within a session must not let it through), and the set
    // takes nothing on the way.
    let mine = h.lock.acquire(&n[1], &o).await.expect("acquire");
    let refused = lock.try_acquire_set(&refs, &o).await.expect("set");
    assert!(
        refused.is_none(),
        "a set granted with a member held by its own client"
    );
    let free = h.other.try_acquire(&n[0], &o).await.expect("probe");
    assert!(free.is_some(), "a refused set left {} held", n[0]);
    if let Some(free) = free {
        assert!(free.release().await.expect("release"));
    }
    assert!(mine.release().await.expect("release"));

    let last = h.other.acquire(&n[2], &o).await.expect("acquire");
    let done = Arc::new(AtomicBool::new(false));
    let prober = {
        let (other, first, o, done) = (
            Arc::clone(&h.other),
            n[0].clone(),
            o.clone(),
            Arc::clone(&done),
        );
        tokio::spawn(async move {
            let (mut probes, mut held) = (0u32, 0u32);
            while !done.load(Ordering::Relaxed) || probes == 0 {
                probes += 1;
                match other.try_acquire(&first, &o).await.expect("probe") {
                    Some(guard) => {
                        guard.release().await.expect("release");
                    }
                    None => held += 1,
                }
            }
            (probes, held)
        })
    };
    let mut refused = 0;
    for _ in 0..40 {
        if h.lock.try_acquire_all(&n, &o).await.expect("try").is_none() {
            refused += 1;
        }
    }
    done.store(true, Ordering::Relaxed);
    let (probes, held) = prober.await.expect("prober");
    assert_eq!(refused, 40, "a set granted with a member held elsewhere");
    assert_eq!(
        held, 0,
        "{held} of {probes} probes found {} held by a refused set",
        n[0]
    );
    assert!(last.release().await.expect("release"));
}

/// The set shares one wait: a member freed late gets only what is left
/// of it, so the set times out when the whole wait ends, not one wait per
/// member later; its members are free afterwards.
pub async fn one_wait_bounds_the_whole_set(h: Harness) {
    let n = names("one-wait", 3);
    let o = opts(&h, Wait::No);
    let second = h.other.acquire(&n[1], &o).await.expect("acquire");
    let third = h.other.acquire(&n[2], &o).await.expect("acquire");
    let wait = Duration::from_secs(2);
    let freed_late = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(second.release().await.expect("release"));
    });
    let started = Instant::now();
    let outcome = h.lock.acquire_all(&n, &opts(&h, Wait::UpTo(wait))).await;
    let took = started.elapsed();
    assert!(
        matches!(&outcome, Err(LockError::Timeout { name, .. }) if *name == n[2]),
        "{outcome:?}"
    );
    assert!(
        took >= wait - Duration::from_millis(50),
        "gave up early: {took:?}"
    );
    // A wait of its own for the last member would end at 3.5 s.
    assert!(
        took < wait + Duration::from_millis(1200),
        "the last member waited a whole wait of its own: {took:?}"
    );
    freed_late.await.expect("task");
    for name in [&n[0], &n[1]] {
        let free = h
            .other
            .acquire(name, &opts(&h, Wait::UpTo(SLACK)))
            .await
            .unwrap_or_else(|e| panic!("{name} still held by the timed-out set: {e}"));
        assert!(free.release().await.expect("release"));
    }
    assert!(third.release().await.expect("release"));
}

/// A member taken away fires the set's `lost()`, naming a member the
/// server no longer holds for it (the one taken away, or one that went
/// with it); the set's release then reports each member as the server
/// had it: the one taken away (and only what went with it) no longer ours.
pub async fn a_member_taken_away_fires_the_sets_loss_naming_it(h: Harness) {
    let n = names("member-lost", 3);
    let ttl = Duration::from_secs(6).max(h.lock.capabilities().min_lease);
    let set = h
        .lock
        .acquire_all(&n, &opts(&h, Wait::No).ttl(ttl))
        .await
        .expect("a set");
    h.hook.take_away(&n[1]).await.expect("fault hook");
    let lost = tokio::time::timeout(ttl, set.lost())
        .await
        .expect("the set's lost() must fire once a member is taken away");
    // Taking one lock away may end others with it where they share what
    // carries them (SQL advisory locks taken in one request share a
    // server session, and the hook ends the holder's session): the server
    // says which members are still held.
    let mut still_held = BTreeMap::new();
    for name in &n {
        let info = h.lock.inspect(name).await.expect("inspect");
        still_held.insert(name.clone(), info.held);
    }
    assert!(!still_held[&n[1]], "the member taken away is still held");
    assert!(
        !still_held[&lost.name],
        "the set's loss names {}, which is still held: {still_held:?}",
        lost.name
    );
    assert!(set.is_lost().is_some());
    assert!(set.ensure_held().is_err());
    let released: BTreeMap<String, bool> = set
        .release_each()
        .await
        .into_iter()
        .map(|(name, ours)| (name, ours.expect("release")))
        .collect();
    assert_eq!(
        released, still_held,
        "a release reports each member as the server had it"
    );
}

/// An acquisition of a set dropped while it waits (holding the members
/// before the one it waits for) leaves nothing held.
pub async fn a_cancelled_set_leaves_nothing_held(h: Harness) {
    let n = names("cancelled-set", 3);
    let o = opts(&h, Wait::No);
    let last = h.other.acquire(&n[2], &o).await.expect("acquire");
    let waiting = opts(&h, Wait::UpTo(Duration::from_secs(20)));
    let cancelled =
        tokio::time::timeout(Duration::from_millis(400), h.lock.acquire_all(&n, &waiting)).await;
    assert!(cancelled.is_err(), "granted while a member was held");
    assert!(last.release().await.expect("release"));
    let all = h
        .other
        .acquire_all(&n, &opts(&h, Wait::UpTo(SLACK)))
        .await
        .expect("every member free once the cancelled set is gone");
    assert!(all.release().await.expect("release"));
}

/// Bad sets are typed errors: none, a bad name, a request for permits.
pub async fn bad_sets_are_typed_errors(h: Harness) {
    let o = opts(&h, Wait::No);
    let none: [&str; 0] = [];
    let lock: &dyn DistributedLock = &*h.lock;
    assert!(matches!(
        lock.try_acquire_all(&none, &o).await,
        Err(LockError::InvalidOptions { .. })
    ));
    let n = unique_name("bad-set");
    assert!(matches!(
        lock.acquire_all(&[n.as_str(), ""], &o).await,
        Err(LockError::InvalidName { .. })
    ));
    assert!(matches!(
        lock.acquire_all(&[n.as_str()], &o.clone().permits(2)).await,
        Err(LockError::InvalidOptions { .. })
    ));
    // Nothing was taken by the refused sets.
    let free = lock.try_acquire(&n, &o).await.expect("try").expect("free");
    assert!(free.release().await.expect("release"));
}

#[doc(hidden)]
#[macro_export]
macro_rules! __lock_set_cases {
    ($harness:expr) => {
        $crate::__conformance_cases!(@module lock_set; $harness;
            overlapping_sets_in_opposite_orders_never_deadlock_or_overlap,
            duplicates_are_taken_once,
            a_failed_try_leaves_no_member_held,
            racing_tries_for_one_set_have_one_winner,
            a_refused_atomic_set_never_holds_a_member,
            one_wait_bounds_the_whole_set,
            a_member_taken_away_fires_the_sets_loss_naming_it,
            a_cancelled_set_leaves_nothing_held,
            bad_sets_are_typed_errors,
        );
    };
}
