//! Faults against the etcd servers of `scripts/services.sh`: a holder
//! process killed with SIGKILL, the 3-member cluster losing its leader and
//! then its majority, leases revoked behind a holder's and a waiter's back;
//! the waiters' watches: one release wakes one waiter of sixteen; and a
//! lock taken through one member and extended at once through another.
//!
//! These tests stop servers, so they run one at a time (a shared mutex) in
//! this binary, apart from the conformance suite, and restart every member
//! when they end, even on failure.

use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::RawGuard;
use lock_core::{DistributedLock, Election, Leadership, LockError, LockOptions, LossReason, Wait};
use lock_etcd::EtcdLock;
use lock_testkit::faults::{
    Restore, acquires_again, env, one_at_a_time, services, unique, upstreams_of,
};
use tokio::sync::Mutex;
use tokio::time::Instant;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// `host:port` of each cluster member, in the order etcd1, etcd2, etcd3.
fn members() -> Vec<String> {
    upstreams_of(&env("DISTLOCK_TEST_ETCD_CLUSTER_URL"))
}

/// A client with a short session and short request timeouts.
/// The session TTL of the test clients.
const SESSION: Duration = Duration::from_secs(3);

/// In the cluster test, a session outlasts an election comfortably: a
/// leader's death stops keep-alives for up to about two election timeouts,
/// and a session whose keep-alives fail past its validity deadline is
/// (rightly) given up as lost.
const CLUSTER_SESSION: Duration = Duration::from_secs(6);

async fn client(base: &str) -> EtcdLock {
    client_with(base, SESSION).await
}

async fn client_with(base: &str, session: Duration) -> EtcdLock {
    let url = format!(
        "{base}?session_ttl_s={}&request_timeout_ms=1000&connect_timeout_ms=1000",
        session.as_secs()
    );
    EtcdLock::connect(&url).await.expect("connect")
}

/// The session's TTL with auto-renewal: the lock lives on the session.
fn on_session(session: Duration) -> LockOptions {
    LockOptions::new().ttl(session).wait(Wait::No)
}

fn session_opts() -> LockOptions {
    on_session(SESSION)
}

