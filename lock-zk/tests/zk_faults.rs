//! ZooKeeper faults: a holder process killed with SIGKILL frees its lock
//! when its session expires; a frozen server makes the holder suspect, then
//! confirm, its loss, and the client recovers on a new session; a waiter
//! whose session expires queues again on a new one; 16 waiters set 16
//! watches and one release fires one; the ensemble outlives its leader; a
//! holder frozen past its session knows at once, on resuming, that its
//! lock is lost, and a guard's deadline never outlasts its session; an
//! operator on a lagging follower still sees the latest grant.
//!
//! The freeze stops the standalone server, so these tests run one at a time
//! (a shared mutex) in this binary, apart from the conformance suite.

use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::RawGuard;
use lock_core::{DistributedLock, Election, Leadership, LockOptions, Wait};
use lock_testkit::faults::{
    announce_token, env, holder_role, one_at_a_time, spawn_holder, unique, upstreams_of,
};
use lock_zk::ZkLock;
use tokio::sync::Mutex;
use tokio::time::Instant;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// The session timeout of the test clients.
const SESSION: Duration = Duration::from_secs(2);

async fn client() -> ZkLock {
    ZkLock::connect(&format!(
        "{}?session_timeout_ms={}",
        env("DISTLOCK_TEST_ZK_URL"),
        SESSION.as_millis()
    ))
    .await
    .expect("connect")
}

/// See `lock_testkit::faults::killed_holder_frees_the_lock`: the session (2 s) frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_frees_the_lock_when_its_session_expires() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::killed_holder_frees_the_lock(
        "a_killed_holder_frees_the_lock_when_its_session_expires",
        client,
        LockOptions::new(),
        SESSION,
    )
    .await;
}

