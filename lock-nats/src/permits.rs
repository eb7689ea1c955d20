//! NATS semaphores. A permit of semaphore `n` asked with limit `L`, on
//! slot `S`, is one message on the subject `$KV.BUCKET.sem.n.L.S`,
//! written, renewed and released as a lock's message is (its stream
//! sequence the token, its lease the message's TTL; `Distlock-Limit`
//! carries the limit too).
//!
//! An attempt reads which of the semaphore's subjects hold a message (one
//! stream info request on `…sem.n.*.*`): a permit held with another limit
//! refuses it, naming both; otherwise it publishes on a free slot below
//! its limit (each attempt starting at a random one) on the condition
//! that that slot's subject has no message, so attempts collide only on
//! one slot, never on the whole semaphore. Two clients asking with two
//! limits at once can both publish (under different subjects): each
//! grant is confirmed after it is stored by reading the subjects again,
//! and one that finds a permit of another limit with a lower grant token
//! withdraws (the later of two grants finds the earlier, stored before it
//! was answered), so the permits handed out always share one limit.
//! Waiters mark themselves among the semaphore's subjects
//! (`$KV.BUCKET.sem.n.q.ARRIVAL-ID`, [`crate::queue`]), so the same read
//! shows them: an attempt publishes only while more slots are free than
//! marks ahead of it, and permits go to waiters in the order they came.
//! Releases are announced on `distlock.BUCKET.permits.n`; waiters
//! otherwise sleep until the first held permit's TTL ends.

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream::message::StreamMessage;
use futures_util::{StreamExt, TryStreamExt};
use lock_core::raw::{Attempt, HolderRecord, RawGuard, limit_mismatch};
use lock_core::{LockError, LockOptions, PermitInfo, SemaphoreInfo};

use crate::error::BACKEND;
use crate::grant::Claimed;
use crate::handle::Claim;
use crate::keys::{Mark, PermitSubjects};
use crate::lock::{Inner, NatsLock, lease_left, token_of};
use crate::queue::Place;

/// The largest limit: a full semaphore's attempt reads each held
/// permit's message to learn when the first one ends.
pub(crate) const MAX_LIMIT: u32 = 1024;

/// How many times one attempt reads the semaphore again after its
/// publish found its slot taken since the read.
const CLAIMS: usize = 8;

/// How many permits' messages are read at once.
const READS_IN_FLIGHT: usize = 32;

/// A permit's subject as read: the limit it was asked with, its slot.
#[derive(Clone)]
struct Held {
    limit: u32,
    slot: u32,
    subject: String,
}

/// A number from a fresh random state: where an attempt starts looking
/// for a free slot.
fn random_start() -> usize {
    use std::hash::{BuildHasher, Hasher};
    std::hash::RandomState::new().build_hasher().finish() as usize
}

/// What one read of a semaphore found.
#[derive(Default)]
struct Read {
    /// The permits held.
    held: Vec<Held>,
    /// The waiters' marks.
    marks: Vec<Mark>,
}

impl Inner {
    /// The permits and the waiters' marks of the semaphore of `subjects`:
    /// one stream info request.
    async fn read_semaphore(
        &self,
        subjects: &PermitSubjects,
        doing: &str,
    ) -> Result<Read, LockError> {
        let mut read = Read::default();
        for subject in self.subjects_with_messages(&subjects.filter, doing).await? {
            if let Some((limit, slot)) = subjects.slot_of(&subject) {
                read.held.push(Held {
                    limit,
                    slot,
                    subject,
                });
            } else if let Some(mark) = subjects.mark_of(&subject) {
                read.marks.push(mark);
            }
        }
        Ok(read)
    }

    /// The messages of the permits `held` that are still there.
    async fn permit_messages(
        &self,
        held: Vec<Held>,
        doing: &str,
    ) -> Result<Vec<(Held, StreamMessage)>, LockError> {
        let read: Vec<Option<(Held, StreamMessage)>> = futures_util::stream::iter(held)
            .map(|h| async move {
                let m = self.last_on(&h.subject, doing).await?;
                Ok::<_, LockError>(m.map(|m| (h, m)))
            })
            .buffer_unordered(READS_IN_FLIGHT)
            .try_collect()
            .await?;
        Ok(read.into_iter().flatten().collect())
    }

