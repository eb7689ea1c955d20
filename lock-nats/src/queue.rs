//! Waiters in arrival order without a queue on the server: a waiter for a
//! semaphore's permit or a reader-writer lock marks itself with its
//! arrival (a message with a short TTL, `…ARRIVAL-ID`, under the
//! subjects its attempts already read), renews the mark while it waits
//! and removes it when the wait ends, however it ends ([`WaitMark`]). An
//! attempt counts the marks ahead of its own [`Place`]: a permit goes to
//! the first waiters while slots are free, a write waits for the marks
//! ahead, a read for the writers' marks ahead. A mark whose waiter died
//! lapses after [`MARK`]; skew between clients' clocks shifts who counts
//! as first, never exclusion.
//!
//! Plain locks keep no marks: their grant is one publish conditioned on
//! the lock's subject alone, which a queue's read would double.

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use bytes::Bytes;
use futures_util::StreamExt;
use lock_core::raw::{
    Arrival, Attempt, MARK_RENEWAL, MARK_TTL, Pace, Request, Unmark, WaitLoop, WaitMark,
};
use lock_core::{Access, LockError, LockGuard};
use tokio::time::Instant;

use crate::error::BACKEND;
use crate::keys::{Mark, PermitSubjects, RwSubjects};
use crate::lock::{Inner, NatsLock, ttl_header};

/// How long a waiter's mark lasts unless renewed: the marks' lifetime in
/// whole seconds, as the server's TTLs are.
pub(crate) const MARK: Duration = Duration::from_secs(MARK_TTL.as_millis().div_ceil(1000) as u64);

/// How long a waiter pauses when what blocks it has no lease it can read
/// (readers, waiters ahead); a release wakes it sooner.
const BACKSTOP: Duration = Duration::from_millis(500);

/// Past a holder's lease by the server's timestamp, how long a waiter
/// sleeps before it looks again: the server expires the message then.
pub(crate) const EXPIRY_SLACK: Duration = Duration::from_millis(5);

/// What a line of waiters waits for.
#[derive(Clone, Copy)]
pub(crate) enum Line {
    /// A permit of a semaphore of this limit.
    Permit(u32),
    /// Reader-writer access.
    Rw(Access),
}

/// Where an attempt stands among the waiters' marks.
#[derive(Clone, Copy)]
pub(crate) enum Place<'a> {
    /// An attempt that does not wait: every mark there came before it.
    New,
    /// A waiter's attempt: the marks before its own (by arrival, then id).
    Marked(Arrival, &'a str),
}

impl Place<'_> {
    /// A place for a waiter with `mark`.
    pub(crate) fn of(mark: &WaitMark) -> Place<'_> {
        Place::Marked(mark.arrival(), mark.id())
    }

    /// Whether the waiter of `mark` came before this attempt.
    pub(crate) fn behind(&self, mark: &Mark) -> bool {
        match *self {
            Place::New => true,
            Place::Marked(arrival, id) => (mark.arrival, mark.id.as_str()) < (arrival.millis(), id),
        }
    }
}

/// Where a line's marks and its announcements live.
#[derive(Clone)]
enum LineSubjects {
    Permit(PermitSubjects),
    Rw(RwSubjects),
}

impl LineSubjects {
    fn of(bucket: &str, name: &str, line: Line) -> LineSubjects {
        match line {
            Line::Permit(_) => LineSubjects::Permit(PermitSubjects::of(bucket, name)),
            Line::Rw(_) => LineSubjects::Rw(RwSubjects::of(bucket, name)),
        }
    }

    /// The subject of the mark of a waiter that arrived at `arrival`.
    fn mark(&self, arrival: Arrival, id: &str) -> String {
        match self {
            LineSubjects::Permit(s) => s.mark(arrival.millis(), id),
            LineSubjects::Rw(s) => s.mark(arrival.millis(), id),
        }
    }

    /// Where releases (and marks removed) are announced.
    fn released(&self) -> &str {
        match self {
            LineSubjects::Permit(s) => s.released(),
            LineSubjects::Rw(s) => &s.released,
        }
    }

    /// The removal of a mark of a waiter that arrived at `arrival`: its
    /// subject's message deleted, and with `announce` the waiters behind it
    /// told.
    fn unmark(&self, inner: &Arc<Inner>, arrival: Arrival, announce: bool) -> Unmark {
        let (inner, subjects) = (Arc::clone(inner), self.clone());
        Arc::new(move |id: String| {
            let (inner, subject, released) = (
                Arc::clone(&inner),
                subjects.mark(arrival, &id),
                subjects.released().to_string(),
            );
            Box::pin(async move {
                let doing = "removing a waiter's mark";
                if let Some(m) = inner.last_on(&subject, doing).await? {
                    inner.delete(m.sequence, doing).await?;
                    if announce {
                        inner.announce_release(&released).await;
                    }
                }
                Ok(())
            })
        })
    }

