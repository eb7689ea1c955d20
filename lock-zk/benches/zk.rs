//! ZooKeeper lock benchmark: distlock against the raw floor of the same
//! server and against zookeeper-client's own lock recipe, in one run.
//!
//! ```sh
//! export $(scripts/services.sh env | xargs)
//! cargo bench -p lock-zk --bench zk
//! ```
//!
//! Measures, in interleaved blocks (`lock_testkit::bench::cycles`): a
//! round trip (`exists`); the raw floor (create an ephemeral-sequential
//! node, list the children, delete the node, plain zookeeper-client); the
//! crate's recipe (`Client::lock`, then deleting its node); distlock
//! acquire + release, with and without the guard's renewal; read and write
//! grants of a reader-writer lock against the hand-written one with the
//! same guarantees (`rw_floor`). Then 8 tasks,
//! and 2, with a client each and 1 ms of work inside the lock, distlock
//! against the recipe, hand-offs also in round trips.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{DistributedLock, LockOptions, Wait};
use lock_testkit::bench::cycles::{Cycles, RW_READ, RW_WRITE};
use lock_testkit::bench::{
    contend, contend_on, print_handoff_round_trips, print_runs, print_rw_mix, ratios,
};
use lock_zk::ZkLock;
use zookeeper_client::{Acls, Client, CreateMode, LockPrefix};

/// Cycles per variant in a block, and rounds of blocks (after one to warm up).
const BLOCK: usize = 50;
const ROUNDS: usize = 20;
const RTT: &str = "round trip: exists";
const FLOOR: &str = "raw floor: create + children + delete";
const PEER: &str = "zookeeper-client lock recipe";
const PERMIT_FLOOR: &str =
    "permit floor: queue node + children, slot node, delete both (5 round trips)";
const OURS_PERMIT: &str = "distlock permit of 4: acquire + release";
const OURS: &str = "distlock acquire + release";
const RW_READ_FLOOR: &str = "read floor: create + children + counter read + delete";
const RW_WRITE_FLOOR: &str =
    "write floor: create + children + counter read + version-checked write + delete";
const OURS_UNRENEWED: &str = "distlock, auto-renew off";
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

/// The crate's recipe: lock `dir` (a Curator-style node under it).
async fn recipe_lock<'c>(client: &'c Client, dir: &str) -> zookeeper_client::LockClient<'c> {
    let prefix = LockPrefix::new_curator(dir, "lock-").expect("prefix");
    let options = zookeeper_client::LockOptions::new(Acls::anyone_all());
    client
        .lock(prefix, b"", options)
        .await
        .expect("recipe lock")
}

/// The recipe's release, in line: its drop deletes the node in the
/// background, and a cycle must include the release like the others.
async fn recipe_unlock(client: &Client, held: zookeeper_client::LockClient<'_>) {
    let path = held.lock_path().to_string();
    std::mem::forget(held);
    client.delete(&path, None).await.expect("recipe unlock");
}

/// One cycle of the crate's recipe on `dir`.
async fn recipe(client: &Client, dir: &str) {
    let held = recipe_lock(client, dir).await;
    recipe_unlock(client, held).await;
}

/// The hand-written reader-writer lock with distlock's guarantees (the
/// recipe of Curator's `InterProcessReadWriteLock`, with a token), on the
/// uncontended path: join the queue with an ephemeral-sequential node
/// (`w-` or `r-`), list it (a writer holds at its head, a reader when no
/// writer's node is before it), take the token from the name's counter
/// node (a writer raises it to its node's creation zxid by a
/// version-checked write; a reader reads it), then delete the node.
async fn rw_floor(raw: &Client, acls: Acls<'_>, write: bool) -> u64 {
    let (dir, counter) = ("/bench/rw-floor/q", "/bench/rw-floor/fence");
    let prefix = format!("{dir}/{}-", if write { 'w' } else { 'r' });
    let (stat, seq) = raw
        .create(
            &prefix,
            b"",
            &CreateMode::EphemeralSequential.with_acls(acls),
        )
        .await
        .expect("create");
    let queue = raw.list_children(dir).await.expect("children");
    assert_eq!(queue.len(), 1, "the floor's lock is free: {queue:?}");
    let (data, counter_stat) = raw.get_data(counter).await.expect("counter");
    let token = if write {
        let token = u64::try_from(stat.czxid).expect("a zxid");
        raw.set_data(
            counter,
            token.to_string().as_bytes(),
            Some(counter_stat.version),
        )
        .await
        .expect("raise the counter");
        token
    } else {
        std::str::from_utf8(&data)
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or(0)
    };
    raw.delete(&format!("{prefix}{seq}"), None)
        .await
        .expect("delete");
    token
}

