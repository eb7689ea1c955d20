//! Checks shared by the Postgres and MySQL fault tests.

use std::time::Duration;

use lock_core::{DistributedLock, LockError, LockOptions, Wait};
use lock_testkit::faults::unique;

/// Released locks' connections are kept warm for the next lock, not handed
/// back to the pool; they must not starve the pool's other users. `locks`
/// has a pool of 2: with both connections cached and one in use again,
/// `take_away` still gets a connection at once.
pub(crate) async fn warm_connections_do_not_starve_the_pool(
    locks: &impl DistributedLock,
    take_away: impl AsyncFn(&str) -> Result<bool, LockError>,
) {
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Wait::No);
    let (a, b) = (unique("warm-a"), unique("warm-b"));
    let ga = locks.acquire(&a, &opts).await.expect("a");
    let gb = locks.acquire(&b, &opts).await.expect("b");
    assert!(ga.release().await.expect("release a"));
    assert!(gb.release().await.expect("release b"));
    let _held = locks.acquire(&a, &opts).await.expect("a again");
    let took = tokio::time::timeout(Duration::from_secs(1), take_away(&a))
        .await
        .expect("take_away got a connection without waiting")
        .expect("take_away");
    assert!(took);
}

/// Fencing tokens never go backwards across a crash of the server: after
/// a burst of grants, the server is killed with SIGKILL at once and started
/// again, and the first token granted afterwards (by a fresh client)
/// exceeds every token granted before.
pub(crate) async fn tokens_survive_a_server_crash<L: DistributedLock>(
    server: &str,
    what: &str,
    connect: impl AsyncFn() -> Result<L, LockError>,
) {
    use lock_testkit::faults::{Restore, services};
    let name = unique("crash-tokens");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait(Wait::Up(Duration::from_secs(5)));
    let locks = connect().await.expect("connect");
    let mut highest = 0;
    for _ in 0..40 {
        let g = locks.acquire(&name, &opts).await.expect("acquire");
        highest = highest.max(g.fencing_token().expect("token"));
        assert!(g.release().await.expect("release"));
    }
    let restore = Restore::servers([server]);
    services(&["kill", server]);
    services(&["start", server]);
    drop(restore);
    let started = tokio::time::Instant::now();
    let after = loop {
        let granted = match connect().await {
            Ok(locks) => locks.acquire(&name, &opts).await,
            Err(e) => Err(e),
        };
        match granted {
            Ok(g) => break g,
            Err(e) => assert!(
                started.elapsed() < Duration::from_secs(60),
                "{what}: no recovery after the restart: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let token = after.fencing_token().expect("token");
    eprintln!("{what}: last token before the crash {highest}, first after {token}");
    assert!(
        token > highest,
        "{what}: fencing token went backwards across a server crash: {token} after {highest}"
    );
    assert!(after.release().await.expect("release"));
}

/// Advisory mode: a client's locks share a few sessions, so losing one
/// session loses exactly the locks it carried. Ten renewed locks on two
/// sessions; the session of the first is ended on the server. Every lock
/// whose `lost()` fired is free for another client at once, and every other
/// lock is still held (refused to another client) and still renewed.
pub(crate) async fn a_lost_session_loses_exactly_its_locks(
    locks: &impl DistributedLock,
    other: &impl DistributedLock,
    take_away: impl AsyncFn(&str) -> Result<bool, LockError>,
) {
    let ttl = Duration::from_secs(2);
    let opts = LockOptions::new().ttl(ttl).wait(Wait::No).auto_renew(true);
    let names: Vec<String> = (0..10).map(|i| unique(&format!("session-{i}"))).collect();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(locks.acquire(name, &opts).await.expect("acquire"));
    }
    assert!(take_away(&names[0]).await.expect("take away"));
    tokio::time::timeout(ttl, guards[0].lost())
        .await
        .expect("the first lock's lost() fired within a TTL");
    // Every lock of that session has been renewed (and found gone) by now.
    tokio::time::sleep(ttl).await;
    let probe = LockOptions::new().ttl(ttl).wait(Wait::No);
    let mut lost = 0;
    for g in &guards {
        let taken = other.try_acquire(g.name(), &probe).await.expect("probe");
        match g.is_lost() {
            Some(reason) => {
                lost += 1;
                assert!(
                    taken.is_some(),
                    "{}: lost ({reason}) but still held on the server",
                    g.name()
                );
            }
            None => assert!(
                taken.is_none(),
                "{}: granted to another client while its holder saw no loss",
                g.name()
            ),
        }
    }
    assert!(
        (1..guards.len()).contains(&lost),
        "{lost} of {} locks lost: expected those of one session of two",
        guards.len()
    );
    for g in guards {
        if g.is_lost().is_none() {
            let name = g.name().to_string();
            assert!(g.release().await.expect("release"), "{name} still ours");
        }
    }
}

/// Advisory mode, one shared session: a guard leaked while the client goes
/// on (no renewal, never released) still ends with its lease, although the
/// session it shares stays busy renewing another lock; the renewed lock
/// stays held.
pub(crate) async fn a_leaked_guard_expires_beside_renewed_locks(
    locks: &impl DistributedLock,
    other: &impl DistributedLock,
) {
    let ttl = Duration::from_secs(1);
    let kept = unique("kept");
    let leaked = unique("leaked");
    let renewed = locks
        .acquire(
            &kept,
            &LockOptions::new().ttl(ttl).wait(Wait::No).auto_renew(true),
        )
        .await
        .expect("acquire the renewed lock");
    let start = tokio::time::Instant::now();
    let g = locks
        .acquire(
            &leaked,
            &LockOptions::new().ttl(ttl).wait(Wait::No).auto_renew(false),
        )
        .await
        .expect("acquire the leaked lock");
    std::mem::forget(g);
    let taken = other
        .acquire(
            &leaked,
            &LockOptions::new()
                .ttl(ttl)
                .wait(Wait::Up(Duration::from_secs(10))),
        )
        .await
        .expect("the leaked lock ends with its lease");
    let took = start.elapsed();
    assert!(took >= ttl, "granted after {took:?}, before the TTL");
    assert!(
        other
            .try_acquire(&kept, &LockOptions::new().ttl(ttl).wait(Wait::No))
            .await
            .expect("probe")
            .is_none(),
        "the renewed lock on the same session was given up too"
    );
    assert!(renewed.is_lost().is_none());
    assert!(renewed.release().await.expect("release"));
    assert!(taken.release().await.expect("release"));
}

/// Advisory mode, one shared session: the server's advisory locks are
/// re-entrant within a session, but a client's second acquisition of a name
/// it holds is refused (or waits) like anyone else's, and is granted once
/// the first guard is released.
pub(crate) async fn a_held_name_is_not_granted_twice_on_one_session(locks: &impl DistributedLock) {
    let name = unique("twice");
    let ttl = Duration::from_secs(10);
    let first = locks
        .acquire(&name, &LockOptions::new().ttl(ttl).wait(Wait::No))
        .await
        .expect("first");
    let again = LockOptions::new().ttl(ttl).wait(Wait::No);
    assert!(
        locks
            .try_acquire(&name, &again)
            .await
            .expect("try")
            .is_none(),
        "a held name was granted a second time"
    );
    let short = LockOptions::new()
        .ttl(ttl)
        .wait(Wait::Up(Duration::from_millis(1500)));
    assert!(
        matches!(
            locks.acquire(&name, &short).await,
            Err(LockError::Timeout { .. })
        ),
        "a waiting second acquisition was granted while the first holds"
    );
    let waiting = async {
        locks
            .acquire(
                &name,
                &LockOptions::new()
                    .ttl(ttl)
                    .wait(Wait::Up(Duration::from_secs(10))),
            )
            .await
    };
    let release = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(first.release().await.expect("release"));
    };
    let (second, ()) = tokio::join!(waiting, release);
    let second = second.expect("granted after the release");
    assert!(second.release().await.expect("release"));
}

/// Advisory mode, one shared session: the session keeps the idle bound of
/// its last lock when that lock is given back, so a client quiet for longer
/// finds the session ended by the server; its next acquisition opens a new
/// session and is granted as if nothing had happened, and the lock it gets
/// is held (refused to `other`).
pub(crate) async fn a_quiet_session_ended_by_the_server_is_replaced(
    locks: &impl DistributedLock,
    other: &impl DistributedLock,
) {
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .wait(Wait::No)
        .auto_renew(false);
    let first = unique("quiet");
    let g = locks.acquire(&first, &opts).await.expect("acquire");
    assert!(g.release().await.expect("release"));
    // Past the session's idle bound (1 s; the server looks about once a
    // second).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let name = unique("after-quiet");
    let g = locks
        .acquire(&name, &opts)
        .await
        .expect("an acquisition after a quiet spell is granted");
    assert!(
        other
            .try_acquire(&name, &opts)
            .await
            .expect("probe")
            .is_none(),
        "the lock granted after a quiet spell is not held on the server"
    );
    assert!(g.release().await.expect("release"), "still ours");
}
