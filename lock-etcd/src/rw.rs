//! etcd reader-writer locks, on the locks' leases and sessions: the recipe
//! of etcd's `recipes/rwmutex.go`.
//!
//! Reader-writer lock `n` lives under `PREFIX/%rw/e(n)/` (no lock's
//! directory can be that: an escaped name holds `%` only as `%25` or
//! `%2F`). Each acquisition puts a key there on its lease, `…/wLEASE-OWNER`
//! for a writer or `…/rLEASE-OWNER` for a reader, and the keys are ordered
//! by create revision. A writer holds when no key was created before its
//! own; a reader when no writer's key was. So a reader that comes after a
//! waiting writer waits behind it (writer preference), readers that came
//! before it keep their place, and every waiter is served in arrival
//! order. A waiter watches only the key it waits for: a writer the key
//! just before its own, a reader the last writer's key before its own.
//!
//! A write grant's token is its key's create revision, which it also
//! writes to the name's counter key `PREFIX/%rw-fence/e(n)/` (in a
//! transaction that checks its key is still there) before the guard is
//! handed out; a read grant carries that counter as it reads it once
//! granted, the latest write's token.

use std::sync::Arc;

use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use lock_core::raw::{self, GuardHandle, HolderRecord, Kind, OwnerToken, PendingGrant, RawGuard};
use lock_core::{Access, LockError, LockGuard, LockOptions, RwHolderInfo, RwLockInfo};
use tokio::time::Instant;

use crate::error::BACKEND;
use crate::handle::EtcdHandle;
use crate::keys;
use crate::lock::{EtcdLock, ride_out};
use crate::queue::{self, Turn};
use crate::requests;

/// The directory of reader-writer lock `name` and its counter key.
struct RwKeys {
    dir: String,
    fence: String,
}

impl RwKeys {
    fn new(prefix: &str, name: &str) -> Self {
        RwKeys {
            dir: keys::dir(&format!("{prefix}/%rw"), name),
            fence: keys::dir(&format!("{prefix}/%rw-fence"), name),
        }
    }
}

/// A key's access, from its name's first byte after the directory.
fn access_of(dir: &str, key: &[u8]) -> Option<Access> {
    match key.get(dir.len()) {
        Some(b'w') => Some(Access::Write),
        Some(b'r') => Some(Access::Read),
        _ => None,
    }
}

/// Every key of the directory: (key, create revision, value), by creation.
fn all_keys(dir: &str, with_values: bool) -> GetOptions {
    let options = GetOptions::new()
        .with_range(keys::range_end(dir))
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    if with_values {
        options
    } else {
        options.with_keys_only()
    }
}

/// The keys of the get at `op` of `resp`, with their create revisions and
/// values.
fn listed(resp: &etcd_client::TxnResponse, op: usize) -> Vec<(Vec<u8>, i64, Vec<u8>)> {
    match resp.op_responses().into_iter().nth(op) {
        Some(TxnOpResponse::Get(get)) => get
            .kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.create_revision(), kv.value().to_vec()))
            .collect(),
        _ => Vec::new(),
    }
}

/// The key a waiter for `access` whose key was created at `rev` waits
/// for ([`Kind::turn`] over the keys created before its own): a writer
/// the last key, a reader the last writer's; `None` when it holds.
fn blocker(
    dir: &str,
    keys: &[(Vec<u8>, i64, Vec<u8>)],
    rev: i64,
    access: Access,
) -> Option<Vec<u8>> {
    let mut ahead: Vec<(&[u8], i64, Kind)> = keys
        .iter()
        .filter(|(_, created, _)| *created < rev)
        .filter_map(|(key, created, _)| Some((&key[..], *created, Kind::Rw(access_of(dir, key)?))))
        .collect();
    ahead.sort_by_key(|(_, created, _)| *created);
    let kinds: Vec<Kind> = ahead.iter().map(|(_, _, kind)| *kind).collect();
    match Kind::Rw(access).turn(&kinds) {
        raw::Turn::After(at) => Some(ahead[at].0.to_vec()),
        _ => None,
    }
}

