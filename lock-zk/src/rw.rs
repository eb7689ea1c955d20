//! ZooKeeper reader-writer locks, as Curator's `InterProcessReadWriteLock`
//! with writer preference and tokens.
//!
//! Reader-writer lock `n` lives under `ROOT/r<encoded n>` (locks are
//! `ROOT/n…`, semaphores `ROOT/s…`), a container. Each acquisition joins
//! it with an `EPHEMERAL_SEQUENTIAL` node `lock-ID-SEQ` whose id starts
//! with `w` (a writer) or `r` (a reader). A writer holds when its node is
//! the first by sequence; a reader when no writer's node comes before its
//! own. So readers that come after a waiting writer wait behind it, those
//! that came before keep their place, and every waiter is served in
//! arrival order. A waiter watches only the node it waits for: a writer
//! the node just before its own, a reader the last writer's before its own.
//!
//! A write grant's token is its node's `czxid`, which it raises the
//! name's counter node `ROOT/f<encoded n>` (persistent) to, by a
//! version-checked write that never lowers it, before the guard is handed
//! out; a read grant carries the counter as it reads it once granted, the
//! latest write's token.

use std::sync::Arc;

use lock_core::raw::{
    GuardHandle, HolderRecord, Kind, OwnerToken, PendingGrant, RawGuard, Request, Turn,
};
use lock_core::{Access, LockError, LockGuard, RwHolderInfo, RwLockInfo};
use tokio::time::Instant;
use zookeeper_client::{Client, CreateMode, Error as ZkError};

use crate::error::zk_error;
use crate::handle::ZkHandle;
use crate::lock::ZkLock;
use crate::path::{rw_counter_node, rw_node};
use crate::queue::{await_turn, catch_up, enqueue, queue};
use crate::session::{Session, retrying_resendable};

/// A queue child's access, from its attempt id's first letter.
fn access_of(child: &str) -> Option<Access> {
    match child.strip_prefix("lock-")?.as_bytes().first() {
        Some(b'w') => Some(Access::Write),
        Some(b'r') => Some(Access::Read),
        _ => None,
    }
}

/// The kinds of queue children, for [`Kind::turn`]: a child whose access
/// cannot be read keeps everyone out.
fn kinds(children: &[String]) -> Vec<Kind> {
    children
        .iter()
        .map(|c| access_of(c).map_or(Kind::Lock, Kind::Rw))
        .collect()
}

/// The counter node's token (0 where no write was ever granted).
fn counter_value(data: &[u8]) -> Result<u64, LockError> {
    if data.is_empty() {
        return Ok(0);
    }
    std::str::from_utf8(data)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| LockError::Backend {
            backend: crate::lock::BACKEND,
            reason: "a reader-writer lock's counter node holds no token".into(),
            source: None,
        })
}

/// The counter node's token and version; `None` if it does not exist.
async fn read_counter(client: &Client, path: &str) -> Result<Option<(u64, i32)>, LockError> {
    match retrying_resendable(|| client.get_data(path)).await {
        Ok((data, stat)) => Ok(Some((counter_value(&data)?, stat.version))),
        Err(ZkError::NoNode) => Ok(None),
        Err(e) => Err(zk_error("reading a reader-writer lock's counter", e)),
    }
}

/// Raise the counter node at `path` to `token`, never lowering it: a
/// version-checked write, read again when another got in between.
async fn raise_counter(session: &Session, path: &str, token: u64) -> Result<(), LockError> {
    let client = &session.client;
    for _ in 0..16 {
        let done = match read_counter(client, path).await? {
            Some((current, _)) if current >= token => return Ok(()),
            Some((_, version)) => client
                .set_data(path, token.to_string().as_bytes(), Some(version))
                .await
                .map(drop),
            None => {
                let mode = CreateMode::Persistent.with_acls(session.acls);
                client
                    .create(path, token.to_string().as_bytes(), &mode)
                    .await
                    .map(drop)
            }
        };
        match done {
            Ok(()) => return Ok(()),
            Err(ZkError::BadVersion | ZkError::NodeExists) => continue,
            Err(e) => return Err(zk_error("writing a reader-writer lock's counter", e)),
        }
    }
    Err(LockError::Unavailable {
        backend: crate::lock::BACKEND,
        reason: "a reader-writer lock's counter changed under every write".into(),
        source: None,
    })
}

