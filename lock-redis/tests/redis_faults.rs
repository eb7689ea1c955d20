//! Faults against the project's own Redis (`scripts/services.sh`): the server
//! is killed while a lock is held, a holder process is frozen past its TTL,
//! and the commands each acquisition costs are counted on the server.
//!
//! These tests stop the server or reset its statistics, so they run one at a
//! time (a shared mutex) in this binary, apart from the conformance suite.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_core::raw::RawGuard;
use lock_core::{DistributedLock, LockError, LockOptions, LossReason, Wait};
use lock_redis::RedisLock;
use lock_testkit::faults::{Restore, env, one_at_a_time, services, unique};
use tokio::sync::Mutex;
use tokio::time::Instant;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// A client with short timeouts, so an outage is noticed quickly.
async fn client() -> RedisLock {
    let url = format!(
        "{}/0?connect_timeout_ms=300&response_timeout_ms=300",
        env("DISTLOCK_TEST_REDIS_URL")
    );
    RedisLock::connect(&url).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_server_fires_lost_fails_fast_and_recovers() {
    let _serial = one_at_a_time(&SERIAL).await;
    let locks = client().await;
    let name = unique("outage");
    let held = Arc::new(
        locks
            .acquire(
                &name,
                &LockOptions::new()
                    .ttl(Duration::from_millis(3000))
                    .wait(Wait::No),
            )
            .await
            .expect("acquire"),
    );
    // Watch lost() from before the outage begins.
    let watcher = {
        let held = held.clone();
        tokio::spawn(async move {
            let reason = tokio::time::timeout(Duration::from_secs(10), held.lost())
                .await
                .expect("lost() fires");
            (reason, Instant::now())
        })
    };
    let restart = Restore::servers(["redis"]);
    let killed_at = Instant::now();
    services(&["kill", "redis"]);
    eprintln!("outage: server killed in {:?}", killed_at.elapsed());

    // Acquire during the outage: Unavailable, within the configured timeouts.
    let start = Instant::now();
    let result = locks
        .acquire(
            &unique("during-outage"),
            &LockOptions::new().wait_timeout(Duration::from_secs(10)),
        )
        .await;
    let failed_after = start.elapsed();
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "expected Unavailable during the outage, got {result:?}"
    );
    assert!(
        failed_after < Duration::from_secs(2),
        "acquire hung for {failed_after:?}"
    );

    // Renewals fail, so lost() fires at the validity deadline, which no
    // failed renewal can have moved.
    let (reason, fired) = watcher.await.expect("watcher");
    let deadline = held
        .validity_deadline()
        .expect("a Redis guard has a deadline");
    assert_eq!(reason, LossReason::DeadlinePassed);
    let late = fired.saturating_duration_since(deadline);
    assert!(fired >= deadline, "lost() fired before the deadline");
    // An ordering, not a latency bound: the server's lease runs a safety
    // margin past the holder's deadline, and lost() must fire before it
    // ends, that is, before anyone else could be granted the lock.
    let margin = held.lease().safety_margin();
    assert!(
        late < margin,
        "lost() fired {late:?} after the deadline, after the server's lease ({margin:?} past it) had run out"
    );
    eprintln!(
        "outage: acquire failed after {failed_after:?}; lost() fired {late:?} after the validity deadline"
    );

    drop(restart); // start the same instance again
    let mut last = None;
    for _ in 0..20 {
        match locks
            .try_acquire(&unique("after-restart"), &LockOptions::new())
            .await
        {
            Ok(Some(g)) => {
                assert!(g.release().await.expect("release"));
                return;
            }
            other => last = Some(other),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("the client did not recover after the restart: {last:?}");
}

/// See `lock_testkit::faults::frozen_holder_loses_its_lock_to_a_later_token`: the
/// lease's TTL (1 s) frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_holder_loses_its_lock_to_a_later_token() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::frozen_holder_loses_its_lock_to_a_later_token(
        "frozen_holder_loses_its_lock_to_a_later_token",
        client,
        LockOptions::new().ttl(Duration::from_secs(1)),
        Duration::from_secs(1),
    )
    .await;
}

/// A plain connection to the server, for its statistics and commands the
/// lock never sends.
async fn admin() -> redis::aio::MultiplexedConnection {
    redis::Client::open(env("DISTLOCK_TEST_REDIS_URL"))
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("admin connection")
}

/// Commands the scripts run inside the server (counted by commandstats, but
/// not round trips).
const SCRIPT_INTERNALS: &[&str] = &[
    "set", "incr", "pttl", "get", "del", "publish", "pexpire", "zpopmin", "zrem", "zadd", "time",
];

