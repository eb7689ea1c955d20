//! The guard's handle on an etcd lock: one acquisition's key and the
//! lease it lives on, released, extended and cleaned up through here.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use lock_core::LockError;
use lock_core::raw::{DetachedRelease, GuardHandle, HolderRecord, LeaseState};

use crate::lock::Inner;
use crate::requests;
use crate::session::Session;

/// The lease a key is attached to.
#[derive(Clone)]
pub(crate) enum Lease {
    /// The client's session lease.
    Session(Arc<Session>),
    /// A lease of the lock's own.
    Own { id: i64, ttl: Duration },
}

impl Lease {
    pub(crate) fn id(&self) -> i64 {
        match self {
            Lease::Session(s) => s.lease,
            Lease::Own { id, .. } => *id,
        }
    }
}

/// One acquisition's key: released, extended and cleaned up through here.
pub(crate) struct EtcdHandle {
    pub(crate) inner: Arc<Inner>,
    pub(crate) name: String,
    pub(crate) dir: String,
    pub(crate) key: String,
    /// The holder record, the key's value.
    pub(crate) record: Mutex<HolderRecord>,
    pub(crate) lease: Mutex<Lease>,
    pub(crate) state: Arc<LeaseState>,
    /// Our key's create revision, once put (0 before).
    pub(crate) rev: Mutex<i64>,
    /// A permit's slot key, once claimed (never for a lock).
    pub(crate) slot: Mutex<Option<SlotKey>>,
}

/// A permit's slot key and its create revision (the permit's token). It
/// lives on the same lease as the permit's queue key and goes with it.
#[derive(Clone)]
pub(crate) struct SlotKey {
    pub(crate) key: String,
    pub(crate) token: i64,
}

/// Delete `key` and, if still ours, `slot`, in one transaction: `true` if
/// the slot was still ours (for a lock: if the key was still there).
async fn delete_on(
    client: &etcd_client::Client,
    key: &str,
    slot: Option<&SlotKey>,
    doing: &str,
) -> Result<bool, LockError> {
    let Some(slot) = slot else {
        return requests::delete(client, key, doing).await;
    };
    let txn = Txn::new()
        .when([Compare::create_revision(
            slot.key.as_str(),
            CompareOp::Equal,
            slot.token,
        )])
        .and_then([
            TxnOp::delete(slot.key.as_str(), None),
            TxnOp::delete(key, None),
        ])
        .or_else([TxnOp::delete(key, None)]);
    Ok(requests::txn(client, txn, doing).await?.succeeded())
}

impl EtcdHandle {
    /// The handle of key `key` in `dir` (a lock's directory or a
    /// semaphore's queue) of `name`, to be put on `lease` with `record`.
    pub(crate) fn new(
        inner: Arc<Inner>,
        name: &str,
        dir: String,
        key: String,
        record: HolderRecord,
        (lease, state): (Lease, Arc<LeaseState>),
    ) -> Self {
        EtcdHandle {
            inner,
            name: name.to_string(),
            dir,
            key,
            record: Mutex::new(record),
            lease: Mutex::new(lease),
            state,
            rev: Mutex::new(0),
            slot: Mutex::new(None),
        }
    }

    /// What the request that was to put our key answers with `e`: where
    /// the lease went before the client noticed (revoked, or expired in a
    /// partition), no key was put, and a session lease is ended here so
    /// that the next attempt takes its place on a new one; the waiter's
    /// place is lost. Any other error is as it is.
    pub(crate) fn put_failed(&self, e: LockError) -> LockError {
        if !crate::error::lease_not_found(&e) {
            return e;
        }
        if let Lease::Session(session) = self.current_lease() {
            session.end(lock_core::LossReason::TakenOver);
        }
        crate::queue::place_lost(&self.name)
    }

