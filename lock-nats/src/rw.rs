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
//!   which of them hold a message; with no reader, no writer and no reader
//!   that arrived before it waiting there, it
//!   publishes `x.w` on the condition that that last sequence is still the
//!   one read (`Nats-Expected-Last-Subject-Sequence-Subject`). Its
//!   sequence is the write's token, which it then writes to `x.t` on the
//!   condition that `x.w`'s last message is still its own, before the
//!   guard is handed out: a writer that never got that far never wrote
//!   under its token, so readers carrying the token before it are right.
//! - A **reader** does the same: granted when no writer holds and no
//!   writer that arrived before it waits, on the same condition; it
//!   carries the token of `x.t`. One condition over every subject of the
//!   lock, for writers and readers alike, because a replicated stream's
//!   leader serialises the conditional publishes of one filter only:
//!   readers' grants and renewals refuse each other's grants too, and a
//!   refused reader reads again (up to [`CLAIMS`] times in one attempt).
//! - A waiter **marks** itself with its arrival (this client's clock) and
//!   renews the mark every [`MARK_RENEWAL`]; a mark lapses [`MARK`] after
//!   its last renewal and is removed when the wait ends, so readers that
//!   come after a waiting writer wait behind it (writer preference), and
//!   readers that queued before a writer keep their place. Skew between
//!   clients shifts who counts as first, never exclusion.
//!
//! Releases, and marks removed by a wait that gave up, are announced on
//! `distlock.BUCKET.rw.n`; waiters also look again when the writer's
//! lease ends. No queue: writers among themselves, and readers behind the
//! same writer, are served in no promised order.

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::message::StreamMessage;
use bytes::Bytes;
use futures_util::StreamExt;
use lock_core::raw::{
    Arrival, Attempt, HolderRecord, MARK_RENEWAL, MARK_TTL, OwnerToken, Pace, RawGuard, Request,
    WaitLoop, WaitMark,
};
use lock_core::{Access, LockError, LockGuard, LockOptions, RwHolderInfo, RwLockInfo};
use tokio::time::Instant;

use crate::error::BACKEND;
use crate::grant::Claimed;
use crate::handle::Claim;
use crate::keys::{self, RwSubject, RwSubjects};
use crate::lock::{Inner, NatsLock, Written, header, lease_left, token_of, ttl_header};

/// How long a waiter's mark lasts unless renewed: the marks'
/// lifetime in whole seconds, as the server's TTLs are.
const MARK: Duration = Duration::from_secs(MARK_TTL.as_millis().div_ceil(1000) as u64);

/// How long a waiter pauses when what blocks it has no lease it can read
/// (readers, a waiting writer); a release wakes it sooner.
const BACKSTOP: Duration = Duration::from_millis(500);

/// How many times one attempt reads the lock again after its publish
/// found it changed since the read: readers' grants and renewals change
/// it too, so a reader among many may need several.
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
    /// Waiting writers that arrived before this acquisition (or with it).
    earlier_marks: usize,
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

/// A waiter's mark, removed (its subject's message deleted, the waiters
/// behind it told) when the wait ends, whenever it ends.
fn wait_mark(
    inner: &Arc<Inner>,
    subjects: &RwSubjects,
    access: Access,
    arrival: Arrival,
) -> WaitMark {
    let (inner, subjects) = (Arc::clone(inner), subjects.clone());
    WaitMark::new(
        access,
        arrival,
        Arc::new(move |id| {
            let (inner, subject, released) = (
                Arc::clone(&inner),
                subjects.mark(arrival.millis(), &id),
                subjects.released.clone(),
            );
            Box::pin(async move {
                let doing = "removing a waiter's mark";
                if let Some(m) = inner.last_on(&subject, doing).await? {
                    inner.delete(m.sequence, doing).await?;
                    inner.announce_release(&released).await;
                }
                Ok(())
            })
        }),
    )
}

/// Publish `mark` (on `subject`) again with a fresh TTL. A failure leaves
/// the wait without its place until the next renewal; the wait's attempts
/// report the server's trouble.
async fn renew_mark(inner: &Inner, mark: &WaitMark, subject: &str) {
    let mut headers = HeaderMap::new();
    headers.insert(
        async_nats::header::NATS_MESSAGE_TTL,
        ttl_header(MARK).as_str(),
    );
    mark.placing();
    let written = inner
        .publish(
            subject.to_string(),
            headers,
            Bytes::new(),
            "marking a waiter",
        )
        .await;
    if let Err(e) = written {
        tracing::debug!(target: "distlock", backend = BACKEND, error = %e.report(), "a waiter's mark could not be renewed");
    }
}

