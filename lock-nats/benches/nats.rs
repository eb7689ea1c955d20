//! NATS lock benchmark: distlock against the hand-written lock with the
//! same guarantees on the same client and server, in one run.
//!
//! ```sh
//! export $(scripts/services.sh env | xargs)
//! cargo bench -p lock-nats --bench nats
//! ```
//!
//! Measures, in interleaved blocks (`lock_testkit::bench::cycles`), on the
//! single server: a round trip (a core PING, `flush`); the floor, written
//! by hand on plain async-nats with distlock's guarantees (a publish of
//! the holder record only if the subject has no message, with the lease
//! as its TTL, the owner and message id headers, its sequence the token;
//! then the message deleted by that sequence and the release announced on
//! the core subject); distlock acquire + release, with and without the
//! guard's renewal; lock sets of eight names against eight single locks.

use std::time::Duration;

use lock_core::{LockOptions, Wait};
use lock_nats::{NatsLock, async_nats};
use lock_testkit::bench::cycles::Cycles;

/// Cycles per variant in a block, and rounds of blocks (after one to warm up).
const BLOCK: usize = 50;
const ROUNDS: usize = 20;
const RTT: &str = "round trip: PING (flush)";
const FLOOR: &str = "floor: conditional publish with TTL + delete by sequence + announce";
const OURS: &str = "distlock acquire + release";
const OURS_UNRENEWED: &str = "distlock, auto-renew off";

fn url() -> String {
    std::env::var("DISTLOCK_TEST_NATS_URL")
        .expect("DISTLOCK_TEST_NATS_URL (see scripts/services.sh env)")
}

/// The hand-written lock's cycle on `subject`: one grant and its release.
async fn floor(js: &async_nats::jetstream::Context, client: &async_nats::Client, n: usize) {
    use async_nats::header::{
        NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, NATS_MESSAGE_ID, NATS_MESSAGE_TTL,
    };
    let subject = "$KV.distlock.lock.62656e63682f666c6f6f72";
    let owner = format!("{:032x}", rand_owner(n));
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, "0");
    headers.insert(NATS_MESSAGE_TTL, "30000ms");
    headers.insert("Distlock-Owner", owner.as_str());
    headers.insert(NATS_MESSAGE_ID, owner.as_str());
    let record = lock_core::LockOptions::new().holder_record();
    let seq = js
        .publish_with_headers(
            subject,
            headers,
            bytes::Bytes::copy_from_slice(record.as_bytes()),
        )
        .await
        .expect("publish")
        .await
        .expect("the floor's lock is free")
        .sequence;
    let deleted: serde_json::Value = js
        .request(
            "STREAM.MSG.DELETE.KV_distlock",
            &serde_json::json!({ "seq": seq, "no_erase": true }),
        )
        .await
        .expect("delete");
    assert_eq!(deleted["success"], true, "{deleted}");
    client
        .publish(
            "distlock.distlock.released.62656e63682f666c6f6f72",
            bytes::Bytes::new(),
        )
        .await
        .expect("announce");
}

/// A distinct owner token per cycle, as distlock draws one per acquisition.
fn rand_owner(n: usize) -> u128 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    nanos ^ ((n as u128) << 64)
}

#[tokio::main]
async fn main() {
    let locks = NatsLock::connect(&url()).await.expect("distlock");
    let servers = lock_testkit::faults::upstreams_of(&url());
    let client = async_nats::connect(servers.as_slice())
        .await
        .expect("the floor's client");
    let js = async_nats::jetstream::new(client.clone());
    let ttl = Duration::from_secs(30);
    let renewed = LockOptions::new().ttl(ttl).wait(Wait::No);
    let unrenewed = LockOptions::new().ttl(ttl).auto_renew(false).wait(Wait::No);
    let mut m = Cycles::new("nats", BLOCK);
    for round in 0..=ROUNDS {
        m.warm_up(round == 0);
        m.measure(RTT, async |_| {
            client.flush().await.expect("flush");
        })
        .await;
        m.measure(FLOOR, async |n| {
            floor(&js, &client, n).await;
        })
        .await;
        for (label, opts) in [(OURS, &renewed), (OURS_UNRENEWED, &unrenewed)] {
            m.measure_lock(label, &locks, "bench/distlock", opts).await;
        }
        m.measure_sets(&locks, "bench/set/", &unrenewed).await;
    }
    m.print();
    for ours in [OURS, OURS_UNRENEWED] {
        m.compare(ours, FLOOR);
        m.compare(ours, RTT);
    }
    m.compare_sets();
}
