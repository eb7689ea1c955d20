//! One grant, written once for locks, permits and reader-writer locks: a
//! conditional publish of the holder's message ([`NatsLock::claim`]), then
//! the guard handed out ([`NatsLock::hand_out`]).

use std::sync::Arc;

use lock_core::raw::{Attempt, GuardHandle, OwnerToken, PendingGrant, RawGuard, Unrenewed};
use lock_core::{LockError, LockGuard, LockOptions};
use tokio::time::Instant;

use crate::error::BACKEND;
use crate::handle::{Claim, NatsHandle};
use crate::keys::Subjects;
use crate::lock::{NatsLock, Written, server_ttl};

/// What a grant's publish came to.
pub(crate) enum Claimed {
    /// Stored, at this sequence: the guard is still to be handed out.
    Stored(u64, Stored),
    /// Refused on its condition; nothing of ours was stored. The last
    /// sequence the server found, where it said.
    Refused(Option<u64>),
}

/// A grant's message, stored, until its guard is handed out: dropped
/// (the attempt failed or was cancelled), it is deleted in the background.
pub(crate) struct Stored {
    pending: PendingGrant,
    sent_at: Instant,
}

impl NatsLock {
    /// Publish a new holder's message on `subjects.lock` for `opts`, on
    /// `claim`'s condition. Cancel-safe: until the answer is read, a
    /// dropped publish (or one whose answer was lost) is given back by the
    /// handle (the same publish sent again, then deleted).
    pub(crate) async fn claim(
        &self,
        subjects: Subjects,
        opts: &LockOptions,
        claim: Claim,
        doing: &str,
    ) -> Result<Claimed, LockError> {
        let inner = &self.inner;
        let handle = Arc::new(
            NatsHandle::new(
                Arc::clone(inner),
                subjects,
                OwnerToken::random().to_hex(),
                opts.holder_record(),
                server_ttl(opts.ttl),
            )
            .claiming(claim),
        );
        let pending = PendingGrant::new(Arc::clone(&handle) as Arc<dyn GuardHandle>);
        let record = handle.record();
        let sent_at = Instant::now();
        match inner
            .write(&handle.subjects, &handle.grant(&record), doing)
            .await?
        {
            Written::At(seq) => {
                handle.granted(seq);
                Ok(Claimed::Stored(seq, Stored { pending, sent_at }))
            }
            Written::Found(last) => {
                drop(pending.disarm());
                Ok(Claimed::Refused(last))
            }
            // Only a publish sent again (a give-back) can find its own
            // message id on its way; read as a refusal that names nothing.
            Written::InFlight => {
                drop(pending.disarm());
                Ok(Claimed::Refused(None))
            }
        }
    }

    /// Hand out the grant `stored` as `name`'s guard with fencing `token`,
    /// made what it is by `shape` (a permit's slot, a reader-writer
    /// access), renewed by the watchdog; too late if its lease ran out on
    /// the way.
    pub(crate) async fn hand_out(
        &self,
        name: &str,
        opts: &LockOptions,
        token: u64,
        stored: Stored,
        shape: impl FnOnce(LockGuard) -> LockGuard,
    ) -> Result<Attempt, LockError> {
        let (handle, lease) = match stored
            .pending
            .grant_in_time(BACKEND, name, stored.sent_at, opts)
            .await
        {
            Ok(granted) => granted,
            Err(too_late) => return Ok(Attempt::TooLate(too_late)),
        };
        let guard = shape(LockGuard::new(
            name,
            Some(token),
            self.inner.caps,
            lease,
            handle,
        ));
        Ok(Attempt::Acquired(guard.kept_by(
            &self.watchdog,
            opts,
            Unrenewed::Left,
        )))
    }
}
