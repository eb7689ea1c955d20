//! The etcd requests the lock makes, each sent again (up to a few times)
//! when the member it was routed to refused the connection: with one member
//! of a cluster down, the client's balancer may still pick it.

use std::future::Future;
use std::time::Duration;

use etcd_client::{
    Client, GetOptions, GetResponse, LeaseGrantResponse, Txn, TxnResponse, WatchOptions,
    WatchStream,
};
use lock_core::raw::Retry;
use lock_core::{Backoff, LockError};

use crate::error::{map_etcd, never_sent};

/// Sends of one request at most.
const ATTEMPTS: u32 = 4;

/// Send `call` again (after 40, 60, 90 ms) while the member it reached
/// refused it unsent.
async fn retry<T, F, Fut>(doing: &str, mut call: F) -> Result<T, LockError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let backoff = Backoff::default()
        .with_initial(Duration::from_millis(40))
        .with_multiplier(1.5)
        .with_jitter(0.0);
    Retry::with_backoff(backoff)
        .attempts(ATTEMPTS)
        .run(doing, never_sent, |_| call())
        .await
        .map_err(|e| map_etcd(doing, e))
}

/// A transaction.
pub(crate) async fn txn(client: &Client, txn: Txn, doing: &str) -> Result<TxnResponse, LockError> {
    retry(doing, || {
        let (mut kv, txn) = (client.kv_client(), txn.clone());
        async move { kv.txn(txn).await }
    })
    .await
}

/// A range read.
pub(crate) async fn get(
    client: &Client,
    key: &str,
    options: GetOptions,
    doing: &str,
) -> Result<GetResponse, LockError> {
    retry(doing, || {
        let (mut kv, options) = (client.kv_client(), options.clone());
        async move { kv.get(key, Some(options)).await }
    })
    .await
}

/// Delete one key: whether it was there.
pub(crate) async fn delete(client: &Client, key: &str, doing: &str) -> Result<bool, LockError> {
    let resp = retry(doing, || {
        let mut kv = client.kv_client();
        async move { kv.delete(key, None).await }
    })
    .await?;
    Ok(resp.deleted() > 0)
}

/// A lease of `secs` seconds.
pub(crate) async fn grant(
    client: &Client,
    secs: u64,
    doing: &str,
) -> Result<LeaseGrantResponse, LockError> {
    let secs = i64::try_from(secs).unwrap_or(i64::MAX);
    retry(doing, || {
        let mut lease = client.lease_client();
        async move { lease.grant(secs, None).await }
    })
    .await
}

/// Revoke lease `id` (its keys are deleted with it).
pub(crate) async fn revoke(client: &Client, id: i64, doing: &str) -> Result<(), LockError> {
    retry(doing, || {
        let mut lease = client.lease_client();
        async move { lease.revoke(id).await }
    })
    .await
    .map(|_| ())
}

/// The seconds lease `id` has left (`None` if it is gone).
pub(crate) async fn time_left(
    client: &Client,
    id: i64,
    doing: &str,
) -> Result<Option<u64>, LockError> {
    let answer = retry(doing, || {
        let mut lease = client.lease_client();
        async move { lease.time_to_live(id, None).await }
    })
    .await?;
    Ok(u64::try_from(answer.ttl()).ok())
}

/// One keep-alive of lease `id`: `false` if the lease is gone.
pub(crate) async fn keep_alive_once(client: &Client, id: i64) -> Result<bool, LockError> {
    let sent = retry("keeping a lease alive", || {
        let mut lease = client.lease_client();
        async move {
            match lease.keep_alive(id).await {
                Ok(_) => Ok(true),
                Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
                Err(e) => Err(e),
            }
        }
    });
    sent.await
}

/// A watch stream on `key`, for `doing` (the errors' context).
pub(crate) async fn watch(
    client: &Client,
    key: &[u8],
    options: WatchOptions,
    doing: &str,
) -> Result<WatchStream, LockError> {
    retry(doing, || {
        let (mut w, options) = (client.watch_client(), options.clone());
        async move { w.watch(key.to_vec(), Some(options)).await }
    })
    .await
}
