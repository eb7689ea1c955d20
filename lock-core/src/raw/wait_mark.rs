//! A waiter's mark: how a backend without a queue keeps arrival order, on
//! a reader-writer lock between its two sides (and, where the backend
//! orders them, among waiters of one kind). A waiting writer's mark
//! holds back the readers that arrive after it (writer preference); a
//! waiting reader's mark holds back the writers that arrive after it, so
//! readers that queued before a writer keep their place. Every such
//! backend keeps its marks through [`WaitMark`], so that a wait dropped at
//! any moment (between sending a mark and hearing back, or while a grant
//! removes it) leaves none behind for longer than its removal takes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;

use crate::error::LockError;
use crate::raw::OwnerToken;
use crate::rw_lock::Access;

/// How long a mark lasts unless renewed: three renewals, so that a writer
/// whose process died stops holding readers back soon.
pub const MARK_TTL: Duration = Duration::from_millis(1500);

/// How often a waiter renews its mark (by attempting again) at
/// least.
pub const MARK_RENEWAL: Duration = Duration::from_millis(500);

/// When a reader-writer acquisition arrived: milliseconds since the Unix
/// epoch by this client's clock. Skew between clients shifts who counts
/// as first, never exclusion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Arrival(u64);

impl Arrival {
    /// Now, by this client's clock.
    pub fn now() -> Arrival {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Arrival(ms)
    }

    /// The arrival `ms` milliseconds after the Unix epoch.
    pub const fn from_millis(ms: u64) -> Arrival {
        Arrival(ms)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn millis(self) -> u64 {
        self.0
    }

    /// Milliseconds since the Unix epoch as a signed SQL integer.
    pub fn millis_i64(self) -> i64 {
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }

    /// Sixteen zero-padded digits, so that arrivals order as text too (a
    /// sorted set's members, a subject's tokens).
    pub fn padded(self) -> String {
        format!("{:016}", self.0)
    }
}

/// A backend's removal of a mark, given the mark's id: one request, safe
/// to send when there is no such mark.
pub type Unmark = Arc<dyn Fn(String) -> BoxFuture<'static, Result<(), LockError>> + Send + Sync>;

/// One waiter's mark. Before each request that may put or renew it, the
/// backend calls [`placing`](Self::placing); from then on, until
/// [`removed`](Self::removed) or [`remove`](Self::remove) says it is gone,
/// dropping the mark removes it in the background. So a wait dropped while
/// its mark is on its way still removes it, behind it where the removal
/// goes out on the same connection.
///
/// A reader's mark has an id that starts with [`READER_MARK`] (a writer's
/// is hexadecimal), so a backend that keeps both sides' marks in one place
/// tells them apart by id ([`WaitMark::is_reader_id`]).
pub struct WaitMark {
    id: String,
    arrival: Arrival,
    reader: bool,
    /// A request that may have put or renewed the mark went out since it
    /// was last known gone.
    out: AtomicBool,
    unmark: Unmark,
    /// The removal a drop sends, where not `unmark`.
    drop_unmark: Option<Unmark>,
}

/// The first character of a waiting reader's mark id.
pub const READER_MARK: char = 'r';

impl WaitMark {
    /// A new mark (a random id) of a waiter for `access` that arrived at
    /// `arrival`, removed by `unmark`. An upgradeable reader waits as a
    /// reader.
    pub fn new(access: Access, arrival: Arrival, unmark: Unmark) -> WaitMark {
        let reader = access != Access::Write;
        let hex = OwnerToken::random().to_hex();
        WaitMark {
            id: match reader {
                true => format!("{READER_MARK}{hex}"),
                false => hex,
            },
            arrival,
            reader,
            out: AtomicBool::new(false),
            unmark,
            drop_unmark: None,
        }
    }

    /// A new mark of a waiter in a line of one kind (a semaphore's
    /// permits): its id is hexadecimal, as a writer's.
    pub fn in_line(arrival: Arrival, unmark: Unmark) -> WaitMark {
        WaitMark::new(Access::Write, arrival, unmark)
    }

    /// With `unmark` as the removal a drop sends: for a backend whose
    /// removal goes out on another connection than a mark that may still
    /// be on its way, a removal that such a mark cannot undo.
    pub fn with_drop_removal(mut self, unmark: Unmark) -> WaitMark {
        self.drop_unmark = Some(unmark);
        self
    }

    /// The mark's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// When its waiter arrived.
    pub fn arrival(&self) -> Arrival {
        self.arrival
    }

    /// Whether a reader waits (else a writer).
    pub fn is_reader(&self) -> bool {
        self.reader
    }

    /// Whether the mark id `id` is a waiting reader's.
    pub fn is_reader_id(id: &str) -> bool {
        id.starts_with(READER_MARK)
    }

    /// A request that may put or renew the mark is about to go out.
    pub fn placing(&self) {
        self.out.store(true, Ordering::Release);
    }

