//! etcd lock benchmark: distlock against the raw floor of the same server
//! and against etcd's built-in Lock RPC, in one run.
//!
//! ```sh
//! export $(scripts/services.sh env | xargs)
//! cargo bench -p lock-etcd --bench etcd
//! ```
//!
//! Compacts the history first (etcd slows down as it grows). Reports
//! p50/p99 of: the raw floor (a put-if-absent transaction and a delete, on
//! one lease, plain etcd-client); the built-in Lock RPC (lock + unlock);
//! distlock acquire + release on its session lease — interleaved sample by
//! sample. Then 8 tasks with a client each and 1 ms of work inside the
//! lock: acquisitions and hand-offs per second, hand-off latency, per-task
//! min/max, distlock against the Lock RPC.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use lock_core::{DistributedLock, LockOptions, Wait};
use lock_etcd::EtcdLock;
use lock_testkit::bench::{contend, contend_on, percentiles, print_runs, ratios, us};

const SAMPLES: usize = 1_000;
const TASKS: usize = 8;
const RUN: Duration = Duration::from_secs(4);
const WORK: Duration = Duration::from_millis(1);

fn url() -> String {
    std::env::var("DISTLOCK_TEST_ETCD_URL")
        .expect("DISTLOCK_TEST_ETCD_URL (see scripts/services.sh env)")
}

async fn raw_client() -> Client {
    Client::connect([url().replace("etcd://", "http://")], None)
        .await
        .expect("etcd client")
}

#[tokio::main]
async fn main() {
    let locks = EtcdLock::connect(&url()).await.expect("distlock");
    locks.compact().await.expect("compact");
    let mut raw = raw_client().await;
    let lease = raw.lease_grant(60, None).await.expect("lease").id();
    let opts = LockOptions::new().wait(Wait::No); // the session's TTL: on the session lease

    let mut samples: [Vec<Duration>; 3] = Default::default();
    for i in 0..SAMPLES + SAMPLES / 10 {
        let keep = i >= SAMPLES / 10; // the first tenth warms up
        let key = format!("/bench/raw/{i}");
        let t = Instant::now();
        let put = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                "x",
                Some(PutOptions::new().with_lease(lease)),
            )]);
        assert!(raw.txn(put).await.expect("txn").succeeded());
        raw.delete(key.as_str(), None).await.expect("delete");
        let floor = t.elapsed();

        let t = Instant::now();
        let held = raw
            .lock(
                "/bench/rpc",
                Some(etcd_client::LockOptions::new().with_lease(lease)),
            )
            .await
            .expect("Lock RPC");
        raw.unlock(held.key()).await.expect("Unlock RPC");
        let rpc = t.elapsed();

        let t = Instant::now();
        let g = locks
            .acquire("bench/distlock", &opts)
            .await
            .expect("acquire");
        assert!(g.release().await.expect("release"));
        let ours = t.elapsed();

        if keep {
            for (v, d) in samples.iter_mut().zip([floor, rpc, ours]) {
                v.push(d);
            }
        }
    }
    let [floor, rpc, ours] = samples.map(percentiles);
    println!("uncontended cycle (p50 / p99, µs)");
    for (what, (p50, p99)) in [
        ("raw floor: put-if-absent txn + delete", floor),
        ("etcd Lock RPC: lock + unlock", rpc),
        ("distlock acquire + release", ours),
    ] {
        println!("  {what:<40} {:>8.1} / {:>8.1}", us(p50), us(p99));
    }
    let ratio =
        |a: (Duration, Duration), b: (Duration, Duration)| a.0.as_secs_f64() / b.0.as_secs_f64();
    println!(
        "  distlock / raw floor: {:.3}x   distlock / Lock RPC: {:.3}x   (p50)",
        ratio(ours, floor),
        ratio(ours, rpc)
    );

    let mut clients = Vec::new();
    let mut raws = Vec::new();
    for _ in 0..TASKS {
        clients.push(
            Arc::new(EtcdLock::connect(&url()).await.expect("distlock client"))
                as Arc<dyn DistributedLock>,
        );
        let mut c = raw_client().await;
        let lease = c.lease_grant(60, None).await.expect("lease").id();
        raws.push((c, lease));
    }
    let o = LockOptions::new().wait_timeout(Duration::from_secs(30));
    let ours = contend_on(clients, "bench/contended", o, WORK, Duration::ZERO, RUN).await;
    let raws = Arc::new(tokio::sync::Mutex::new(raws));
    let theirs = contend(TASKS, RUN, |t, end, log| {
        let raws = raws.clone();
        async move {
            let (mut c, lease) = {
                let r = raws.lock().await;
                (r[t].0.clone(), r[t].1)
            };
            while Instant::now() < end {
                let held = c
                    .lock(
                        "/bench/rpc-contended",
                        Some(etcd_client::LockOptions::new().with_lease(lease)),
                    )
                    .await
                    .expect("Lock RPC");
                let granted = Instant::now();
                tokio::time::sleep(WORK).await;
                let released = Instant::now();
                c.unlock(held.key()).await.expect("Unlock RPC");
                log.lock().expect("log").push((granted, released, t));
            }
        }
    })
    .await;
    print_runs(
        &format!("{TASKS} tasks, a client each; 1 ms of work inside, re-acquire at once"),
        RUN,
        &[("distlock", &ours), ("Lock RPC", &theirs)],
    );
    let (acquisitions, handoffs) = ratios(&ours, &theirs);
    println!(
        "  distlock / Lock RPC: {acquisitions:.2}x acquisitions/s, {handoffs:.2}x hand-offs/s"
    );
}