    /// The limit of a permit of another limit than `limit` granted before
    /// sequence `seq`, if one is there.
    async fn other_limit_before(
        &self,
        subjects: &PermitSubjects,
        limit: u32,
        seq: u64,
        doing: &str,
    ) -> Result<Option<u32>, LockError> {
        let mut others = self.read_semaphore(subjects, doing).await?.held;
        others.retain(|h| h.limit != limit);
        Ok(self
            .permit_messages(others, doing)
            .await?
            .into_iter()
            .find(|(_, m)| token_of(m) < seq)
            .map(|(h, _)| h.limit))
    }
}

impl NatsLock {
    /// One attempt at a permit of `name` among `limit` from `place` among
    /// the waiters, without waiting, and whether another slot was free
    /// when it was granted. Cancel-safe as a lock's attempt is: a publish
    /// whose answer never came is given back by the guard's handle.
    pub(crate) async fn attempt_permit(
        &self,
        name: &str,
        opts: &LockOptions,
        limit: u32,
        place: Place<'_>,
    ) -> Result<(Attempt, bool), LockError> {
        let inner = &self.inner;
        let subjects = PermitSubjects::of(&inner.config().bucket, name);
        let doing = "acquiring a permit";
        for _ in 0..CLAIMS {
            let Read { held, marks } = inner.read_semaphore(&subjects, doing).await?;
            if let Some(other) = held.iter().find(|h| h.limit != limit) {
                return Err(limit_mismatch(name, limit, other.limit));
            }
            let taken: BTreeSet<u32> = held.iter().map(|h| h.slot).collect();
            let free: Vec<u32> = (0..limit).filter(|s| !taken.contains(s)).collect();
            if free.is_empty() {
                let messages = inner.permit_messages(held, doing).await?;
                let first_to_end = messages.iter().filter_map(|(_, m)| lease_left(m)).min();
                let held = Attempt::Held {
                    // None left: they went since the read; look again soon.
                    expires_in: first_to_end.or(Some(Duration::ZERO)),
                };
                return Ok((held, false));
            }
            // The first waiters take the free slots.
            if marks.iter().filter(|m| place.behind(m)).count() >= free.len() {
                return Ok((Attempt::Held { expires_in: None }, false));
            }
            let slot = free[random_start() % free.len()];
            let claim = Claim {
                expected: 0,
                filter: None,
                limit: Some(limit),
            };
            match self
                .claim(subjects.slot(limit, slot), opts, claim, doing)
                .await?
            {
                Claimed::Stored(seq, stored) => {
                    // A permit of another limit granted before ours: ours
                    // is given back as it drops.
                    if let Some(held) = inner
                        .other_limit_before(&subjects, limit, seq, doing)
                        .await?
                    {
                        return Err(limit_mismatch(name, limit, held));
                    }
                    let granted = self
                        .hand_out(name, opts, seq, stored, |g| g.with_slot(Some(slot)))
                        .await?;
                    return Ok((granted, free.len() > 1));
                }
                // Another permit took the slot since the read: read again.
                Claimed::Refused(_) => {}
            }
        }
        Ok((Attempt::Held { expires_in: None }, false))
    }

    /// The semaphore's permits, then each one's message: its token, lease
    /// left and holder; the marks are the waiters.
    pub(crate) async fn inspect_permits(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        let inner = &self.inner;
        let subjects = PermitSubjects::of(&inner.config().bucket, name);
        let doing = "reading a semaphore";
        let Read { held, marks } = inner.read_semaphore(&subjects, doing).await?;
        let messages = inner.permit_messages(held, doing).await?;
        let Some((first, _)) = messages.first() else {
            return Ok(SemaphoreInfo::free().with_waiters(Some(marks.len())));
        };
        let limit = first.limit;
        let permits = messages
            .iter()
            .map(|(h, m)| {
                let holder = HolderRecord::decode_for(BACKEND, name, &m.payload)?;
                Ok(PermitInfo::new(h.slot)
                    .with_fencing_token(Some(token_of(m)))
                    .with_expires_in(lease_left(m))
                    .with_holder(Some(holder)))
            })
            .collect::<Result<Vec<_>, LockError>>()?;
        Ok(SemaphoreInfo::held(limit, permits).with_waiters(Some(marks.len())))
    }
}
