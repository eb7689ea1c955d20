//! Quickstart: several workers contend for one lock.
//!
//! Runs with no server: by default the locks live in a SQLite file in a
//! temporary directory. Set `DISTLOCK_URL` to try another backend, e.g.
//! `DISTLOCK_URL=memory:// cargo run --example quickstart`.
//!
//! Each worker takes the lock, prints its fencing token, does its "work"
//! under `tokio::select!` so that it stops at once if `lost()` fires, and
//! releases. The last part shows `lost()` firing for a lease that is not
//! renewed.

use std::time::Duration;

use distlock::{LockError, LockOptions, Wait};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();

    // Keep the temporary directory alive for the whole run.
    let tmp =
        tempfile::tempdir().map_err(|e| LockError::invalid_options(format!("no temp dir: {e}")))?;
    let url = std::env::var("DISTLOCK_URL")
        .unwrap_or_else(|_| format!("sqlite://{}/quickstart.db", tmp.path().display()));
    let locks = distlock::connect(&url).await?;
    let caps = locks.capabilities();
    println!(
        "backend: {} ({:?}-grade, fencing {:?}, waiters {:?})",
        caps.backend, caps.grade, caps.fencing, caps.waiting
    );

    let opts = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait(Wait::UpTo(Duration::from_secs(30)));
    let mut workers = Vec::new();
    for id in 1..=4 {
        let (locks, opts) = (locks.clone(), opts.clone());
        workers.push(tokio::spawn(async move {
            for round in 1..=2 {
                let guard = locks.acquire("quickstart/report", &opts).await?;
                let token = guard.fencing_token();
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {
                        println!("worker {id}, round {round}: wrote the report with fencing token {token:?}");
                    }
                    reason = guard.lost() => {
                        println!("worker {id}: lock lost ({reason}); abandoning the write");
                    }
                }
                guard.release().await?;
            }
            Ok::<_, LockError>(())
        }));
    }
    for w in workers {
        w.await
            .map_err(|e| LockError::invalid_options(format!("worker panicked: {e}")))??;
    }

    // A short lease without renewal: lost() fires at its validity deadline,
    // before anyone else can be granted the lock.
    let short = LockOptions::new()
        .ttl(Duration::from_millis(300))
        .auto_renew(false)
        .wait(Wait::No);
    let guard = locks.acquire("quickstart/short-lease", &short).await?;
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(5)) => println!("unexpected: the lease outlived its TTL"),
        reason = guard.lost() => println!("short lease: lost() fired: {reason}"),
    }
    println!(
        "release after lost(): the server still had it as ours: {}",
        guard.release().await?
    );
    Ok(())
}