#[tokio::main]
async fn main() {
    // Each contender has a client (a connection and a session) of its own.
    let locks = ZkLock::connect(&url()).await.expect("distlock");
    let raw = raw_client().await;
    let recipe_client = raw_client().await;
    let acls = Acls::anyone_all();
    for dir in [
        "/bench/raw",
        "/bench/recipe",
        "/bench/recipe-contended",
        "/bench/permit-floor",
        "/bench/permit-floor/q",
        "/bench/permit-floor/slots",
        "/bench/rw-floor",
        "/bench/rw-floor/q",
        "/bench/rw-floor/fence",
    ] {
        match raw
            .mkdir(dir, &CreateMode::Persistent.with_acls(acls))
            .await
        {
            Ok(()) | Err(zookeeper_client::Error::NodeExists) => {}
            Err(e) => panic!("mkdir {dir}: {e}"),
        }
    }
    // A lock without renewal cannot outlive the session: a TTL within it.
    let ttl = Duration::from_secs(5);
    let renewed = LockOptions::new().ttl(ttl).wait(Wait::No);
    let unrenewed = LockOptions::new().ttl(ttl).auto_renew(false).wait(Wait::No);
    let permit = renewed.clone().permits(4);
    let mut m = Cycles::new("zookeeper", BLOCK);
    for round in 0..=ROUNDS {
        m.warm_up(round == 0);
        m.measure(RTT, async |_| {
            raw.check_stat("/bench").await.expect("exists");
        })
        .await;
        m.measure(FLOOR, async |_| {
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
        })
        .await;
        m.measure(PEER, async |_| {
            recipe(&recipe_client, "/bench/recipe").await;
        })
        .await;
        for (label, opts) in [(OURS, &renewed), (OURS_UNRENEWED, &unrenewed)] {
            m.measure_lock(label, &locks, "bench/distlock", opts).await;
        }
        // The hand-written permit: join the queue, list it (the place and
        // the limits), take slot 0, then delete both.
        m.measure(PERMIT_FLOOR, async |_| {
            let (_, seq) = raw
                .create(
                    "/bench/permit-floor/q/lock-",
                    b"",
                    &CreateMode::EphemeralSequential.with_acls(acls),
                )
                .await
                .expect("queue node");
            let queue = raw
                .list_children("/bench/permit-floor/q")
                .await
                .expect("queue");
            assert!(!queue.is_empty());
            raw.create(
                "/bench/permit-floor/slots/00000000",
                b"",
                &CreateMode::Ephemeral.with_acls(acls),
            )
            .await
            .expect("slot node");
            raw.delete("/bench/permit-floor/slots/00000000", None)
                .await
                .expect("delete the slot");
            raw.delete(&format!("/bench/permit-floor/q/lock-{seq}"), None)
                .await
                .expect("delete the queue node");
        })
        .await;
        m.measure_lock(OURS_PERMIT, &locks, "bench/permit", &permit)
            .await;
        m.measure_sets(&locks, "bench/set/", &unrenewed).await;
        m.measure(RW_READ_FLOOR, async |_| {
            rw_floor(&raw, acls, false).await;
        })
        .await;
        m.measure(RW_WRITE_FLOOR, async |_| {
            assert!(rw_floor(&raw, acls, true).await > 0);
        })
        .await;
        m.measure_rw(&locks, "bench/rw", &renewed).await;
    }
    m.print();
    for ours in [OURS, OURS_UNRENEWED] {
        m.compare(ours, FLOOR);
        m.compare(ours, PEER);
    }
    m.compare(OURS_PERMIT, PERMIT_FLOOR);
    m.compare(OURS_PERMIT, OURS);
    m.compare_sets();
    m.compare_rw(OURS);
    m.compare(RW_READ, RW_READ_FLOOR);
    m.compare(RW_WRITE, RW_WRITE_FLOOR);
    let rtt = m.figures(RTT).map_or(Duration::ZERO, |f| f.wall.0);

    // 8 contenders: waiters queue and each hand-off lists the queue; 2
    // contenders: the one waiter takes over on the delete's notification.
    for tasks in [TASKS, 2] {
        contention(tasks, rtt).await;
    }
}

/// `tasks` clients contending for one lock, distlock against the recipe;
/// hand-offs also in round trips of `rtt`.
async fn contention(tasks: usize, rtt: Duration) {
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
        .ttl(Duration::from_secs(5))
        .auto_renew(false)
        .wait_timeout(Duration::from_secs(30));
    print_rw_mix("zookeeper", clients.clone(), "bench/rw-mix", o.clone(), RUN).await;
    let ours = contend_on(clients, "bench/contended", o, WORK, Duration::ZERO, RUN).await;
    let theirs = contend(tasks, RUN, |t, end, log| {
        let raws = raws.clone();
        async move {
            while Instant::now() < end {
                let held = recipe_lock(&raws[t], "/bench/recipe-contended").await;
                let granted = Instant::now();
                tokio::time::sleep(WORK).await;
                let released = Instant::now();
                recipe_unlock(&raws[t], held).await;
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
    print_handoff_round_trips(&[("distlock", &ours), ("recipe", &theirs)], rtt);
}