    /// A waiter's mark, removed when the wait ends, whenever it ends:
    /// [`WaitMark::remove`] deletes it, a drop (a wait cancelled) also
    /// tells the waiters behind it.
    fn wait_mark(&self, inner: &Arc<Inner>, line: Line, arrival: Arrival) -> WaitMark {
        let quiet = self.unmark(inner, arrival, false);
        let mark = match line {
            Line::Permit(_) => WaitMark::in_line(arrival, quiet),
            Line::Rw(access) => WaitMark::new(access, arrival, quiet),
        };
        mark.with_drop_removal(self.unmark(inner, arrival, true))
    }
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

/// Remove the mark of a wait that gave up, and tell the waiters behind
/// it; a removal that fails leaves the mark to lapse by itself.
async fn give_up(inner: &Inner, mark: &WaitMark, released: &str) {
    match mark.remove().await {
        Ok(()) => inner.announce_release(released).await,
        Err(e) => {
            tracing::debug!(target: "distlock", backend = BACKEND, error = %e.report(), "a waiter's mark could not be removed; it lapses by itself");
        }
    }
}

impl NatsLock {
    /// One attempt in `line` from `place`, without waiting, and whether a
    /// grant leaves room for a waiter behind it (a permit taken while
    /// another slot was free). A reader's or a writer's grant never does:
    /// what kept those behind out, it now holds.
    pub(crate) async fn attempt_in_line(
        &self,
        req: Request<'_>,
        line: Line,
        place: Place<'_>,
    ) -> Result<(Attempt, bool), LockError> {
        match line {
            Line::Permit(limit) => self.attempt_permit(req.name, req.opts, limit, place).await,
            Line::Rw(access) => Ok((
                self.attempt_rw(req.name, req.opts, access, place).await?,
                false,
            )),
        }
    }

    /// Wait in `line`: listening for releases (subscribed before the first
    /// attempt), else until the first lease ahead ends or a [`BACKSTOP`];
    /// the waiter marks itself while it waits, at least every
    /// [`MARK_RENEWAL`].
    pub(crate) async fn wait_in_line(
        &self,
        req: Request<'_>,
        line: Line,
    ) -> Result<Option<LockGuard>, LockError> {
        let inner = &self.inner;
        let subjects = LineSubjects::of(&inner.config().bucket, req.name, line);
        let mut released = inner.listen(subjects.released().to_string()).await?;
        let arrival = Arrival::now();
        let mark = subjects.wait_mark(inner, line, arrival);
        let mark_subject = subjects.mark(arrival, mark.id());
        let mut listening = true;
        let mut wait = WaitLoop::new(req, None);
        let mut marked_at: Option<Instant> = None;
        loop {
            let mut too_late = None;
            let (attempt, room_left) = self.attempt_in_line(req, line, Place::of(&mark)).await?;
            let pace = match attempt {
                // Those behind the mark are told only if they may follow.
                // A permit's mark goes in the background (its holder goes
                // on at once; `inspect` may count it a moment longer); a
                // reader's or writer's before the guard is handed out, so
                // that `inspect` no longer counts it as waiting.
                Attempt::Acquired(guard) => {
                    match (line, room_left) {
                        (_, true) => drop(mark),
                        (Line::Permit(_), false) => mark.remove_in_background(),
                        (Line::Rw(_), false) => {
                            if let Err(e) = mark.remove().await {
                                tracing::debug!(target: "distlock", backend = BACKEND, error = %e.report(), "a granted waiter's mark could not be removed; it lapses by itself");
                            }
                        }
                    }
                    return Ok(Some(guard));
                }
                Attempt::Held { expires_in } => {
                    if marked_at.is_none_or(|at| at.elapsed() >= MARK_RENEWAL) {
                        renew_mark(inner, &mark, &mark_subject).await;
                        marked_at = Some(Instant::now());
                    }
                    let pause = expires_in.map_or(BACKSTOP, |left| left + EXPIRY_SLACK);
                    Pace::Until(Instant::now() + pause.min(MARK_RENEWAL))
                }
                Attempt::TooLate(e) => {
                    too_late = Some(e);
                    Pace::For(Duration::ZERO)
                }
            };
            tokio::select! {
                go_on = wait.pause(pace) => {
                    if !go_on {
                        give_up(inner, &mark, subjects.released()).await;
                        return too_late.map_or(Ok(None), Err);
                    }
                }
                message = released.next(), if listening => {
                    // The subscription ended (the client closed): the
                    // leases and the backstop still pace the wait.
                    listening = message.is_some();
                }
            }
        }
    }
}