impl NatsLock {
    /// One attempt at `access` to `name` by an acquisition that arrived at
    /// `arrival`, without waiting. Cancel-safe as a lock's attempt is.
    pub(crate) async fn attempt_rw(
        &self,
        name: &str,
        opts: &LockOptions,
        access: Access,
        arrival: u64,
    ) -> Result<Attempt, LockError> {
        let inner = &self.inner;
        let subjects = RwSubjects::of(&inner.config().bucket, name);
        let write = access == Access::Write;
        // Every grant is conditioned on all of the lock's subjects, by one
        // filter: a replicated stream's leader lets one conditional publish
        // of a filter be in flight at a time, and checks it against what
        // is stored, not against other filters' publishes still on their
        // way (a writer's and a reader's under two filters could both
        // pass).
        let filter = &subjects.all;
        let doing = "acquiring a reader-writer lock";
        for _ in 0..CLAIMS {
            let last = inner.last_on(filter, doing).await?;
            let mut seen = Seen::default();
            if last.is_some() {
                for subject in inner.subjects_with_messages(filter, doing).await? {
                    match subjects.kind_of(&subject) {
                        Some(RwSubject::Writer) => seen.writer = true,
                        Some(RwSubject::Reader) => seen.readers += 1,
                        // A writer that arrived at the same moment goes
                        // first, as on every backend.
                        Some(RwSubject::Mark { arrival: a, reader }) => match reader {
                            true if a < arrival => seen.earlier_readers += 1,
                            false if a <= arrival => seen.earlier_marks += 1,
                            _ => {}
                        },
                        _ => {}
                    }
                }
            }
            let blocked = match write {
                true => seen.writer || seen.readers > 0 || seen.earlier_readers > 0,
                false => seen.writer || seen.earlier_marks > 0,
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
            // A reader carries the latest write's token, read under the
            // same condition as its grant.
            let read_token = match (write, &last) {
                (true, _) => None,
                (false, Some(m)) if m.subject.as_str() == subjects.token => {
                    Some(recorded_token(m, name)?)
                }
                (false, _) => Some(inner.write_token(&subjects, name).await?),
            };
            let claim = Claim {
                expected: last.as_ref().map_or(0, |m| m.sequence),
                filter: Some(filter.clone()),
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
            let token = match read_token {
                Some(token) => token,
                // Gone before its token was recorded (expired, taken away):
                // not granted; the stored grant is given back as it drops.
                None if !inner.record_write_token(&subjects, seq).await? => {
                    return Ok(Attempt::Held { expires_in: None });
                }
                None => seq,
            };
            return self
                .hand_out(name, opts, token, stored, |g| g.with_access(Some(access)))
                .await;
        }
        Ok(Attempt::Held { expires_in: None })
    }

    /// Wait for `access`: listening for the lock's releases (subscribed
    /// before the first attempt), else until the writer's lease ends or a
    /// [`BACKSTOP`]; the waiter marks itself while it waits.
    pub(crate) async fn wait_for_rw(
        &self,
        req: Request<'_>,
        access: Access,
    ) -> Result<Option<LockGuard>, LockError> {
        let (name, opts) = (req.name, req.opts);
        let inner = &self.inner;
        let subjects = RwSubjects::of(&inner.config().bucket, name);
        let mut released = inner.listen(subjects.released.clone()).await?;
        let arrival = Arrival::now();
        let mark = wait_mark(inner, &subjects, access, arrival);
        let mark_subject = subjects.mark(arrival.millis(), mark.id());
        let mut listening = true;
        let mut wait = WaitLoop::new(req, None);
        let mut marked_at: Option<Instant> = None;
        loop {
            let mut too_late = None;
            let pace = match self
                .attempt_rw(name, opts, access, arrival.millis())
                .await?
            {
                Attempt::Acquired(guard) => {
                    if let Err(e) = mark.remove().await {
                        tracing::debug!(target: "distlock", backend = BACKEND, error = %e.report(), "a granted waiter's mark could not be removed; it lapses by itself");
                    }
                    return Ok(Some(guard));
                }
                Attempt::Held { expires_in } => {
                    if marked_at.is_none_or(|at| at.elapsed() >= MARK_RENEWAL) {
                        renew_mark(inner, &mark, &mark_subject).await;
                        marked_at = Some(Instant::now());
                    }
                    let until = Instant::now() + expires_in.unwrap_or(BACKSTOP).min(MARK_RENEWAL);
                    Pace::Until(until)
                }
                Attempt::TooLate(e) => {
                    too_late = Some(e);
                    Pace::For(Duration::ZERO)
                }
            };
            tokio::select! {
                go_on = wait.pause(pace) => {
                    if !go_on {
                        if let Err(e) = mark.remove().await {
                            tracing::debug!(target: "distlock", backend = BACKEND, error = %e.report(), "a waiter's mark could not be removed; it lapses by itself");
                        }
                        return too_late.map_or(Ok(None), Err);
                    }
                }
                message = released.next(), if listening => {
                    listening = message.is_some();
                }
            }
        }
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
                Some(RwSubject::Mark { reader, .. }) => {
                    match reader {
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
