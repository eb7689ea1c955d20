//! The guard's handle on a NATS lock: one acquisition's message, renewed
//! by rewriting it on its sequence, released by deleting it by sequence.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::message::StreamMessage;
use async_trait::async_trait;
use lock_core::LockError;
use lock_core::raw::{DetachedRelease, GuardHandle, HolderRecord};
use tokio::time::Instant;

use crate::keys::Subjects;
use crate::lock::{Inner, Put, Written, owner_of, token_of};

/// How long a release of a grant whose answer never came waits before it
/// looks again for a publish of its own still on its way to the stream.
const IN_FLIGHT_PAUSE: Duration = Duration::from_millis(10);

/// How many times a step that found the lock's message moved under it
/// (a write of ours whose answer was lost) looks again.
const LOOKS: usize = 3;

/// The latest of one acquisition's messages.
#[derive(Clone, Copy)]
struct Revision {
    /// The grant's sequence: the fencing token (0 until granted).
    token: u64,
    /// The sequence of the latest message we wrote for it (0 until
    /// granted).
    seq: u64,
    /// The TTL that message asked the server for.
    ttl: Duration,
}

/// What a grant's publish is conditioned on: kept, so that a give-back
/// sends the very same publish again.
#[derive(Clone, Default)]
pub(crate) struct Claim {
    /// The last sequence expected (0: none).
    pub(crate) expected: u64,
    /// The subjects it is checked against, where not the message's own (a
    /// permit: every slot of its semaphore).
    pub(crate) filter: Option<String>,
    /// The semaphore's limit, on a permit's messages.
    pub(crate) limit: Option<u32>,
}

/// One acquisition's message: released, renewed and rewritten through here.
pub(crate) struct NatsHandle {
    pub(crate) inner: Arc<Inner>,
    pub(crate) subjects: Subjects,
    /// This acquisition's owner token, the `Distlock-Owner` header of its
    /// messages.
    pub(crate) owner: String,
    /// The holder record, the messages' payload.
    record: Mutex<HolderRecord>,
    revision: Mutex<Revision>,
    /// The grant's condition (a lock's: its subject has no message).
    claim: Claim,
    /// One write at a time: a renewal and a new value each rewrite the
    /// message on its latest sequence.
    writing: tokio::sync::Mutex<()>,
}

impl NatsHandle {
    /// The handle of an acquisition of `subjects` by `owner`, whose
    /// messages carry `record` with `ttl`.
    pub(crate) fn new(
        inner: Arc<Inner>,
        subjects: Subjects,
        owner: String,
        record: HolderRecord,
        ttl: Duration,
    ) -> Self {
        NatsHandle {
            inner,
            subjects,
            owner,
            record: Mutex::new(record),
            revision: Mutex::new(Revision {
                token: 0,
                seq: 0,
                ttl,
            }),
            claim: Claim::default(),
            writing: tokio::sync::Mutex::new(()),
        }
    }

    /// The same, granted on `claim` in place of an empty subject.
    pub(crate) fn claiming(mut self, claim: Claim) -> Self {
        self.claim = claim;
        self
    }

