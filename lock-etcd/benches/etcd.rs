//! etcd lock benchmark: distlock against the raw floor of the same server
//! and against etcd's built-in Lock RPC, in one run.
//!
//! ```sh
//! export $(scripts/services.sh env | xargs)
//! cargo bench -p lock-etcd --bench etcd
//! ```
//!
//! Compacts the history first (etcd slows down as it grows). Measures, in
//! interleaved blocks (`lock_testkit::bench::cycles`): a round trip (a
//! `get`); the raw floor (a put-if-absent transaction and a delete, on one
//! lease, plain etcd-client); the raw floor of a lock that lapses on the
//! server after its TTL whether or not its client lives on (as one with
//! `auto_renew(false)` does): a lease granted for it, the put, and the
//! lease revoked, which deletes the key, blindly or (as distlock's release
//! answers whether the lock was still held) after a read-only transaction
//! checks the key is ours; the built-in Lock RPC (lock + unlock);
//! distlock acquire + release on its session lease, with and without the
//! guard's renewal; a permit of a semaphore of 4 against the hand-written
//! permit with the same guarantees (a queue key read back with the queue
//! and the slots in one transaction, so that waiters are served in order
//! and another limit is seen; a slot key claimed by a transaction that
//! checks the queue key; both deleted in one transaction); read and write
//! grants of a reader-writer lock against the hand-written one with the
//! same guarantees (`rw_floor`: one transaction and a delete). Then 8 tasks with a client each and 1 ms of work inside
//! the lock: acquisitions and hand-offs per second, hand-off latency (also
//! in round trips), per-task min/max, distlock against the Lock RPC.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use lock_core::{DistributedLock, LockOptions, Wait};
use lock_etcd::EtcdLock;
use lock_testkit::bench::cycles::{Cycles, RW_READ, RW_WRITE};
use lock_testkit::bench::{
    contend, contend_on, print_handoff_round_trips, print_runs, print_rw_mix, ratios,
};

/// Cycles per variant in a block, and rounds of blocks (after one to warm up).
const BLOCK: usize = 50;
const ROUNDS: usize = 20;
const RTT: &str = "round trip: get";
const FLOOR: &str = "raw floor: put-if-absent txn + delete";
const OWN_LEASE_FLOOR: &str = "raw floor, a lease of its own: grant + put-if-absent txn + revoke";
const OWN_LEASE_CHECKED: &str = "the same, checking the key is ours before the revoke";
const PEER: &str = "etcd Lock RPC: lock + unlock";
const PERMIT_FLOOR: &str =
    "permit floor: queue key + queue and slots read, slot claim, delete both (3 txns)";
const OURS_PERMIT: &str = "distlock permit of 4: acquire + release";
const OURS: &str = "distlock acquire + release";
const RW_READ_FLOOR: &str = "read floor: txn (no writer key: put + read the fence) + delete";
const RW_WRITE_FLOOR: &str = "write floor: txn (no key: put + put the fence) + delete";
const OURS_UNRENEWED: &str = "distlock, auto-renew off";
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

/// Put `key` on `lease` if it is absent (it must be): the put's revision.
async fn put_if_absent(raw: &mut Client, key: &str, lease: i64) -> i64 {
    let put = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            "x",
            Some(PutOptions::new().with_lease(lease)),
        )]);
    let put = raw.txn(put).await.expect("txn");
    assert!(put.succeeded());
    put.header().expect("header").revision()
}

/// Every key under `dir` (which ends with `/`), keys only.
fn under(dir: &str) -> GetOptions {
    let mut end = dir.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    GetOptions::new().with_range(end).with_keys_only()
}

/// The hand-written permit: put the queue key (reading the queue and the
/// slots with it), claim slot 0 if the queue key is still there, then
/// delete both.
async fn permit_floor(raw: &mut Client, i: usize, lease: i64) {
    let (queue, slots) = ("/bench/permit-floor/q/", "/bench/permit-floor/s/");
    let key = format!("{queue}{i:016x}");
    let enqueue = Txn::new()
        .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(key.as_str(), "x", Some(PutOptions::new().with_lease(lease))),
            TxnOp::get(queue, Some(under(queue))),
            TxnOp::get(slots, Some(under(slots))),
        ]);
    let queued = raw.txn(enqueue).await.expect("enqueue");
    assert!(queued.succeeded());
    let rev = queued.header().expect("header").revision();
    let slot = format!("{slots}00000000");
    let claim = Txn::new()
        .when([
            Compare::create_revision(key.as_str(), CompareOp::Equal, rev),
            Compare::create_revision(slot.as_str(), CompareOp::Equal, 0),
        ])
        .and_then([TxnOp::put(
            slot.as_str(),
            "x",
            Some(PutOptions::new().with_lease(lease)),
        )]);
    assert!(raw.txn(claim).await.expect("claim").succeeded());
    let release = Txn::new().and_then([
        TxnOp::delete(slot.as_str(), None),
        TxnOp::delete(key.as_str(), None),
    ]);
    raw.txn(release).await.expect("release");
}

