//! The queue of one lock: its children in sequence order, joining it
//! with a node that can be found again after a lost reply, and waiting in
//! it ([`await_turn`]), the one queue walk of locks, reader-writer locks
//! and semaphores.

use std::sync::Arc;

use lock_core::raw::{Request, Turn};
use lock_core::{LockError, LossReason};
use tokio::time::Instant;
use zookeeper_client::{Client, CreateMode, Error as ZkError, EventType, OneshotWatcher};

use crate::error::{connection_dropped, zk_error};
use crate::path::{attempt_prefix, is_attempt, sequence};
use crate::session::{Session, retrying, retrying_resendable};

/// How many times the lock node may vanish between creating it and
/// creating our child in it (an empty lock node is a container, which the
/// server removes).
const RECREATE_LIMIT: usize = 8;

/// The lock children of `dir` in sequence order (none if `dir` is missing).
pub(crate) async fn queue(client: &Client, dir: &str) -> Result<Vec<String>, LockError> {
    let mut children = match retrying_resendable(|| client.list_children(dir)).await {
        Ok(c) => c,
        Err(ZkError::NoNode) => Vec::new(),
        Err(e) => return Err(zk_error("listing the queue", e)),
    };
    children.retain(|c| sequence(c).is_some());
    children.sort_by_key(|c| sequence(c));
    Ok(children)
}

/// [`queue`] with a watch on its children, for a waiter that waits for
/// any change of the queue.
async fn watched_queue(
    client: &Client,
    dir: &str,
) -> Result<(Vec<String>, OneshotWatcher), LockError> {
    let (mut children, _, watcher) = retrying_resendable(|| client.get_and_watch_children(dir))
        .await
        .map_err(|e| zk_error("listing the queue", e))?;
    children.retain(|c| sequence(c).is_some());
    children.sort_by_key(|c| sequence(c));
    Ok((children, watcher))
}

/// Wait (until `req`'s deadline) for our node `child` of the queue `dir`
/// to hold: `decide` gives its [`Turn`] from the children ahead of it (in
/// sequence order). Returns how many were ahead when it held, or `None`
/// if the deadline passed first; [`LockError::Lost`] if our node is gone
/// (with its session, or deleted by hand).
///
/// A waiter watches only the node it waits for, and when that node goes,
/// decides again from what it listed without it: no node joins ahead of
/// ours (sequence numbers only grow) and an entry leaving never keeps
/// anyone out longer, so the hand-off costs the holder's delete and one
/// notification. A turn that waits for any entry ahead (a permit) watches
/// the queue's children. `watch_all` lists with that watch.
pub(crate) async fn await_turn(
    client: &Client,
    dir: &str,
    child: &str,
    req: &Request<'_>,
    watch_all: bool,
    mut decide: impl FnMut(&[String]) -> Result<Turn, LockError>,
) -> Result<Option<usize>, LockError> {
    // The children ahead as last known, when known without listing.
    let mut known: Option<Vec<String>> = None;
    loop {
        let (mut ahead, changed) = match known.take() {
            Some(ahead) => (ahead, None),
            None => {
                let (listed, watcher) = match watch_all {
                    true => watched_queue(client, dir)
                        .await
                        .map(|(l, w)| (l, Some(w)))?,
                    false => (queue(client, dir).await?, None),
                };
                let Some(at) = listed.iter().position(|c| c == child) else {
                    return Err(LockError::Lost {
                        name: req.name.to_string(),
                        reason: LossReason::TakenOver,
                    });
                };
                let mut ahead = listed;
                ahead.truncate(at);
                (ahead, watcher)
            }
        };
        let at = match decide(&ahead)? {
            Turn::Holds => return Ok(Some(ahead.len())),
            _ if req.expired_at(Instant::now()) => return Ok(None),
            Turn::After(at) => at,
            _ => {
                // Any change of the queue (one ahead that goes, a
                // newcomer) or of the session's state: look again.
                if let Some(changed) = changed {
                    let _ = req.or_deadline(changed.changed()).await;
                }
                continue;
            }
        };
        let node = format!("{dir}/{}", ahead[at]);
        let (stat, watcher) = retrying_resendable(|| client.check_and_watch_stat(&node))
            .await
            .map_err(|e| zk_error("watching the node ahead", e))?;
        if stat.is_some() {
            // The watch fires when the node goes, and on a change of the
            // session's state (then, or at the deadline, list again).
            match req.or_deadline(watcher.changed()).await {
                Some(event) if event.event_type == EventType::NodeDeleted => {}
                _ => continue,
            }
        }
        ahead.remove(at);
        known = Some(ahead);
    }
}

