//! A key's place in its lock's queue, and waiting for its turn.
//!
//! The queue is the keys under the lock's directory, ordered by create
//! revision. A waiter watches only the key just before its own (so a
//! release wakes one waiter, not all) and, when that key is the first, its
//! own key too, in one watcher, whose events come in revision order. When
//! the first key is deleted while the waiter's own is still there, the
//! waiter holds the lock (a waiter whose lease expired while queued sees
//! its own key go first, and never reports success); after any other
//! deletion of its predecessor it reads its place as of that deletion's
//! revision (from the member's own store: the waiter is usually first
//! then), and, if it still waits, or after a watch that ended, its place
//! now, in one transaction that also checks its own key still exists (so
//! that its next watch starts at the present, served live).

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, TxnResponse, WatchFilterType, WatchOptions, WatchStream,
};
use lock_core::{LockError, LossReason};

use crate::error::BACKEND;
use crate::keys;
use crate::requests;

/// Where our key stands, as read at some revision.
#[derive(Debug)]
pub(crate) struct Place {
    /// The key created just before ours; `None` when ours is first.
    pub(crate) predecessor: Option<Vec<u8>>,
    /// The predecessor is the first key: once it is deleted, ours is
    /// (keys created later come after ours).
    pub(crate) next_in_line: bool,
    /// The revision the place was read at.
    pub(crate) read_at: i64,
}

/// What ended a wait on the predecessor.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// The predecessor was deleted, at this revision.
    PredecessorGone(i64),
    /// Our own key or lease is gone (deleted, or a keep-alive found the
    /// lease expired or revoked).
    OursGone,
    /// The watch ended or was cancelled (compaction): read the place again.
    Ended,
}

/// Put our key if absent and read our place, in one transaction:
/// `(our create revision, place)`.
pub(crate) async fn enqueue(
    client: &Client,
    dir: &str,
    key: &str,
    record: &[u8],
    lease: i64,
) -> Result<(i64, Place), LockError> {
    // The two newest keys after the put: ours, and the one before it.
    let newest = GetOptions::new()
        .with_range(keys::range_end(dir))
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(2)
        .with_keys_only();
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(key, record, Some(PutOptions::new().with_lease(lease))),
            TxnOp::get(dir, Some(newest)),
        ]);
    let resp = requests::txn(client, txn, "acquiring").await?;
    if !resp.succeeded() {
        return Err(LockError::Backend {
            backend: BACKEND,
            reason: format!("lock key {key:?} exists already"),
            source: None,
        });
    }
    let rev = resp.header().map_or(0, |h| h.revision());
    let (kvs, count) = get_result(&resp, 1);
    let predecessor = kvs.into_iter().find(|k| k.as_slice() != key.as_bytes());
    Ok((
        rev,
        Place {
            predecessor: predecessor.filter(|_| count > 1),
            // Ours and the predecessor are all the keys there are.
            next_in_line: count == 2,
            read_at: rev,
        },
    ))
}

/// Our place now, or `None` if our key (created at `rev`) is gone.
pub(crate) async fn place(
    client: &Client,
    dir: &str,
    key: &str,
    rev: i64,
) -> Result<Option<Place>, LockError> {
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, rev)])
        .and_then([
            TxnOp::get(dir, Some(created_before(dir, rev))),
            TxnOp::get(dir, Some(first_by_creation(dir))),
        ]);
    let resp = requests::txn(client, txn, "reading the queue").await?;
    if !resp.succeeded() {
        return Ok(None);
    }
    let read_at = resp.header().map_or(0, |h| h.revision());
    Ok(Some(place_from(&resp, 0, read_at)))
}

