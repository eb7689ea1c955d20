//! One subscriber connection per client, shared by all its waiters.
//!
//! Release messages arrive as RESP3 push messages and are turned straight
//! into a wake-up of one local waiter of that lock (no task, no queue). A
//! channel is subscribed while at least one waiter needs it and unsubscribed
//! when the last one leaves. After a reconnect the connection manager
//! resubscribes, and every waiter is woken once to re-check, since messages
//! may have been missed meanwhile.

use std::collections::HashMap;
use std::sync::Arc;

use lock_core::{LockError, Wakeups};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{PushInfo, PushKind, Value};
use tokio::sync::Mutex;

use crate::config::RedisConfig;
use crate::error::{map_redis, within};

pub(crate) struct Subscriber {
    conn: ConnectionManager,
    counts: Mutex<HashMap<String, usize>>,
    config: RedisConfig,
}

/// A waiter's claim on a channel; dropping it releases the claim.
pub(crate) struct Subscription {
    subscriber: Arc<Subscriber>,
    channel: String,
}

impl Subscriber {
    pub(crate) async fn connect(
        client: &redis::Client,
        config: &RedisConfig,
        wakeups: Wakeups,
    ) -> Result<Arc<Self>, LockError> {
        let on_push = move |info: PushInfo| {
            match info.kind {
                PushKind::Message => {
                    if let Some(Value::BulkString(channel)) = info.data.first()
                        && let Ok(channel) = std::str::from_utf8(channel)
                    {
                        wakeups.wake_one(channel);
                    }
                }
                PushKind::Disconnection => wakeups.wake_all(),
                _ => {}
            }
            Ok::<(), std::convert::Infallible>(())
        };
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.response_timeout))
            .set_automatic_resubscription()
            .set_push_sender(on_push);
        let conn = within(
            config,
            "connecting the subscriber",
            client.get_connection_manager_with_config(manager),
        )
        .await?
        .map_err(|e| map_redis("connecting the subscriber", e))?;
        Ok(Arc::new(Subscriber {
            conn,
            counts: Mutex::new(HashMap::new()),
            config: config.clone(),
        }))
    }

    /// Make sure `channel` is subscribed (the SUBSCRIBE has been answered)
    /// before returning, so a release published after this cannot be missed.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        channel: &str,
    ) -> Result<Subscription, LockError> {
        let mut counts = self.counts.lock().await;
        let count = counts.get(channel).copied().unwrap_or(0);
        if count == 0 {
            let mut conn = self.conn.clone();
            within(&self.config, "subscribing", conn.subscribe(channel))
                .await?
                .map_err(|e| map_redis("subscribing", e))?;
        }
        counts.insert(channel.to_string(), count + 1);
        Ok(Subscription {
            subscriber: Arc::clone(self),
            channel: channel.to_string(),
        })
    }

    async fn leave(&self, channel: &str) {
        let mut counts = self.counts.lock().await;
        let Some(count) = counts.get_mut(channel) else {
            return;
        };
        *count -= 1;
        if *count > 0 {
            return;
        }
        counts.remove(channel);
        let mut conn = self.conn.clone();
        match within(&self.config, "unsubscribing", conn.unsubscribe(channel)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "unsubscribe failed; the channel stays subscribed until reconnect")
            }
            Err(e) => tracing::debug!(error = %e, "unsubscribe timed out"),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let subscriber = Arc::clone(&self.subscriber);
        let channel = std::mem::take(&mut self.channel);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { subscriber.leave(&channel).await });
        }
    }
}
