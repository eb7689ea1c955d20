//! Many locks held at once by one client: the case a service that locks per
//! entity (an order, a tenant, a shard) depends on. A backend's scale test
//! calls [`holds_many_renewed_locks`] with its own client.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::time::Instant;

use lock_core::{DistributedLock, LockGuard, LockOptions, Wait};

/// How many acquisitions are in flight at once.
const PARALLEL: usize = 32;

/// What [`holds_many_renewed_locks`] measured.
#[derive(Debug, Clone)]
pub struct ScaleRun {
    /// Locks held.
    pub held: usize,
    /// Time to acquire them all.
    pub acquire: Duration,
    /// Time to release them all.
    pub release: Duration,
}

/// The lease of the locks [`holds_many_renewed_locks`] takes: long enough
/// that a stall of a few hundred milliseconds (a loaded two-core machine
/// running several test processes and every server) is not a loss, short
/// enough that the hold spans several renewal rounds.
pub const SCALE_TTL: Duration = Duration::from_secs(3);

/// How long [`holds_many_renewed_locks`] holds: more than two leases, so
/// every lock lives on renewals alone for most of it (about seven rounds).
pub const SCALE_HOLD: Duration = Duration::from_secs(7);

/// Acquire `count` distinct names (auto-renewed, [`SCALE_TTL`]), hold them
/// all for [`SCALE_HOLD`], and require that none was lost on the way: no
/// `lost()`, every validity deadline still ahead, a sample refused to a new
/// acquisition, and every release finding its lock still ours.
pub async fn holds_many_renewed_locks(
    lock: &dyn DistributedLock,
    prefix: &str,
    count: usize,
) -> ScaleRun {
    let (ttl, hold) = (SCALE_TTL, SCALE_HOLD);
    crate::faults::capture_logs();
    let opts = LockOptions::new()
        .ttl(ttl)
        .wait(Wait::UpTo(ttl * 10))
        .auto_renew(true);
    let started = Instant::now();
    let guards: Vec<LockGuard> = futures_util::stream::iter(0..count)
        .map(|i| {
            let opts = opts.clone();
            async move {
                let name = format!("{prefix}/{i}");
                lock.acquire(&name, &opts)
                    .await
                    .unwrap_or_else(|e| panic!("acquiring {name}: {e}"))
            }
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    let acquire = started.elapsed();
    tracing::info!(count, ?acquire, "all locks acquired");

    let until = Instant::now() + hold;
    while Instant::now() < until {
        tokio::time::sleep(ttl / 4).await;
        let lost: Vec<String> = guards
            .iter()
            .filter_map(|g| g.is_lost().map(|r| format!("{}: {r}", g.name())))
            .take(5)
            .collect();
        assert!(
            lost.is_empty(),
            "{} of {count} locks lost while held, e.g. {lost:?}",
            guards.iter().filter(|g| g.is_lost().is_some()).count()
        );
    }
    let now = Instant::now();
    for g in &guards {
        let deadline = g.validity_deadline();
        assert!(
            deadline.is_none_or(|d| d > now),
            "{}: validity deadline passed after {hold:?} of renewals",
            g.name()
        );
    }
    for g in guards.iter().step_by((count / 20).max(1)) {
        let refused = lock
            .try_acquire(g.name(), &LockOptions::new().ttl(ttl))
            .await
            .unwrap_or_else(|e| panic!("probing {}: {e}", g.name()));
        assert!(
            refused.is_none(),
            "{} was granted again while held",
            g.name()
        );
    }

    let started = Instant::now();
    let released: Vec<(String, bool)> = futures_util::stream::iter(guards)
        .map(|g| async move {
            let name = g.name().to_string();
            let held = g
                .release()
                .await
                .unwrap_or_else(|e| panic!("releasing {name}: {e}"));
            (name, held)
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    let release = started.elapsed();
    let gone: Vec<&String> = released
        .iter()
        .filter(|(_, held)| !held)
        .map(|(name, _)| name)
        .collect();
    assert!(
        gone.is_empty(),
        "{} locks were no longer ours at release, e.g. {:?}",
        gone.len(),
        &gone[..gone.len().min(5)]
    );
    ScaleRun {
        held: count,
        acquire,
        release,
    }
}
