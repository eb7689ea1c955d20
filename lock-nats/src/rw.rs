//! NATS reader-writer locks. Lock `n` lives on the subjects
//! `$KV.BUCKET.rw.n.…` ([`RwSubjects`]): each reader's grant is a message
//! on `r.OWNER`, the writer's on `x.w`, each with its lease as the
//! message's TTL and written, renewed and released as a lock's message is.
//! The writers' side `x.>` also holds the waiters' marks
//! (`x.q.ARRIVAL-ID`, a reader's id starting with `r`, with a short TTL
//! their waits renew) and the latest write's token (`x.t`, a message
//! without a TTL).
//!
//! - A **writer** reads the last sequence of all the lock's subjects and
//!   which of them hold a message; with no reader, no writer and no waiter
//!   that arrived before it there, it publishes `x.w` on the
//!   condition that that last sequence is still the one read
//!   (`Nats-Expected-Last-Subject-Sequence-Subject`): writers exclude each
//!   other by that one filter, which a replicated stream's leader
//!   serialises. Its sequence is the write's token, which it writes to
//!   `x.t` on the condition that `x.w`'s last message is still its own,
//!   before the guard is handed out: a writer that never got that far
//!   never wrote under its token, so readers carrying the token before it
//!   are right.
//! - A **reader** reads which subjects hold a message and, when no writer
//!   holds and no writer that arrived before it waits, publishes its own
//!   `r.OWNER` on that subject's condition alone: readers never refuse
//!   each other's grants or renewals.
//! - **Confirmed after the grant**: a replicated stream's leader checks a
//!   conditional publish against what is stored, not against publishes of
//!   other subjects still on their way, so a reader's and a writer's grant
//!   can both pass. Each then reads the other side (a writer every
//!   reader's message, a reader the writer's): of the two, the later grant
//!   was answered after the earlier was stored, finds it, and withdraws
//!   if the other's grant token (a renewed message carries it) is lower.
//!   A reader reads the latest write's token there too, after its grant,
//!   so it carries every write handed out before it.
//! - A waiter **marks** itself ([`crate::queue`]), so readers that come
//!   after a waiting writer wait behind it (writer preference), readers
//!   that queued before a writer keep their place, and writers are served
//!   in the order they came.
//!
//! Releases, and marks removed, are announced on `distlock.BUCKET.rw.n`;
//! waiters also look again when the writer's lease ends.

use async_nats::HeaderMap;
use async_nats::jetstream::message::StreamMessage;
use bytes::Bytes;
use lock_core::raw::{Attempt, HolderRecord, OwnerToken, RawGuard};
use lock_core::{Access, LockError, LockOptions, RwHolderInfo, RwLockInfo};

use crate::error::BACKEND;
use crate::grant::Claimed;
use crate::handle::Claim;
use crate::keys::{self, RwSubject, RwSubjects};
use crate::lock::{Inner, NatsLock, Written, header, lease_left, token_of};
use crate::queue::Place;

/// How many times one attempt reads the lock again after its publish
/// found it changed since the read: readers' grants and renewals change
/// it too, so a writer among many readers may need several.
const CLAIMS: usize = 16;

/// The write token the `x.t` message `m` records.
fn recorded_token(m: &StreamMessage, name: &str) -> Result<u64, LockError> {
    header(m, keys::TOKEN)
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| LockError::Backend {
            backend: BACKEND,
            reason: format!(
                "reader-writer lock {name:?}: the token record at sequence {} is unreadable",
                m.sequence
            ),
            source: None,
        })
}

/// What one attempt read of the lock.
#[derive(Default)]
struct Seen {
    writer: bool,
    readers: usize,
    /// Waiting writers that arrived before this acquisition.
    earlier_writers: usize,
    /// Waiting readers that arrived before this acquisition.
    earlier_readers: usize,
}

impl Inner {
    /// The latest write's token: 0 before the first write.
    async fn write_token(&self, subjects: &RwSubjects, name: &str) -> Result<u64, LockError> {
        match self
            .last_on(&subjects.token, "reading a write's token")
            .await?
        {
            Some(m) => recorded_token(&m, name),
            None => Ok(0),
        }
    }

