//! The election conformance suite (and the holder record it rests on),
//! run by every backend through [`conformance_suite!`](crate::conformance_suite)
//! in a module named `election`, on the same [`Harness`].
//!
//! A backend whose capabilities offer no elections (no fencing tokens, or
//! no holder record) must refuse them with [`LockError::Unsupported`]:
//! each case checks that instead.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::time::Instant;

use lock_core::{
    Election, Fencing, Leader, LockError, LockOptions, MAX_VALUE_BYTES, Wait, Waiting,
    default_identity,
};

use crate::conformance::{Harness, unique_name};

/// Slack for scheduling and round trips.
const SLACK: Duration = Duration::from_millis(1500);

/// How often observers poll in these cases, where the backend does not
/// notify them.
const POLL: Duration = Duration::from_millis(40);

fn offered(h: &Harness) -> bool {
    let caps = h.lock.capabilities();
    caps.fencing != Fencing::None && caps.holder
}

/// Where elections are not offered, a campaign says so, typed; `true`
/// when they are (the case goes on).
async fn offered_or_refused(h: &Harness, election: &Election) -> bool {
    if offered(h) {
        return true;
    }
    let refused = election.try_campaign("v", &LockOptions::new()).await;
    assert!(
        matches!(refused, Err(LockError::Unsupported { .. })),
        "a backend without terms or holder records must refuse elections: {refused:?}"
    );
    false
}

fn election(h: &Harness, case: &str) -> (Election, Election) {
    let name = unique_name(case);
    (
        Election::new(h.lock.clone(), name.clone()).poll_interval(POLL),
        Election::new(h.other.clone(), name).poll_interval(POLL),
    )
}

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

/// The holder record: `inspect` shows the identity and value a grant set
/// (the process's default identity when none is set), `set_value`
/// replaces the value while held and is refused once the lock is gone;
/// values over the limit are a typed error.
pub async fn inspect_shows_the_holder(h: Harness) {
    let name = unique_name("holder");
    let caps = h.lock.capabilities();
    let o = opts(Duration::from_secs(20), Wait::No, true, &h);
    if !caps.holder {
        let g = h.lock.acquire(&name, &o).await.expect("acquire");
        assert_eq!(h.other.inspect(&name).await.expect("inspect").holder, None);
        assert!(matches!(
            g.set_value(b"x").await,
            Err(LockError::Unsupported { .. })
        ));
        return;
    }
    let g = h.lock.acquire(&name, &o).await.expect("acquire");
    let holder = h
        .other
        .inspect(&name)
        .await
        .expect("inspect")
        .holder
        .expect("a holder record");
    assert_eq!(holder.identity, default_identity());
    assert!(holder.value.is_empty(), "{holder:?}");
    let age = std::time::SystemTime::now()
        .duration_since(holder.since)
        .unwrap_or_default();
    assert!(age < Duration::from_secs(60), "recorded {age:?} ago");
    assert!(g.release().await.expect("release"));

    let named = o
        .clone()
        .identity("worker-7 (pid 1)")
        .value(&b"shard 3"[..]);
    let g = h.lock.acquire(&name, &named).await.expect("acquire");
    let seen = h.other.inspect(&name).await.expect("inspect");
    let holder = seen.holder.expect("a holder record");
    assert_eq!(
        (holder.identity.as_str(), holder.value.as_slice()),
        ("worker-7 (pid 1)", &b"shard 3"[..])
    );
    let big = vec![0xA5u8; MAX_VALUE_BYTES];
    g.set_value(&big).await.expect("a value at the limit");
    let holder = h
        .other
        .inspect(&name)
        .await
        .expect("inspect")
        .holder
        .expect("holder");
    assert_eq!(holder.value, big, "the replaced value");
    assert_eq!(holder.identity, "worker-7 (pid 1)", "the identity stays");
    // And back to a short one (a backend may keep long and short records
    // apart: the short one must win).
    g.set_value(b"shard 4").await.expect("a short value again");
    let holder = h.other.inspect(&name).await.expect("inspect").holder;
    assert_eq!(holder.map(|h| h.value), Some(b"shard 4".to_vec()));
    assert!(matches!(
        g.set_value(&[0; MAX_VALUE_BYTES + 1]).await,
        Err(LockError::InvalidOptions { .. })
    ));
    let over = o.clone().value(vec![0; MAX_VALUE_BYTES + 1]);
    assert!(matches!(
        h.other.try_acquire(&unique_name("holder-big"), &over).await,
        Err(LockError::InvalidOptions { .. })
    ));

    // Taken away: the value can no longer be replaced, and the next
    // holder's record is not touched by the old one.
    h.other.force_release(&name).await.expect("force_release");
    // The next holder's record is long from the grant on.
    let long = vec![b'n'; MAX_VALUE_BYTES];
    let next = h
        .other
        .acquire(&name, &o.clone().identity("next").value(long.clone()))
        .await
        .expect("acquire after force_release");
    let refused = g.set_value(b"stale").await;
    assert!(
        matches!(
            refused,
            Err(LockError::NotHeld { .. } | LockError::Lost { .. })
        ),
        "{refused:?}"
    );
    let holder = h
        .lock
        .inspect(&name)
        .await
        .expect("inspect")
        .holder
        .expect("holder");
    assert_eq!(
        (holder.identity.as_str(), holder.value.as_slice()),
        ("next", long.as_slice())
    );
    assert!(next.release().await.expect("release"));
    drop(g);
    assert_eq!(
        h.lock.inspect(&name).await.expect("inspect").holder,
        None,
        "a free lock has no holder"
    );
}

