//! ZooKeeper faults: a holder process killed with SIGKILL frees its lock
//! when its session expires; a frozen server makes the holder suspect, then
//! confirm, its loss, and the client recovers on a new session.
//!
//! The freeze stops the standalone server, so these tests run one at a time
//! (a shared mutex) in this binary, apart from the conformance suite.

use std::time::Duration;

use lock_core::faultkit::{announce_token, env, holder_role, spawn_holder, unique};
use lock_core::{DistributedLock, LockOptions, Wait};
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

const CHILD_ENV: &str = "DISTLOCK_ZK_KILLED_HOLDER";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_frees_the_lock_when_its_session_expires() {
    if let Some(name) = holder_role(CHILD_ENV) {
        let locks = client().await;
        let g = locks
            .acquire(&name, &LockOptions::new().wait(Wait::No))
            .await
            .expect("child acquire");
        announce_token(g.fencing_token().expect("token"));
        tokio::time::sleep(Duration::from_secs(60)).await;
        return;
    }
    let _serial = SERIAL.lock().await;
    let name = unique("killed");
    let (mut child, first) = spawn_holder(
        "a_killed_holder_frees_the_lock_when_its_session_expires",
        CHILD_ENV,
        &name,
    )
    .await;
    let locks = client().await;
    let opts = LockOptions::new().wait(Wait::No);
    assert!(
        locks
            .try_acquire(&name, &opts)
            .await
            .expect("try")
            .is_none()
    );
    child.start_kill().expect("SIGKILL");
    let killed_at = Instant::now();
    child.wait().await.expect("reap child");
    let g = locks
        .acquire(&name, &opts.clone().wait_timeout(SESSION * 5))
        .await
        .expect("the dead holder's lock is freed");
    let after = killed_at.elapsed();
    assert!(g.fencing_token().expect("token") > first);
    assert!(after < SESSION * 3, "freed only after {after:?}");
    eprintln!(
        "zk faults: a killed holder's lock was acquired {after:?} after SIGKILL (session timeout {SESSION:?})"
    );
    assert!(g.release().await.expect("release"));
}

/// The standalone server is frozen (SIGSTOP) past the session timeout: the
/// holder sees a suspected loss at once, then a confirmed one when the
/// thawed server expires the session, and the same client acquires again
/// on a fresh session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_suspends_then_expires_and_the_client_recovers() {
    use lock_core::faultkit::{Restore, services};
    use lock_core::{LossKind, LossReason};
    let _serial = SERIAL.lock().await;
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