/// Our place as it was at revision `at` (that of a deletion the watch
/// reported), or `None` if our key (created at `rev`) was gone by then.
///
/// The store at a past revision is the same on every member, and the
/// member that reported the deletion has applied it, so the read is served
/// from that member's own store (serializable), without waiting for the
/// writes still being agreed on (a release's re-acquisition, say). It says
/// no more than the watch's event would: what held at `at`; keys ahead of
/// ours are never created later, so a place first at `at` stays first. An
/// error (the request went to a member that has not applied `at`, or `at`
/// was compacted) calls for [`place`].
pub(crate) async fn place_at(
    client: &Client,
    dir: &str,
    key: &str,
    rev: i64,
    at: i64,
) -> Result<Option<Place>, LockError> {
    let at_rev = |options: GetOptions| options.with_revision(at).with_serializable();
    // No comparison: a transaction of serializable reads only is served
    // by the member alone.
    let txn = Txn::new().and_then([
        TxnOp::get(key, Some(at_rev(GetOptions::new().with_keys_only()))),
        TxnOp::get(dir, Some(at_rev(created_before(dir, rev)))),
        TxnOp::get(dir, Some(at_rev(first_by_creation(dir)))),
    ]);
    let resp = requests::txn(client, txn, "reading the queue").await?;
    let ours_then = match resp.op_responses().into_iter().next() {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().map(|kv| kv.create_revision()),
        _ => None,
    };
    if ours_then != Some(rev) {
        return Ok(None);
    }
    Ok(Some(place_from(&resp, 1, at)))
}

/// The place read at `read_at` by the gets at `op` (the key created just
/// before ours) and `op + 1` (the first key) of `resp`.
fn place_from(resp: &TxnResponse, op: usize, read_at: i64) -> Place {
    let predecessor = get_result(resp, op).0.into_iter().next();
    let first = get_result(resp, op + 1).0.into_iter().next();
    Place {
        next_in_line: predecessor.is_some() && predecessor == first,
        predecessor,
        read_at,
    }
}

/// Get options for the key under `dir` created last before revision `rev`.
fn created_before(dir: &str, rev: i64) -> GetOptions {
    GetOptions::new()
        .with_range(keys::range_end(dir))
        .with_max_create_revision(rev - 1)
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(1)
}

/// Get options for the first key (lowest create revision) under `dir`.
pub(crate) fn first_by_creation(dir: &str) -> GetOptions {
    first_with_value(dir).with_keys_only()
}