    pub(crate) fn record(&self) -> HolderRecord {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn current_lease(&self) -> Lease {
        self.lease.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn lease_id(&self) -> i64 {
        self.current_lease().id()
    }

    pub(crate) fn lease_ttl(&self) -> Duration {
        match self.current_lease() {
            Lease::Session(s) => s.ttl,
            Lease::Own { ttl, .. } => ttl,
        }
    }

    pub(crate) fn rev(&self) -> i64 {
        *self.rev.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn slot(&self) -> Option<SlotKey> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The comparisons that our key (and a permit's slot key) are still
    /// ours.
    fn still_ours(&self) -> Vec<Compare> {
        let mut when = vec![Compare::create_revision(
            self.key.as_str(),
            CompareOp::Equal,
            self.rev(),
        )];
        if let Some(slot) = self.slot() {
            when.push(Compare::create_revision(
                slot.key.as_str(),
                CompareOp::Equal,
                slot.token,
            ));
        }
        when
    }

    /// Puts of `record` on our key (and a permit's slot key), with `options`.
    fn put_record(&self, record: &HolderRecord, options: PutOptions) -> Vec<TxnOp> {
        let mut puts = vec![TxnOp::put(
            self.key.as_str(),
            record.as_bytes(),
            Some(options.clone()),
        )];
        if let Some(slot) = self.slot() {
            puts.push(TxnOp::put(
                slot.key.as_str(),
                record.as_bytes(),
                Some(options),
            ));
        }
        puts
    }

    /// One keep-alive of our lease: `false` if the lease is gone.
    pub(crate) async fn keep_alive_once(&self) -> Result<bool, LockError> {
        requests::keep_alive_once(&self.inner.client, self.lease_id()).await
    }

    /// Whether our key still exists with our revision, by a linearizable
    /// read. Not a transaction of the comparison alone: etcd serves a
    /// transaction without operations as a serializable read, from the
    /// member's own store, and a member behind the leader answers it from
    /// before our key was put.
    pub(crate) async fn key_is_ours(&self, rev: i64) -> Result<bool, LockError> {
        let options = GetOptions::new().with_keys_only();
        let resp = requests::get(
            &self.inner.client,
            &self.key,
            options,
            "checking a lock key",
        )
        .await?;
        Ok(resp
            .kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == rev))
    }

    /// Give back a lease of the lock's own, in the background.
    pub(crate) fn revoke_own(&self, lease: &Lease) {
        if let (Lease::Own { id, .. }, Ok(rt)) = (lease, tokio::runtime::Handle::try_current()) {
            let (client, id) = (self.inner.client.clone(), *id);
            rt.spawn(async move {
                let _ = client.lease_client().revoke(id).await;
            });
        }
    }
}

impl Drop for EtcdHandle {
    fn drop(&mut self) {
        let rev = self.rev();
        self.inner
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(std::mem::take(&mut self.name), rev));
    }
}

#[async_trait]
impl GuardHandle for EtcdHandle {
    /// Delete our key; `true` if it was still there. No comparison is
    /// needed: the key's name holds this acquisition's owner token, and only
    /// this acquisition writes it (put if absent; moved to a longer lease
    /// only while its create revision is ours), so whatever key of that name
    /// exists is ours, whether or not we learnt its revision.
    ///
    /// A permit's slot key goes in the same transaction, if its create
    /// revision is still ours (a slot key's name is reused by later
    /// holders); the answer is whether it was.
    async fn release(&self) -> Result<bool, LockError> {
        let slot = self.slot();
        let held = delete_on(
            &self.inner.client,
            &self.key,
            slot.as_ref(),
            "releasing a lock",
        )
        .await?;
        self.revoke_own(&self.current_lease());
        Ok(held)
    }

    /// The same delete (and the revoke of a lease of its own), on a
    /// client of its own connected from the URL. A lock on the
    /// application's own client has none: its key goes with its lease.
    fn detached_release(&self) -> Option<DetachedRelease> {
        let inner = Arc::clone(&self.inner);
        inner.reconnect.as_ref()?;
        let (key, lease, slot) = (self.key.clone(), self.current_lease(), self.slot());
        Some(Box::pin(async move {
            let reconnect = inner
                .reconnect
                .as_ref()
                .ok_or_else(|| LockError::Unavailable {
                    backend: crate::error::BACKEND,
                    reason: "no way to connect again".into(),
                    source: None,
                })?;
            let client = reconnect.connect(&inner.display).await?;
            let held =
                delete_on(&client, &key, slot.as_ref(), "releasing a lock at shutdown").await?;
            if let Lease::Own { id, .. } = lease {
                let _ = requests::revoke(&client, id, "revoking a lock's lease at shutdown").await;
            }
            Ok(held)
        }))
    }

    /// Keep the key's lease alive for at least `ttl`: a keep-alive if the
    /// lease is long enough, else (a lease of the lock's own) a new lease of
    /// `ttl` the key moves to. `false` if the key or its lease is gone.
    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        let rev = self.rev();
        let lease = self.current_lease();
        let current = self.lease_ttl();
        if ttl <= current {
            let (alive, ours) = tokio::join!(self.keep_alive_once(), self.key_is_ours(rev));
            return Ok(alive? && ours?);
        }
        let Lease::Own { .. } = lease else {
            return Err(LockError::invalid_options(format!(
                "this lock lives on the client's session lease ({current:?}); extend it by at most that, or acquire with another TTL to give it a lease of its own"
            )));
        };
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let granted = requests::grant(&self.inner.client, secs, "granting a lease").await?;
        // A permit's slot key moves with it.
        let txn = Txn::new()
            .when(self.still_ours())
            .and_then(self.put_record(&self.record(), PutOptions::new().with_lease(granted.id())));
        let resp =
            requests::txn(&self.inner.client, txn, "moving a lock to a longer lease").await?;
        let fresh = Lease::Own {
            id: granted.id(),
            ttl: Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0).max(1)),
        };
        if resp.succeeded() {
            *self.lease.lock().unwrap_or_else(|e| e.into_inner()) = fresh;
            self.revoke_own(&lease);
        } else {
            self.revoke_own(&fresh);
        }
        Ok(resp.succeeded())
    }

    /// Put the new record on our key (and a permit's slot key), on its
    /// lease, only while its create revision is ours.
    async fn set_value(&self, value: &[u8]) -> Result<bool, LockError> {
        let record = self.record().with_value(value);
        let txn = Txn::new()
            .when(self.still_ours())
            .and_then(self.put_record(&record, PutOptions::new().with_ignore_lease()));
        let resp = requests::txn(&self.inner.client, txn, "replacing a holder's value").await?;
        if resp.succeeded() {
            *self.record.lock().unwrap_or_else(|e| e.into_inner()) = record;
        }
        Ok(resp.succeeded())
    }
}
