//! One subscriber connection per client, shared by all its waiters.
//!
//! Release messages arrive as RESP3 push messages carrying the id of the
//! waiter the lock was handed to; they are turned straight into a wake-up of
//! that waiter, if it is one of ours (no task, no queue).
//!
//! A channel is subscribed while a waiter needs it and lingers for
//! [`LINGER`] after the last one leaves, so a busy lock does not pay a
//! SUBSCRIBE and an UNSUBSCRIBE per wait. After a reconnect the connection
//! manager resubscribes, and every waiter is woken once to re-check, since
//! messages may have been missed meanwhile.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lock_core::LockError;
use lock_core::raw::Wakeups;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{PushInfo, PushKind, Value};

use crate::config::RedisConfig;
use crate::error::{map_redis, within};

/// How long a channel stays subscribed after its last waiter left.
const LINGER: Duration = Duration::from_secs(5);

/// The shared subscriber connection of one client to one Redis server.
pub struct Subscriber {
    conn: ConnectionManager,
    /// Waiters per channel, and whether the SUBSCRIBE has been answered.
    channels: Mutex<HashMap<String, Channel>>,
    /// Serialises SUBSCRIBE and UNSUBSCRIBE so that they reach the server in
    /// the order the channel table decided them.
    io: tokio::sync::Mutex<()>,
    config: RedisConfig,
}

#[derive(Default)]
struct Channel {
    users: usize,
    subscribed: bool,
    /// Bumped whenever the channel is taken into use; a linger timer only
    /// unsubscribes if nothing used the channel since it was started.
    generation: u64,
}

/// A waiter's claim on a channel; dropping it releases the claim.
pub struct Subscription {
    subscriber: Arc<Subscriber>,
    channel: String,
}

impl Subscriber {
    /// Connect the subscriber. A message (a waiter id) wakes that waiter
    /// ([`Wakeups::wake_one`]); a reconnect wakes everyone.
    pub async fn connect(
        client: &redis::Client,
        config: &RedisConfig,
        wakeups: Wakeups,
    ) -> Result<Arc<Self>, LockError> {
        let on_push = move |info: PushInfo| {
            match info.kind {
                PushKind::Message => {
                    if let Some(Value::BulkString(waiter)) = info.data.get(1)
                        && let Ok(waiter) = std::str::from_utf8(waiter)
                    {
                        wakeups.wake_one(waiter);
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
            channels: Mutex::new(HashMap::new()),
            io: tokio::sync::Mutex::new(()),
            config: config.clone(),
        }))
    }

    fn channels(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn claim(self: &Arc<Self>, channel: &str) -> (Subscription, bool) {
        let mut channels = self.channels();
        let entry = channels.entry(channel.to_string()).or_default();
        entry.users += 1;
        entry.generation += 1;
        let subscribed = entry.subscribed;
        let claim = Subscription {
            subscriber: Arc::clone(self),
            channel: channel.to_string(),
        };
        (claim, subscribed)
    }

    /// A claim on `channel` if it is subscribed already (no round trip).
    pub fn join_subscribed(self: &Arc<Self>, channel: &str) -> Option<Subscription> {
        match self.claim(channel) {
            (claim, true) => Some(claim),
            (claim, false) => {
                drop(claim);
                None
            }
        }
    }

    /// A claim on `channel`, subscribing first if needed: when this returns,
    /// a message published from now on reaches us.
    pub async fn subscribe(self: &Arc<Self>, channel: &str) -> Result<Subscription, LockError> {
        let (claim, subscribed) = self.claim(channel);
        if subscribed {
            return Ok(claim);
        }
        let _io = self.io.lock().await;
        if self.channels().get(channel).is_some_and(|c| c.subscribed) {
            return Ok(claim);
        }
        let mut conn = self.conn.clone();
        within(&self.config, "subscribing", conn.subscribe(channel))
            .await?
            .map_err(|e| map_redis("subscribing", e))?;
        if let Some(c) = self.channels().get_mut(channel) {
            c.subscribed = true;
        }
        Ok(claim)
    }

    fn leave(self: &Arc<Self>, channel: &str) {
        let generation = {
            let mut channels = self.channels();
            let Some(c) = channels.get_mut(channel) else {
                return;
            };
            c.users -= 1;
            if c.users > 0 {
                return;
            }
            c.generation
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (this, channel) = (Arc::clone(self), channel.to_string());
        rt.spawn(async move {
            tokio::time::sleep(LINGER).await;
            let _io = this.io.lock().await;
            {
                let mut channels = this.channels();
                match channels.get(&channel) {
                    Some(c) if c.users == 0 && c.generation == generation => {
                        // Forget it before unsubscribing: a waiter arriving
                        // now subscribes afresh, after this UNSUBSCRIBE.
                        let was_subscribed = c.subscribed;
                        channels.remove(&channel);
                        if !was_subscribed {
                            return;
                        }
                    }
                    _ => return,
                }
            }
            let mut conn = this.conn.clone();
            if !matches!(
                within(&this.config, "unsubscribing", conn.unsubscribe(&channel)).await,
                Ok(Ok(()))
            ) {
                tracing::debug!(target: "distlock", "unsubscribe failed; the channel stays subscribed until reconnect");
            }
        });
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.subscriber.leave(&self.channel);
    }
}
