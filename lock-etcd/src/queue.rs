//! A key's place in its lock's queue, and waiting for its turn.
//!
//! The queue is the keys under the lock's directory, ordered by create
//! revision. A waiter watches only the key just before its own (so a
//! release wakes one waiter, not all). When that key is deleted, the waiter
//! reads its place again in one transaction that also checks its own key
//! still exists: a waiter whose lease expired while queued learns it there
//! and never reports success.

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
    /// The revision the place was read at.
    pub(crate) read_at: i64,
}

/// What ended a wait on the predecessor.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// The predecessor was deleted.
    PredecessorGone,
    /// Our own lease is gone (a keep-alive found it expired or revoked).
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
        .and_then([TxnOp::get(dir, Some(before_us))]);
    let resp = requests::txn(client, txn, "reading the queue").await?;
    if !resp.succeeded() {
        return Ok(None);
    }
    let (kvs, _) = get_result(&resp, 0);
    Ok(Some(Place {
        predecessor: kvs.into_iter().next(),
        read_at: resp.header().map_or(0, |h| h.revision()),
    }))
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

/// A watch for the deletion of `predecessor` only, from revision `from`:
/// the revision our place was read at plus one, so nothing is missed and
/// the watch is served live rather than by etcd's slower catch-up of
/// watches that start in the past.
pub(crate) async fn watch(
    client: &Client,
    predecessor: &[u8],
    from: i64,
) -> Result<WatchStream, LockError> {
    let options = WatchOptions::new()
        .with_start_revision(from)
        .with_filters([WatchFilterType::NoPut]);
    requests::watch(client, predecessor, options).await
}

/// The next turn a watch from [`watch`] reports, if its message has one.
pub(crate) fn turn(
    message: Result<Option<etcd_client::WatchResponse>, etcd_client::Error>,
    predecessor: &[u8],
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
        if event.kv().is_some_and(|kv| kv.key() == predecessor) {
            return Some(Turn::PredecessorGone);
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