/// Six candidates on two clients campaign over and over: never two
/// leaders at once, and terms rise strictly in the order leaders won.
pub async fn one_leader_at_a_time_and_terms_rise(h: Harness) {
    const CANDIDATES: usize = 6;
    const WINS: usize = 3;
    let (a, b) = election(&h, "one-leader");
    if !offered_or_refused(&h, &a).await {
        return;
    }
    let leading = Arc::new(Mutex::new((0usize, Vec::<u64>::new())));
    let mut tasks = Vec::new();
    for c in 0..CANDIDATES {
        let e = if c % 2 == 0 { a.clone() } else { b.clone() };
        let o = opts(
            Duration::from_secs(10),
            Wait::UpTo(Duration::from_secs(60)),
            true,
            &h,
        )
        .identity(format!("candidate-{c}"));
        let leading = Arc::clone(&leading);
        tasks.push(tokio::spawn(async move {
            for _ in 0..WINS {
                let l = e.campaign(format!("c{c}"), &o).await.expect("campaign");
                {
                    let mut s = leading.lock().expect("state");
                    s.0 += 1;
                    assert_eq!(s.0, 1, "two leaders at once");
                    s.1.push(l.term());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                leading.lock().expect("state").0 -= 1;
                assert!(
                    l.resign().await.expect("resign"),
                    "resigned while not leader"
                );
            }
        }));
    }
    for t in tasks {
        t.await.expect("candidate");
    }
    let terms = leading.lock().expect("state").1.clone();
    assert_eq!(terms.len(), CANDIDATES * WINS);
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms out of order: {terms:?}"
    );
}