/// Let the client's member catch up with the leader (`sync`). A client
/// that did not make the latest change itself (an operator's `inspect`,
/// `queued` or `force_release`, on a session of its own) could otherwise
/// read a follower's stale tree and miss a grant the leader has already
/// committed; reads after this see at least what the leader had.
pub(crate) async fn catch_up(client: &Client, dir: &str) -> Result<(), LockError> {
    match retrying_resendable(|| client.sync(dir)).await {
        Ok(()) | Err(ZkError::NoNode) => Ok(()),
        Err(e) => Err(zk_error("syncing with the leader", e)),
    }
}

/// [`queue`] as the leader has it: read after [`catch_up`].
pub(crate) async fn synced_queue(client: &Client, dir: &str) -> Result<Vec<String>, LockError> {
    catch_up(client, dir).await?;
    queue(client, dir).await
}

/// Our node in the queue: its path and `czxid`.
pub(crate) struct Enqueued {
    pub path: String,
    pub czxid: i64,
}

/// Join the queue of `dir` with a node of the attempt `id`.
///
/// The lock node (and the root above it) is created as a *container* when
/// missing, so the server removes it once its last child is gone. If a
/// create's reply is lost with the connection, the node may exist all the
/// same: it is looked up by `id` before creating again. If this future
/// fails or is dropped before it returns, any node of `id` is deleted in
/// the background, so that no orphan can block the lock for the rest of the
/// session.
pub(crate) async fn enqueue(
    session: &Arc<Session>,
    dir: &str,
    id: &str,
    data: &[u8],
) -> Result<Enqueued, LockError> {
    let mut sweep = Sweep {
        session: Arc::clone(session),
        dir,
        id,
        armed: true,
    };
    let done = create(session, dir, id, data).await;
    if done.is_ok() {
        sweep.armed = false;
    }
    done
}

async fn create(
    session: &Session,
    dir: &str,
    id: &str,
    data: &[u8],
) -> Result<Enqueued, LockError> {
    let client = &session.client;
    let prefix = attempt_prefix(dir, id);
    let mode = CreateMode::EphemeralSequential.with_acls(session.acls);
    let mut recreated = 0;
    let mut lost = 0;
    loop {
        match client.create(&prefix, data, &mode).await {
            Ok((stat, seq)) => {
                return Ok(Enqueued {
                    path: format!("{prefix}{seq}"),
                    czxid: stat.czxid,
                });
            }
            Err(ZkError::NoNode) if recreated < RECREATE_LIMIT => {
                recreated += 1;
                let parents = CreateMode::Container.with_acls(session.acls);
                match client.mkdir(dir, &parents).await {
                    Ok(()) | Err(ZkError::NodeExists) => {}
                    Err(e) => return Err(zk_error("creating the lock node", e)),
                }
            }
            Err(e) if connection_dropped(&e) && lost < RECREATE_LIMIT => {
                lost += 1;
                // The create may have landed before the connection dropped
                // (or before the client gave up on it): look, then create
                // again only if it did not.
                if let Some(found) = find(client, dir, id).await? {
                    tracing::debug!(target: "distlock", path = %found.path, "found our node after a lost create reply");
                    return Ok(found);
                }
            }
            Err(e) => return Err(zk_error("creating our node", e)),
        }
    }
}

/// The node of attempt `id` in `dir`, if it exists.
async fn find(client: &Client, dir: &str, id: &str) -> Result<Option<Enqueued>, LockError> {
    let Some(child) = queue(client, dir)
        .await?
        .into_iter()
        .find(|c| is_attempt(c, id))
    else {
        return Ok(None);
    };
    let path = format!("{dir}/{child}");
    let stat = retrying_resendable(|| client.check_stat(&path))
        .await
        .map_err(|e| zk_error("reading our node", e))?;
    Ok(stat.map(|stat| Enqueued {
        path,
        czxid: stat.czxid,
    }))
}

/// Deletes the nodes of an attempt that did not finish joining the queue.
struct Sweep<'a> {
    session: Arc<Session>,
    dir: &'a str,
    id: &'a str,
    armed: bool,
}

impl Drop for Sweep<'_> {
    fn drop(&mut self) {
        if !self.armed || self.session.is_terminated() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let session = Arc::clone(&self.session);
        let (dir, id) = (self.dir.to_string(), self.id.to_string());
        rt.spawn(async move {
            // While the session lives, a create sent before we gave up may
            // still land; look once it would have been answered.
            match find(&session.client, &dir, &id).await {
                Ok(Some(orphan)) => {
                    let deleted = retrying(|| session.client.delete(&orphan.path, None)).await;
                    tracing::info!(target: "distlock", path = %orphan.path, ?deleted, "deleted the node of an abandoned acquisition");
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(target: "distlock", error = %e.report(), dir, "could not look for the node of an abandoned acquisition; it ends with the session"),
            }
        });
    }
}