async fn command_calls(conn: &mut redis::aio::MultiplexedConnection) -> Vec<(String, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO");
    info.lines()
        .filter_map(|l| {
            let (cmd, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((cmd.to_string(), calls))
        })
        .filter(|(cmd, _)| cmd != "info" && !cmd.starts_with("config"))
        .collect::<std::collections::BTreeMap<_, _>>()
        .into_iter()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_cost_few_commands() {
    let _serial = one_at_a_time(&SERIAL).await;
    let mut admin = admin().await;
    let locks = client().await;
    let opts = LockOptions::new().auto_renew(false).wait(Wait::No);
    let name = unique("commands");
    // Warm up: scripts loaded, connections open.
    locks
        .acquire(&name, &opts)
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");

    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut admin)
        .await
        .expect("RESETSTAT");
    let g = locks.acquire(&name, &opts).await.expect("acquire");
    assert!(g.release().await.expect("release"));
    let calls = command_calls(&mut admin).await;
    // Acquire: GET handoff, SET NX PX, SET holder record, PUBLISH on the
    // changes channel (election observers), INCR. Release: GET, DEL,
    // PUBLISH on the changes channel, ZPOPMIN queue.
    let expected: Vec<(String, u64)> = [
        ("del", 1),
        ("evalsha", 2),
        ("get", 2),
        ("incr", 1),
        ("publish", 2),
        ("set", 2),
        ("zpopmin", 1),
    ]
    .into_iter()
    .map(|(c, n)| (c.to_string(), n))
    .collect();
    assert_eq!(
        calls, expected,
        "one uncontended acquire+release: two EVALSHA round trips, nothing else"
    );

    // 8 clients contend on one name for 3 s, 1 ms of work inside. On a
    // saturated machine a request may outlast the client's response timeout;
    // that is a transient `Unavailable`, counted and retried (a grant whose
    // reply was lost that way frees itself within the 2 s TTL, well inside
    // the others' 10 s wait). Anything else fails the test.
    let contended = unique("contended");
    let acquisitions = Arc::new(AtomicU64::new(0));
    let transient = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(client().await);
    }
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut admin)
        .await
        .expect("RESETSTAT");
    let end = Instant::now() + Duration::from_secs(3);
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|c| {
            let (name, n, transient) = (contended.clone(), acquisitions.clone(), transient.clone());
            tokio::spawn(async move {
                let o = LockOptions::new()
                    .auto_renew(false)
                    .ttl(Duration::from_secs(2))
                    .wait_timeout(Duration::from_secs(10));
                let mut mine = 0u64;
                while Instant::now() < end {
                    let g = match c.acquire(&name, &o).await {
                        Ok(g) => g,
                        Err(e) if e.is_transient() => {
                            transient.fetch_add(1, Ordering::SeqCst);
                            continue;
                        }
                        Err(e) => panic!("acquire: {e:?}"),
                    };
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    match g.release().await {
                        Ok(released) => assert!(released, "a held lock is released"),
                        Err(e) if e.is_transient() => {
                            transient.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => panic!("release: {e:?}"),
                    }
                    mine += 1;
                }
                n.fetch_add(mine, Ordering::SeqCst);
                mine
            })
        })
        .collect();
    let mut per_task = Vec::new();
    for t in tasks {
        per_task.push(t.await.expect("task"));
    }
    tokio::time::sleep(Duration::from_millis(100)).await; // let unsubscribes land
    let calls: Vec<(String, u64)> = command_calls(&mut admin)
        .await
        .into_iter()
        .filter(|(c, _)| !SCRIPT_INTERNALS.contains(&c.as_str()))
        .collect();
    let total: u64 = calls.iter().map(|(_, n)| n).sum();
    let acquired = acquisitions.load(Ordering::SeqCst);
    let transient = transient.load(Ordering::SeqCst);
    let per = total as f64 / acquired as f64;
    eprintln!(
        "contention: {acquired} acquisitions by 8 clients in 3 s, {transient} transient errors, {total} commands ({per:.2} per acquisition): {calls:?}; per client min {} max {}",
        per_task.iter().min().expect("tasks"),
        per_task.iter().max().expect("tasks"),
    );
    assert!(acquired > 0);
    assert!(
        transient * 10 <= acquired,
        "{transient} transient errors in {acquired} acquisitions: more than a stall explains"
    );
    assert!(
        per < 10.0,
        "{per:.2} commands per acquisition: waiters are polling"
    );
}