/// The first key under `dir` by creation, with its value (the holder's
/// record).
pub(crate) fn first_with_value(dir: &str) -> GetOptions {
    GetOptions::new()
        .with_range(keys::range_end(dir))
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// The keys (and the count before the limit) of the get at `op`.
pub(crate) fn get_result(resp: &TxnResponse, op: usize) -> (Vec<Vec<u8>>, i64) {
    match resp.op_responses().into_iter().nth(op) {
        Some(TxnOpResponse::Get(get)) => (
            get.kvs().iter().map(|kv| kv.key().to_vec()).collect(),
            get.count(),
        ),
        _ => (Vec::new(), 0),
    }
}

/// A watch for the deletion of `predecessor` and, given `ours` (our own
/// key, watched when the predecessor is the first key), of our own key, in
/// one watcher (so its events come in revision order), from revision
/// `from`: the revision our place was read at plus one, so nothing is
/// missed and the watch is served live rather than by etcd's slower
/// catch-up of watches that start in the past. Watching both takes the
/// range between the two keys, whose other deletions are passed over;
/// the keys there were created after ours, and are deleted before our
/// turn only by a waiter giving up.
pub(crate) async fn watch(
    client: &Client,
    predecessor: &[u8],
    ours: Option<&str>,
    from: i64,
) -> Result<WatchStream, LockError> {
    let mut options = WatchOptions::new()
        .with_start_revision(from)
        .with_filters([WatchFilterType::NoPut]);
    let mut start = predecessor;
    if let Some(ours) = ours {
        let (low, high) = if predecessor < ours.as_bytes() {
            (predecessor, ours.as_bytes())
        } else {
            (ours.as_bytes(), predecessor)
        };
        let mut end = high.to_vec();
        end.push(0);
        options = options.with_range(end);
        start = low;
    }
    requests::watch(client, start, options, "watching the predecessor").await
}

/// The next turn a watch from [`watch`] reports, if its message has one:
/// the first of the watched keys deleted.
pub(crate) fn turn(
    message: Result<Option<etcd_client::WatchResponse>, etcd_client::Error>,
    predecessor: &[u8],
    ours: Option<&str>,
) -> Option<Turn> {
    let resp = match message {
        Ok(Some(resp)) => resp,
        Ok(None) | Err(_) => return Some(Turn::Ended),
    };
    if resp.canceled() {
        return Some(Turn::Ended);
    }
    for event in resp.events() {
        if event.event_type() != EventType::Delete {
            continue;
        }
        let Some(kv) = event.kv() else { continue };
        if ours.is_some_and(|o| kv.key() == o.as_bytes()) {
            return Some(Turn::OursGone);
        }
        if kv.key() == predecessor {
            // A deletion's event carries its revision as the key's.
            return Some(Turn::PredecessorGone(kv.mod_revision()));
        }
    }
    None
}

/// The error for a waiter whose key disappeared while it was queued.
pub(crate) fn place_lost(name: &str) -> LockError {
    LockError::Lost {
        name: name.to_string(),
        reason: LossReason::TakenOver,
    }
}

#[cfg(test)]
mod tests {
    use etcd_client::Client;

    use super::{Place, place_at};

    /// A put's revision.
    async fn put(client: &mut Client, key: &str) -> i64 {
        let put = client.put(key, "x", None).await.expect("put");
        put.header().expect("header").revision()
    }

    /// A delete's revision.
    async fn delete(client: &mut Client, key: &str) -> i64 {
        let deleted = client.delete(key, None).await.expect("delete");
        deleted.header().expect("header").revision()
    }

    fn shape(place: Option<Place>) -> Option<(Option<String>, bool)> {
        place.map(|p| {
            let predecessor = p
                .predecessor
                .map(|k| String::from_utf8(k).expect("an ASCII key"));
            (predecessor, p.next_in_line)
        })
    }

    /// The place read as of a deletion is the queue as it was then,
    /// whatever happened after: keys deleted later still stand ahead, a
    /// key of ours deleted later still stands, and one deleted before is
    /// gone. A revision the member has not reached is an error (the
    /// caller reads the place now).
    #[tokio::test]
    async fn a_place_is_read_as_it_was_at_a_revision() {
        let url = std::env::var("DISTLOCK_TEST_ETCD_URL")
            .expect("DISTLOCK_TEST_ETCD_URL (scripts/services.sh env)");
        let client = Client::connect([url.replace("etcd://", "http://")], None)
            .await
            .expect("connect");
        let mut c = client.clone();
        let dir = format!("/distlock-test/place-at-{}/", std::process::id());
        let (a, b, ours, later) = (
            format!("{dir}a"),
            format!("{dir}b"),
            format!("{dir}c"),
            format!("{dir}d"),
        );
        // Created in this order: b ahead of a ahead of ours, then later.
        put(&mut c, &b).await;
        put(&mut c, &a).await;
        let rev = put(&mut c, &ours).await;
        put(&mut c, &later).await;
        let a_gone = delete(&mut c, &a).await;
        let b_gone = delete(&mut c, &b).await;
        let ours_gone = delete(&mut c, &ours).await;

        let at = async |revision| {
            shape(
                place_at(&client, &dir, &ours, rev, revision)
                    .await
                    .expect("read"),
            )
        };
        assert_eq!(
            at(a_gone).await,
            Some((Some(b.clone()), true)),
            "with a gone, b is the predecessor and first"
        );
        assert_eq!(
            at(b_gone).await,
            Some((None, false)),
            "with both gone, ours was first (deleted since)"
        );
        assert_eq!(at(ours_gone).await, None, "ours was gone");
        assert!(
            place_at(&client, &dir, &ours, rev, ours_gone + 1_000_000)
                .await
                .is_err(),
            "a future revision is an error"
        );
        c.delete(later.as_str(), None).await.expect("clean up");
    }
}