    /// Whether a mark may be there: a request that may have put it went
    /// out, and none is known to have removed it since.
    pub fn may_be_placed(&self) -> bool {
        self.out.load(Ordering::Acquire)
    }

    /// The mark is gone: the request that granted the waiter removed it,
    /// or none was put.
    pub fn removed(&self) {
        self.out.store(false, Ordering::Release);
    }

    /// Remove the mark in the background, with the removal
    /// [`remove`](Self::remove) sends: for a waiter that was granted and
    /// goes on at once (the mark no longer matters to those behind it).
    pub fn remove_in_background(mut self) {
        self.drop_unmark = None;
    }

    /// Remove the mark now if one may be there. Dropped halfway, the mark
    /// is still removed, by the drop.
    pub async fn remove(&self) -> Result<(), LockError> {
        if !self.may_be_placed() {
            return Ok(());
        }
        (self.unmark)(self.id.clone()).await?;
        self.removed();
        Ok(())
    }
}

impl std::fmt::Debug for WaitMark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitMark")
            .field("id", &self.id)
            .field("arrival", &self.arrival)
            .field("reader", &self.reader)
            .field("out", &self.out.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Drop for WaitMark {
    fn drop(&mut self) {
        if !self.out.load(Ordering::Acquire) {
            return;
        }
        // Outside a runtime the mark lapses by itself within MARK_TTL.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let unmark = self.drop_unmark.as_ref().unwrap_or(&self.unmark);
        let removal = unmark(std::mem::take(&mut self.id));
        rt.spawn(async move {
            if let Err(e) = removal.await {
                tracing::debug!(target: "distlock", error = %e.report(), "removing a waiter's mark failed; it lapses by itself");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A removal that records the ids it is asked for; with `stuck`, its
    /// request never comes back.
    fn recording(stuck: bool) -> (Unmark, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = Arc::clone(&seen);
        let unmark: Unmark = Arc::new(move |id| {
            s.lock().unwrap().push(id);
            match stuck {
                true => Box::pin(std::future::pending()),
                false => Box::pin(async { Ok(()) }),
            }
        });
        (unmark, seen)
    }

    fn counting() -> (Unmark, Arc<Mutex<Vec<String>>>) {
        recording(false)
    }

    #[tokio::test]
    async fn a_mark_never_sent_is_not_removed() {
        let (unmark, seen) = counting();
        drop(WaitMark::new(Access::Write, Arrival::now(), unmark));
        tokio::task::yield_now().await;
        assert!(seen.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_mark_on_its_way_is_removed_when_dropped() {
        let (unmark, seen) = counting();
        let mark = WaitMark::new(Access::Write, Arrival::now(), unmark);
        let id = mark.id().to_string();
        mark.placing();
        drop(mark);
        tokio::task::yield_now().await;
        assert_eq!(*seen.lock().unwrap(), vec![id]);
    }

    #[tokio::test]
    async fn a_removal_dropped_halfway_is_done_by_the_drop() {
        use futures_util::FutureExt;
        let (unmark, seen) = recording(true);
        let mark = WaitMark::new(Access::Write, Arrival::now(), unmark);
        mark.placing();
        // The removal is sent, and dropped before its answer came.
        assert!(mark.remove().now_or_never().is_none());
        drop(mark);
        tokio::task::yield_now().await;
        assert_eq!(seen.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_drop_sends_its_own_removal_where_given() {
        let (unmark, seen) = counting();
        let (dropped, seen_dropped) = counting();
        let mark = WaitMark::new(Access::Write, Arrival::now(), unmark).with_drop_removal(dropped);
        mark.placing();
        drop(mark);
        tokio::task::yield_now().await;
        assert!(seen.lock().unwrap().is_empty());
        assert_eq!(seen_dropped.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_mark_removed_by_its_grant_is_left_alone() {
        let (unmark, seen) = counting();
        let mark = WaitMark::new(Access::Write, Arrival::now(), unmark);
        mark.placing();
        mark.removed();
        drop(mark);
        tokio::task::yield_now().await;
        assert!(seen.lock().unwrap().is_empty());
    }

    #[test]
    fn a_readers_mark_is_told_apart_by_its_id() {
        let (unmark, _) = counting();
        let reader = WaitMark::new(Access::Read, Arrival::now(), Arc::clone(&unmark));
        let writer = WaitMark::new(Access::Write, Arrival::now(), unmark);
        assert!(reader.is_reader() && WaitMark::is_reader_id(reader.id()));
        assert!(!writer.is_reader() && !WaitMark::is_reader_id(writer.id()));
    }

    #[test]
    fn arrivals_order_as_text() {
        let (a, b) = (Arrival::from_millis(999), Arrival::from_millis(1_000));
        assert!(a < b && a.padded() < b.padded());
        assert_eq!(b.padded(), "0000000000001000");
    }
}
