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
//! guard's renewal; lock sets of eight names against eight single locks;
//! a permit of a semaphore of 4 against the floor of the same algorithm
//! (the semaphore's subjects read, a free slot published on the
//! condition that its own subject has none, the subjects read again,
//! deleted); reader-writer locks' reads and writes against theirs (a
//! reader: the lock's subjects read, its message published on its own
//! subject's condition, the writer's message and the latest write's token
//! read; a writer: the lock's last message and subjects read, its message
//! published on the condition that none of them changed, the readers'
//! subjects read, its token recorded; then deleted). Every release is
//! announced and flushed, as distlock's are.

use std::time::Duration;

use lock_core::{LockOptions, Wait};
use lock_nats::{NatsLock, async_nats};
use lock_testkit::bench::cycles::{Cycles, RW_READ, RW_WRITE};

/// Cycles per variant in a block, and rounds of blocks (after one to warm up).
const BLOCK: usize = 50;
const ROUNDS: usize = 20;
const RTT: &str = "round trip: PING (flush)";
const FLOOR: &str = "floor: conditional publish with TTL + delete by sequence + announce";
const OURS: &str = "distlock acquire + release";
const OURS_UNRENEWED: &str = "distlock, auto-renew off";
const PERMIT_FLOOR: &str =
    "floor: semaphore of 4 read (subjects) + publish on a free slot + subjects again + delete";
const OURS_PERMIT: &str = "distlock permit of 4: acquire + release";
const RW_READ_FLOOR: &str =
    "floor: reader-writer lock read (subjects) + own publish + writer and token read + delete";
const RW_WRITE_FLOOR: &str = "floor: reader-writer lock read (last + subjects) + conditional publish + readers read + token record + delete";

/// The headers of a grant's message: the condition on the last sequence
/// of `filter` (of the message's own subject where `None`), the lease,
/// the owner and its message id.
fn grant_headers(filter: Option<&str>, last: u64, owner: &str) -> async_nats::HeaderMap {
    use async_nats::header::{
        NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, NATS_MESSAGE_ID, NATS_MESSAGE_TTL,
    };
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(
        NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
        last.to_string().as_str(),
    );
    if let Some(filter) = filter {
        headers.insert("Nats-Expected-Last-Subject-Sequence-Subject", filter);
    }
    headers.insert(NATS_MESSAGE_TTL, "30000ms");
    headers.insert("Distlock-Owner", owner);
    headers.insert(NATS_MESSAGE_ID, owner);
    headers
}

/// The subjects under `filter` that hold a message.
async fn subjects_of(js: &async_nats::jetstream::Context, filter: &str) -> Vec<String> {
    let info: serde_json::Value = js
        .request(
            "STREAM.INFO.KV_distlock",
            &serde_json::json!({ "subjects_filter": filter }),
        )
        .await
        .expect("stream info");
    info["state"]["subjects"]
        .as_object()
        .map(|s| s.keys().cloned().collect())
        .unwrap_or_default()
}

/// Publish a grant (the holder record) to `subject` on `headers`' condition: its sequence.
async fn publish(
    js: &async_nats::jetstream::Context,
    subject: String,
    headers: async_nats::HeaderMap,
) -> u64 {
    let record = lock_core::LockOptions::new().holder_record();
    js.publish_with_headers(
        subject,
        headers,
        bytes::Bytes::copy_from_slice(record.as_bytes()),
    )
    .await
    .expect("publish")
    .await
    .expect("granted: nobody else uses the floor's names")
    .sequence
}

/// Delete message `seq` and announce the release on `released`.
async fn delete(
    js: &async_nats::jetstream::Context,
    client: &async_nats::Client,
    seq: u64,
    released: &'static str,
) {
    let deleted: serde_json::Value = js
        .request(
            "STREAM.MSG.DELETE.KV_distlock",
            &serde_json::json!({ "seq": seq, "no_erase": true }),
        )
        .await
        .expect("delete");
    assert_eq!(deleted["success"], true, "{deleted}");
    client
        .publish(released, bytes::Bytes::new())
        .await
        .expect("announce");
    client.flush().await.expect("announced");
}

