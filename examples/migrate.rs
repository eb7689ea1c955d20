//! A rolling migration between two backends, in one program: three tasks
//! stand for the three configurations of the fleet, and run side by side
//! as a rolling deploy would have them.
//!
//! ```sh
//! cargo run --example migrate                 # SQLite file → another SQLite file
//! cargo run --example migrate -- OLD_URL NEW_URL   # e.g. redis://… etcd://…
//! ```
//!
//! Step 1 processes lock on OLD_URL, step 2 on
//! `migrate://?from=OLD_URL&to=NEW_URL`, step 3 on NEW_URL with a higher
//! `fencing_epoch`. Phase A runs steps 1 and 2 together, phase B steps 2
//! and 3. A fenced resource (in memory here) checks that nobody is inside
//! twice and refuses tokens lower than the highest it accepted; the program
//! prints what it saw and fails if two holders ever overlapped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use distlock::{DistributedLock, LockError, LockOptions, Wait};

/// A resource that checks fencing tokens, and notices overlapping holders.
#[derive(Default)]
struct Resource {
    inside: AtomicBool,
    highest: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    overlaps: AtomicU64,
}

impl Resource {
    fn write(&self, token: Option<u64>) {
        if self.inside.swap(true, Ordering::SeqCst) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let token = token.unwrap_or(0);
        if self.highest.fetch_max(token, Ordering::SeqCst) <= token {
            self.accepted.fetch_add(1, Ordering::SeqCst);
        } else {
            self.refused.fetch_add(1, Ordering::SeqCst);
        }
        std::thread::sleep(Duration::from_millis(1));
        self.inside.store(false, Ordering::SeqCst);
    }
}

/// One process of step `step`: lock, write, release, `rounds` times.
async fn process(
    step: u8,
    locks: Arc<dyn DistributedLock>,
    resource: Arc<Resource>,
    rounds: usize,
) -> Result<(u8, u64, u64), LockError> {
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Wait::UpTo(Duration::from_secs(30)));
    let (mut lowest, mut highest) = (u64::MAX, 0);
    for _ in 0..rounds {
        let guard = locks.acquire("nightly-report", &opts).await?;
        let token = guard.fencing_token().unwrap_or(0);
        (lowest, highest) = (lowest.min(token), highest.max(token));
        if guard.is_lost().is_none() {
            resource.write(guard.fencing_token());
        }
        guard.release().await?;
        tokio::task::yield_now().await;
    }
    Ok((step, lowest, highest))
}

async fn phase(
    name: &str,
    steps: [(u8, &Arc<dyn DistributedLock>); 2],
    resource: &Arc<Resource>,
) -> Result<(), LockError> {
    let tasks: Vec<_> = steps
        .iter()
        .map(|(step, locks)| {
            tokio::spawn(process(*step, Arc::clone(locks), Arc::clone(resource), 200))
        })
        .collect();
    println!("{name}");
    for task in tasks {
        let (step, lowest, highest) = task
            .await
            .map_err(|e| LockError::invalid_options(format!("task failed: {e}")))??;
        println!("  step {step}: tokens {lowest}..={highest}");
    }
    println!(
        "  resource: {} writes accepted, {} refused (older token), {} overlaps",
        resource.accepted.swap(0, Ordering::SeqCst),
        resource.refused.swap(0, Ordering::SeqCst),
        resource.overlaps.load(Ordering::SeqCst),
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let tmp =
        tempfile::tempdir().map_err(|e| LockError::invalid_options(format!("no temp dir: {e}")))?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (old, new) = match args.as_slice() {
        [old, new] => (old.clone(), new.clone()),
        _ => (
            format!("sqlite://{}/old.db", tmp.path().display()),
            format!("sqlite://{}/new.db", tmp.path().display()),
        ),
    };
    let encode = |u: &str| url::form_urlencoded::byte_serialize(u.as_bytes()).collect::<String>();
    let separator = if new.contains('?') { '&' } else { '?' };
    let new_epoch = format!("{new}{separator}fencing_epoch=1");
    let migrate = format!("migrate://?from={}&to={}", encode(&old), encode(&new));

    let step1 = distlock::connect(&old).await?;
    let step2 = distlock::connect(&migrate).await?;
    let step3 = distlock::connect(&new_epoch).await?;
    println!(
        "step 1: {}\nstep 2: {}\nstep 3: {}",
        distlock::redact_url(&old),
        distlock::redact_url(&migrate),
        distlock::redact_url(&new_epoch)
    );
    let resource = Arc::new(Resource::default());
    phase(
        "phase A: steps 1 and 2 side by side",
        [(1, &step1), (2, &step2)],
        &resource,
    )
    .await?;
    phase(
        "phase B: steps 2 and 3 side by side",
        [(2, &step2), (3, &step3)],
        &resource,
    )
    .await?;
    let overlaps = resource.overlaps.load(Ordering::SeqCst);
    if overlaps > 0 {
        return Err(LockError::invalid_options(format!(
            "{overlaps} overlapping holders"
        )));
    }
    println!("no two holders at once");
    Ok(())
}
