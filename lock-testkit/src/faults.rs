//! Helpers shared by the backends' fault tests (feature `testkit`): the
//! test environment's URLs, `scripts/services.sh` verbs, servers put back
//! after a test, unique names, and a holder run in a child process.
//!
//! These are test utilities: they panic with a message when the test
//! environment is not what the fault tests need.

use lock_core::raw::RawGuard;
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

/// The value of `var`, which `scripts/test.sh` sets.
pub fn env(var: &str) -> String {
    std::env::var(var)
        .unwrap_or_else(|_| panic!("{var} is not set: run the tests through scripts/test.sh"))
}

/// The `host:port` list of a URL `scheme://[userinfo@]h1:p1,h2:p2[/…][?…]`.
pub fn upstreams_of(url: &str) -> Vec<String> {
    let (_, rest) = url.split_once("://").expect("a URL with a scheme");
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    hosts.split(',').map(str::to_string).collect()
}

/// `url` with its `host:port` list replaced by `hosts` (user info, path
/// and query kept).
pub fn with_upstreams(url: &str, hosts: &[String]) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let userinfo = authority
        .rsplit_once('@')
        .map(|(u, _)| format!("{u}@"))
        .unwrap_or_default();
    format!("{scheme}://{userinfo}{}{tail}", hosts.join(","))
}

/// Send the libraries' diagnostics (debug and above from the lock crates,
/// warnings from the rest; `RUST_LOG` overrides) to the test's captured
/// output, so that a fault test that fails on a loaded machine shows what
/// its renewals, waits and releases saw. The test runner prints captured
/// output only for a failed test. Once per process; later calls do nothing.
pub fn capture_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "warn,lock_core=debug,lock_redis=debug,lock_redlock=debug,lock_sql=debug,\
             lock_etcd=debug,lock_zk=debug,distlock=debug",
        )
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .with_ansi(false)
        .try_init();
}

/// Start a fault test: wait for `serial`, the binary's mutex that keeps its
/// tests from stopping servers under each other when they share a process
/// (`cargo test`), and [`capture_logs`].
pub async fn one_at_a_time(
    serial: &'static tokio::sync::Mutex<()>,
) -> tokio::sync::MutexGuard<'static, ()> {
    let guard = serial.lock().await;
    capture_logs();
    guard
}

/// Run `scripts/services.sh ARGS` (`kill redis`, `pause etcd2`, …) and
/// require it to succeed.
pub fn services(args: &[&str]) {
    let status = services_status(args);
    assert!(status, "services.sh {args:?} failed");
}