/// The hand-written permit's cycle: the semaphore's subjects read, a
/// free slot claimed on the condition that its own subject has no
/// message, the subjects read again (the check against another limit),
/// released.
async fn permit_floor(js: &async_nats::jetstream::Context, client: &async_nats::Client, n: usize) {
    let filter = "$KV.distlock.sem.bench/permit-floor.*.*";
    let held = subjects_of(js, filter).await;
    let slot = (0..4u32)
        .find(|s| !held.iter().any(|h| h.ends_with(&format!(".4.{s}"))))
        .expect("a free slot");
    let owner = format!("{:032x}", rand_owner(n));
    let mut headers = grant_headers(None, 0, &owner);
    headers.insert("Distlock-Limit", "4");
    let subject = format!("$KV.distlock.sem.bench/permit-floor.4.{slot}");
    let seq = publish(js, subject, headers).await;
    let now = subjects_of(js, filter).await;
    assert!(now.iter().all(|s| s.contains(".4.")), "one limit: {now:?}");
    delete(
        js,
        client,
        seq,
        "distlock.distlock.permits.bench/permit-floor",
    )
    .await;
}

/// The hand-written reader-writer lock's cycle. A reader: the lock's
/// subjects read, its own message published on its own subject's
/// condition, then the writer's message and the recorded token read.
/// A writer: the lock's last message and subjects read, its message
/// published on the condition that nothing of the lock changed, the
/// readers' subjects read, its token recorded. Then released.
async fn rw_floor(
    js: &async_nats::jetstream::Context,
    stream: &async_nats::jetstream::stream::Stream,
    client: &async_nats::Client,
    n: usize,
    write: bool,
) {
    let all = "$KV.distlock.rw.bench/rw-floor.>";
    let base = "$KV.distlock.rw.bench/rw-floor.";
    let token_subject = format!("{base}x.t");
    let owner = format!("{:032x}", rand_owner(n));
    let last = match write {
        true => stream.get_last_raw_message_by_subject(all).await.ok(),
        false => None,
    };
    let seen = match (&last, write) {
        (None, true) => Vec::new(),
        _ => subjects_of(js, all).await,
    };
    assert!(
        !seen
            .iter()
            .any(|s| s.ends_with(".x.w") || s.contains(".r.")),
        "the floor's lock is free: {seen:?}"
    );
    let seq = match write {
        true => {
            let headers = grant_headers(Some(all), last.map_or(0, |m| m.sequence), &owner);
            let seq = publish(js, format!("{base}x.w"), headers).await;
            let readers = subjects_of(js, &format!("{base}r.*")).await;
            assert!(readers.is_empty(), "no reader: {readers:?}");
            use async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE;
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(
                NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
                seq.to_string().as_str(),
            );
            headers.insert(
                "Nats-Expected-Last-Subject-Sequence-Subject",
                format!("{base}x.w").as_str(),
            );
            headers.insert("Distlock-Token", seq.to_string().as_str());
            js.publish_with_headers(token_subject, headers, bytes::Bytes::new())
                .await
                .expect("publish")
                .await
                .expect("the token recorded");
            seq
        }
        false => {
            let headers = grant_headers(None, 0, &owner);
            let seq = publish(js, format!("{base}r.{owner}"), headers).await;
            let writer = format!("{base}x.w");
            let (w, _) = tokio::join!(
                stream.get_last_raw_message_by_subject(&writer),
                stream.get_last_raw_message_by_subject(&token_subject)
            );
            assert!(w.is_err(), "no writer");
            seq
        }
    };
    delete(js, client, seq, "distlock.distlock.rw.bench/rw-floor").await;
}

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
    delete(
        js,
        client,
        seq,
        "distlock.distlock.released.62656e63682f666c6f6f72",
    )
    .await;
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
    let stream = js
        .get_stream("KV_distlock")
        .await
        .expect("the bucket's stream");
    let permit = renewed.clone().permits(4);
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
        m.measure(PERMIT_FLOOR, async |n| {
            permit_floor(&js, &client, n).await;
        })
        .await;
        m.measure_lock(OURS_PERMIT, &locks, "bench/permit", &permit)
            .await;
        m.measure(RW_READ_FLOOR, async |n| {
            rw_floor(&js, &stream, &client, n, false).await;
        })
        .await;
        m.measure(RW_WRITE_FLOOR, async |n| {
            rw_floor(&js, &stream, &client, n, true).await;
        })
        .await;
        m.measure_rw(&locks, "bench/rw", &renewed).await;
    }
    m.print();
    for ours in [OURS, OURS_UNRENEWED] {
        m.compare(ours, FLOOR);
        m.compare(ours, RTT);
    }
    m.compare_sets();
    m.compare(OURS_PERMIT, PERMIT_FLOOR);
    m.compare(OURS_PERMIT, OURS);
    m.compare_rw(OURS);
    m.compare(RW_READ, RW_READ_FLOOR);
    m.compare(RW_WRITE, RW_WRITE_FLOOR);
}
