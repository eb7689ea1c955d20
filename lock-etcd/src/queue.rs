//! A key's place in its lock's queue, and waiting for its turn.
//!
//! The queue is the keys under the lock's directory, ordered by create
//! revision. A waiter watches only the key just before its own (so a
//! release wakes one waiter, not all) and, when that key is the first, its
//! own key too, in one watcher, whose events come in revision order. When
//! the first key is deleted while the waiter's own is still there, the
//! waiter holds the lock (a waiter whose lease expired while queued sees
//! its own key go first, and never reports success); after any other
//! deletion it reads its place again, in one transaction that also checks
//! its own key still exists.

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
    /// The predecessor was deleted.
    PredecessorGone,
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
    owner: &str,
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
            TxnOp::put(key, owner, Some(PutOptions::new().with_lease(lease))),
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
    let before_us = GetOptions::new()
        .with_range(keys::range_end(dir))
        .with_max_create_revision(rev - 1)
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(1)
        .with_keys_only();
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, rev)])
        .and_then([
            TxnOp::get(dir, Some(before_us)),
            TxnOp::get(dir, Some(first_by_creation(dir))),
        ]);
    let resp = requests::txn(client, txn, "reading the queue").await?;
    if !resp.succeeded() {
        return Ok(None);
    }
    let predecessor = get_result(&resp, 0).0.into_iter().next();
    let first = get_result(&resp, 1).0.into_iter().next();
    Ok(Some(Place {
        next_in_line: predecessor.is_some() && predecessor == first,
        predecessor,
        read_at: resp.header().map_or(0, |h| h.revision()),
    }))
}

/// Get options for the first key (lowest create revision) under `dir`.
pub(crate) fn first_by_creation(dir: &str) -> GetOptions {
    GetOptions::new()
        .with_range(keys::range_end(dir))
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
        .with_keys_only()
}

/// The keys (and the count before the limit) of the get at `op`.
fn get_result(resp: &TxnResponse, op: usize) -> (Vec<Vec<u8>>, i64) {
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
    requests::watch(client, start, options).await
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
        match event.kv().map(|kv| kv.key()) {
            Some(k) if ours.is_some_and(|o| k == o.as_bytes()) => return Some(Turn::OursGone),
            Some(k) if k == predecessor => return Some(Turn::PredecessorGone),
            _ => {}
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
