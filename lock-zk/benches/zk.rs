//! ZooKeeper lock benchmark: distlock against the raw floor of the same
//! server and against zookeeper-client's own lock recipe, in one run.
//!
//! ```sh
//! export $(scripts/services.sh env | xargs)
//! cargo bench -p lock-zk --bench zk
//! ```
//!
//! Reports p50/p99 of: the raw floor (create an ephemeral-sequential node,
//! list the children, delete the node, plain zookeeper-client); the crate's
//! recipe (`Client::lock`, then deleting its node); distlock acquire +
//! release — interleaved sample by sample. Then 8 tasks, and 2, with a
//! client each and 1 ms of work inside the lock, distlock against the
//! recipe.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{DistributedLock, LockOptions, Wait};
use lock_testkit::bench::{contend, contend_on, percentiles, print_runs, ratios, us};
use lock_zk::ZkLock;
use zookeeper_client::{Acls, Client, CreateMode, LockPrefix};

const SAMPLES: usize = 1_000;
const TASKS: usize = 8;
const RUN: Duration = Duration::from_secs(4);
const WORK: Duration = Duration::from_millis(1);

fn url() -> String {
    std::env::var("DISTLOCK_TEST_ZK_URL")
        .expect("DISTLOCK_TEST_ZK_URL (see scripts/services.sh env)")
}

fn hosts() -> String {
    lock_testkit::faults::upstreams_of(&url()).join(",")
}

async fn raw_client() -> Client {
    Client::connect(&hosts()).await.expect("zookeeper client")
}

/// One cycle of the crate's recipe on `dir`, releasing by deleting the node.
async fn recipe(client: &Client, dir: &str) {
    let prefix = LockPrefix::new_curator(dir, "lock-").expect("prefix");
    let held = client
        .lock(
            prefix,
            b"",
            zookeeper_client::LockOptions::new(Acls::anyone_all()),
        )
        .await
        .expect("recipe lock");
    let path = held.lock_path().to_string();
    // Its drop deletes in the background; delete in line instead, so that
    // the cycle includes the release like the others.
    std::mem::forget(held);
    client.delete(&path, None).await.expect("recipe unlock");
}

#[tokio::main]
async fn main() {
    // Each contender has a client (a connection and a session) of its own.
    let locks = ZkLock::connect(&url()).await.expect("distlock");
    let raw = raw_client().await;
    let recipe_client = raw_client().await;
    let acls = Acls::anyone_all();
    for dir in ["/bench/raw", "/bench/recipe", "/bench/recipe-contended"] {
        match raw
            .mkdir(dir, &CreateMode::Persistent.with_acls(acls))
            .await
        {
            Ok(()) | Err(zookeeper_client::Error::NodeExists) => {}
            Err(e) => panic!("mkdir {dir}: {e}"),
        }
    }
    let opts = LockOptions::new().auto_renew(false).wait(Wait::No);
    let mut samples: [Vec<Duration>; 3] = Default::default();
    for i in 0..SAMPLES + SAMPLES / 10 {
        let keep = i >= SAMPLES / 10; // the first tenth warms up
        let t = Instant::now();
        let (_, seq) = raw
            .create(
                "/bench/raw/lock-",
                b"",
                &CreateMode::EphemeralSequential.with_acls(acls),
            )
            .await
            .expect("create");
        let children = raw.list_children("/bench/raw").await.expect("children");
        assert!(!children.is_empty());
        raw.delete(&format!("/bench/raw/lock-{seq}"), None)
            .await
            .expect("delete");
        let floor = t.elapsed();

        let t = Instant::now();
        recipe(&recipe_client, "/bench/recipe").await;
        let peer = t.elapsed();

        let t = Instant::now();
        let g = locks
            .acquire("bench/distlock", &opts)
            .await
            .expect("acquire");
        assert!(g.release().await.expect("release"));
        let ours = t.elapsed();

        if keep {
            for (v, d) in samples.iter_mut().zip([floor, peer, ours]) {
                v.push(d);
            }
        }
    }
    let [floor, peer, ours] = samples.map(percentiles);
    println!("uncontended cycle (p50 / p99, µs)");
    for (what, (p50, p99)) in [
        ("raw floor: create + children + delete", floor),
        ("zookeeper-client lock recipe", peer),
        ("distlock acquire + release", ours),
    ] {
        println!("  {what:<40} {:>8.1} / {:>8.1}", us(p50), us(p99));
    }
    let ratio =
        |a: (Duration, Duration), b: (Duration, Duration)| a.0.as_secs_f64() / b.0.as_secs_f64();
    println!(
        "  distlock / raw floor: {:.3}x   distlock / recipe: {:.3}x   (p50)",
        ratio(ours, floor),
        ratio(ours, peer)
    );

    // 8 contenders: waiters queue and each hand-off lists the queue; 2
    // contenders: the one waiter takes over on the delete's notification.
    for tasks in [TASKS, 2] {
        contention(tasks).await;
    }
}

/// `tasks` clients contending for one lock, distlock against the recipe.
async fn contention(tasks: usize) {
    let mut clients = Vec::new();
    let mut raws = Vec::new();
    for _ in 0..tasks {
        clients.push(
            Arc::new(ZkLock::connect(&url()).await.expect("distlock client"))
                as Arc<dyn DistributedLock>,
        );
        raws.push(raw_client().await);
    }
    let raws = Arc::new(raws);
    let o = LockOptions::new()
        .auto_renew(false)
        .wait_timeout(Duration::from_secs(30));
    let ours = contend_on(clients, "bench/contended", o, WORK, Duration::ZERO, RUN).await;
    let theirs = contend(tasks, RUN, |t, end, log| {
        let raws = raws.clone();
        async move {
            while Instant::now() < end {
                let prefix =
                    LockPrefix::new_curator("/bench/recipe-contended", "lock-").expect("prefix");
                let held = raws[t]
                    .lock(
                        prefix,
                        b"",
                        zookeeper_client::LockOptions::new(Acls::anyone_all()),
                    )
                    .await
                    .expect("recipe lock");
                let granted = Instant::now();
                tokio::time::sleep(WORK).await;
                let released = Instant::now();
                let path = held.lock_path().to_string();
                std::mem::forget(held);
                raws[t].delete(&path, None).await.expect("recipe unlock");
                log.lock().expect("log").push((granted, released, t));
            }
        }
    })
    .await;
    print_runs(
        &format!("{tasks} tasks, a client each; 1 ms of work inside, re-acquire at once"),
        RUN,
        &[("distlock", &ours), ("recipe", &theirs)],
    );
    let (acquisitions, handoffs) = ratios(&ours, &theirs);
    println!("  distlock / recipe: {acquisitions:.2}x acquisitions/s, {handoffs:.2}x hand-offs/s");
}