fn services_status(args: &[&str]) -> bool {
    Command::new("bash")
        .arg(env("DISTLOCK_SERVICES_SCRIPT"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Puts servers back when dropped, even if the test failed: resumes and
/// starts each (without asserting: a panic while unwinding would abort).
pub struct Restore(pub Vec<String>);

impl Restore {
    /// Restore the named servers.
    pub fn servers<const N: usize>(names: [&str; N]) -> Self {
        Restore(names.iter().map(|s| s.to_string()).collect())
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        for name in &self.0 {
            services_status(&["resume", name]);
            services_status(&["start", name]);
        }
    }
}

/// A lock name no other run uses: `faults/CASE/RANDOM`.
pub fn unique(case: &str) -> String {
    format!("faults/{case}/{:016x}", rand::random::<u64>())
}

/// The lock name this process should hold, if it was started by
/// [`spawn_holder`] with `env_var` (it is then the child).
pub fn holder_role(env_var: &str) -> Option<String> {
    std::env::var(env_var).ok()
}

/// What a child holder prints once it holds the lock.
pub fn announce_token(token: u64) {
    println!("CHILD token {token}");
}

/// Run this test binary again as a child that holds `name` (it runs the
/// test named `test` with `env_var` set, sees [`holder_role`], acquires and
/// calls [`announce_token`]); returns the child and its fencing token.
pub async fn spawn_holder(test: &str, env_var: &str, name: &str) -> (tokio::process::Child, u64) {
    let (child, token, _) = spawn_announcing_holder(test, env_var, name).await;
    (child, token)
}

/// A child holder's later reports: each line it printed with a `CHILD `
/// prefix, in order.
pub struct ChildReports(tokio::io::Lines<BufReader<tokio::process::ChildStdout>>);

impl ChildReports {
    /// The next report (without its prefix), failing the test if none
    /// comes within 30 s.
    pub async fn next(&mut self) -> String {
        loop {
            let line = tokio::time::timeout(Duration::from_secs(30), self.0.next_line())
                .await
                .expect("the child reported in time")
                .expect("read the child's output")
                .expect("the child's output ended early");
            if let Some(report) = line.strip_prefix("CHILD ") {
                return report.to_string();
            }
        }
    }
}

/// [`spawn_holder`], keeping the child's later reports.
async fn spawn_announcing_holder(
    test: &str,
    env_var: &str,
    name: &str,
) -> (tokio::process::Child, u64, ChildReports) {
    let mut child = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", test, "--nocapture"])
        .env(env_var, name)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn holder");
    let mut reports = ChildReports(BufReader::new(child.stdout.take().expect("stdout")).lines());
    let token = reports
        .next()
        .await
        .strip_prefix("token ")
        .expect("the child's first report is its token")
        .parse()
        .expect("token");
    (child, token, reports)
}

/// Send `signal` (`STOP`, `CONT`) to a child process.
fn signal(child: &tokio::process::Child, signal: &str) {
    let pid = child.id().expect("the child runs").to_string();
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &pid])
        .status()
        .is_ok_and(|s| s.success());
    assert!(sent, "kill -{signal} {pid}");
}

/// The environment variable that makes a test binary the holder of
/// [`frozen_holder_loses_its_lock_to_a_later_token`] (set in the child).
pub const FROZEN_HOLDER_ENV: &str = "DISTLOCK_FROZEN_HOLDER";

/// A holder in a child process (auto-renewed, `opts`' TTL) is frozen with
/// SIGSTOP, as a long GC pause or a stopped VM would freeze it. The server
/// frees the lock within `freed_within` of the freeze (its lease, its
/// session or its idle bound ran out) and another client is granted it
/// with a larger fencing token. Thawed, the holder's `lost()` fires and its
/// release answers "not held"; the new holder's lock is undisturbed.
///
/// Call it from a test named `test` (the child runs that same test) with
/// the client `connect` builds.
pub async fn frozen_holder_loses_its_lock_to_a_later_token<L, F>(
    test: &str,
    connect: F,
    opts: lock_core::LockOptions,
    freed_within: Duration,
) where
    L: lock_core::DistributedLock,
    F: AsyncFn() -> L,
{
    use lock_core::Wait;
    if let Some(name) = holder_role(FROZEN_HOLDER_ENV) {
        let locks = connect().await;
        let g = locks
            .acquire(&name, &opts.clone().wait(Wait::No))
            .await
            .expect("the child's acquire");
        announce_token(g.fencing_token().unwrap_or(0));
        let reason = tokio::time::timeout(Duration::from_secs(120), g.lost())
            .await
            .expect("lost() fires in the thawed child");
        println!("CHILD lost {reason:?}");
        println!("CHILD released {:?}", g.release().await);
        return;
    }
    let name = unique("frozen-holder");
    let locks = connect().await;
    let (mut child, first, mut reports) =
        spawn_announcing_holder(test, FROZEN_HOLDER_ENV, &name).await;
    signal(&child, "STOP");
    let frozen_at = tokio::time::Instant::now();
    let bound = freed_within + Duration::from_secs(5);
    let taken = locks
        .acquire(&name, &opts.clone().wait(Wait::UpTo(bound)))
        .await
        .unwrap_or_else(|e| {
            panic!("the frozen holder's lock was not freed within {bound:?}: {e:?}")
        });
    let after = frozen_at.elapsed();
    if let (Some(next), true) = (taken.fencing_token(), first > 0) {
        assert!(next > first, "token {next} granted after {first}");
    }
    signal(&child, "CONT");
    let lost = reports.next().await;
    assert!(
        lost.starts_with("lost"),
        "the thawed holder reported {lost:?}"
    );
    let released = reports.next().await;
    assert!(
        released == "released Ok(false)" || released.starts_with("released Err(Lost"),
        "the thawed holder's release must answer not-held: {released}"
    );
    assert!(child.wait().await.expect("reap the child").success());
    assert!(
        taken.release().await.expect("release"),
        "the new holder's lock was disturbed by the thawed one"
    );
    eprintln!(
        "{}: a frozen holder's lock was granted again {after:?} after SIGSTOP; thawed it said {lost}, {released}",
        locks.capabilities().backend
    );
}

/// The error kinds an acquisition sees when its server fails under it.
/// With `servers` killed (SIGKILL), a waiting `acquire` (queued behind a
/// holder) and a `try_acquire` both end in an error that
/// [`is_transient`](lock_core::LockError::is_transient) (`Unavailable`,
/// `QuorumNotReached`), never `Lost` (which belongs to a held
/// guard), `Backend` or a hang; the waiting `acquire` (a 6 s wait) returns
/// by the end of its wait plus [`WAIT_OVERRUN`](lock_core::WAIT_OVERRUN),
/// not when the servers come back; the holder's `release()` returns within
/// [`RELEASE_PATIENCE`](lock_core::RELEASE_PATIENCE), with an answer or a
/// transient error; once the servers are started again the
/// client acquires again without being rebuilt. `connect` builds the two
/// clients (holder and waiter).
pub async fn server_failure_gives_transient_errors<L, F>(
    connect: F,
    servers: &[&str],
    opts: lock_core::LockOptions,
) where
    L: lock_core::DistributedLock + 'static,
    F: AsyncFn() -> L,
{
    use lock_core::{LockError, Wait};
    let (locks, other) = (connect().await, std::sync::Arc::new(connect().await));
    let transient = |what: &str, r: &Result<(), LockError>| match r {
        Err(e @ (LockError::Lost { .. } | LockError::Backend { .. })) => {
            panic!("{what}: a server failure gave {e:?}")
        }
        Err(e) => assert!(e.is_transient(), "{what}: not transient: {e:?}"),
        Ok(()) => panic!("{what}: granted while {servers:?} were down"),
    };
    let name = unique("server-down");
    let holder = locks
        .acquire(&name, &opts.clone().wait(Wait::No))
        .await
        .expect("holder");
    let wait = Duration::from_secs(6);
    let waiter = spawn_timed_acquire(&other, &name, opts.clone().wait(Wait::UpTo(wait)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let restore = Restore(servers.iter().map(|s| s.to_string()).collect());
    for server in servers {
        services(&["kill", server]);
    }
    let attempt = tokio::time::timeout(
        Duration::from_secs(30),
        locks.try_acquire(&unique("while-down"), &opts.clone().wait(Wait::No)),
    )
    .await
    .expect("try_acquire returns while the server is down");
    transient("try_acquire", &attempt.map(drop));
    let waited = bounded_wait(waiter, wait, "down").await;
    transient("a waiting acquire", &waited);
    bounded_release(holder, "down").await;
    drop(restore);
    acquires_again(&locks, &opts.wait(Wait::No), Duration::from_secs(60)).await;
}

/// A frozen server (SIGSTOP: its connections stay open and nothing is
/// answered) does not stretch the caller's bounds: with `servers` frozen
/// under a waiting `acquire` (a 3 s wait, queued behind a holder), the
/// wait returns by its end plus [`WAIT_OVERRUN`](lock_core::WAIT_OVERRUN)
/// with a `Timeout` or an error that is transient, and the holder's `release()` within
/// [`RELEASE_PATIENCE`](lock_core::RELEASE_PATIENCE), with an answer or a
/// transient error. Once the servers are resumed the client acquires
/// again. `connect` builds the two clients (holder and waiter).
pub async fn frozen_server_bounds_waits_and_releases<L, F>(
    connect: F,
    servers: &[&str],
    opts: lock_core::LockOptions,
) where
    L: lock_core::DistributedLock + 'static,
    F: AsyncFn() -> L,
{
    use lock_core::Wait;
    let (locks, other) = (connect().await, std::sync::Arc::new(connect().await));
    let name = unique("server-frozen");
    let holder = locks
        .acquire(&name, &opts.clone().wait(Wait::No))
        .await
        .expect("holder");
    let wait = Duration::from_secs(3);
    let waiter = spawn_timed_acquire(&other, &name, opts.clone().wait(Wait::UpTo(wait)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let restore = Restore(servers.iter().map(|s| s.to_string()).collect());
    for server in servers {
        services(&["pause", server]);
    }
    let waited = bounded_wait(waiter, wait, "frozen").await;
    match &waited {
        Err(lock_core::LockError::Timeout { .. }) => {}
        Err(e) => assert!(e.is_transient(), "a waiting acquire: not transient: {e:?}"),
        Ok(()) => panic!("granted a held lock while {servers:?} were frozen"),
    }
    bounded_release(holder, "frozen").await;
    drop(restore);
    acquires_again(&locks, &opts.wait(Wait::No), Duration::from_secs(60)).await;
}

/// A grant answered after its lease's validity deadline is never handed
/// out as held: with `servers` frozen (SIGSTOP: the request waits,
/// unanswered) for `freeze` while a single unrenewed attempt (`opts`) is
/// under way, the attempt either hands out a guard that is still valid (a
/// backend that confirms a slow grant counts its lease from the
/// confirmation) or reports a transient error and gives the grant back,
/// so that the name is free at once. Never a guard already past its
/// deadline, and never "held": nobody else holds the lock. `connect`'s
/// client must bound its requests by more than `freeze`, so that the
/// grant is answered, not timed out; a `freeze` inside the safety margin
/// (after the validity deadline, before the TTL) is the narrow case.
pub async fn a_grant_answered_past_its_deadline_is_not_handed_out<L, F>(
    connect: F,
    servers: &[&str],
    opts: lock_core::LockOptions,
    freeze: Duration,
) where
    L: lock_core::DistributedLock + 'static,
    F: AsyncFn() -> L,
{
    let locks = std::sync::Arc::new(connect().await);
    let opts = opts.wait(lock_core::Wait::No).auto_renew(false);
    // Connections and sessions are open before the freeze.
    acquires_again(locks.as_ref(), &opts, Duration::from_secs(10)).await;
    let name = unique("late-grant");
    let restore = Restore(servers.iter().map(|s| s.to_string()).collect());
    for server in servers {
        services(&["pause", server]);
    }
    let attempt = {
        let (locks, name, opts) = (std::sync::Arc::clone(&locks), name.clone(), opts.clone());
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            let answer = locks.try_acquire(&name, &opts).await;
            (answer, start.elapsed())
        })
    };
    tokio::time::sleep(freeze).await;
    for server in servers {
        services(&["resume", server]);
    }
    drop(restore);
    let (answer, took) = tokio::time::timeout(Duration::from_secs(30), attempt)
        .await
        .expect("the attempt returns once the servers are resumed")
        .expect("attempt task");
    assert!(
        took >= freeze,
        "the attempt returned {took:?} after its request, before the servers were resumed ({answer:?})"
    );
    match answer {
        Ok(Some(guard)) => {
            assert_eq!(
                guard.is_lost(),
                None,
                "a guard answered {took:?} after its request was handed out already lost"
            );
            assert!(
                guard
                    .validity_deadline()
                    .is_some_and(|d| d > tokio::time::Instant::now()),
                "a guard answered {took:?} after its request was handed out past its deadline"
            );
            assert!(
                guard.release().await.expect("release"),
                "the guard held the lock"
            );
        }
        Ok(None) => panic!("reported held {took:?} after the request, but nobody holds the lock"),
        Err(e) => {
            assert!(e.is_transient(), "a late grant's error is transient: {e:?}");
            let again = locks
                .try_acquire(&name, &opts)
                .await
                .expect("try again")
                .expect("the late grant was given back");
            assert!(again.release().await.expect("release"));
        }
    }
}

/// A little beyond each bound, for this loaded machine's scheduling.
const SCHEDULING_SLACK: Duration = Duration::from_millis(500);

/// `locks.acquire(name, opts)` in a task that also returns how long it took.
fn spawn_timed_acquire<L>(
    locks: &std::sync::Arc<L>,
    name: &str,
    opts: lock_core::LockOptions,
) -> tokio::task::JoinHandle<(Result<(), lock_core::LockError>, Duration)>
where
    L: lock_core::DistributedLock + 'static,
{
    let (locks, name) = (std::sync::Arc::clone(locks), name.to_string());
    tokio::spawn(async move {
        let start = tokio::time::Instant::now();
        let outcome = locks.acquire(&name, &opts).await.map(drop);
        (outcome, start.elapsed())
    })
}

/// The outcome of a `wait`-long acquire spawned by [`spawn_timed_acquire`]
/// while the servers are `state` (down, frozen), which must have returned
/// by the end of its wait plus [`WAIT_OVERRUN`](lock_core::WAIT_OVERRUN).
async fn bounded_wait(
    waiter: tokio::task::JoinHandle<(Result<(), lock_core::LockError>, Duration)>,
    wait: Duration,
    state: &str,
) -> Result<(), lock_core::LockError> {
    let (waited, took) = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .unwrap_or_else(|_| panic!("the waiter returns while the server is {state}"))
        .expect("waiter task");
    assert!(
        took <= wait + lock_core::WAIT_OVERRUN + SCHEDULING_SLACK,
        "a {wait:?} wait returned after {took:?} with the servers {state} ({waited:?})"
    );
    waited
}

/// Release `holder` while the servers are `state` (down, frozen): an answer
/// or a transient error, within [`RELEASE_PATIENCE`](lock_core::RELEASE_PATIENCE).
async fn bounded_release(holder: lock_core::LockGuard, state: &str) {
    let start = tokio::time::Instant::now();
    let released = holder.release().await;
    let took = start.elapsed();
    if let Err(e) = &released {
        assert!(e.is_transient(), "release with the servers {state}: {e:?}");
    }
    assert!(
        took <= lock_core::RELEASE_PATIENCE + SCHEDULING_SLACK,
        "release() returned after {took:?} with the servers {state} ({released:?})"
    );
}

/// A holder without auto-renewal whose lock ends with its connection learns
/// of a server crash before anyone else is granted the lock: with the lock
/// held (TTL 6 s, unrenewed), `servers` are killed and, after 2.5 s, started
/// again; another client then acquires the lock, and by then the holder's
/// `lost()` must have fired by the backend's own signal, well before the
/// validity deadline. `connect` builds the two clients.
pub async fn unrenewed_holder_learns_of_a_server_crash<L, F>(connect: F, servers: &[&str])
where
    L: lock_core::DistributedLock + 'static,
    F: AsyncFn() -> L,
{
    use lock_core::{LockOptions, LossReason, Wait};
    let (locks, other) = (connect().await, connect().await);
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(6))
        .auto_renew(false)
        .wait(Wait::No);
    let name = unique("server-crash");
    let holder = locks.acquire(&name, &opts).await.expect("holder");
    let deadline = holder.validity_deadline().expect("a lease with a deadline");
    let lease = std::sync::Arc::clone(holder.lease());
    let lost = tokio::spawn(async move {
        let reason = lease.lost().await;
        (reason, tokio::time::Instant::now())
    });
    let restore = Restore(servers.iter().map(|s| s.to_string()).collect());
    for server in servers {
        services(&["kill", server]);
    }
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    drop(restore);
    let started = tokio::time::Instant::now();
    let next = loop {
        match other
            .acquire(
                &name,
                &opts.clone().wait(Wait::UpTo(Duration::from_secs(2))),
            )
            .await
        {
            Ok(g) => break g,
            Err(e) => assert!(
                started.elapsed() < Duration::from_secs(30),
                "no grant after the restart: {e:?}"
            ),
        }
    };
    let granted_at = tokio::time::Instant::now();
    assert!(
        lost.is_finished(),
        "another client was granted the lock while the holder still believed in it"
    );
    let (reason, lost_at) = lost.await.expect("lost task");
    assert_ne!(
        reason,
        LossReason::DeadlinePassed,
        "only the deadline noticed"
    );
    assert!(lost_at < granted_at && lost_at < deadline);
    assert!(next.release().await.expect("release"));
    drop(holder);
}

/// The election `name`, read through `locks`, shows `won` (a campaign's
/// guard) as its leader, with `value`: a win after a fault is the one the
/// server records.
pub async fn assert_election_shows(
    locks: std::sync::Arc<dyn lock_core::DistributedLock>,
    name: &str,
    won: &lock_core::LockGuard,
    value: &[u8],
) {
    let leader = lock_core::Election::new(locks, name)
        .leader()
        .await
        .expect("leader")
        .expect("a leader");
    assert_eq!(
        Some(leader.term),
        won.fencing_token(),
        "the election shows the win"
    );
    assert_eq!(leader.value, value);
}

/// After servers come back: poll `try_acquire` (every 100 ms, on fresh
/// names, with `opts`) until a lock is granted and released again, and
/// return how long that took; fails the test if it takes longer than
/// `within`.
pub async fn acquires_again(
    locks: &dyn lock_core::DistributedLock,
    opts: &lock_core::LockOptions,
    within: Duration,
) -> Duration {
    let started = tokio::time::Instant::now();
    loop {
        match locks.try_acquire(&unique("after-restart"), opts).await {
            Ok(Some(g)) => {
                assert!(g.release().await.expect("release"));
                return started.elapsed();
            }
            other => assert!(
                started.elapsed() < within,
                "no recovery within {within:?} after the restart: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The environment variable that makes a test binary the holder of
/// [`killed_holder_frees_the_lock`] (set in the child only).
pub const KILLED_HOLDER_ENV: &str = "DISTLOCK_KILLED_HOLDER";

/// A holder in a child process is killed with SIGKILL; its lock is freed as
/// the backend's `crash_release` capability says: at once when the server
/// sees the connection close (`Connection`), after the lease's TTL
/// (`Ttl`), or when the session expires (`Session`: within twice the
/// `session` timeout and a second). The next grant carries a larger
/// fencing token.
///
/// Call it from a test named `test` (the child runs that same test) with
/// the client `connect` builds and the holder's `opts` (its TTL).
pub async fn killed_holder_frees_the_lock<L, F>(
    test: &str,
    connect: F,
    opts: lock_core::LockOptions,
    session: Duration,
) where
    L: lock_core::DistributedLock,
    F: AsyncFn() -> L,
{
    use lock_core::{CrashRelease, Wait};
    if let Some(name) = holder_role(KILLED_HOLDER_ENV) {
        let locks = connect().await;
        let g = locks
            .acquire(&name, &opts.clone().wait(Wait::No))
            .await
            .expect("child acquire");
        announce_token(g.fencing_token().unwrap_or(0));
        tokio::time::sleep(Duration::from_secs(120)).await;
        return;
    }
    let name = unique("killed-holder");
    let locks = connect().await;
    let (mut child, first) = spawn_holder(test, KILLED_HOLDER_ENV, &name).await;
    let announced = tokio::time::Instant::now();
    let probe = opts.clone().wait(Wait::No);
    assert!(
        locks
            .try_acquire(&name, &probe)
            .await
            .expect("try")
            .is_none(),
        "the child's lock is held"
    );
    child.start_kill().expect("SIGKILL");
    let killed_at = tokio::time::Instant::now();
    child.wait().await.expect("reap child");
    let caps = locks.capabilities();
    let bound = match caps.crash_release {
        CrashRelease::Connection => Duration::from_secs(3),
        CrashRelease::Ttl => opts.ttl + Duration::from_secs(3),
        CrashRelease::Session => session * 2 + Duration::from_secs(1),
        CrashRelease::ProcessExit => Duration::from_secs(3),
        other => panic!("no bound known for {other:?}: add one here"),
    };
    let g = locks
        .acquire(&name, &opts.clone().wait(Wait::UpTo(bound)))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{:?}: the dead holder's lock was not freed within {bound:?}: {e:?}",
                caps.crash_release
            )
        });
    let after = killed_at.elapsed();
    if caps.crash_release == CrashRelease::Ttl {
        // The lease ran out; it was granted before the child announced.
        assert!(
            announced.elapsed() + Duration::from_millis(100) >= opts.ttl,
            "freed before the TTL: {after:?} after the kill"
        );
    }
    if let (Some(next), true) = (g.fencing_token(), first > 0) {
        assert!(next > first, "token {next} after {first}");
    }
    eprintln!(
        "{}: a killed holder's lock ({:?}) was granted again {after:?} after SIGKILL",
        caps.backend, caps.crash_release
    );
    assert!(g.release().await.expect("release"));
}
