//! NATS semaphores. A permit of semaphore `n` on slot `S` is one message
//! on the subject `$KV.BUCKET.sem.n.S`, written, renewed and released as a
//! lock's message is (its stream sequence the token, its lease the
//! message's TTL), and carrying the limit it was asked with
//! (`Distlock-Limit`).
//!
//! An attempt reads the last message of all the semaphore's subjects
//! (`$KV.BUCKET.sem.n.*`: its sequence, and the limit the permits are held
//! with) and which slots have a message (one stream info request), then
//! publishes on the lowest free slot on the condition that the last
//! sequence of all the semaphore's subjects is still the one read
//! (`Nats-Expected-Last-Subject-Sequence-Subject`, nats-server 2.11). Any
//! permit taken, renewed or given back between the read and the publish
//! refuses it, and the attempt reads again: so no two permits share a
//! slot, and a permit is granted only against the limit every holder
//! asked with. Releases are announced on `distlock.BUCKET.permits.n`;
//! waiters otherwise sleep until the first held permit's TTL ends. No
//! queue: the order among waiters is not promised.

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream::message::StreamMessage;
use futures_util::{StreamExt, TryStreamExt};
use lock_core::raw::{Attempt, HolderRecord, RawGuard, limit_mismatch};
use lock_core::{LockError, LockOptions, PermitInfo, SemaphoreInfo};

use crate::error::BACKEND;
use crate::grant::Claimed;
use crate::handle::Claim;
use crate::keys::{self, PermitSubjects};
use crate::lock::{Inner, NatsLock, header, lease_left, token_of};

/// The largest limit: a full semaphore's attempt reads each held
/// permit's message to learn when the first one ends.
pub(crate) const MAX_LIMIT: u32 = 1024;

/// How many times one attempt reads the semaphore again after its
/// publish found it changed since the read.
const CLAIMS: usize = 4;

/// How many permits' messages are read at once.
const READS_IN_FLIGHT: usize = 32;

/// A semaphore as one attempt read it.
struct Permits {
    /// The last sequence of all its subjects (0: none has a message).
    last: u64,
    /// The limit its permits are held with; `None` when none is held.
    limit: Option<u32>,
    /// The slots that have a message.
    held: BTreeSet<u32>,
}

/// The limit a permit's message carries.
fn limit_of(m: &StreamMessage, name: &str) -> Result<u32, LockError> {
    header(m, keys::LIMIT)
        .and_then(|l| l.parse().ok())
        .ok_or_else(|| LockError::Backend {
            backend: BACKEND,
            reason: format!(
                "semaphore {name:?}: the message at sequence {} carries no readable limit",
                m.sequence
            ),
            source: None,
        })
}

impl Inner {
    /// Read semaphore `name`: its subjects' last message first, then its
    /// slots with a message. A change after the first read moves the
    /// last sequence, so a publish conditioned on it is refused.
    async fn read_permits(
        &self,
        subjects: &PermitSubjects,
        name: &str,
        doing: &str,
    ) -> Result<Permits, LockError> {
        let Some(last) = self.last_on(&subjects.filter, doing).await? else {
            return Ok(Permits {
                last: 0,
                limit: None,
                held: BTreeSet::new(),
            });
        };
        let limit = limit_of(&last, name)?;
        let held = self
            .subjects_with_messages(&subjects.filter, doing)
            .await?
            .iter()
            .filter_map(|s| subjects.slot_of(s))
            .collect();
        Ok(Permits {
            last: last.sequence,
            limit: Some(limit),
            held,
        })
    }

    /// The messages of `slots` that are still there, by slot.
    async fn permit_messages(
        &self,
        subjects: &PermitSubjects,
        slots: impl IntoIterator<Item = u32>,
        doing: &str,
    ) -> Result<Vec<(u32, StreamMessage)>, LockError> {
        let read: Vec<Option<(u32, StreamMessage)>> = futures_util::stream::iter(slots)
            .map(|slot| async move {
                let m = self.last(&subjects.slot(slot), doing).await?;
                Ok::<_, LockError>(m.map(|m| (slot, m)))
            })
            .buffer_unordered(READS_IN_FLIGHT)
            .try_collect()
            .await?;
        Ok(read.into_iter().flatten().collect())
    }
}

impl NatsLock {
    /// One attempt at a permit of `name` among `limit`, without waiting.
    /// Cancel-safe as a lock's attempt is: a publish whose answer never
    /// came is given back by the guard's handle.
    pub(crate) async fn attempt_permit(
        &self,
        name: &str,
        opts: &LockOptions,
        limit: u32,
    ) -> Result<Attempt, LockError> {
        let inner = &self.inner;
        let subjects = PermitSubjects::of(&inner.config().bucket, name);
        let doing = "acquiring a permit";
        for _ in 0..CLAIMS {
            let permits = inner.read_permits(&subjects, name, doing).await?;
            if let Some(held) = permits.limit.filter(|&held| held != limit) {
                return Err(limit_mismatch(name, limit, held));
            }
            let Some(slot) = (0..limit).find(|s| !permits.held.contains(s)) else {
                let messages = inner
                    .permit_messages(&subjects, permits.held, doing)
                    .await?;
                let first_to_end = messages.iter().filter_map(|(_, m)| lease_left(m)).min();
                return Ok(Attempt::Held {
                    // None left: they went since the read; look again soon.
                    expires_in: first_to_end.or(Some(Duration::ZERO)),
                });
            };
            // Every claim of the semaphore names this one filter: a
            // replicated stream's leader lets one conditional publish per
            // filter be in flight, and checks it against what is stored.
            let claim = Claim {
                expected: permits.last,
                filter: Some(subjects.filter.clone()),
                limit: Some(limit),
            };
            match self.claim(subjects.slot(slot), opts, claim, doing).await? {
                Claimed::Stored(seq, stored) => {
                    return self
                        .hand_out(name, opts, seq, stored, |g| g.with_slot(Some(slot)))
                        .await;
                }
                // A permit was taken, renewed or given back since the read:
                // read again.
                Claimed::Refused(_) => {}
            }
        }
        Ok(Attempt::Held { expires_in: None })
    }

    /// The semaphore's slots with a message, then each one's message: its
    /// token, lease left and holder. Waiters are not queued on the
    /// server, so their number is not known.
    pub(crate) async fn inspect_permits(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        let inner = &self.inner;
        let subjects = PermitSubjects::of(&inner.config().bucket, name);
        let doing = "reading a semaphore";
        let slots: Vec<u32> = inner
            .subjects_with_messages(&subjects.filter, doing)
            .await?
            .iter()
            .filter_map(|s| subjects.slot_of(s))
            .collect();
        let messages = inner.permit_messages(&subjects, slots, doing).await?;
        let Some((_, first)) = messages.first() else {
            return Ok(SemaphoreInfo::free());
        };
        let limit = limit_of(first, name)?;
        let permits = messages
            .iter()
            .map(|(slot, m)| {
                let holder = HolderRecord::decode_for(BACKEND, name, &m.payload)?;
                Ok(PermitInfo::new(*slot)
                    .with_fencing_token(Some(token_of(m)))
                    .with_expires_in(lease_left(m))
                    .with_holder(Some(holder)))
            })
            .collect::<Result<Vec<_>, LockError>>()?;
        Ok(SemaphoreInfo::held(limit, permits))
    }
}
