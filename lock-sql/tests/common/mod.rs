//! Checks shared by the Postgres and MySQL fault tests.

use std::time::Duration;

use lock_core::faultkit::unique;
use lock_core::{DistributedLock, LockError, LockOptions, Wait};

/// Released locks' connections are kept warm for the next lock, not handed
/// back to the pool; they must not starve the pool's other users. `locks`
/// has a pool of 2: with both connections cached and one in use again,
/// `take_away` still gets a connection at once.
pub async fn warm_connections_do_not_starve_the_pool(
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
pub async fn tokens_survive_a_server_crash<L: DistributedLock>(
    server: &str,
    what: &str,
    connect: impl AsyncFn() -> Result<L, LockError>,
) {
    use lock_core::faultkit::{Restore, services};
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