/// `leader()` and an observer see the leader's identity and value;
/// `proclaim` is seen with the same term; `resign` hands over to a
/// waiting candidate with a higher term, and the observer sees that too.
pub async fn proclaim_and_resign_are_observed(h: Harness) {
    let (a, b) = election(&h, "proclaim");
    if !offered_or_refused(&h, &a).await {
        return;
    }
    assert_eq!(b.leader().await.expect("leader"), None);
    let o = opts(
        Duration::from_secs(20),
        Wait::UpTo(Duration::from_secs(30)),
        true,
        &h,
    );
    let mut first = a
        .campaign("10.0.0.1:80", &o.clone().identity("node-a"))
        .await
        .expect("campaign");
    let mut events = Box::pin(b.observe());
    let seen = next_change(&mut events)
        .await
        .expect("the current leader first");
    assert_eq!(
        (seen.term, seen.identity.as_str(), seen.value.as_slice()),
        (first.term(), "node-a", &b"10.0.0.1:80"[..])
    );
    first.proclaim("10.0.0.1:81").await.expect("proclaim");
    assert_eq!(first.value(), b"10.0.0.1:81");
    let seen = next_change(&mut events).await.expect("still a leader");
    assert_eq!(
        (seen.term, seen.value.as_slice()),
        (first.term(), &b"10.0.0.1:81"[..])
    );

    let waiting = tokio::spawn({
        let (b, o) = (b.clone(), o.clone().identity("node-b"));
        async move { b.campaign("10.0.0.2:80", &o).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "a second leader while the first leads"
    );
    let term_a = first.term();
    assert!(first.resign().await.expect("resign"), "was leader");
    let second = tokio::time::timeout(SLACK * 2, waiting)
        .await
        .expect("the waiting candidate wins after the resignation")
        .expect("task")
        .expect("campaign");
    assert!(second.term() > term_a, "{} after {term_a}", second.term());
    let mut saw_b = false;
    while !saw_b {
        match next_change(&mut events).await {
            None => {}
            Some(l) => {
                assert!(l.term >= term_a, "an observer went back to term {}", l.term);
                saw_b = l.term == second.term();
                if saw_b {
                    assert_eq!(l.identity, "node-b");
                }
            }
        }
    }
    let now = a.leader().await.expect("leader").expect("b leads");
    assert_eq!(
        (now.term, now.value.as_slice()),
        (second.term(), &b"10.0.0.2:80"[..])
    );
    assert!(second.resign().await.expect("resign"));
    assert_eq!(
        next_change(&mut events).await,
        None,
        "no leader after the last resignation"
    );
    assert_eq!(a.leader().await.expect("leader"), None);
}

/// The observer's next item, within a few seconds.
async fn next_change<S>(events: &mut S) -> Option<Leader>
where
    S: Stream<Item = Result<Option<Leader>, LockError>> + Unpin,
{
    tokio::time::timeout(SLACK * 4, events.next())
        .await
        .expect("an observer sees the change")
        .expect("the stream never ends")
        .expect("no read error")
}

/// A resigned or taken-over leader can no longer proclaim: a typed error,
/// and nothing changes for the new leader.
pub async fn a_former_leader_cannot_proclaim(h: Harness) {
    let (a, b) = election(&h, "former");
    if !offered_or_refused(&h, &a).await {
        return;
    }
    let o = opts(Duration::from_secs(20), Wait::UpTo(SLACK * 2), true, &h);
    let mut old = a.campaign("old", &o).await.expect("campaign");
    h.hook.take_away(a.lock_name()).await.expect("fault hook");
    let new = b
        .campaign("new", &o)
        .await
        .expect("campaign after the take-away");
    let refused = old.proclaim("stale").await;
    assert!(
        matches!(
            refused,
            Err(LockError::NotHeld { .. } | LockError::Lost { .. })
        ),
        "{refused:?}"
    );
    assert!(old.is_lost().is_some());
    let leader = b.leader().await.expect("leader").expect("new leads");
    assert_eq!(
        (leader.term, leader.value.as_slice()),
        (new.term(), &b"new"[..])
    );
    assert!(
        !old.resign().await.expect("resign"),
        "resigned someone else's term"
    );
    assert!(new.resign().await.expect("resign"));
}

/// A leader that stops renewing (frozen) learns it lost leadership before
/// another candidate wins; one that vanishes (killed, its guard leaked)
/// is replaced once its lease runs out, with a higher term.
pub async fn a_silent_leader_is_replaced_and_knows_first(h: Harness) {
    let (a, b) = election(&h, "silent");
    if !offered_or_refused(&h, &a).await {
        return;
    }
    let ttl = Duration::from_secs(2).max(h.lock.capabilities().min_lease);
    let frozen = a
        .campaign("a", &opts(ttl, Wait::No, false, &h))
        .await
        .expect("campaign");
    let won = b
        .campaign("b", &opts(ttl, Wait::UpTo(ttl + SLACK * 2), false, &h))
        .await
        .expect("the successor wins after the lease");
    assert!(
        frozen.is_lost().is_some(),
        "the frozen leader still believed it led when the successor won"
    );
    assert!(won.term() > frozen.term());
    drop(frozen);

    // Killed: no renewal, no release, no resignation.
    let start = Instant::now();
    std::mem::forget(won);
    let next = a
        .campaign("a2", &opts(ttl, Wait::UpTo(ttl * 2 + SLACK * 2), true, &h))
        .await
        .expect("a vanished leader is replaced");
    assert!(start.elapsed() < ttl * 2 + SLACK * 2);
    assert!(next.resign().await.expect("resign"));
}

/// Observers see terms in order, every leadership that lasts longer than
/// a few poll intervals, and `None` between leaders.
pub async fn observers_see_every_term_in_order(h: Harness) {
    let (a, b) = election(&h, "observe");
    if !offered_or_refused(&h, &a).await {
        return;
    }
    let o = opts(Duration::from_secs(20), Wait::UpTo(SLACK * 2), true, &h);
    let first = a.campaign("0", &o).await.expect("campaign");
    let events = b.observe();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let watcher = tokio::spawn({
        let seen = Arc::clone(&seen);
        async move {
            let mut events = Box::pin(events);
            while let Some(item) = events.next().await {
                let item = item.expect("no read error");
                seen.lock().expect("seen").push(item.map(|l| l.term));
            }
        }
    });
    let hold = POLL * 6 + Duration::from_millis(200);
    tokio::time::sleep(hold).await;
    let mut terms = vec![first.term()];
    assert!(first.resign().await.expect("resign"));
    for round in 1..4 {
        tokio::time::sleep(hold).await;
        let e = if round % 2 == 0 { &a } else { &b };
        let l = e.campaign(round.to_string(), &o).await.expect("campaign");
        terms.push(l.term());
        tokio::time::sleep(hold).await;
        assert!(l.resign().await.expect("resign"));
    }
    tokio::time::sleep(hold).await;
    watcher.abort();
    let seen = seen.lock().expect("seen").clone();
    let mut expected = Vec::new();
    for t in &terms {
        expected.push(Some(*t));
        expected.push(None);
    }
    assert_eq!(seen, expected, "observed {seen:?} for terms {terms:?}");
}

/// Where the capabilities say the server notifies observers
/// (`observers: Notified`), an observer that would read again only every
/// minute sees a new leader, a proclaimed value and a resignation within
/// seconds: it was woken. Where they say `Polling`, the backend offers no
/// notifications ([`DistributedLock::changes`](lock_core::DistributedLock::changes) is `None`).
pub async fn observers_are_woken_by_the_server_where_it_notifies(h: Harness) {
    const REREAD: Duration = Duration::from_secs(60);
    const WOKEN: Duration = Duration::from_secs(10);
    let name = unique_name("woken");
    let caps = h.lock.capabilities();
    if caps.observers != Waiting::Notified {
        let changes = h.lock.changes(&name).await.expect("changes");
        assert!(
            changes.is_none(),
            "{}: observers: Polling, yet notifications are offered",
            caps.backend
        );
        return;
    }
    let a = Election::new(h.lock.clone(), name.clone());
    if !offered_or_refused(&h, &a).await {
        return;
    }
    let b = Election::new(h.other.clone(), name).poll_interval(REREAD);
    let mut events = Box::pin(b.observe());
    let first = tokio::time::timeout(WOKEN, events.next()).await;
    assert!(
        matches!(first, Ok(Some(Ok(None)))),
        "the first state, no leader: {first:?}"
    );
    let o = opts(Duration::from_secs(20), Wait::No, true, &h);
    let mut leadership = a.campaign("v1", &o).await.expect("campaign");
    let mut next = async || {
        let started = Instant::now();
        let item = tokio::time::timeout(WOKEN, events.next())
            .await
            .unwrap_or_else(|_| panic!("{}: no notification within {WOKEN:?}", caps.backend))
            .expect("the stream goes on")
            .expect("no read error");
        (item, started.elapsed())
    };
    let (seen, after) = next().await;
    assert_eq!(
        seen.as_ref().map(|l| (l.term, l.value.clone())),
        Some((leadership.term(), b"v1".to_vec())),
        "the new leader"
    );
    leadership.proclaim("v2").await.expect("proclaim");
    let (seen, _) = next().await;
    assert_eq!(seen.map(|l| l.value), Some(b"v2".to_vec()), "the new value");
    assert!(leadership.resign().await.expect("resign"));
    let (seen, _) = next().await;
    assert!(seen.is_none(), "no leader after the resignation: {seen:?}");
    eprintln!(
        "{}: an observer saw a new leader {after:?} after it won",
        caps.backend
    );
}

/// A leader that vanishes (killed: its guard leaked, no renewal, no
/// release) is seen to be gone by an observer once its lease runs out,
/// with no candidate left to win after it: where the server notifies
/// observers, by an observer that would otherwise read again only every
/// minute (a lease that runs out may send no notification: the observer
/// reads again when the lease it read ends); elsewhere by polling.
pub async fn observers_see_a_lapsed_lease_end_the_leadership(h: Harness) {
    const REREAD: Duration = Duration::from_secs(60);
    let name = unique_name("lapsed");
    let a = Election::new(h.lock.clone(), name.clone());
    if !offered_or_refused(&h, &a).await {
        return;
    }
    let caps = h.lock.capabilities();
    let every = if caps.observers == Waiting::Notified {
        REREAD
    } else {
        POLL
    };
    let b = Election::new(h.other.clone(), name).poll_interval(every);
    let mut events = Box::pin(b.observe());
    let first = tokio::time::timeout(SLACK * 4, events.next()).await;
    assert!(
        matches!(first, Ok(Some(Ok(None)))),
        "the first state, no leader: {first:?}"
    );
    let ttl = Duration::from_secs(2).max(caps.min_lease);
    let leadership = a
        .campaign("v", &opts(ttl, Wait::No, false, &h))
        .await
        .expect("campaign");
    let won = Instant::now();
    let term = leadership.term();
    std::mem::forget(leadership);
    let seen = next_change(&mut events).await;
    assert_eq!(seen.map(|l| l.term), Some(term), "the new leader");
    let bound = ttl + SLACK * 2;
    let seen = tokio::time::timeout(bound, next_change(&mut events))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{}: the leader's lease ran out {ttl:?} after it won, and {:?} after the win an observer still saw it lead",
                caps.backend,
                won.elapsed()
            )
        });
    assert!(seen.is_none(), "no leader once the lease ran out: {seen:?}");
}

