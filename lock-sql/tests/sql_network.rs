//! The shared network fault matrix (`lock_testkit::network`) against the
//! project's Postgres and MariaDB, in row and advisory mode: the holder
//! reaches the server through a proxy that partitions it or loses a
//! grant, a release or a renewal. The server frees a silent holder's lock
//! by its idle bound (`idle_in_transaction_session_timeout` and
//! `idle_session_timeout` on Postgres, `wait_timeout` and
//! `idle_transaction_timeout` on MariaDB), which the client sets from the
//! lease.

use std::time::Duration;

use lock_sql::{MySqlLock, PgLock};
use lock_testkit::faults::{env, upstreams_of, with_upstreams};
use lock_testkit::network::NetworkTarget;

/// The scenarios' TTL, and so the server's idle bound.
const TTL: Duration = Duration::from_secs(3);

fn postgres(mode: &'static str) -> NetworkTarget {
    let url = || env("DISTLOCK_TEST_POSTGRES_URL");
    let target = NetworkTarget::new(upstreams_of(&url()), move |hosts| async move {
        let url = format!(
            "{}?connect_timeout_ms=2000&mode={mode}",
            with_upstreams(&url(), &hosts)
        );
        PgLock::connect(&url).await.expect("connect")
    });
    described(target, mode)
}

fn mysql(mode: &'static str) -> NetworkTarget {
    let url = || env("DISTLOCK_TEST_MYSQL_URL");
    let target = NetworkTarget::new(upstreams_of(&url()), move |hosts| async move {
        let url = format!(
            "{}?connect_timeout_ms=2000&mode={mode}",
            with_upstreams(&url(), &hosts)
        );
        MySqlLock::connect(&url).await.expect("connect")
    });
    // MySQL's advisory release names the lock by its hash (computed by the
    // client), not by the name itself.
    let target = described(target, mode);
    if mode == "advisory" {
        target.release_is_anonymous()
    } else {
        target
    }
}

/// Row mode releases with a bare `COMMIT`, which does not name the lock;
/// advisory mode unlocks by name (Postgres) or by its hash (MySQL).
fn described(target: NetworkTarget, mode: &str) -> NetworkTarget {
    let target = target.ttl(TTL).freed_within(TTL + Duration::from_secs(1));
    if mode == "row" {
        target.release_is_anonymous()
    } else {
        target
    }
}

mod postgres_row {
    use super::*;
    lock_testkit::network_fault_matrix!(postgres("row"));
}

mod postgres_advisory {
    use super::*;
    lock_testkit::network_fault_matrix!(postgres("advisory"));
}

mod mysql_row {
    use super::*;
    lock_testkit::network_fault_matrix!(mysql("row"));
}

mod mysql_advisory {
    use super::*;
    lock_testkit::network_fault_matrix!(mysql("advisory"));
}

/// The wait counts from the call: a client whose new connection is slow to
/// reach the server (the pool has none idle) spends that time out of the
/// caller's wait, not on top of it. A lock held elsewhere, a connect delay
/// longer than the wait: the acquisition ends at about the delay (one
/// attempt once connected), not at the delay plus the whole wait.
mod slow_connections {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use lock_core::{DistributedLock, LockError, LockOptions, Wait};
    use lock_sql::{MySqlLock, PgLock};
    use lock_testkit::faults::{env, unique, upstreams_of, with_upstreams};
    use lock_testkit::tcp_proxy::TcpProxy;

    const CONNECT_DELAY: Duration = Duration::from_millis(1500);
    const WAIT: Duration = Duration::from_secs(1);

    /// A Postgres or MySQL client (by `env_var`'s server) in `mode`.
    async fn connect(env_var: &str, url: String, mode: &str) -> Arc<dyn DistributedLock> {
        let url = format!("{url}&mode={mode}");
        if env_var.contains("POSTGRES") {
            Arc::new(PgLock::connect(&url).await.expect("connect"))
        } else {
            Arc::new(MySqlLock::connect(&url).await.expect("connect"))
        }
    }

    async fn slow_connect_counts_against_the_wait(env_var: &str, mode: &str) {
        let url = env(env_var);
        let upstream = upstreams_of(&url).remove(0);
        let proxy = TcpProxy::start(&upstream).await;
        let via = with_upstreams(&url, &[proxy.addr().to_string()]);
        let client = connect(
            env_var,
            format!("{via}?connect_timeout_ms=5000&sessions=0"),
            mode,
        )
        .await;
        let other = connect(env_var, format!("{url}?sessions=0"), mode).await;
        let opts = LockOptions::new().ttl(Duration::from_secs(10));
        // Hold locks until one of them needed a new connection: then none
        // is idle, and the client's next acquisition connects anew. (The
        // first may connect for its token alone, on the side connection.)
        let first = client
            .acquire(&unique("kept"), &opts)
            .await
            .expect("a lock");
        let mut kept = vec![first];
        loop {
            let before = proxy.connections();
            let guard = client
                .acquire(&unique("kept"), &opts)
                .await
                .expect("a lock");
            kept.push(guard);
            if proxy.connections() > before {
                break;
            }
            assert!(kept.len() < 64, "the client never connected anew");
        }
        let name = unique("slow-connect");
        let held = other.acquire(&name, &opts).await.expect("the holder");
        let connected = proxy.connections();
        proxy.delay_new_connections(CONNECT_DELAY);
        let start = Instant::now();
        let outcome = client
            .acquire(&name, &opts.clone().wait(Wait::UpTo(WAIT)))
            .await;
        let took = start.elapsed();
        assert!(
            matches!(outcome, Err(LockError::Timeout { .. })),
            "{outcome:?}"
        );
        eprintln!(
            "took {took:?}; connections {connected} -> {}",
            proxy.connections()
        );
        assert!(
            proxy.connections() > connected,
            "the acquisition did not connect anew: the scenario did not happen"
        );
        assert!(
            took < CONNECT_DELAY + WAIT / 2,
            "the wait of {WAIT:?} began after the {CONNECT_DELAY:?} connect: it took {took:?}"
        );
        assert!(held.release().await.expect("release"));
        for guard in kept {
            assert!(guard.release().await.expect("release"));
        }
    }

    #[tokio::test]
    async fn postgres_row() {
        slow_connect_counts_against_the_wait("DISTLOCK_TEST_POSTGRES_URL", "row").await;
    }

    #[tokio::test]
    async fn postgres_advisory() {
        slow_connect_counts_against_the_wait("DISTLOCK_TEST_POSTGRES_URL", "advisory").await;
    }

    #[tokio::test]
    async fn mysql_row() {
        slow_connect_counts_against_the_wait("DISTLOCK_TEST_MYSQL_URL", "row").await;
    }

    #[tokio::test]
    async fn mysql_advisory() {
        slow_connect_counts_against_the_wait("DISTLOCK_TEST_MYSQL_URL", "advisory").await;
    }
}
