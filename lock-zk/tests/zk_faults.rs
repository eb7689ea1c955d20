//! ZooKeeper faults: a holder process killed with SIGKILL frees its lock
//! when its session expires.

use std::time::Duration;

use lock_core::faultkit::{announce_token, env, holder_role, spawn_holder, unique};
use lock_core::{DistributedLock, LockOptions, Wait};
use lock_zk::ZkLock;
use tokio::time::Instant;

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
