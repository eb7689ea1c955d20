//! Compare backends side by side in one program.
//!
//! ```sh
//! cargo run --release --example compare                    # memory and SQLite
//! cargo run --release --example compare -- memory:// sqlite:///tmp/a.db
//! ```
//!
//! For each URL: the capabilities (as data), then the median and 99th
//! percentile of an uncontended acquire + release cycle and of a contended
//! hand-off between two tasks. The first URL is the reference that the others
//! are reported against.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{DistributedLock, LockError, LockOptions, Wait};

const CYCLES: usize = 300;

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let tmp =
        tempfile::tempdir().map_err(|e| LockError::invalid_options(format!("no temp dir: {e}")))?;
    let mut urls: Vec<String> = std::env::args().skip(1).collect();
    if urls.is_empty() {
        urls = vec![
            "memory://".to_string(),
            format!("sqlite://{}/compare.db", tmp.path().display()),
        ];
    }
    let mut reference: Option<Duration> = None;
    for url in &urls {
        let locks = distlock::connect(url).await?;
        let c = locks.capabilities();
        println!("{}  ({})", c.backend, distlock::redact_url(url));
        println!(
            "  grade {:?}, fencing {:?}, fair {}, crash release {:?}, survives a server failure {}, clocks {}, waiters {:?}",
            c.grade,
            c.fencing,
            c.fair_queue,
            c.crash_release,
            c.survives_server_failure,
            c.depends_on_clocks,
            c.waiting
        );
        let cycle = uncontended(&locks).await?;
        let handoff = contended(&locks).await?;
        let base = *reference.get_or_insert(cycle.0);
        println!(
            "  acquire+release: median {:?}, p99 {:?} ({:.1}x the first URL)",
            cycle.0,
            cycle.1,
            cycle.0.as_secs_f64() / base.as_secs_f64()
        );
        println!(
            "  hand-off between two tasks: median {:?}, p99 {:?}",
            handoff.0, handoff.1
        );
    }
    Ok(())
}

fn median_p99(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

async fn uncontended(locks: &Arc<dyn DistributedLock>) -> Result<(Duration, Duration), LockError> {
    let opts = LockOptions::new().auto_renew(false).wait(Wait::No);
    let mut samples = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        let start = Instant::now();
        let g = locks.acquire("compare/uncontended", &opts).await?;
        g.release().await?;
        samples.push(start.elapsed());
    }
    Ok(median_p99(samples))
}

/// Time from a release to the waiting task's grant, alternating holders.
async fn contended(locks: &Arc<dyn DistributedLock>) -> Result<(Duration, Duration), LockError> {
    let opts = LockOptions::new()
        .auto_renew(false)
        .wait(Wait::UpTo(Duration::from_secs(10)));
    let mut samples = Vec::with_capacity(CYCLES / 3);
    for _ in 0..CYCLES / 3 {
        let held = locks.acquire("compare/contended", &opts).await?;
        let waiter = {
            let (locks, opts) = (locks.clone(), opts.clone());
            tokio::spawn(async move {
                let g = locks.acquire("compare/contended", &opts).await;
                (Instant::now(), g)
            })
        };
        tokio::time::sleep(Duration::from_millis(2)).await;
        let released = Instant::now();
        held.release().await?;
        let (granted, g) = waiter
            .await
            .map_err(|e| LockError::invalid_options(format!("waiter panicked: {e}")))?;
        g?.release().await?;
        samples.push(granted.saturating_duration_since(released));
    }
    Ok(median_p99(samples))
}