/// The standalone server is frozen (SIGSTOP) past the session timeout: the
/// holder sees a suspected loss at once, then a confirmed one when the
/// thawed server expires the session, and the same client acquires again
/// on a fresh session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_suspends_then_expires_and_the_client_recovers() {
    use lock_core::{LossKind, LossReason};
    use lock_testkit::faults::{Restore, services};
    let _serial = one_at_a_time(&SERIAL).await;
    let locks = client().await;
    let name = unique("frozen");
    let g = locks
        .acquire(&name, &LockOptions::new().wait(Wait::No))
        .await
        .expect("acquire");
    let _restore = Restore::servers(["zk"]);
    services(&["pause", "zk"]);
    let paused_at = Instant::now();
    let suspected = tokio::time::timeout(SESSION * 3, g.lost())
        .await
        .expect("lost() fires while the server is frozen");
    assert_eq!(suspected.kind(), LossKind::Suspected, "{suspected:?}");
    let suspected_after = paused_at.elapsed();
    tokio::time::sleep(SESSION * 2).await;
    services(&["resume", "zk"]);
    let resumed_at = Instant::now();
    let (confirmed, confirmed_after) = loop {
        if let Some(reason) = g.is_lost()
            && reason.kind() == LossKind::Confirmed
        {
            break (reason, resumed_at.elapsed());
        }
        assert!(
            resumed_at.elapsed() < SESSION * 5,
            "no confirmed loss after the thaw: {:?}",
            g.is_lost()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        matches!(confirmed, LossReason::ConnectionLost { .. }),
        "{confirmed:?}"
    );
    let start = Instant::now();
    let again = loop {
        match locks
            .try_acquire(&unique("after-expiry"), &LockOptions::new().wait(Wait::No))
            .await
        {
            Ok(Some(g)) => break g,
            other => assert!(start.elapsed() < SESSION * 5, "no recovery: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(again.release().await.expect("release"));
    eprintln!(
        "zk faults: suspected loss {suspected_after:?} after the freeze; confirmed loss seen {confirmed_after:?} after the thaw (the freeze lasted twice the session timeout); new session in {:?}",
        start.elapsed()
    );
}

/// A waiter whose session expires (the standalone server frozen past the
/// session timeout, so the holder's session goes too) joins the queue again
/// on a fresh session and gets the lock, within its wait, without the
/// caller doing anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_outlives_the_expiry_of_its_session() {
    waiter_whose_session_expires(false).await;
}

/// The etcd#19597 case on ZooKeeper: a candidate whose session expires
/// while it campaigns never reports a leadership on it; it campaigns again
/// on a fresh session, within its wait, and wins with a higher term that
/// the election shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_whose_session_expires_mid_campaign_never_believes_it_leads() {
    waiter_whose_session_expires(true).await;
}

/// A waiter (a candidate, if `campaign`) queued behind a holder; the
/// server is frozen past the session timeout.
async fn waiter_whose_session_expires(campaign: bool) {
    use lock_testkit::faults::{Restore, services};
    let _serial = one_at_a_time(&SERIAL).await;
    let name = unique("waiter-expiry");
    let (holder_client, waiter_client) = (client().await, client().await);
    // A candidate queues behind the election's lock.
    let lock_name = match campaign {
        true => format!("{}{name}", lock_core::ELECTION_PREFIX),
        false => name.clone(),
    };
    let holder = holder_client
        .acquire(&lock_name, &LockOptions::new().wait(Wait::No))
        .await
        .expect("acquire");
    let first = holder.fencing_token().expect("token");
    let waiting = tokio::spawn({
        let name = name.clone();
        async move {
            let o = LockOptions::new().wait_timeout(SESSION * 10);
            if campaign {
                Election::new(Arc::new(waiter_client), name)
                    .campaign("candidate", &o)
                    .await
                    .map(Leadership::into_guard)
            } else {
                waiter_client.acquire(&name, &o).await
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _restore = Restore::servers(["zk"]);
    services(&["pause", "zk"]);
    tokio::time::sleep(SESSION * 2).await;
    services(&["resume", "zk"]);
    let resumed_at = Instant::now();
    let g = waiting
        .await
        .expect("waiter task")
        .expect("the waiter acquires on a fresh session");
    let after = resumed_at.elapsed();
    assert!(g.fencing_token().expect("token") > first);
    assert!(
        holder.is_lost().is_some(),
        "the holder's session expired too"
    );
    assert!(
        g.is_lost().is_none(),
        "granted on a live session: {:?} (waited {after:?})",
        g.is_lost()
    );
    if campaign {
        lock_testkit::faults::assert_election_shows(
            Arc::new(client().await),
            &name,
            &g,
            b"candidate",
        )
        .await;
    }
    assert!(g.release().await.expect("release"));
    eprintln!("zk faults: a waiter whose session expired got the lock {after:?} after the thaw");
}

/// The watches (one per watching session) set on nodes of lock `name`,
/// from the standalone server's `wchp` report (watched paths, each followed
/// by the sessions watching it).
fn watches_on(name: &str) -> usize {
    use std::io::{Read, Write};
    let addr = upstreams_of(&env("DISTLOCK_TEST_ZK_URL")).remove(0);
    let mut conn = std::net::TcpStream::connect(addr).expect("connect for wchp");
    conn.write_all(b"wchp").expect("wchp");
    let mut report = String::new();
    conn.read_to_string(&mut report).expect("read wchp");
    // The lock's node, as the backend encodes it (no byte of these test
    // names needs escaping but `/`).
    let dir = format!("/distlock/n{}/", name.replace('/', "%2F"));
    let mut on_ours = false;
    let mut count = 0;
    for line in report.lines() {
        if line.starts_with('/') {
            on_ours = line.starts_with(&dir);
        } else if on_ours && !line.trim().is_empty() {
            count += 1;
        }
    }
    count
}

/// 16 waiters, each watching only its predecessor: one release fires one
/// watch and wakes one waiter, not the herd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_wakes_one_waiter() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let _serial = one_at_a_time(&SERIAL).await;
    let name = unique("herd");
    let holder_client = client().await;
    let holder = holder_client
        .acquire(&name, &LockOptions::new().wait(Wait::No))
        .await
        .expect("acquire");
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client().await);
    }
    let granted = Arc::new(AtomicUsize::new(0));
    let mut waiters = Vec::new();
    for i in 0..16 {
        let (locks, name, granted) = (clients[i % 4].clone(), name.clone(), granted.clone());
        waiters.push(tokio::spawn(async move {
            let g = locks
                .acquire(
                    &name,
                    &LockOptions::new().wait_timeout(Duration::from_secs(60)),
                )
                .await
                .expect("waiter acquires");
            granted.fetch_add(1, Ordering::SeqCst);
            // Hold until the test has looked, then pass it on.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            g.release().await.expect("release");
        }));
        // Queue in a known order, each after the previous one's watch is set.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = watches_on(&name);
    assert_eq!(before, 16, "each waiter watches one node, its predecessor");
    assert!(holder.release().await.expect("release"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = watches_on(&name);
    assert_eq!(
        granted.load(Ordering::SeqCst),
        1,
        "exactly one waiter got the lock"
    );
    assert_eq!(
        before - after,
        1,
        "one release fired exactly one watch ({before} watches before, {after} after)"
    );
    eprintln!(
        "zk faults: 16 waiters, {before} watches; one release fired {} and woke 1 waiter",
        before - after
    );
    for w in waiters {
        w.abort();
    }
}

/// The ensemble member (1-based) that leads, from each member's `srvr`.
fn ensemble_leader() -> usize {
    use std::io::{Read, Write};
    let hosts = upstreams_of(&env("DISTLOCK_TEST_ZK_ENSEMBLE_URL"));
    for _ in 0..50 {
        for (i, host) in hosts.iter().enumerate() {
            let Ok(mut conn) = std::net::TcpStream::connect(host) else {
                continue;
            };
            let mut report = String::new();
            if conn.write_all(b"srvr").is_ok()
                && conn.read_to_string(&mut report).is_ok()
                && report.contains("Mode: leader")
            {
                return i + 1;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("no ensemble member says it leads");
}

/// On the ensemble: the leader dies and the session survives (no confirmed
/// loss); a second member dies, and the holder sees a suspected loss, then
/// a confirmed one; the members come back and the client recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ensemble_survives_its_leader_and_reports_the_loss_of_its_quorum() {
    use lock_core::LossKind;
    use lock_testkit::faults::{Restore, services};
    let _serial = one_at_a_time(&SERIAL).await;
    let _restore = Restore::servers(["zk1", "zk2", "zk3"]);
    let session = Duration::from_secs(4);
    let url = format!(
        "{}?session_timeout_ms={}",
        env("DISTLOCK_TEST_ZK_ENSEMBLE_URL"),
        session.as_millis()
    );
    let (locks, other) = (
        ZkLock::connect(&url).await.expect("connect"),
        ZkLock::connect(&url).await.expect("connect"),
    );
    assert!(
        locks.capabilities().survives_server_failure,
        "this test proves the claim `survives_server_failure`; the backend must make it"
    );
    let name = unique("ensemble");
    let g = locks
        .acquire(&name, &LockOptions::new().wait(Wait::No))
        .await
        .expect("acquire");
    let leader = ensemble_leader();
    services(&["kill", &format!("zk{leader}")]);
    tokio::time::sleep(session * 2).await;
    let after_leader = g.is_lost();
    assert!(
        after_leader
            .as_ref()
            .is_none_or(|r| r.kind() == LossKind::Suspected),
        "losing the leader confirmed a loss: {after_leader:?}"
    );
    // Still held: nobody else gets it.
    let busy = loop {
        match other
            .try_acquire(&name, &LockOptions::new().wait(Wait::No))
            .await
        {
            Ok(b) => break b,
            Err(e) => {
                pause_if_transient(&e).await;
            }
        }
    };
    assert!(busy.is_none(), "the lock was free after a leader kill");

    let second = (1..=3).find(|&m| m != leader).expect("another member");
    services(&["kill", &format!("zk{second}")]);
    let killed_at = Instant::now();
    let (kind_seen, confirmed_after) = loop {
        if let Some(reason) = g.is_lost()
            && reason.kind() == LossKind::Confirmed
        {
            break (reason.kind(), killed_at.elapsed());
        }
        assert!(
            killed_at.elapsed() < session * 5,
            "no confirmed loss without a quorum: {:?}",
            g.is_lost()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(kind_seen, LossKind::Confirmed);

    services(&["start", &format!("zk{leader}")]);
    services(&["start", &format!("zk{second}")]);
    let start = Instant::now();
    let again = loop {
        match locks
            .try_acquire(
                &unique("ensemble-after"),
                &LockOptions::new().wait(Wait::No),
            )
            .await
        {
            Ok(Some(g)) => break g,
            other => assert!(
                start.elapsed() < Duration::from_secs(30),
                "no recovery: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(again.release().await.expect("release"));
    eprintln!(
        "zk faults: leader killed, no confirmed loss ({after_leader:?}); quorum lost, confirmed loss {confirmed_after:?} later; recovered {:?} after the restart",
        start.elapsed()
    );
}

/// A moment's pause before retrying a request the ensemble could not
/// answer during an election.
async fn pause_if_transient(e: &lock_core::LockError) {
    assert!(e.is_transient(), "unexpected error: {e}");
    tokio::time::sleep(Duration::from_millis(200)).await;
}

const BELIEF_ENV: &str = "DISTLOCK_ZK_PAUSED_HOLDER";

/// Where the paused holder writes what it believes, one line per check.
fn belief_file(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("distlock-belief-{}", name.replace('/', "_")))
}

/// A holder whose process is frozen for longer than its session timeout
/// (but shorter than its TTL) must not believe it still holds the lock
/// when it resumes: its session expired and someone else holds it. The
/// guard's deadline is bounded by the session, so the first check after
/// the resume already says lost, before the client hears of the expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_session_knows_it_lost_the_lock() {
    let session = Duration::from_secs(3);
    let url = format!(
        "{}?session_timeout_ms={}",
        env("DISTLOCK_TEST_ZK_URL"),
        session.as_millis()
    );
    let ttl = Duration::from_secs(9);
    if let Some(name) = holder_role(BELIEF_ENV) {
        let locks = ZkLock::connect(&url).await.expect("connect");
        let opts = LockOptions::new().ttl(ttl).wait(Wait::No);
        let g = locks.acquire(&name, &opts).await.expect("child acquire");
        announce_token(g.fencing_token().expect("token"));
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(belief_file(&name))
            .expect("belief file");
        // A thread of its own checks every millisecond, as a holder about
        // to write would: it runs as soon as the process resumes, whatever
        // the client has yet to hear from the server.
        let lease = std::sync::Arc::clone(g.lease());
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(1));
                let line = if lease.lost_now().is_some() {
                    "lost\n"
                } else {
                    "held\n"
                };
                std::io::Write::write_all(&mut out, line.as_bytes()).expect("write belief");
            }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(g);
        return;
    }
    let _serial = one_at_a_time(&SERIAL).await;
    let name = unique("paused-holder");
    let file = belief_file(&name);
    let (mut child, first) = spawn_holder(
        "a_holder_paused_past_its_session_knows_it_lost_the_lock",
        BELIEF_ENV,
        &name,
    )
    .await;
    let pid = child.id().expect("child pid").to_string();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let stopped_at = Instant::now();
    let other = ZkLock::connect(&url).await.expect("connect");
    let taken = other
        .acquire(
            &name,
            &LockOptions::new()
                .ttl(ttl)
                .wait(Wait::UpTo(Duration::from_secs(8))),
        )
        .await
        .expect("the frozen holder's session expires and frees the lock");
    assert!(taken.fencing_token().expect("token") > first);
    let frozen = stopped_at.elapsed();
    assert!(frozen < ttl, "taken over after {frozen:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
    signal("-CONT");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = std::fs::read_to_string(&file).expect("belief file");
    let after: Vec<&str> = text
        .get(usize::try_from(seen).expect("offset")..)
        .unwrap_or_default()
        .lines()
        .collect();
    let _ = child.start_kill();
    let _ = child.wait().await;
    let _ = std::fs::remove_file(&file);
    eprintln!(
        "zk faults: frozen {:?}; first beliefs after the resume: {:?}",
        stopped_at.elapsed(),
        &after[..after.len().min(3)]
    );
    assert_eq!(
        after.first().copied(),
        Some("lost"),
        "the resumed holder believed it held a lock another client holds"
    );
    assert!(taken.release().await.expect("release"));
}

/// A guard's validity never outlasts the session that carries its node:
/// with a 9 s TTL on a 3 s session the deadline lies within 3 s, and
/// stays there as renewals confirm the node; without auto-renewal such a
/// TTL is refused with a reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_is_bounded_by_the_session() {
    let _serial = one_at_a_time(&SERIAL).await;
    let session = Duration::from_secs(3);
    let locks = ZkLock::connect(&format!(
        "{}?session_timeout_ms={}",
        env("DISTLOCK_TEST_ZK_URL"),
        session.as_millis()
    ))
    .await
    .expect("connect");
    let name = unique("session-bound");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(9))
        .wait(Wait::No);
    let g = locks.acquire(&name, &opts).await.expect("acquire");
    for _ in 0..3 {
        let left = g
            .validity_deadline()
            .expect("a deadline")
            .saturating_duration_since(Instant::now());
        assert!(
            left <= session,
            "deadline {left:?} ahead on a {session:?} session"
        );
        assert!(g.is_lost().is_none(), "renewals keep it within the session");
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    assert!(g.release().await.expect("release"));
    match locks.acquire(&name, &opts.clone().auto_renew(false)).await {
        Err(lock_core::LockError::InvalidOptions { reason }) => {
            assert!(reason.contains("session"), "{reason}")
        }
        other => panic!("expected InvalidOptions, got {other:?}"),
    }
}

/// A release whose delete is cut by a server crash (the server frozen
/// under the request, then killed, down for 2 s, and started again while
/// the session survives) never leaves the lock held by a live client: `release()`
/// reports a transient error at worst, and keeps deleting the node in the
/// background until it is gone, so another client gets the lock well
/// within the session's life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cut_by_a_server_crash_still_frees_the_lock() {
    use lock_testkit::faults::{Restore, services};
    let _serial = one_at_a_time(&SERIAL).await;
    let session = Duration::from_secs(6);
    let url = format!(
        "{}?session_timeout_ms={}",
        env("DISTLOCK_TEST_ZK_URL"),
        session.as_millis()
    );
    let holder = ZkLock::connect(&url).await.expect("connect");
    let name = unique("cut-release");
    let opts = LockOptions::new().wait(Wait::No);
    let g = holder.acquire(&name, &opts).await.expect("acquire");
    let restore = Restore::servers(["zk"]);
    services(&["pause", "zk"]);
    let release = tokio::spawn(async move { g.release().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    services(&["kill", "zk"]);
    // Down for a while: the client's own resends run out meanwhile.
    tokio::time::sleep(Duration::from_secs(2)).await;
    services(&["start", "zk"]);
    drop(restore);
    let released = tokio::time::timeout(session * 3, release)
        .await
        .expect("release() returns")
        .expect("task");
    eprintln!("zk faults: release cut by a crash gave {released:?}");
    if let Err(e) = &released {
        assert!(e.is_transient(), "a cut release is transient: {e:?}");
    }
    let started = Instant::now();
    let other = ZkLock::connect(&url).await.expect("connect");
    let g2 = other
        .acquire(&name, &opts.clone().wait(Wait::UpTo(session * 2)))
        .await
        .expect("the lock is freed while the holder's client lives on");
    eprintln!(
        "zk faults: another client got the lock {:?} after the restart",
        started.elapsed()
    );
    assert!(g2.release().await.expect("release"));
    drop(holder);
}

/// See `lock_testkit::faults::server_failure_gives_transient_errors`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_failure_gives_transient_errors() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::server_failure_gives_transient_errors(
        client,
        &["zk"],
        LockOptions::new(),
    )
    .await;
}

/// See `lock_testkit::faults::frozen_server_bounds_waits_and_releases`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_server_bounds_waits_and_releases() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::frozen_server_bounds_waits_and_releases(
        client,
        &["zk"],
        LockOptions::new(),
    )
    .await;
}

/// See `lock_testkit::faults::frozen_holder_loses_its_lock_to_a_later_token`: the
/// server expires the silent session (2 s) and its node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_loses_its_lock_to_a_later_token() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::frozen_holder_loses_its_lock_to_a_later_token(
        "a_frozen_holder_loses_its_lock_to_a_later_token",
        client,
        LockOptions::new(),
        SESSION,
    )
    .await;
}

/// On the ensemble, an operator's client connected to a follower that has
/// not yet applied a grant still sees it: `inspect`, `queued` and
/// `force_release` first sync their member with the leader. The follower
/// is frozen while a client on the leader acquires, and the operator's
/// request is sent before the follower thaws; unsynced, the thawed
/// follower answers it from its stale tree ("free", "nothing to release").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_on_a_lagging_follower_sees_the_latest_grant() {
    use lock_core::LockError;
    use lock_testkit::faults::{Restore, services};
    let _serial = one_at_a_time(&SERIAL).await;
    let _restore = Restore::servers(["zk1", "zk2", "zk3"]);
    let hosts = upstreams_of(&env("DISTLOCK_TEST_ZK_ENSEMBLE_URL"));
    let leader = ensemble_leader();
    let follower = (1..=3).find(|&m| m != leader).expect("a follower");
    let on_member = async |member: usize| {
        ZkLock::connect(&format!(
            "zk://{}/distlock-lagging?session_timeout_ms=10000",
            hosts[member - 1]
        ))
        .await
        .expect("connect to one member")
    };
    let (holder, operator) = (on_member(leader).await, on_member(follower).await);
    let opts = LockOptions::new().wait(Wait::No);
    // Both clients have their sessions before the follower stops.
    operator
        .inspect(&unique("lagging-open"))
        .await
        .expect("inspect");

    // Grant while the follower is frozen, ask it once it thaws.
    async fn asked_while_lagging<T: Send + 'static>(
        follower: usize,
        holder: &ZkLock,
        name: &str,
        opts: &LockOptions,
        ask: impl Future<Output = Result<T, LockError>> + Send + 'static,
    ) -> (lock_core::LockGuard, T) {
        services(&["pause", &format!("zk{follower}")]);
        let granted = holder.acquire(name, opts).await;
        let asked = tokio::spawn(ask);
        tokio::time::sleep(Duration::from_millis(150)).await;
        services(&["resume", &format!("zk{follower}")]);
        let granted = granted.expect("acquire while a follower is frozen");
        let answer = asked
            .await
            .expect("the operator's task")
            .expect("the operator's request");
        (granted, answer)
    }

    for round in 0..3 {
        let name = unique("lagging");
        let (guard, info) = asked_while_lagging(follower, &holder, &name, &opts, {
            let (operator, name) = (operator.clone(), name.clone());
            async move { operator.inspect(&name).await }
        })
        .await;
        assert!(
            info.held,
            "round {round}: the follower's operator saw a just-granted lock as free: {info:?}"
        );
        guard.release().await.expect("release");

        let name = unique("lagging");
        let (guard, released) = asked_while_lagging(follower, &holder, &name, &opts, {
            let (operator, name) = (operator.clone(), name.clone());
            async move { operator.force_release(&name).await }
        })
        .await;
        assert!(
            released,
            "round {round}: the follower's operator found nothing to release"
        );
        assert!(
            holder
                .try_acquire(&name, &opts)
                .await
                .expect("try")
                .is_some(),
            "round {round}: force_release answered true but the lock is still held"
        );
        drop(guard);
    }
}

/// See `lock_testkit::faults::a_grant_answered_past_its_deadline_is_not_handed_out`:
/// a lock of 1 s on a 6 s session, its grant answered 1.3 s after the
/// request (the grant is confirmed, and its lease counted from the
/// confirmation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_answered_past_its_deadline_is_not_handed_out() {
    let _serial = one_at_a_time(&SERIAL).await;
    let url = format!("{}?session_timeout_ms=6000", env("DISTLOCK_TEST_ZK_URL"));
    lock_testkit::faults::a_grant_answered_past_its_deadline_is_not_handed_out(
        async || ZkLock::connect(&url).await.expect("connect"),
        &["zk"],
        LockOptions::new().ttl(Duration::from_secs(1)),
        Duration::from_millis(1300),
    )
    .await;
}