impl EtcdLock {
    /// Acquire `access` to `name`; `wait == false` gives up (removing our
    /// key) if it does not hold at once.
    pub(crate) async fn acquire_rw(
        &self,
        name: &str,
        opts: &LockOptions,
        access: Access,
        deadline: Option<Instant>,
        wait: bool,
    ) -> Result<Option<LockGuard>, LockError> {
        let rw = RwKeys::new(&self.inner.config.prefix, name);
        let leased = self.lease_for(opts).await?;
        let mark = if access == Access::Write { 'w' } else { 'r' };
        let key = format!(
            "{}{mark}{:016x}-{}",
            rw.dir,
            leased.0.id(),
            OwnerToken::random().to_hex()
        );
        let handle = Arc::new(EtcdHandle::new(
            Arc::clone(&self.inner),
            name,
            rw.dir.clone(),
            key,
            opts.holder_record(),
            leased,
        ));
        // Until a guard owns the key, leaving (failure, timeout,
        // cancellation) deletes it and gives back a lease of its own.
        let pending = PendingGrant::new(Arc::clone(&handle) as Arc<dyn GuardHandle>);
        let client = &self.inner.client;
        let txn = Txn::new()
            .when([Compare::create_revision(
                handle.key.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([
                TxnOp::put(
                    handle.key.as_str(),
                    handle.record().as_bytes(),
                    Some(PutOptions::new().with_lease(handle.lease_id())),
                ),
                TxnOp::get(rw.dir.as_str(), Some(all_keys(&rw.dir, false))),
            ]);
        let resp = match requests::txn(client, txn, "acquiring").await {
            Ok(resp) => resp,
            Err(e) => return Err(handle.put_failed(e)),
        };
        if !resp.succeeded() {
            return Err(LockError::Backend {
                backend: BACKEND,
                reason: format!("reader-writer key {:?} exists already", handle.key),
                source: None,
            });
        }
        let rev = resp.header().map_or(0, |h| h.revision());
        *handle.rev.lock().unwrap_or_else(|e| e.into_inner()) = rev;
        let mut waiting_for = blocker(&rw.dir, &listed(&resp, 1), rev, access);
        let mut read_at = rev;
        loop {
            if handle.state.lost_now().is_some() {
                let _ = pending.give_back().await;
                return Err(queue::place_lost(name));
            }
            let Some(pred) = waiting_for else {
                let token = match self.grant_token(&rw, &handle, rev, access).await {
                    Ok(Some(token)) => token,
                    Ok(None) => return Err(queue::place_lost(name)),
                    Err(e) => {
                        let _ = pending.give_back().await;
                        return Err(e);
                    }
                };
                pending.disarm();
                let guard = self
                    .guard(name, handle, rev, opts)
                    .with_fencing_token(Some(token))
                    .with_access(Some(access));
                return Ok(Some(guard));
            };
            if !wait {
                let _ = pending.give_back().await;
                return Ok(None);
            }
            let waited = async {
                let watch = queue::watch(client, &pred, None, read_at + 1).await?;
                self.watch_until(&handle, watch, deadline, |message| {
                    queue::turn(message, &pred, None)
                })
                .await
            }
            .await;
            match waited {
                Ok(Turn::OursGone) => return Err(queue::place_lost(name)),
                Ok(Turn::PredecessorGone(_) | Turn::Ended) => {}
                Err(e) if e.is_transient() => ride_out(name, e, deadline).await?,
                Err(e @ LockError::Timeout { .. }) => {
                    let _ = pending.give_back().await;
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
            // Our place now, checking our key is still there.
            let txn = Txn::new()
                .when([Compare::create_revision(
                    handle.key.as_str(),
                    CompareOp::Equal,
                    rev,
                )])
                .and_then([TxnOp::get(rw.dir.as_str(), Some(all_keys(&rw.dir, false)))]);
            let resp = match requests::txn(client, txn, "reading the queue").await {
                Ok(resp) => resp,
                Err(e) if e.is_transient() => {
                    ride_out(name, e, deadline).await?;
                    waiting_for = Some(pred);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if !resp.succeeded() {
                return Err(queue::place_lost(name));
            }
            read_at = resp.header().map_or(read_at, |h| h.revision());
            waiting_for = blocker(&rw.dir, &listed(&resp, 0), rev, access);
        }
    }

    /// The token of a grant whose key was created at `rev`, read or
    /// written in one transaction that checks the key is still ours: a
    /// writer's is `rev`, written to the name's counter; a reader's is the
    /// counter. `None` if the key has gone.
    async fn grant_token(
        &self,
        rw: &RwKeys,
        handle: &EtcdHandle,
        rev: i64,
        access: Access,
    ) -> Result<Option<u64>, LockError> {
        let ours = Compare::create_revision(handle.key.as_str(), CompareOp::Equal, rev);
        let op = match access {
            Access::Write => TxnOp::put(rw.fence.as_str(), rev.to_string(), None),
            _ => TxnOp::get(rw.fence.as_str(), None),
        };
        let resp = requests::txn(
            &self.inner.client,
            Txn::new().when([ours]).and_then([op]),
            "drawing a fencing token",
        )
        .await?;
        if !resp.succeeded() {
            return Ok(None);
        }
        if access == Access::Write {
            return Ok(u64::try_from(rev).ok());
        }
        let counter = listed(&resp, 0)
            .into_iter()
            .next()
            .map(|(_, _, value)| value)
            .unwrap_or_default();
        Ok(Some(counter_value(&counter)?))
    }

    /// The keys of reader-writer lock `name`: who holds it (the first
    /// writer's key if no key came before it, else every reader's key with
    /// no writer's before it), the latest write's token, and the writers
    /// and readers waiting.
    pub(crate) async fn inspect_rw_lock(&self, name: &str) -> Result<RwLockInfo, LockError> {
        let rw = RwKeys::new(&self.inner.config.prefix, name);
        let txn = Txn::new().and_then([
            TxnOp::get(rw.dir.as_str(), Some(all_keys(&rw.dir, true))),
            TxnOp::get(rw.fence.as_str(), None),
        ]);
        let resp = requests::txn(&self.inner.client, txn, "reading a reader-writer lock").await?;
        let listed_keys = listed(&resp, 0);
        let counter = listed(&resp, 1)
            .into_iter()
            .next()
            .map(|(_, _, value)| value)
            .unwrap_or_default();
        let token = counter_value(&counter)?;
        let mut holders = Vec::new();
        let (mut writers, mut readers) = (0, 0);
        for (key, created, value) in &listed_keys {
            let Some(access) = access_of(&rw.dir, key) else {
                continue;
            };
            let holds = blocker(&rw.dir, &listed_keys, *created, access).is_none();
            if holds {
                let record = (!value.is_empty())
                    .then(|| HolderRecord::decode_for(BACKEND, name, value))
                    .transpose()?;
                holders.push(
                    RwHolderInfo::new(access)
                        .with_fencing_token(Some(match access {
                            Access::Write => u64::try_from(*created).unwrap_or(0),
                            _ => token,
                        }))
                        .with_holder(record),
                );
            } else if access == Access::Write {
                writers += 1;
            } else {
                readers += 1;
            }
        }
        Ok(RwLockInfo::held(holders)
            .with_fencing_token(Some(token))
            .with_waiting(Some(writers), Some(readers)))
    }
}

/// The counter key's value: a decimal token, or 0 where no write was ever
/// granted.
fn counter_value(value: &[u8]) -> Result<u64, LockError> {
    if value.is_empty() {
        return Ok(0);
    }
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| LockError::Backend {
            backend: BACKEND,
            reason: "a reader-writer lock's counter key holds no token".into(),
            source: None,
        })
}
