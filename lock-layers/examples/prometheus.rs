//! Lock metrics in Prometheus' text format: a few workers contend for one
//! lock through `MetricsLayer`, and the exporter renders what a scrape of
//! `/metrics` would return: the inputs of a contention graph (acquisition
//! latency by outcome, hold times, waiters, renewals, losses).
//!
//! ```sh
//! cargo run -p lock-layers --example prometheus
//! ```

use std::sync::Arc;
use std::time::Duration;

use lock_core::{DistributedLock, LockOptions, MemoryLock, Wait};
use lock_layers::{LayerExt, MetricsLayer};
use metrics_exporter_prometheus::PrometheusBuilder;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // In a service, serve `handle.render()` on `/metrics` (or use the
    // exporter's own HTTP listener feature).
    let handle = PrometheusBuilder::new().install_recorder()?;
    let locks = (Arc::new(MemoryLock::new()) as Arc<dyn DistributedLock>).layer(MetricsLayer);
    let opts = LockOptions::new()
        .ttl(Duration::from_millis(300))
        .wait(Wait::UpTo(Duration::from_secs(5)));
    let mut workers = Vec::new();
    for _ in 0..4 {
        let (locks, opts) = (Arc::clone(&locks), opts.clone());
        workers.push(tokio::spawn(async move {
            for _ in 0..5 {
                let guard = locks.acquire("nightly-report", &opts).await?;
                tokio::time::sleep(Duration::from_millis(120)).await;
                guard.release().await?;
            }
            Ok::<_, lock_core::LockError>(())
        }));
    }
    for w in workers {
        w.await??;
    }
    print!("{}", handle.render());
    Ok(())
}
