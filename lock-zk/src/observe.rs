//! Notifications for an election's observers: ZooKeeper watches on a
//! lock's queue (its children: a grant, a release, a waiter coming or
//! going) and on the first node's data (the holder record a `set_value`
//! rewrites), armed again after each firing, before the consumer reads.

use std::sync::Arc;

use lock_core::{Changes, LockError};
use zookeeper_client::{Client, Error as ZkError, OneshotWatcher};

use crate::error::zk_error;
use crate::lock::BACKEND;
use crate::path::sequence;
use crate::session::{Session, retrying_resendable};

const DOING: &str = "watching a lock for observers";

/// How often [`arm`] looks again when the queue changes under it.
const ATTEMPTS: usize = 5;

/// The watches of one round.
struct Armed {
    /// The queue's children; or, while the lock node does not exist, its
    /// creation.
    queue: OneshotWatcher,
    /// The first node's data, if there is a first node.
    first: Option<OneshotWatcher>,
}

impl Armed {
    /// Resolves when either watch fires.
    async fn fired(self) {
        let Armed { queue, first } = self;
        match first {
            Some(first) => {
                tokio::select! {
                    _ = queue.changed() => {}
                    _ = first.changed() => {}
                }
            }
            None => {
                queue.changed().await;
            }
        }
    }
}

/// Set the watches on lock node `dir`.
async fn arm(client: &Client, dir: &str) -> Result<Armed, LockError> {
    for _ in 0..ATTEMPTS {
        let (children, queue) =
            match retrying_resendable(|| client.list_and_watch_children(dir)).await {
                Ok(listed) => listed,
                Err(ZkError::NoNode) => {
                    let (stat, created) = retrying_resendable(|| client.check_and_watch_stat(dir))
                        .await
                        .map_err(|e| zk_error(DOING, e))?;
                    if stat.is_none() {
                        return Ok(Armed {
                            queue: created,
                            first: None,
                        });
                    }
                    // Made between the two requests: list it.
                    continue;
                }
                Err(e) => return Err(zk_error(DOING, e)),
            };
        let Some(first) = children
            .iter()
            .filter_map(|c| sequence(c).map(|s| (s, c)))
            .min()
            .map(|(_, c)| format!("{dir}/{c}"))
        else {
            return Ok(Armed { queue, first: None });
        };
        match retrying_resendable(|| client.get_and_watch_data(&first)).await {
            Ok((_, _, data)) => {
                return Ok(Armed {
                    queue,
                    first: Some(data),
                });
            }
            // Gone between the listing and the read: the queue's watch has
            // fired already; list again.
            Err(ZkError::NoNode) => continue,
            Err(e) => return Err(zk_error(DOING, e)),
        }
    }
    Err(LockError::unavailable(
        BACKEND,
        DOING,
        format!("the queue of {dir} kept changing while its watches were set"),
    ))
}

/// The notifications of lock node `dir`, on `session` (the stream ends
/// with an error when the session does; the caller subscribes again on a
/// new one).
pub(crate) async fn changes(session: Arc<Session>, dir: String) -> Result<Changes, LockError> {
    let armed = arm(&session.client, &dir).await?;
    Ok(Box::pin(futures_util::stream::unfold(
        Some((session, dir, armed)),
        |state| async move {
            let (session, dir, armed) = state?;
            armed.fired().await;
            // Armed again before the consumer reads, so that no change
            // falls between its read and the next watch.
            match arm(&session.client, &dir).await {
                Ok(armed) => Some((Ok(()), Some((session, dir, armed)))),
                Err(e) => Some((Err(e), None)),
            }
        },
    )))
}