/// The member (1-based) that currently leads the cluster.
async fn leader() -> usize {
    for _ in 0..50 {
        for (i, member) in members().iter().enumerate() {
            let Ok(mut c) = etcd_client::Client::connect([format!("http://{member}")], None).await
            else {
                continue;
            };
            if let Ok(status) = c.status().await
                && status
                    .header()
                    .is_some_and(|h| h.member_id() == status.leader())
            {
                return i + 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("no etcd member says it leads");
}

/// See `lock_testkit::faults::killed_holder_frees_the_lock`: the session lease (3 s)
/// frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_frees_the_lock_within_its_session_ttl() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::killed_holder_frees_the_lock(
        "a_killed_holder_frees_the_lock_within_its_session_ttl",
        async || client(&env("DISTLOCK_TEST_ETCD_URL")).await,
        session_opts(),
        SESSION,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_survives_its_leader_and_reports_the_loss_of_its_majority() {
    let _serial = one_at_a_time(&SERIAL).await;
    let _restore = Restore::servers(["etcd1", "etcd2", "etcd3"]);
    let cluster = env("DISTLOCK_TEST_ETCD_CLUSTER_URL");
    let (locks, other) = (
        client_with(&cluster, CLUSTER_SESSION).await,
        client_with(&cluster, CLUSTER_SESSION).await,
    );
    assert!(
        locks.capabilities().survives_server_failure,
        "this test proves the claim `survives_server_failure`; the backend must make it"
    );
    let name = unique("leader");
    let holder = locks
        .acquire(&name, &on_session(CLUSTER_SESSION))
        .await
        .expect("acquire");
    let first = holder.fencing_token().expect("token");
    let waiter = tokio::spawn({
        let (other, name) = (other.clone(), name.clone());
        async move {
            let o = on_session(CLUSTER_SESSION).wait_timeout(Duration::from_secs(30));
            other.acquire(&name, &o).await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The leader dies: a new one is elected; the session and the lock live on.
    let old_leader = leader().await;
    services(&["kill", &format!("etcd{old_leader}")]);
    tokio::time::sleep(CLUSTER_SESSION).await;
    assert_eq!(holder.is_lost(), None, "losing the leader cost the lock");
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    let start = Instant::now();
    assert!(holder.release().await.expect("release after the election"));
    let handed = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was woken")
        .expect("waiter task")
        .expect("the waiter acquired");
    let handoff = start.elapsed();
    assert!(handed.fencing_token().expect("token") > first);

    // A second member dies: no majority. Requests fail promptly with
    // Unavailable, and the held lock's lost() fires by its deadline.
    let watcher = tokio::spawn(async move {
        let reason = handed.lost().await;
        (reason, Instant::now(), handed)
    });
    let second = (1..=3).find(|&m| m != old_leader).expect("another member");
    services(&["kill", &format!("etcd{second}")]);
    let start = Instant::now();
    let refused = locks
        .try_acquire(&unique("no-majority"), &on_session(CLUSTER_SESSION))
        .await;
    let failed_after = start.elapsed();
    assert!(
        matches!(refused, Err(LockError::Unavailable { .. })),
        "expected Unavailable without a majority, got {refused:?}"
    );
    assert!(failed_after < Duration::from_secs(5), "{failed_after:?}");
    let (reason, fired, handed) = tokio::time::timeout(CLUSTER_SESSION * 3, watcher)
        .await
        .expect("lost() fired")
        .expect("watcher");
    let deadline = handed.validity_deadline().expect("deadline");
    let late = fired.saturating_duration_since(deadline);
    assert!(
        matches!(reason, LossReason::DeadlinePassed | LossReason::TakenOver),
        "{reason:?}"
    );
    // Before the session lease (a safety margin past the deadline) ends,
    // so before anyone else could be granted the lock.
    let margin = handed.lease().safety_margin();
    assert!(
        late < margin,
        "lost() fired {late:?} after the deadline, after the session lease ({margin:?} past it) had run out"
    );
    eprintln!(
        "etcd faults: hand-off after a leader kill {handoff:?}; without a majority Unavailable after {failed_after:?}; lost() {late:?} after the validity deadline"
    );

    // The members come back: the same clients work again.
    services(&["start", &format!("etcd{old_leader}")]);
    services(&["start", &format!("etcd{second}")]);
    let recovered = acquires_again(&other, &session_opts(), Duration::from_secs(20)).await;
    eprintln!("etcd faults: recovered {:?} after the restart", recovered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_session_fires_lost_and_the_next_token_is_larger() {
    let _serial = one_at_a_time(&SERIAL).await;
    let base = env("DISTLOCK_TEST_ETCD_URL");
    let (locks, other) = (client(&base).await, client(&base).await);
    let name = unique("revoked");
    let g = locks
        .acquire(&name, &session_opts())
        .await
        .expect("acquire");
    let also = locks
        .acquire(&unique("same-session"), &session_opts())
        .await
        .expect("acquire");
    assert!(locks.force_release(&name).await.expect("revoke"));
    let start = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost() fires");
    assert_eq!(reason, LossReason::TakenOver);
    // Every guard of the revoked session is lost, not just this one (the
    // session marks them one after another: allow it a moment).
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(1), also.lost())
            .await
            .expect("a guard on the same session survived"),
        LossReason::TakenOver
    );
    eprintln!(
        "etcd faults: lost() {:?} after the session lease was revoked",
        start.elapsed()
    );
    let next = other
        .try_acquire(&name, &session_opts())
        .await
        .expect("try")
        .expect("free after the revoke");
    assert!(next.fencing_token() > g.fencing_token());
    assert!(
        !g.release().await.expect("release"),
        "a revoked lock is not held"
    );
    // The client starts a fresh session for new locks.
    let fresh = locks
        .try_acquire(&unique("fresh"), &session_opts())
        .await
        .expect("try")
        .expect("a new session");
    assert_eq!(fresh.is_lost(), None);
    assert!(fresh.release().await.expect("release"));
    assert!(next.release().await.expect("release"));
}

/// A waiter whose lease goes while it queues (revoked here; a partition
/// longer than its TTL does the same) never reports a grant on the lost
/// key: it queues again on a fresh lease, within its wait, and is granted
/// once the holder releases, with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_lease_expires_while_queued_queues_again() {
    waiter_whose_lease_expires(false).await;
}

/// The etcd#19597 case: a candidate whose session (lease) goes while it
/// campaigns never reports a leadership on it; it campaigns again on a
/// fresh lease, within its wait, and wins with a higher term that the
/// election shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_whose_session_expires_mid_campaign_never_believes_it_leads() {
    waiter_whose_lease_expires(true).await;
}

/// A waiter (a candidate, if `campaign`) queued behind a holder has its
/// lease revoked; the holder releases.
async fn waiter_whose_lease_expires(campaign: bool) {
    let _serial = one_at_a_time(&SERIAL).await;
    let base = env("DISTLOCK_TEST_ETCD_URL");
    let (locks, other) = (client(&base).await, client(&base).await);
    let name = unique("queued");
    // A candidate queues behind the election's lock.
    let lock_name = match campaign {
        true => format!("{}{name}", lock_core::ELECTION_PREFIX),
        false => name.clone(),
    };
    let holder = locks
        .acquire(&lock_name, &session_opts())
        .await
        .expect("acquire");
    let holder_token = holder.fencing_token();
    let waiter = tokio::spawn({
        let (other, name) = (other.clone(), name.clone());
        async move {
            let o = LockOptions::new()
                .ttl(Duration::from_secs(3))
                .wait_timeout(Duration::from_secs(20));
            if campaign {
                Election::new(Arc::new(other), name)
                    .campaign("candidate", &o)
                    .await
                    .map(Leadership::into_guard)
            } else {
                other.acquire(&name, &o).await
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Revoke the waiter's lease (its key is the second in line).
    let mut raw = etcd_client::Client::connect([base.replace("etcd://", "http://")], None)
        .await
        .expect("raw client");
    let dir = format!(
        "/distlock/{}/",
        lock_name.replace('%', "%25").replace('/', "%2F")
    );
    let queue = raw
        .get(
            dir.as_str(),
            Some(etcd_client::GetOptions::new().with_prefix().with_sort(
                etcd_client::SortTarget::Create,
                etcd_client::SortOrder::Ascend,
            )),
        )
        .await
        .expect("read the queue");
    assert_eq!(queue.kvs().len(), 2, "holder and waiter");
    raw.lease_revoke(queue.kvs()[1].lease())
        .await
        .expect("revoke the waiter's lease");
    assert!(holder.release().await.expect("release"));
    let outcome = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter finished")
        .expect("waiter task");
    let g = outcome.expect("the waiter queues again and is granted");
    assert!(g.is_lost().is_none(), "granted on a live lease");
    assert!(g.fencing_token() > holder_token);
    if campaign {
        lock_testkit::faults::assert_election_shows(
            Arc::new(locks.clone()),
            &name,
            &g,
            b"candidate",
        )
        .await;
    }
    assert!(
        locks
            .try_acquire(&lock_name, &session_opts())
            .await
            .expect("try")
            .is_none(),
        "the re-queued waiter holds the lock"
    );
    assert!(g.release().await.expect("release"));
}

/// See `lock_testkit::faults::server_failure_gives_transient_errors`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_failure_gives_transient_errors() {
    let _serial = one_at_a_time(&SERIAL).await;
    let base = env("DISTLOCK_TEST_ETCD_URL");
    lock_testkit::faults::server_failure_gives_transient_errors(
        async || client(&base).await,
        &["etcd"],
        session_opts(),
    )
    .await;
}

/// See `lock_testkit::faults::frozen_server_bounds_waits_and_releases`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_server_bounds_waits_and_releases() {
    let _serial = one_at_a_time(&SERIAL).await;
    let base = env("DISTLOCK_TEST_ETCD_URL");
    lock_testkit::faults::frozen_server_bounds_waits_and_releases(
        async || client(&base).await,
        &["etcd"],
        session_opts(),
    )
    .await;
}

/// See `lock_testkit::faults::frozen_holder_loses_its_lock_to_a_later_token`: the
/// session's lease (3 s) runs out without keep-alives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_loses_its_lock_to_a_later_token() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::frozen_holder_loses_its_lock_to_a_later_token(
        "a_frozen_holder_loses_its_lock_to_a_later_token",
        async || client(&env("DISTLOCK_TEST_ETCD_URL")).await,
        session_opts(),
        SESSION,
    )
    .await;
}

/// See `lock_testkit::faults::a_grant_answered_past_its_deadline_is_not_handed_out`:
/// a lease of the lock's own (2 s), its grant answered 2.5 s after the
/// request (the client's requests bounded by 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_answered_past_its_deadline_is_not_handed_out() {
    let _serial = one_at_a_time(&SERIAL).await;
    let url = format!("{}?request_timeout_ms=10000", env("DISTLOCK_TEST_ETCD_URL"));
    lock_testkit::faults::a_grant_answered_past_its_deadline_is_not_handed_out(
        async || EtcdLock::connect(&url).await.expect("connect"),
        &["etcd"],
        LockOptions::new().ttl(Duration::from_secs(2)),
        Duration::from_millis(2500),
    )
    .await;
}

/// The watch events the etcd server at `base` has sent, from its own
/// counter (`etcd_debugging_mvcc_events_total` on `/metrics`).
fn events_sent(base: &str) -> u64 {
    use std::io::{Read, Write};
    let addr = upstreams_of(base).remove(0);
    let mut conn = std::net::TcpStream::connect(&addr).expect("connect for /metrics");
    write!(
        conn,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("request /metrics");
    let mut report = String::new();
    conn.read_to_string(&mut report).expect("read /metrics");
    report
        .lines()
        .find_map(|line| line.strip_prefix("etcd_debugging_mvcc_events_total "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map(|value| value as u64)
        .expect("etcd_debugging_mvcc_events_total in /metrics")
}

/// 16 waiters on four clients, each watching only the key just before its
/// own: one release sends one watch event and wakes one waiter, not the
/// herd (counted by the server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_wakes_one_waiter() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let _serial = one_at_a_time(&SERIAL).await;
    let base = env("DISTLOCK_TEST_ETCD_URL");
    let name = unique("herd");
    let locks = client(&base).await;
    let holder = locks
        .acquire(&name, &session_opts())
        .await
        .expect("acquire");
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&base).await);
    }
    let granted = Arc::new(AtomicUsize::new(0));
    let mut waiters = Vec::new();
    for i in 0..16 {
        let (other, name, granted) = (clients[i % 4].clone(), name.clone(), granted.clone());
        waiters.push(tokio::spawn(async move {
            let o = on_session(SESSION).wait_timeout(Duration::from_secs(60));
            let g = other.acquire(&name, &o).await.expect("waiter acquires");
            granted.fetch_add(1, Ordering::SeqCst);
            // Hold until the test has counted, then pass it on.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            g.release().await.expect("release");
        }));
        // Queue in a known order.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let queued_by = Instant::now() + Duration::from_secs(10);
    while locks.queued(&name).await.expect("queued") < 16 {
        assert!(Instant::now() < queued_by, "the 16 waiters never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every waiter's watch is in place once its reads are done.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = events_sent(&base);
    assert!(holder.release().await.expect("release"));
    let granted_by = Instant::now() + Duration::from_secs(5);
    while granted.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < granted_by,
            "no waiter was granted the lock"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = events_sent(&base) - before;
    assert_eq!(
        granted.load(Ordering::SeqCst),
        1,
        "exactly one waiter got the lock"
    );
    assert_eq!(sent, 1, "one release sent {sent} watch events");
    eprintln!("etcd faults: 16 waiters; one release sent {sent} watch event and woke 1 waiter");
    for w in waiters {
        w.abort();
    }
}

/// A lock taken through one member and extended at once through another:
/// the extension checks our key on a member that may not have applied its
/// put yet, so the check must be linearizable. Sixteen clients, each
/// balanced over a follower and the leader, take a lock on a lease of its
/// own and extend it at once, a hundred times each: no `extend` of a lock
/// still held says it is not held. (With the check as a transaction of
/// one comparison, served from the member's own store, 12 to 31 of the
/// 1 600 extends were refused in each of four runs.) A request the loaded
/// cluster does not answer within the client's timeout is transient
/// (`Unavailable`), not a refusal: an acquisition is asked again, an
/// extension or a release that timed out is counted and left to the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_through_one_member_is_extended_through_another() {
    let _serial = one_at_a_time(&SERIAL).await;
    let leading = leader().await;
    let members = members();
    let leader_at = &members[leading - 1];
    let follower_and_leader: Vec<String> = members
        .iter()
        .enumerate()
        .filter(|(i, _)| i + 1 != leading)
        .map(|(_, m)| format!("etcd://{m},{leader_at}"))
        .collect();
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(2))
        .auto_renew(false)
        .wait(Wait::No);
    let mut tasks = Vec::new();
    for i in 0..16 {
        let lock = client(&follower_and_leader[i % follower_and_leader.len()]).await;
        let opts = opts.clone();
        tasks.push(tokio::spawn(async move {
            let (mut refused, mut extended, mut timed_out) = (0, 0, 0);
            for _ in 0..100 {
                let name = unique("extended-at-once");
                let mut asked = 0;
                let g = loop {
                    match lock.acquire(&name, &opts).await {
                        Ok(g) => break g,
                        Err(e) if e.is_transient() && asked < 5 => {
                            asked += 1;
                            timed_out += 1;
                        }
                        Err(e) => panic!("acquire: {e}"),
                    }
                };
                match g.extend(Duration::from_secs(2)).await {
                    Ok(_) => extended += 1,
                    Err(LockError::NotHeld { .. }) => refused += 1,
                    Err(e) if e.is_transient() => timed_out += 1,
                    Err(e) => panic!("extend: {e}"),
                }
                match g.release().await {
                    Ok(_) => {}
                    Err(e) if e.is_transient() => timed_out += 1,
                    Err(e) => panic!("release: {e}"),
                }
            }
            (refused, extended, timed_out)
        }));
    }
    let (mut refused, mut extended, mut timed_out) = (0, 0, 0);
    for t in tasks {
        let (r, e, t) = t.await.expect("client task");
        refused += r;
        extended += e;
        timed_out += t;
    }
    eprintln!(
        "etcd faults: {extended} extends at once through another member, \
         {refused} refused, {timed_out} requests timed out"
    );
    assert_eq!(refused, 0, "extends of held locks refused as not held");
    assert!(
        extended >= 1_400,
        "only {extended} of 1 600 extends were answered"
    );
}
