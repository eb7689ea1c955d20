//! Batched extends: the extends waiting for one server (the watchdog's
//! renewals of many locks) go out as one script run, so a client holding
//! thousands of renewed locks sends a few requests per renewal round
//! instead of one per lock.

use std::sync::Arc;
use std::time::Duration;

use lock_core::LockError;
use lock_core::raw::{BatchFn, Batcher};
use redis::aio::ConnectionLike;

use crate::error::map_error;
use crate::script_call::{Acknowledge, ScriptCall};
use crate::scripts::EXTEND;

/// The most leases one script run touches: a few hundred microseconds of
/// the server's single thread.
const MAX_BATCH: usize = 512;

/// One extend: a lock key, its owner token and the new lease.
pub struct Extension {
    /// The lock's key (`LockKeys::lock`).
    pub key: String,
    /// The owner token the key must still hold.
    pub owner: String,
    /// The new lease.
    pub ttl: Duration,
}

/// A batcher of extends on `conn`, each batch acknowledged by `ack`'s
/// replicas (if any) and bounded by `limit` (then `Unavailable`); errors
/// name `backend` and `server` (shown, so without credentials). With
/// `per_slot` (a Redis Cluster, where one script run touches one slot's
/// keys), a batch goes out as one script run per hash slot, side by side.
pub fn extend_batcher<C>(
    backend: &'static str,
    server: &str,
    conn: C,
    ack: Option<Acknowledge>,
    limit: Duration,
    per_slot: bool,
) -> Batcher<Extension, bool>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let doing: Arc<str> = format!("extending locks on {server}").into();
    let run: BatchFn<Extension, bool> = Arc::new(move |items: Vec<Extension>| {
        let conn = conn.clone();
        let doing = Arc::clone(&doing);
        Box::pin(async move {
            let runs = if per_slot {
                by_slot(&items)
            } else {
                vec![(0..items.len()).collect()]
            };
            let sent = runs.iter().map(|members| {
                let mut conn = conn.clone();
                let items = &items;
                async move {
                    let keys: Vec<&str> = members.iter().map(|&i| items[i].key.as_str()).collect();
                    let mut call = ScriptCall::new(&EXTEND, &keys, 2 * members.len());
                    for &i in members {
                        let x = &items[i];
                        call.arg(&x.owner).arg(lock_core::raw::lease_millis(x.ttl));
                    }
                    call.acknowledged(ack);
                    call.invoke::<Vec<i64>>(&mut conn).await
                }
            });
            let answered = tokio::time::timeout(limit, futures_util::future::join_all(sent)).await;
            let Ok(answers) = answered else {
                return Err(LockError::Unavailable {
                    backend,
                    reason: format!("{doing}: no answer within {limit:?}"),
                    source: None,
                });
            };
            let mut renewed = vec![false; items.len()];
            for (members, answer) in runs.iter().zip(answers) {
                let replies = answer.map_err(|e| map_error(backend, &doing, e))?;
                if replies.len() != members.len() {
                    return Err(LockError::Backend {
                        backend,
                        reason: format!(
                            "{doing}: the extend script answered {} replies for {} leases",
                            replies.len(),
                            members.len()
                        ),
                        source: None,
                    });
                }
                for (&i, reply) in members.iter().zip(replies) {
                    renewed[i] = reply == 1;
                }
            }
            Ok(renewed)
        })
    });
    Batcher::new(backend, MAX_BATCH, run)
}

/// The positions of `items` grouped by their key's hash slot, in order of
/// first appearance.
fn by_slot(items: &[Extension]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(redis::cluster_routing::Slot, Vec<usize>)> = Vec::new();
    for (i, x) in items.iter().enumerate() {
        let slot = redis::cluster_routing::Slot::for_key(x.key.as_bytes());
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, members)) => members.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups.into_iter().map(|(_, members)| members).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_batch_is_one_run_per_hash_slot() {
        let keys = crate::keys::Keys::new("p:");
        let ext = |name: &str| Extension {
            key: keys.lock(name),
            owner: "o".into(),
            ttl: Duration::from_secs(1),
        };
        let items = [ext("a"), ext("b"), ext("a"), ext("c")];
        let groups = by_slot(&items);
        assert!(groups.contains(&vec![0, 2]), "{groups:?}");
        let mut all: Vec<usize> = groups.concat();
        all.sort_unstable();
        assert_eq!(all, [0, 1, 2, 3]);
        for members in &groups {
            let slot = |i: usize| redis::cluster_routing::Slot::for_key(items[i].key.as_bytes());
            assert!(members.iter().all(|&i| slot(i) == slot(members[0])));
        }
    }
}