/// A campaign cancelled while it waits (dropped at any point) leaves no
/// candidate behind: once the leader resigns, a newcomer wins at once.
pub async fn a_cancelled_campaign_leaves_no_candidate(h: Harness) {
    let (a, b) = election(&h, "cancel");
    if !offered_or_refused(&h, &a).await {
        return;
    }
    let o = opts(
        Duration::from_secs(20),
        Wait::UpTo(Duration::from_secs(30)),
        true,
        &h,
    );
    let leader = a.campaign("a", &o).await.expect("campaign");
    for after in [0u64, 1, 5, 30, 150] {
        let cancelled =
            tokio::time::timeout(Duration::from_millis(after), b.campaign("b", &o)).await;
        assert!(cancelled.is_err(), "won while another led");
    }
    assert!(leader.resign().await.expect("resign"));
    let newcomer = tokio::time::timeout(SLACK * 2, async {
        loop {
            if let Some(l) = a.try_campaign("c", &o).await.expect("try_campaign") {
                return l;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a cancelled candidate held the election");
    let leader = b
        .leader()
        .await
        .expect("leader")
        .expect("the newcomer leads");
    assert_eq!(
        (leader.term, leader.value.as_slice()),
        (newcomer.term(), &b"c"[..])
    );
    assert!(newcomer.resign().await.expect("resign"));
}

/// An election and a plain lock of the same name are apart: a campaign
/// wins at once while the lock is held, the lock is granted while the
/// election has a leader, and each reads as itself. The election's lock is
/// `election/NAME`, which an operator can read.
pub async fn an_election_and_a_lock_of_the_same_name_are_apart(h: Harness) {
    let (a, b) = election(&h, "apart");
    if !offered_or_refused(&h, &a).await {
        return;
    }
    let o = opts(
        Duration::from_secs(20),
        Wait::UpTo(Duration::from_secs(3)),
        true,
        &h,
    );
    let plain = h
        .other
        .try_acquire(a.name(), &o.clone().value("plain"))
        .await
        .expect("lock")
        .expect("the plain lock is free");
    let leader = a
        .campaign("leader", &o)
        .await
        .expect("a campaign does not wait behind the plain lock of its name");
    assert_eq!(leader.name(), a.name());
    let lock = h
        .lock
        .inspect(a.name())
        .await
        .expect("inspect")
        .holder
        .map(|h| h.value);
    assert_eq!(
        lock.as_deref(),
        Some(&b"plain"[..]),
        "the lock reads as itself"
    );
    let seen = b.leader().await.expect("leader").expect("a leader");
    assert_eq!(
        (seen.term, seen.value.as_slice()),
        (leader.term(), &b"leader"[..])
    );
    let through_lock = h.other.inspect(a.lock_name()).await.expect("inspect");
    assert_eq!(through_lock.fencing_token, Some(leader.term()));
    assert!(plain.release().await.expect("release"));
    let again = h
        .other
        .try_acquire(a.name(), &o)
        .await
        .expect("lock")
        .expect("the plain lock is granted while the election has a leader");
    assert!(again.release().await.expect("release"));
    assert!(leader.resign().await.expect("resign"));
}

/// `lead` runs the work with the term while leader and resigns after;
/// when leadership is lost, the work is cancelled and the loss reported.
pub async fn lead_runs_while_leader_and_stops_on_loss(h: Harness) {
    let (a, b) = election(&h, "lead");
    if !offered_or_refused(&h, &a).await {
        return;
    }
    let o = opts(Duration::from_secs(20), Wait::UpTo(SLACK * 2), true, &h);
    let done = a.lead("a", &o, async |term| term).await.expect("lead");
    let lock_core::Led::Finished(term) = done else {
        panic!("the work finished: {done:?}");
    };
    assert_eq!(
        b.leader().await.expect("leader"),
        None,
        "resigned after the work"
    );
    let name = a.lock_name().to_string();
    let hook = h.hook.clone();
    let led = a
        .lead("a", &o, async move |t| {
            assert!(t > term);
            hook.take_away(&name).await.expect("fault hook");
            std::future::pending::<()>().await
        })
        .await
        .expect("lead");
    assert!(matches!(led, lock_core::Led::Lost { .. }), "{led:?}");
}

/// The names every election case registers, in order; used by
/// [`conformance_suite!`](crate::conformance_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __election_cases {
    ($harness:expr) => {
        $crate::__conformance_cases!(@module election; $harness;
            inspect_shows_the_holder,
            one_leader_at_a_time_and_terms_rise,
            proclaim_and_resign_are_observed,
            a_former_leader_cannot_proclaim,
            a_silent_leader_is_replaced_and_knows_first,
            observers_see_every_term_in_order,
            a_cancelled_campaign_leaves_no_candidate,
            an_election_and_a_lock_of_the_same_name_are_apart,
            lead_runs_while_leader_and_stops_on_loss,
            observers_are_woken_by_the_server_where_it_notifies,
            observers_see_a_lapsed_lease_end_the_leadership,
        );
    };
}