/// A waiter on a busy lock (its channel still subscribed from the last
/// wait) joins the queue with its first script and, once the release hands
/// it the lock, takes it with its second: two scripts, no third to look
/// again before it waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_waiter_costs_two_scripts() {
    let _serial = one_at_a_time(&SERIAL).await;
    let mut admin = admin().await;
    let (holder, waiter) = (client().await, client().await);
    let name = unique("queued-waiter");
    let now = LockOptions::new().auto_renew(false).wait(Wait::No);
    let waiting = LockOptions::new()
        .auto_renew(false)
        .wait_timeout(Duration::from_secs(10));
    // Once by hand-off, so that the waiter's client has subscribed the
    // lock's channel (it lingers after the wait) and loaded the scripts.
    let held = holder.acquire(&name, &now).await.expect("acquire");
    let waited = {
        let (waiter, name, waiting) = (waiter.clone(), name.clone(), waiting.clone());
        tokio::spawn(async move { waiter.acquire(&name, &waiting).await })
    };
    wait_until_queued(&holder, &name, 1).await;
    assert!(held.release().await.expect("release"));
    let handed = waited.await.expect("task").expect("handed the lock");
    assert!(handed.release().await.expect("release"));

    let held = holder.acquire(&name, &now).await.expect("acquire");
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut admin)
        .await
        .expect("RESETSTAT");
    let waited = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.acquire(&name, &waiting).await })
    };
    wait_until_queued(&holder, &name, 1).await;
    // Time for a script the waiter might send after joining the queue.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(held.release().await.expect("release"));
    let handed = waited.await.expect("task").expect("handed the lock");
    let calls: Vec<(String, u64)> = command_calls(&mut admin)
        .await
        .into_iter()
        // This test's own reads of the queue's live waiters.
        .filter(|(c, _)| {
            !SCRIPT_INTERNALS.contains(&c.as_str()) && !matches!(c.as_str(), "zrange" | "exists")
        })
        .collect();
    assert_eq!(
        calls,
        vec![("evalsha".to_string(), 3)],
        "the waiter's two scripts (queue, take) and the holder's release, nothing else"
    );
    assert!(handed.release().await.expect("release"));
}

/// Scripts the server forgot (`SCRIPT FLUSH`, as after a restart or on a
/// new replica) are loaded again: acquire, release and a renewal all work
/// after a flush, each on its first run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_the_server_forgot_are_loaded_again() {
    let _serial = one_at_a_time(&SERIAL).await;
    let mut admin = admin().await;
    let locks = client().await;
    let name = unique("flushed");
    let opts = LockOptions::new().auto_renew(false).wait(Wait::No);
    let flush = async |admin: &mut redis::aio::MultiplexedConnection| {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(admin)
            .await
            .expect("SCRIPT FLUSH");
    };
    flush(&mut admin).await;
    let held = locks.acquire(&name, &opts).await.expect("acquire");
    assert!(held.fencing_token().is_some());
    flush(&mut admin).await;
    held.extend(Duration::from_secs(5))
        .await
        .expect("the renewal went through");
    flush(&mut admin).await;
    assert!(held.release().await.expect("release"));
    assert!(
        !locks.inspect(&name).await.expect("inspect").held,
        "released on the server"
    );
}

/// Until `name`'s queue holds `n` waiters (at most 5 s).
async fn wait_until_queued(locks: &RedisLock, name: &str, n: usize) {
    let give_up = Instant::now() + Duration::from_secs(5);
    while locks.queued(name).await.expect("queued") < n {
        assert!(Instant::now() < give_up, "no waiter joined the queue");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// See `lock_testkit::faults::server_failure_gives_transient_errors`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_failure_gives_transient_errors() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::server_failure_gives_transient_errors(
        client,
        &["redis"],
        LockOptions::new().ttl(Duration::from_secs(5)),
    )
    .await;
}

/// See `lock_testkit::faults::frozen_server_bounds_waits_and_releases`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_server_bounds_waits_and_releases() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::frozen_server_bounds_waits_and_releases(
        client,
        &["redis"],
        LockOptions::new().ttl(Duration::from_secs(5)),
    )
    .await;
}

/// See `lock_testkit::faults::killed_holder_frees_the_lock` (the TTL frees it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_frees_the_lock() {
    let _serial = one_at_a_time(&SERIAL).await;
    lock_testkit::faults::killed_holder_frees_the_lock(
        "a_killed_holder_frees_the_lock",
        client,
        LockOptions::new().ttl(Duration::from_secs(2)),
        Duration::ZERO,
    )
    .await;
}

/// See `lock_testkit::faults::a_grant_answered_past_its_deadline_is_not_handed_out`:
/// a 1 s lease valid for 750 ms (a 250 ms margin), its grant answered
/// 850 ms after the request, inside the margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_answered_past_its_deadline_is_not_handed_out() {
    let _serial = one_at_a_time(&SERIAL).await;
    let url = format!(
        "{}/0?response_timeout_ms=5000",
        env("DISTLOCK_TEST_REDIS_URL")
    );
    lock_testkit::faults::a_grant_answered_past_its_deadline_is_not_handed_out(
        async || RedisLock::connect(&url).await.expect("connect"),
        &["redis"],
        LockOptions::new()
            .ttl(Duration::from_secs(1))
            .safety_margin(Duration::from_millis(400)),
        Duration::from_millis(850),
    )
    .await;
}