impl ZkLock {
    /// Join the reader-writer queue in `session` for `access` and wait
    /// (until the request's deadline) to hold.
    pub(crate) async fn attempt_rw(
        &self,
        session: &Arc<Session>,
        req: Request<'_>,
        access: Access,
    ) -> Result<Option<LockGuard>, LockError> {
        let (name, opts) = (req.name, req.opts);
        let dir = rw_node(self.root(), name);
        let counter = rw_counter_node(self.root(), name);
        let letter = if access == Access::Write { 'w' } else { 'r' };
        let id = format!("{letter}{}", &OwnerToken::random().to_hex()[..15]);
        let sent_at = Instant::now();
        let client = &session.client;
        let record = opts.holder_record();
        let ours = enqueue(session, &dir, &id, record.as_bytes()).await?;
        let handle = Arc::new(ZkHandle::new(
            Arc::clone(session),
            ours.path,
            self.url(),
            record,
        ));
        // Leaving without the lock (timeout, error, cancellation) deletes
        // our node.
        let pending = PendingGrant::new(Arc::clone(&handle) as Arc<dyn GuardHandle>);
        let child = handle.path.rsplit('/').next().unwrap_or_default();
        let kind = Kind::Rw(access);
        let holds = await_turn(client, &dir, child, &req, false, |ahead| {
            Ok(kind.turn(&kinds(ahead)))
        })
        .await?;
        if holds.is_none() {
            let _ = pending.give_back().await;
            return Ok(None);
        }
        let token = match access {
            Access::Write => {
                let token = u64::try_from(ours.czxid).unwrap_or(0);
                raise_counter(session, &counter, token).await?;
                token
            }
            _ => read_counter(client, &counter).await?.map_or(0, |(t, _)| t),
        };
        let guard = self
            .guard(name, session, pending, ours.czxid, sent_at, opts)
            .await?;
        Ok(Some(
            guard
                .with_fencing_token(Some(token))
                .with_access(Some(access)),
        ))
    }

    /// The queue of reader-writer lock `name` (read once this client's
    /// member caught up with the leader): its holders with their records,
    /// the counter, the writers and readers waiting.
    pub(crate) async fn inspect_rw_lock(
        &self,
        session: &Session,
        name: &str,
    ) -> Result<RwLockInfo, LockError> {
        let dir = rw_node(self.root(), name);
        let client = &session.client;
        catch_up(client, &dir).await?;
        let queue = queue(client, &dir).await?;
        let token = read_counter(client, &rw_counter_node(self.root(), name))
            .await?
            .map_or(0, |(t, _)| t);
        let mut holders = Vec::new();
        let (mut writers, mut readers) = (0, 0);
        let kinds = kinds(&queue);
        for (at, child) in queue.iter().enumerate() {
            let Some(access) = access_of(child) else {
                continue;
            };
            if Kind::Rw(access).turn(&kinds[..at]) != Turn::Holds {
                if access == Access::Write {
                    writers += 1;
                } else {
                    readers += 1;
                }
                continue;
            }
            let path = format!("{dir}/{child}");
            let (data, stat) = match retrying_resendable(|| client.get_data(&path)).await {
                Ok(read) => read,
                Err(ZkError::NoNode) => continue,
                Err(e) => return Err(zk_error("reading a holder's node", e)),
            };
            let record = (!data.is_empty())
                .then(|| HolderRecord::decode_for(crate::lock::BACKEND, name, &data))
                .transpose()?;
            let own = match access {
                Access::Write => u64::try_from(stat.czxid).ok(),
                _ => Some(token),
            };
            holders.push(
                RwHolderInfo::new(access)
                    .with_fencing_token(own)
                    .with_holder(record),
            );
        }
        Ok(RwLockInfo::held(holders)
            .with_fencing_token(Some(token))
            .with_waiting(Some(writers), Some(readers)))
    }
}
