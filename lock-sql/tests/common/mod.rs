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