    fn revision(&self) -> Revision {
        *self.revision.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The holder record, as the messages carry it.
    pub(crate) fn record(&self) -> HolderRecord {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The TTL the grant asks the server for.
    pub(crate) fn ttl(&self) -> Duration {
        self.revision().ttl
    }

    /// The grant's message, with `record`.
    pub(crate) fn grant<'a>(&'a self, record: &'a HolderRecord) -> Put<'a> {
        Put {
            expected: self.claim.expected,
            filter: self.claim.filter.as_deref(),
            limit: self.claim.limit,
            ttl: self.ttl(),
            owner: &self.owner,
            token: None,
            record: record.as_bytes(),
        }
    }

    /// The grant's message was written at `seq`.
    pub(crate) fn granted(&self, seq: u64) {
        let mut r = self.revision.lock().unwrap_or_else(|e| e.into_inner());
        r.token = seq;
        r.seq = seq;
    }

    /// Rewrite our message with `record` and a server TTL of `ttl`, on the
    /// sequence of our latest: `Ok(true)` if it was still ours (and now
    /// carries both), `Ok(false)` if it is not.
    async fn rewrite(
        &self,
        record: &HolderRecord,
        ttl: Duration,
        doing: &str,
    ) -> Result<bool, LockError> {
        let _one = self.writing.lock().await;
        let mut at = self.revision();
        if at.token == 0 {
            return Ok(false);
        }
        for _ in 0..LOOKS {
            let put = Put {
                expected: at.seq,
                filter: None,
                limit: self.claim.limit,
                ttl,
                owner: &self.owner,
                token: Some(at.token),
                record: record.as_bytes(),
            };
            let written = self.inner.write(&self.subjects, &put, doing).await?;
            match written {
                // Renewals carry no message id; looked at as any other
                // refusal that names no message.
                Written::InFlight => {}
                Written::At(seq) => {
                    let mut r = self.revision.lock().unwrap_or_else(|e| e.into_inner());
                    r.seq = seq;
                    r.ttl = ttl;
                    return Ok(true);
                }
                // None is there: gone (taken away, expired).
                Written::Found(Some(0)) => return Ok(false),
                // Another message is the subject's latest: ours, if a write
                // of ours whose answer was lost put it there.
                Written::Found(last) => {
                    match self.inner.found(&self.subjects, last, doing).await? {
                        Some(m)
                            if owner_of(&m) == Some(self.owner.as_str())
                                && token_of(&m) == at.token =>
                        {
                            at.seq = m.sequence;
                            self.revision.lock().unwrap_or_else(|e| e.into_inner()).seq =
                                m.sequence;
                        }
                        _ => return Ok(false),
                    }
                }
            }
        }
        Ok(false)
    }

    /// Delete whatever message of ours is the subject's latest: the
    /// grant's answer never came (`token` 0), or a renewal's was lost.
    /// `true` if there was one.
    ///
    /// A grant whose answer never came may still be on its way to the
    /// stream when this runs (the server reads and stores by separate
    /// paths), so it is sent again, on the same connection and so behind
    /// it: the stream answers the first one's sequence if it stored it
    /// (the same message id), stores it now if the lock is free (and it
    /// is deleted at once), or refuses it as the first was refused.
    async fn release_unconfirmed(&self, token: u64) -> Result<bool, LockError> {
        let doing = "releasing a lock";
        let record = self.record();
        let patience = Instant::now() + self.inner.config().request_timeout;
        loop {
            let found = if token == 0 {
                match self
                    .inner
                    .write(&self.subjects, &self.grant(&record), doing)
                    .await?
                {
                    Written::At(seq) => Look::Ours(seq),
                    // (A replicated stream's leader refuses a publish
                    // while another to the same subject is on its way to
                    // the stream, without saying which: ours, maybe; the
                    // subject's last is looked at.)
                    Written::Found(last) => {
                        self.look(self.inner.found(&self.subjects, last, doing).await?)
                    }
                    // Ours is on its way: look again once it is in.
                    Written::InFlight => Look::Nothing,
                }
            } else {
                self.look(self.inner.last(&self.subjects, doing).await?)
            };
            match found {
                Look::Ours(seq) => {
                    if self.inner.delete(seq, doing).await? {
                        self.inner.announce_release(&self.subjects.released).await;
                        return Ok(true);
                    }
                }
                // Any later grant of ours would find it there and be
                // refused.
                Look::Another => return Ok(false),
                Look::Nothing if token != 0 || Instant::now() >= patience => return Ok(false),
                Look::Nothing => tokio::time::sleep(IN_FLIGHT_PAUSE).await,
            }
        }
    }

    /// What message `m` (the subject's last, if any) is to us.
    fn look(&self, m: Option<StreamMessage>) -> Look {
        match m {
            Some(m) if owner_of(&m) == Some(self.owner.as_str()) => Look::Ours(m.sequence),
            Some(_) => Look::Another,
            None => Look::Nothing,
        }
    }
}

/// The subject's last message, to a release.
enum Look {
    /// Ours, at this sequence.
    Ours(u64),
    /// Another acquisition's.
    Another,
    /// None, or none yet.
    Nothing,
}

#[async_trait]
impl GuardHandle for NatsHandle {
    async fn release(&self) -> Result<bool, LockError> {
        let _one = self.writing.lock().await;
        let at = self.revision();
        // The message of that sequence is ours: only this acquisition
        // wrote it.
        if at.seq != 0 && self.inner.delete(at.seq, "releasing a lock").await? {
            self.inner.announce_release(&self.subjects.released).await;
            return Ok(true);
        }
        self.release_unconfirmed(at.token).await
    }

    /// The same release, on a client of its own connected again from the
    /// URL (its announcement flushed before it returns, as every
    /// release's is). A lock on the application's own client has none:
    /// its message expires with its TTL.
    fn detached_release(&self) -> Option<DetachedRelease> {
        let reconnect = self.inner.reconnect()?;
        let mut this = NatsHandle {
            inner: Arc::clone(&self.inner),
            subjects: self.subjects.clone(),
            owner: self.owner.clone(),
            record: Mutex::new(self.record()),
            revision: Mutex::new(self.revision()),
            claim: self.claim.clone(),
            writing: tokio::sync::Mutex::new(()),
        };
        Some(Box::pin(async move {
            this.inner = Arc::new(reconnect.await?);
            this.release().await
        }))
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        let record = self.record();
        self.rewrite(&record, crate::lock::server_ttl(ttl), "renewing a lock")
            .await
    }

    /// Rewrites the message with the new record and the lease's TTL (the
    /// server's lease restarts; the guard's validity deadline does not
    /// move).
    async fn set_value(&self, value: &[u8]) -> Result<bool, LockError> {
        let record = self.record().with_value(value);
        let done = self
            .rewrite(&record, self.ttl(), "replacing a holder's value")
            .await?;
        if done {
            *self.record.lock().unwrap_or_else(|e| e.into_inner()) = record;
        }
        Ok(done)
    }
}