/// The hand-written reader-writer lock with distlock's guarantees, on the
/// uncontended path: one transaction, then a delete. Keys under the name's
/// directory are ordered by create revision (the recipe of
/// `rwmutex.go`); a writer's key starts with `w`, a reader's with `r`.
/// A writer is granted when no key is there at all and puts the fence in
/// the same transaction: its token is the transaction's revision. A reader
/// is granted when no writer's key is there (held or waiting: writer
/// preference) and reads the fence in the same transaction: its token is
/// the fence's revision, the latest write's. A waiter would list the
/// directory instead, as distlock does; the benchmark never waits.
async fn rw_floor(raw: &mut Client, i: usize, lease: i64, write: bool) -> i64 {
    let (dir, writers, fence) = (
        "/bench/rw-floor/q/",
        "/bench/rw-floor/q/w",
        "/bench/rw-floor/fence",
    );
    let key = format!("{dir}{}{i:016x}", if write { 'w' } else { 'r' });
    let put = TxnOp::put(key.as_str(), "x", Some(PutOptions::new().with_lease(lease)));
    let txn = if write {
        Txn::new()
            .when([Compare::create_revision(dir, CompareOp::Equal, 0).with_prefix()])
            .and_then([put, TxnOp::put(fence, "", None)])
    } else {
        Txn::new()
            .when([Compare::create_revision(writers, CompareOp::Equal, 0).with_prefix()])
            .and_then([put, TxnOp::get(fence, None)])
    };
    let resp = raw.txn(txn).await.expect("txn");
    assert!(resp.succeeded(), "the floor's lock is free");
    let token = if write {
        resp.header().expect("header").revision()
    } else {
        match resp.op_responses().get(1) {
            Some(etcd_client::TxnOpResponse::Get(got)) => {
                got.kvs().first().map_or(0, |kv| kv.mod_revision())
            }
            _ => panic!("the fence's get answers second"),
        }
    };
    raw.delete(key.as_str(), None).await.expect("delete");
    token
}

#[tokio::main]
async fn main() {
    let locks = EtcdLock::connect(&url()).await.expect("distlock");
    locks.compact().await.expect("compact");
    let mut raw = raw_client().await;
    // Nothing keeps this lease alive: it outlives the whole run (every
    // variant's rounds, interleaved).
    let lease = raw.lease_grant(900, None).await.expect("lease").id();
    // On the session lease, with and without the guard's renewal.
    let renewed = LockOptions::new().wait(Wait::No);
    let unrenewed = LockOptions::new().auto_renew(false).wait(Wait::No);
    let permit = renewed.clone().permits(4);

    let mut m = Cycles::new("etcd", BLOCK);
    for round in 0..=ROUNDS {
        m.warm_up(round == 0);
        m.measure(RTT, async |_| {
            raw.get("/bench/none", None).await.expect("get");
        })
        .await;
        m.measure(FLOOR, async |i| {
            let key = format!("/bench/raw/{i}");
            put_if_absent(&mut raw, &key, lease).await;
            raw.delete(key.as_str(), None).await.expect("delete");
        })
        .await;
        m.measure(OWN_LEASE_FLOOR, async |i| {
            let key = format!("/bench/raw-own/{i}");
            let own = raw.lease_grant(30, None).await.expect("lease").id();
            put_if_absent(&mut raw, &key, own).await;
            raw.lease_revoke(own).await.expect("revoke");
        })
        .await;
        m.measure(OWN_LEASE_CHECKED, async |i| {
            let key = format!("/bench/raw-own/{i}");
            let own = raw.lease_grant(30, None).await.expect("lease").id();
            let rev = put_if_absent(&mut raw, &key, own).await;
            let check = Txn::new().when([Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                rev,
            )]);
            assert!(raw.txn(check).await.expect("check").succeeded());
            raw.lease_revoke(own).await.expect("revoke");
        })
        .await;
        m.measure(PEER, async |_| {
            let held = raw
                .lock(
                    "/bench/rpc",
                    Some(etcd_client::LockOptions::new().with_lease(lease)),
                )
                .await
                .expect("Lock RPC");
            raw.unlock(held.key()).await.expect("Unlock RPC");
        })
        .await;
        for (label, opts) in [(OURS, &renewed), (OURS_UNRENEWED, &unrenewed)] {
            m.measure_lock(label, &locks, "bench/distlock", opts).await;
        }
        m.measure(PERMIT_FLOOR, async |i| {
            permit_floor(&mut raw, i, lease).await;
        })
        .await;
        m.measure_lock(OURS_PERMIT, &locks, "bench/permit", &permit)
            .await;
        m.measure_sets(&locks, "bench/set/", &unrenewed).await;
        m.measure(RW_READ_FLOOR, async |i| {
            rw_floor(&mut raw, i, lease, false).await;
        })
        .await;
        m.measure(RW_WRITE_FLOOR, async |i| {
            assert!(rw_floor(&mut raw, i, lease, true).await > 0);
        })
        .await;
        m.measure_rw(&locks, "bench/rw", &renewed).await;
    }
    m.print();
    for ours in [OURS, OURS_UNRENEWED] {
        m.compare(ours, FLOOR);
        m.compare(ours, PEER);
    }
    m.compare(OURS_UNRENEWED, OWN_LEASE_FLOOR);
    m.compare(OURS_UNRENEWED, OWN_LEASE_CHECKED);
    m.compare(OURS_PERMIT, PERMIT_FLOOR);
    m.compare(OURS_PERMIT, OURS);
    m.compare_sets();
    m.compare_rw(OURS);
    m.compare(RW_READ, RW_READ_FLOOR);
    m.compare(RW_WRITE, RW_WRITE_FLOOR);

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
    print_rw_mix("etcd", clients.clone(), "bench/rw-mix", o.clone(), RUN).await;
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
    if let Some(rtt) = m.figures(RTT) {
        print_handoff_round_trips(&[("distlock", &ours), ("Lock RPC", &theirs)], rtt.wall.0);
    }
}