    /// Whether a reader of the lock was granted before sequence `seq`
    /// (its message's grant token is lower): a writer granted at `seq`
    /// must then withdraw.
    async fn read_before(&self, subjects: &RwSubjects, seq: u64) -> Result<bool, LockError> {
        let doing = "confirming a write";
        for subject in self
            .subjects_with_messages(&subjects.readers, doing)
            .await?
        {
            if let Some(m) = self.last_on(&subject, doing).await?
                && token_of(&m) < seq
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Record `token` as the latest write's, if the writer's message is
    /// still the grant of that token (`x.w`'s last sequence): `false` if
    /// it is not.
    async fn record_write_token(
        &self,
        subjects: &RwSubjects,
        token: u64,
    ) -> Result<bool, LockError> {
        let mut headers = HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            token.to_string().as_str(),
        );
        headers.insert(keys::EXPECTED_SUBJECTS, subjects.writer.as_str());
        headers.insert(keys::TOKEN, token.to_string().as_str());
        let written = self
            .publish(
                subjects.token.clone(),
                headers,
                Bytes::new(),
                "recording a write's token",
            )
            .await?;
        Ok(matches!(written, Written::At(_)))
    }
}

impl NatsLock {
    /// One attempt at `access` to `name` from `place` among the waiters,
    /// without waiting. Cancel-safe as a lock's attempt is.
    pub(crate) async fn attempt_rw(
        &self,
        name: &str,
        opts: &LockOptions,
        access: Access,
        place: Place<'_>,
    ) -> Result<Attempt, LockError> {
        let inner = &self.inner;
        let subjects = RwSubjects::of(&inner.config().bucket, name);
        let write = access == Access::Write;
        let filter = &subjects.all;
        let doing = "acquiring a reader-writer lock";
        for _ in 0..CLAIMS {
            // A writer's grant is conditioned on the last sequence of all
            // the lock's subjects; a reader's only on its own subject.
            let last = match write {
                true => inner.last_on(filter, doing).await?,
                false => None,
            };
            let mut seen = Seen::default();
            if last.is_some() || !write {
                for subject in inner.subjects_with_messages(filter, doing).await? {
                    match subjects.kind_of(&subject) {
                        Some(RwSubject::Writer) => seen.writer = true,
                        Some(RwSubject::Reader) => seen.readers += 1,
                        // Marks order by arrival, then id: a writer that
                        // arrived at the same moment goes first, as on
                        // every backend.
                        Some(RwSubject::Mark(mark)) if place.behind(&mark) => match mark.reader() {
                            true => seen.earlier_readers += 1,
                            false => seen.earlier_writers += 1,
                        },
                        _ => {}
                    }
                }
            }
            // Every waiter ahead keeps a writer out; a waiting writer
            // ahead keeps a reader out.
            let blocked = match write {
                true => {
                    seen.writer
                        || seen.readers > 0
                        || seen.earlier_readers > 0
                        || seen.earlier_writers > 0
                }
                false => seen.writer || seen.earlier_writers > 0,
            };
            if blocked {
                let expires_in = match seen.writer {
                    true => inner
                        .last_on(&subjects.writer, doing)
                        .await?
                        .and_then(|m| lease_left(&m)),
                    false => None,
                };
                return Ok(Attempt::Held { expires_in });
            }
            let claim = Claim {
                expected: last.as_ref().map_or(0, |m| m.sequence),
                filter: write.then(|| filter.clone()),
                limit: None,
            };
            let owner = OwnerToken::random().to_hex();
            let (seq, stored) = match self
                .claim(subjects.holder(write, &owner), opts, claim, doing)
                .await?
            {
                Claimed::Stored(seq, stored) => (seq, stored),
                // The lock changed since the read: read again.
                Claimed::Refused(_) => continue,
            };
            // Confirmed against the other side: of a reader and a writer
            // granted at once, the later grant finds the earlier one (its
            // message was stored before the later's answer) and withdraws;
            // the stored grant is given back as it drops.
            let token = match write {
                true => {
                    if inner.read_before(&subjects, seq).await? {
                        return Ok(Attempt::Held { expires_in: None });
                    }
                    // Gone before its token was recorded (expired, taken
                    // away): not granted.
                    if !inner.record_write_token(&subjects, seq).await? {
                        return Ok(Attempt::Held { expires_in: None });
                    }
                    seq
                }
                false => {
                    // The latest write's token, read after the grant: a
                    // write handed out before it recorded its token first.
                    let (writer, token) = tokio::try_join!(
                        inner.last_on(&subjects.writer, doing),
                        inner.write_token(&subjects, name)
                    )?;
                    if let Some(w) = writer.filter(|w| token_of(w) < seq) {
                        return Ok(Attempt::Held {
                            expires_in: lease_left(&w),
                        });
                    }
                    token
                }
            };
            return self
                .hand_out(name, opts, token, stored, |g| g.with_access(Some(access)))
                .await;
        }
        Ok(Attempt::Held { expires_in: None })
    }

    /// The lock's subjects with a message, then the writer's and each
    /// reader's message (token, lease left, holder) and the latest
    /// write's token; the marks are the waiters.
    pub(crate) async fn inspect_rw_lock(&self, name: &str) -> Result<RwLockInfo, LockError> {
        let inner = &self.inner;
        let subjects = RwSubjects::of(&inner.config().bucket, name);
        let doing = "reading a reader-writer lock";
        let listed = inner.subjects_with_messages(&subjects.all, doing).await?;
        let token = inner.write_token(&subjects, name).await?;
        let mut holders = Vec::new();
        let (mut marks, mut readers_waiting) = (0, 0);
        for subject in listed {
            let access = match subjects.kind_of(&subject) {
                Some(RwSubject::Writer) => Access::Write,
                Some(RwSubject::Reader) => Access::Read,
                Some(RwSubject::Mark(mark)) => {
                    match mark.reader() {
                        true => readers_waiting += 1,
                        false => marks += 1,
                    }
                    continue;
                }
                _ => continue,
            };
            let Some(m) = inner.last_on(&subject, doing).await? else {
                continue;
            };
            let holder = HolderRecord::decode_for(BACKEND, name, &m.payload)?;
            holders.push(
                RwHolderInfo::new(access)
                    .with_fencing_token(Some(match access {
                        Access::Write => token_of(&m),
                        _ => token,
                    }))
                    .with_expires_in(lease_left(&m))
                    .with_holder(Some(holder)),
            );
        }
        Ok(RwLockInfo::held(holders)
            .with_fencing_token(Some(token))
            .with_waiting(Some(marks), Some(readers_waiting)))
    }
}
