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

/// How many grants a token check makes before its fault, and after it.
pub(crate) const GRANTS: usize = 40;

/// Fencing tokens never go backwards across `fault` (a server killed with
/// SIGKILL and started again, a clean restart, one server process killed):
/// one task grants one name over and over (a fresh client after every
/// error, as a restarted service would have) while the fault strikes after
/// [`GRANTS`] grants, until [`GRANTS`] more grants succeeded after it; every
/// token granted, in grant order, is above the one before.
pub(crate) async fn tokens_rise_across<L, F>(
    what: &str,
    fault: impl FnOnce() + Send + 'static,
    connect: impl Fn() -> F + Send + 'static,
) where
    L: DistributedLock + 'static,
    F: std::future::Future<Output = Result<L, LockError>> + Send,
{
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let name = unique("tokens-across");
    let struck = Arc::new(AtomicBool::new(false));
    let granted = Arc::new(AtomicUsize::new(0));
    let grants = {
        let (struck, granted) = (Arc::clone(&struck), Arc::clone(&granted));
        let what = what.to_string();
        tokio::spawn(async move {
            let opts = LockOptions::new()
                .ttl(Duration::from_secs(5))
                .wait(Wait::UpTo(Duration::from_secs(5)));
            let started = tokio::time::Instant::now();
            let mut tokens = Vec::new();
            let mut after = 0;
            let mut locks = None;
            while after < GRANTS {
                assert!(
                    started.elapsed() < Duration::from_secs(120),
                    "{what}: only {after} grants after the fault"
                );
                if locks.is_none() {
                    locks = connect().await.ok();
                }
                let Some(client) = &locks else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let was_struck = struck.load(Ordering::SeqCst);
                match client.acquire(&name, &opts).await {
                    Ok(g) => {
                        tokens.push(g.fencing_token().expect("token"));
                        let _ = g.release().await;
                        granted.fetch_add(1, Ordering::SeqCst);
                        after += usize::from(was_struck);
                    }
                    Err(_) => {
                        locks = None;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            tokens
        })
    };
    while granted.load(Ordering::SeqCst) < GRANTS {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::task::spawn_blocking(fault).await.expect("the fault");
    struck.store(true, Ordering::SeqCst);
    let tokens = grants.await.expect("the granting task");
    let backwards: Vec<_> = tokens.windows(2).filter(|w| w[1] <= w[0]).collect();
    eprintln!(
        "{what}: {} grants, tokens from {:#x} to {:#x}",
        tokens.len(),
        tokens.first().copied().unwrap_or(0),
        tokens.last().copied().unwrap_or(0)
    );
    assert!(
        backwards.is_empty(),
        "{what}: fencing tokens went backwards: {backwards:x?}"
    );
}

/// [`tokens_rise_across`] a server stopped by `how` (`kill`: SIGKILL;
/// `stop`: a clean shutdown) and started again.
pub(crate) fn restart(server: &'static str, how: &'static str) -> impl FnOnce() + Send + 'static {
    move || {
        use lock_testkit::faults::{Restore, services};
        let restore = Restore::servers([server]);
        services(&[how, server]);
        services(&["start", server]);
        drop(restore);
    }
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
                .wait(Wait::UpTo(Duration::from_secs(10))),
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
        .wait(Wait::UpTo(Duration::from_millis(1500)));
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
                    .wait(Wait::UpTo(Duration::from_secs(10))),
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

/// The fault tests every session-lock dialect runs, written once for
/// Postgres and MySQL/MariaDB: `lock` is the client type, `url` the
/// variable holding the server's URL, `server` its name in
/// `scripts/services.sh`, and `warm_pool` the query of the client whose
/// pool must not starve. Defines the binary's `SERIAL` mutex and the
/// clients `client(mode)` and `advisory(sessions)`, and `quick(ttl_ms)`
/// options, for the dialect's own tests beside these.
macro_rules! session_fault_tests {
    (lock: $lock:ty, url: $url:literal, server: $server:literal, warm_pool: $warm:literal $(,)?) => {
        static SERIAL: ::tokio::sync::Mutex<()> = ::tokio::sync::Mutex::const_new(());

        /// A client in `mode` (`row` or `advisory`).
        async fn client(mode: &str) -> $lock {
            <$lock>::connect(&format!(
                "{}?connect_timeout_ms=2000&mode={mode}",
                ::lock_testkit::faults::env($url)
            ))
            .await
            .expect("connect")
        }

        /// An advisory-mode client with `sessions` shared sessions.
        async fn advisory(sessions: usize) -> $lock {
            <$lock>::connect(&format!(
                "{}?connect_timeout_ms=2000&mode=advisory&sessions={sessions}",
                ::lock_testkit::faults::env($url)
            ))
            .await
            .expect("connect")
        }

        /// A lease of `ttl_ms`, one attempt.
        fn quick(ttl_ms: u64) -> ::lock_core::LockOptions {
            ::lock_core::LockOptions::new()
                .ttl(::std::time::Duration::from_millis(ttl_ms))
                .wait(::lock_core::Wait::No)
        }

        /// A holder's session ended on the server by another client's
        /// `force_release` (Postgres terminates it, MySQL kills it): the
        /// holder's `lost()` fires as taken over, and the next grant's
        /// token is larger.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_force_released_holder_fires_lost_and_the_next_token_is_larger() {
            use ::lock_core::DistributedLock;
            use ::std::time::Duration;
            let _serial = ::lock_testkit::faults::one_at_a_time(&SERIAL).await;
            for mode in ["row", "advisory"] {
                let (locks, other) = (client(mode).await, client(mode).await);
                let name = ::lock_testkit::faults::unique("force-released");
                let opts = quick(1500);
                let g = locks.acquire(&name, &opts).await.expect("acquire");
                assert!(
                    other.force_release(&name).await.expect("force_release"),
                    "{mode}: holder found"
                );
                let start = ::tokio::time::Instant::now();
                let reason = ::tokio::time::timeout(Duration::from_secs(3), g.lost())
                    .await
                    .expect("lost() fires");
                assert_eq!(reason, ::lock_core::LossReason::TakenOver, "{mode}");
                let next = other
                    .try_acquire(&name, &opts)
                    .await
                    .expect("try")
                    .expect("free after the force-release");
                assert!(next.fencing_token() > g.fencing_token(), "{mode}");
                eprintln!(
                    "{} faults ({mode}): lost() {:?} after the holder's session was ended",
                    $server,
                    start.elapsed()
                );
                assert!(
                    !g.release().await.expect("release"),
                    "{mode}: not held any more"
                );
                assert!(next.release().await.expect("release"));
            }
        }

        /// See `lock_testkit::faults::killed_holder_frees_the_lock`: the
        /// server ends the dead holder's session, and its lock, at once.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_killed_holder_process_frees_the_lock_at_once() {
            let _serial = ::lock_testkit::faults::one_at_a_time(&SERIAL).await;
            ::lock_testkit::faults::killed_holder_frees_the_lock(
                "a_killed_holder_process_frees_the_lock_at_once",
                async || client("row").await,
                ::lock_core::LockOptions::new(),
                ::std::time::Duration::ZERO,
            )
            .await;
        }

        /// A server stopped under a held lock: `lost()` fires, acquisitions
        /// are `Unavailable` while it is down, and the same client acquires
        /// again once it is back.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_server_restart_fires_lost_and_the_client_recovers() {
            use ::lock_core::DistributedLock;
            use ::std::time::Duration;
            let _serial = ::lock_testkit::faults::one_at_a_time(&SERIAL).await;
            let locks = client("row").await;
            let g = locks
                .acquire(&::lock_testkit::faults::unique("restart"), &quick(1500))
                .await
                .expect("acquire");
            let restart = ::lock_testkit::faults::Restore::servers([$server]);
            ::lock_testkit::faults::services(&["stop", $server]);
            let stopped_at = ::tokio::time::Instant::now();
            let reason = ::tokio::time::timeout(Duration::from_secs(5), g.lost())
                .await
                .expect("lost() fires");
            eprintln!(
                "{} faults: lost() ({reason:?}) {:?} after the server stopped",
                $server,
                stopped_at.elapsed()
            );
            let during = locks
                .try_acquire(&::lock_testkit::faults::unique("down"), &quick(5000))
                .await;
            assert!(
                matches!(during, Err(::lock_core::LockError::Unavailable { .. })),
                "expected Unavailable while the server is down, got {during:?}"
            );
            drop(restart);
            let recovered = ::lock_testkit::faults::acquires_again(
                &locks,
                &quick(5000),
                Duration::from_secs(30),
            )
            .await;
            eprintln!(
                "{} faults: recovered {recovered:?} after the restart",
                $server
            );
        }

        /// See `common::warm_connections_do_not_starve_the_pool`.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn warm_connections_do_not_starve_the_pool() {
            use ::lock_core::DistributedLock;
            let _serial = ::lock_testkit::faults::one_at_a_time(&SERIAL).await;
            let locks =
                <$lock>::connect(&format!("{}?{}", ::lock_testkit::faults::env($url), $warm))
                    .await
                    .expect("connect");
            common::warm_connections_do_not_starve_the_pool(&locks, async |name| {
                locks.force_release(name).await
            })
            .await;
        }

        /// `common::tokens_rise_across` `fault` (`what` it is), in both
        /// modes.
        async fn tokens_rise_across<F: FnOnce() + Send + 'static>(
            what: &str,
            fault: impl Fn() -> F,
        ) {
            for mode in ["row", "advisory"] {
                let url = format!(
                    "{}?connect_timeout_ms=2000&mode={mode}",
                    ::lock_testkit::faults::env($url)
                );
                common::tokens_rise_across(
                    &format!("{} {mode}, {what}", $server),
                    fault(),
                    move || {
                        let url = url.clone();
                        async move { <$lock>::connect(&url).await }
                    },
                )
                .await;
            }
        }

        /// Tokens keep rising across a crash of the server (SIGKILL, then
        /// a start).
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn tokens_survive_a_server_crash() {
            let _serial = ::lock_testkit::faults::one_at_a_time(&SERIAL).await;
            tokens_rise_across("server killed", || common::restart($server, "kill")).await;
        }

        /// Tokens keep rising across a clean restart of the server.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn tokens_survive_a_clean_restart() {
            let _serial = ::lock_testkit::faults::one_at_a_time(&SERIAL).await;
            tokens_rise_across("clean restart", || common::restart($server, "stop")).await;
        }

        /// See `lock_testkit::faults::server_failure_gives_transient_errors`.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn server_failure_gives_transient_errors() {
            let _serial = ::lock_testkit::faults::one_at_a_time(&SERIAL).await;
            for mode in ["row", "advisory"] {
                ::lock_testkit::faults::server_failure_gives_transient_errors(
                    async || client(mode).await,
                    &[$server],
                    ::lock_core::LockOptions::new().ttl(::std::time::Duration::from_secs(5)),
                )
                .await;
            }
        }

        /// See `lock_testkit::faults::frozen_server_bounds_waits_and_releases`.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn frozen_server_bounds_waits_and_releases() {
            let _serial = ::lock_testkit::faults::one_at_a_time(&SERIAL).await;
            for mode in ["row", "advisory"] {
                ::lock_testkit::faults::frozen_server_bounds_waits_and_releases(
                    async || client(mode).await,
                    &[$server],
                    ::lock_core::LockOptions::new().ttl(::std::time::Duration::from_secs(5)),
                )
                .await;
            }
        }

        /// See `lock_testkit::faults::unrenewed_holder_learns_of_a_server_crash`:
        /// the server's crash ends the holder's session and its lock; the
        /// holder's guard, though not renewed, is checked, and its `lost()`
        /// fires before the restarted server grants the lock to another
        /// client.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn an_unrenewed_holder_learns_of_a_server_crash() {
            let _serial = ::lock_testkit::faults::one_at_a_time(&SERIAL).await;
            for mode in ["row", "advisory"] {
                ::lock_testkit::faults::unrenewed_holder_learns_of_a_server_crash(
                    async || client(mode).await,
                    &[$server],
                )
                .await;
            }
        }

        /// See `common::a_lost_session_loses_exactly_its_locks`.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_lost_session_loses_exactly_its_locks() {
            use ::lock_core::DistributedLock;
            let _serial = ::lock_testkit::faults::one_at_a_time(&SERIAL).await;
            let (locks, other) = (advisory(2).await, advisory(2).await);
            common::a_lost_session_loses_exactly_its_locks(&locks, &other, async |name| {
                other.force_release(name).await
            })
            .await;
        }

        /// See `common::a_quiet_session_ended_by_the_server_is_replaced`.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_quiet_session_ended_by_the_server_is_replaced() {
            let _serial = ::lock_testkit::faults::one_at_a_time(&SERIAL).await;
            common::a_quiet_session_ended_by_the_server_is_replaced(
                &advisory(1).await,
                &advisory(1).await,
            )
            .await;
        }

        /// See `common::a_leaked_guard_expires_beside_renewed_locks`.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_leaked_guard_expires_beside_renewed_locks() {
            let _serial = ::lock_testkit::faults::one_at_a_time(&SERIAL).await;
            common::a_leaked_guard_expires_beside_renewed_locks(
                &advisory(1).await,
                &advisory(1).await,
            )
            .await;
        }

        /// See `common::a_held_name_is_not_granted_twice_on_one_session`.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_held_name_is_not_granted_twice_on_one_session() {
            let _serial = ::lock_testkit::faults::one_at_a_time(&SERIAL).await;
            common::a_held_name_is_not_granted_twice_on_one_session(&advisory(1).await).await;
        }

        /// See `lock_testkit::faults::frozen_holder_loses_its_lock_to_a_later_token`:
        /// the server's idle bound, set from the lease, ends the frozen
        /// holder's session and its lock. The child runs the same test, so
        /// each mode has a test of its own.
        async fn a_frozen_holder_loses_its_lock(test: &str, mode: &str) {
            let _serial = ::lock_testkit::faults::one_at_a_time(&SERIAL).await;
            ::lock_testkit::faults::frozen_holder_loses_its_lock_to_a_later_token(
                test,
                async || client(mode).await,
                ::lock_core::LockOptions::new().ttl(::std::time::Duration::from_secs(2)),
                ::std::time::Duration::from_secs(3),
            )
            .await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_frozen_row_holder_loses_its_lock_to_a_later_token() {
            a_frozen_holder_loses_its_lock(
                "a_frozen_row_holder_loses_its_lock_to_a_later_token",
                "row",
            )
            .await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_frozen_advisory_holder_loses_its_lock_to_a_later_token() {
            a_frozen_holder_loses_its_lock(
                "a_frozen_advisory_holder_loses_its_lock_to_a_later_token",
                "advisory",
            )
            .await;
        }

        /// See `lock_testkit::faults::a_grant_answered_past_its_deadline_is_not_handed_out`:
        /// a 1 s lease, its grant answered 1.3 s after the request (the
        /// grant is confirmed, and its lease counted from the confirmation).
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_grant_answered_past_its_deadline_is_not_handed_out() {
            let _serial = ::lock_testkit::faults::one_at_a_time(&SERIAL).await;
            for mode in ["row", "advisory"] {
                ::lock_testkit::faults::a_grant_answered_past_its_deadline_is_not_handed_out(
                    async || client(mode).await,
                    &[$server],
                    ::lock_core::LockOptions::new().ttl(::std::time::Duration::from_secs(1)),
                    ::std::time::Duration::from_millis(1300),
                )
                .await;
            }
        }
    };
}
