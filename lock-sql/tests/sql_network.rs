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
