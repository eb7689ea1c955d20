//! Live migration between backends: a lock held only while it is held on
//! both the old (`from`) and the new (`to`) backend.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lock_core::raw::{
    GuardHandle, LeaseState, LockUrl, RawGuard, RawLock, Request, asked_options, async_trait,
    granted_too_late,
};
use lock_core::{
    Access, Capabilities, Changes, CrashRelease, DistributedLock, Grade, LockError, LockGuard,
    LockInfo, LockOptions, RwLockCapabilities, RwLockInfo, Wait, Waiting, redact_url,
};
use tokio::sync::{Mutex, Notify};
use tokio::time::Instant;

/// The backend name of the composite, as in `migrate://` URLs.
pub(crate) const BACKEND: &str = "migrate";

/// A lock over two backends during a rolling migration from `from` to `to`:
/// acquiring takes `from` first, then `to`; the lock is held only while both
/// are. Processes on the old URL, on the migration URL and on the new URL
/// can then run side by side, neighbour with neighbour, without two
/// holders at once (see "Migrating between backends" in `docs/guide.md`).
///
/// - **Order, no deadlock**: `from` is always taken first. If `to` cannot
///   be had within the wait, `from` is released and the acquire fails with
///   [`LockError::Timeout`]; nobody ever holds `to` while waiting for `from`.
///   A single attempt (`try_acquire`) whose `from` ran out while `to` was
///   being granted gives both back and fails with the transient
///   [`LockError::Unavailable`] (the lock was free, not held).
/// - **Loss**: the guard's `lost()` fires when either part is lost (the
///   other part is then no longer renewed and ends with its lease); its
///   validity deadline is the earlier of the two; each part renews itself; `extend` acts on both; `release`
///   releases both (`to` first) and reports whether both were still ours.
/// - **Fencing**: the guard carries `from`'s token, so a resource checking
///   tokens sees the same sequence as before the migration. The new URL of
///   the last step carries a higher `fencing_epoch`, so its tokens are
///   larger than every token of the old backend.
/// - **Reader-writer locks** (where both backends offer them): a read
///   grant reads on both, a write grant writes on both, `from` first, by
///   the same rules; a reader's token is `from`'s (the latest write's
///   there). Writer preference is not promised: a writer waits on `from`,
///   where later readers of `from` queue behind it (where that backend
///   gives writer preference), but a reader of `to` alone (a process on
///   the new URL) does not see it.
/// - **Holder record**: `from`'s carries the holder's identity; `to`'s
///   carries it followed by ` (migrating)`, so a view of `to` alone (a
///   process on the new URL, `inspect` when `from` has ended first) tells
///   the rest of a migrating holder from a holder of `to` alone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::LockError> {
/// use std::sync::Arc;
/// use distlock::{DistributedLock, LockOptions, MemoryLock, MigratingLock};
/// let (old, new) = (Arc::new(MemoryLock::new()), Arc::new(MemoryLock::new()));
/// let locks = MigratingLock::new(old.clone(), new.clone());
/// let guard = locks.acquire("report", &LockOptions::new()).await?;
/// // Held on both: neither an old-style nor a new-style process can take it.
/// assert!(old.try_acquire("report", &LockOptions::new()).await?.is_none());
/// assert!(new.try_acquire("report", &LockOptions::new()).await?.is_none());
/// assert!(guard.release().await?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MigratingLock {
    from: Arc<dyn DistributedLock>,
    to: Arc<dyn DistributedLock>,
    /// The URLs it was built from, redacted, for `Debug`.
    urls: Option<(String, String)>,
}

impl MigratingLock {
    /// Migrate from `from` to `to`.
    pub fn new(from: Arc<dyn DistributedLock>, to: Arc<dyn DistributedLock>) -> Self {
        MigratingLock {
            from,
            to,
            urls: None,
        }
    }

    /// Build from a `migrate://?from=URL&to=URL` URL: each nested URL is
    /// connected with [`connect`](crate::connect). Nested URLs holding `&`,
    /// `#` or `%` must be percent-encoded.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let (from_url, to_url) = parse(url)?;
        let nested = |which: &str, e: LockError| match e {
            LockError::InvalidUrl { reason, .. } => invalid(url, format!("`{which}`: {reason}")),
            other => other,
        };
        let from = Box::pin(crate::connect(&from_url))
            .await
            .map_err(|e| nested("from", e))?;
        let to = Box::pin(crate::connect(&to_url))
            .await
            .map_err(|e| nested("to", e))?;
        Ok(MigratingLock {
            from,
            to,
            urls: Some((redact_url(&from_url), redact_url(&to_url))),
        })
    }

    /// The old backend.
    pub fn from_lock(&self) -> &Arc<dyn DistributedLock> {
        &self.from
    }

    /// The new backend.
    pub fn to_lock(&self) -> &Arc<dyn DistributedLock> {
        &self.to
    }

    /// One view of the lock from the two parts' (see `raw_inspect`).
    fn merge(&self, from: LockInfo, to: LockInfo) -> LockInfo {
        let waiters = match (from.waiters, to.waiters) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        let mut info = if from.held || to.held {
            LockInfo::held()
        } else {
            LockInfo::free()
        };
        if info.held && !from.held && is_migrating_part(&to) {
            // Half a migrating holder: held, with no token of either
            // sequence to show.
            return info.with_expires_in(to.expires_in).with_waiters(waiters);
        }
        if info.held {
            let (token, holder) = if from.held {
                (from.fencing_token, from.holder.clone())
            } else {
                (to.fencing_token, to.holder.clone())
            };
            // Only where both parts keep one (`Capabilities::holder`).
            let holder = holder.filter(|_| self.raw_capabilities().holder);
            let expires_in = [&from, &to]
                .iter()
                .filter(|part| part.held)
                .filter_map(|part| part.expires_in)
                .min();
            info = info
                .with_fencing_token(token)
                .with_expires_in(expires_in)
                .with_holder(holder);
        }
        info.with_waiters(waiters)
    }

    async fn acquire_both(
        &self,
        req: Request<'_>,
        one_attempt: bool,
    ) -> Result<Option<LockGuard>, LockError> {
        // The parts are asked as the caller asked (each adds any lock
        // delay and hold itself).
        let asked = asked_options(req.opts);
        let (name, opts, deadline) = (req.name, &*asked, req.deadline);
        loop {
            let first = if one_attempt {
                match self.from.try_acquire(name, opts).await? {
                    Some(g) => g,
                    None => return Ok(None),
                }
            } else {
                self.from.acquire(name, &remaining(opts, deadline)).await?
            };
            let first_granted = Instant::now();
            // `from` is ours: `to` is contended only by processes already on
            // the new URL, and by nobody holding `to` while waiting for
            // `from`; so waiting for it here cannot deadlock.
            let to_opts = to_part_options(opts);
            let second = if one_attempt {
                self.to.try_acquire(name, &to_opts).await
            } else {
                self.to
                    .acquire(name, &remaining(&to_opts, deadline))
                    .await
                    .map(Some)
            };
            let second = match second {
                Ok(Some(g)) => g,
                Ok(None) => {
                    release_quietly(first, name).await;
                    return Ok(None);
                }
                Err(e) => {
                    release_quietly(first, name).await;
                    return Err(e);
                }
            };
            // The wait for `to` counts against `from`'s lease: start it
            // again, so that the grant has a full TTL ahead (the rule
            // `confirmed_lease_start` applies to a single backend).
            let refreshed = if first_granted.elapsed() > opts.ttl / 10 {
                first.extend(opts.ttl).await.map(drop)
            } else {
                Ok(())
            };
            // A long wait for `to` may have outlived an unrenewed `from`.
            if refreshed.is_err() || first.is_lost().is_some() || second.is_lost().is_some() {
                let took = first_granted.elapsed();
                release_quietly(second, name).await;
                release_quietly(first, name).await;
                if one_attempt {
                    // Both parts were granted: the lock is not held by
                    // anyone else, so "held" (`None`) would be untrue.
                    return Err(granted_too_late(BACKEND, name, took, opts.ttl));
                }
                continue;
            }
            return Ok(Some(compose(name, first, second, self.capabilities())));
        }
    }
}

/// How many times `inspect` reads the two parts before it gives up on a
/// consistent view (see `MigratingLock::raw_inspect`).
const INSPECT_READS: usize = 4;

/// `opts` with the wait cut to what is left before `deadline`.
/// What a migrating grant appends to its identity in `to`'s holder
/// record. `to` held under it while `from` is free is what is left of a
/// migrating holder whose `from` part has ended (released first, lapsed
/// first, taken away): not a holder of `to` alone, and not a leader with a
/// term of `to`'s sequence.
const MIGRATING_MARK: &str = " (migrating)";

/// The options of a migrating grant's `to` part: its identity marked.
fn to_part_options(opts: &LockOptions) -> LockOptions {
    let mut identity = opts.holder_identity().to_string();
    let mut keep = lock_core::MAX_IDENTITY_BYTES - MIGRATING_MARK.len();
    while keep < identity.len() && !identity.is_char_boundary(keep) {
        keep -= 1;
    }
    identity.truncate(keep);
    identity.push_str(MIGRATING_MARK);
    opts.clone().identity(identity)
}

/// Whether a part's holder is the `to` part of a migrating holder.
fn is_migrating_part(part: &LockInfo) -> bool {
    part.holder
        .as_ref()
        .is_some_and(|h| h.identity.ends_with(MIGRATING_MARK))
}

fn remaining(opts: &LockOptions, deadline: Option<Instant>) -> LockOptions {
    match (opts.wait, deadline) {
        (Wait::No, _) | (_, None) => opts.clone(),
        (_, Some(d)) => opts
            .clone()
            .wait(Wait::UpTo(d.saturating_duration_since(Instant::now()))),
    }
}

async fn release_quietly(guard: LockGuard, name: &str) {
    if let Err(e) = guard.release().await {
        tracing::warn!(target: "distlock", lock = %name, error = %e.report(), "releasing one part of a migrating lock failed; it ends with its lease");
    }
}

/// The guard over both parts.
fn compose(name: &str, from: LockGuard, to: LockGuard, caps: Capabilities) -> LockGuard {
    let (token, access) = (from.fencing_token(), from.access());
    let lease = LeaseState::following(vec![Arc::clone(from.lease()), Arc::clone(to.lease())]);
    let released = Arc::new(Notify::new());
    let parts = Arc::new(Parts {
        from: Mutex::new(Some(from)),
        to: Mutex::new(Some(to)),
        released: Arc::clone(&released),
    });
    // Once either part is lost, the lock is: stop renewing the other part,
    // so that a holder ignoring `lost()` does not keep blocking others with
    // it. It is not released at once: it ends with its lease, which keeps
    // the safety margin between `lost()` and anyone else's grant. The task
    // ends with the release.
    let (watched, weak) = (Arc::clone(&lease), Arc::downgrade(&parts));
    let lock = name.to_string();
    tokio::spawn(async move {
        tokio::select! {
            reason = watched.lost() => {
                if let Some(parts) = weak.upgrade() {
                    tracing::debug!(target: "distlock", lock = %lock, %reason, "migrating lock lost; its parts are no longer renewed");
                    parts.stop_renewal().await;
                }
            }
            () = released.notified() => {}
        }
    });
    LockGuard::new(name, token, caps, lease, parts).with_access(access)
}

/// Both parts' guards, taken out when released.
struct Parts {
    from: Mutex<Option<LockGuard>>,
    to: Mutex<Option<LockGuard>>,
    /// Told when both parts were given back.
    released: Arc<Notify>,
}

impl Parts {
    async fn stop_renewal(&self) {
        for part in [&self.from, &self.to] {
            if let Some(g) = part.lock().await.as_mut() {
                g.stop_renewal();
            }
        }
    }
}

#[async_trait]
impl GuardHandle for Parts {
    async fn release(&self) -> Result<bool, LockError> {
        // `to` first: whoever takes `from` next finds `to` free.
        let to = match self.to.lock().await.take() {
            Some(g) => g.release().await,
            None => Ok(false),
        };
        let from = match self.from.lock().await.take() {
            Some(g) => g.release().await,
            None => Ok(false),
        };
        self.released.notify_one();
        Ok(to? && from?)
    }

    async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        for part in [&self.from, &self.to] {
            let guard = part.lock().await;
            let Some(g) = guard.as_ref() else {
                return Ok(false);
            };
            match g.extend(ttl).await {
                Ok(_) => {}
                Err(LockError::NotHeld { .. } | LockError::Lost { .. }) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// On both parts, `to` first: an observer of either backend sees the
    /// new value.
    async fn set_value(&self, value: &[u8]) -> Result<bool, LockError> {
        for part in [&self.to, &self.from] {
            let guard = part.lock().await;
            let Some(g) = guard.as_ref() else {
                return Ok(false);
            };
            match g.set_value(value).await {
                Ok(()) => {}
                Err(LockError::NotHeld { .. } | LockError::Lost { .. }) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

#[async_trait]
impl RawLock for MigratingLock {
    async fn attempt_once(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        self.acquire_both(req, true).await
    }

    async fn wait(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        self.acquire_both(req, false).await
    }

    fn raw_capabilities(&self) -> Capabilities {
        combined(self.from.capabilities(), self.to.capabilities())
    }

    /// Held where either part is held (a process on the old URL holds only
    /// `from`, one on the new URL only `to`); the token is `from`'s when it
    /// is held there (the one a migrating guard carries), else `to`'s; the
    /// lease is the earlier of the held parts'; the holder record is the
    /// one beside that token; the waiters are those of both. `to` held by
    /// a migrating grant (its identity ends with ` (migrating)`) while
    /// `from` is free is the rest of a migrating holder whose `from` part
    /// has ended: held, with no token or holder (an election has no
    /// leader then, and no term of `to`'s sequence is shown).
    ///
    /// The parts are read one after the other, so a migrating grant or
    /// release may land between the reads. `to` is read first: a migrating
    /// holder holds `from` for the whole time it holds `to`, so `to` held
    /// and then `from` free means either a holder of `to` alone or a
    /// migrating holder that has gone since; `to` is read again to tell
    /// them apart (the same grant still held is a holder of `to` alone).
    /// Where the lock keeps changing between reads, it is reported held
    /// without a token or holder rather than with a token of the other
    /// sequence.
    async fn raw_inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        for _ in 0..INSPECT_READS {
            let to = self.to.inspect(name).await?;
            let from = self.from.inspect(name).await?;
            if from.held || !to.held {
                return Ok(self.merge(from, to));
            }
            let again = self.to.inspect(name).await?;
            if again.held && again.fencing_token == to.fencing_token {
                return Ok(self.merge(from, again));
            }
        }
        Ok(LockInfo::held())
    }

    /// Both parts' notifications, merged, where both notify (`None`
    /// otherwise): [`raw_inspect`](Self::raw_inspect) reads both, so a
    /// change of either may change what it shows.
    async fn raw_changes(&self, name: &str) -> Result<Option<Changes>, LockError> {
        let Some(to) = self.to.changes(name).await? else {
            return Ok(None);
        };
        let Some(from) = self.from.changes(name).await? else {
            return Ok(None);
        };
        // Ends when either part's ends (its channel broke): an observer
        // then subscribes again, rather than hear only the other part.
        let until_end = |part: Changes| {
            part.map(Some)
                .chain(futures_util::stream::once(async { None }))
        };
        let merged = futures_util::stream::select(until_end(to), until_end(from))
            .take_while(|item| futures_util::future::ready(item.is_some()))
            .filter_map(futures_util::future::ready);
        Ok(Some(Box::pin(merged)))
    }

    /// The reader-writer lock as both parts show it: the mode the stronger
    /// of the two (a writer on either is a writer), `from`'s token (the
    /// one a migrating reader carries), `from`'s holders and those of
    /// `to` that are not the `to` parts of migrating holders (a holder of
    /// `to` alone, a process on the new URL), and the waiters of both.
    /// `to` is read first, as in [`raw_inspect`](Self::raw_inspect).
    async fn raw_inspect_rw(&self, name: &str) -> Result<RwLockInfo, LockError> {
        let to = self.to.inspect_rw(name).await?;
        let from = self.from.inspect_rw(name).await?;
        Ok(merge_rw(from, to))
    }

    /// Force-release on both backends, `to` first (as a release does);
    /// `true` if either part was held.
    async fn raw_force_release(&self, name: &str) -> Result<bool, LockError> {
        let to = self.to.force_release(name).await?;
        let from = self.from.force_release(name).await?;
        Ok(from || to)
    }
}

/// One view of a reader-writer lock from its two parts (see
/// `MigratingLock::raw_inspect_rw`). A `to` holder without a holder
/// record cannot be told from a migrating holder's part: it is shown only
/// where `from` is free.
fn merge_rw(from: RwLockInfo, to: RwLockInfo) -> RwLockInfo {
    let from_held = from.mode.is_some();
    let mode = match (from.mode, to.mode) {
        (Some(Access::Write), _) | (_, Some(Access::Write)) => Some(Access::Write),
        (None, None) => None,
        _ => Some(Access::Read),
    };
    let alone = to.holders.into_iter().filter(|h| match &h.holder {
        Some(record) => !record.identity.ends_with(MIGRATING_MARK),
        None => !from_held,
    });
    let holders = from.holders.into_iter().chain(alone).collect();
    // Known only where both parts know: a waiter may wait on either.
    let sum = |a: Option<usize>, b: Option<usize>| Some(a? + b?);
    let mut info = RwLockInfo::held(holders)
        .with_fencing_token(from.fencing_token)
        .with_waiting(
            sum(from.waiting_writers, to.waiting_writers),
            sum(from.waiting_readers, to.waiting_readers),
        );
    info.mode = mode;
    info
}

/// The weaker of the two for each property; fencing is `from`'s (its tokens
/// are the ones handed out).
pub(crate) fn combined(from: Capabilities, to: Capabilities) -> Capabilities {
    let grade_rank = |g: Grade| match g {
        Grade::ProcessLocal => 0,
        Grade::Efficiency => 1,
        Grade::Correctness => 2,
        // A grade this code does not know: taken as the weakest.
        _ => -1,
    };
    let release_rank = |c: CrashRelease| match c {
        CrashRelease::ProcessExit => 0,
        CrashRelease::Connection => 1,
        CrashRelease::Session => 2,
        CrashRelease::Ttl => 3,
        // A way this code does not know: taken as the slowest.
        _ => 4,
    };
    Capabilities::new(
        BACKEND,
        if grade_rank(from.grade) <= grade_rank(to.grade) {
            from.grade
        } else {
            to.grade
        },
    )
    .with_fencing(from.fencing)
    .with_fair_queue(false)
    .with_crash_release(
        if release_rank(from.crash_release) >= release_rank(to.crash_release) {
            from.crash_release
        } else {
            to.crash_release
        },
    )
    .with_survives_server_failure(from.survives_server_failure && to.survives_server_failure)
    .with_depends_on_clocks(from.depends_on_clocks || to.depends_on_clocks)
    .with_waiting(
        if from.waiting == Waiting::Notified && to.waiting == Waiting::Notified {
            Waiting::Notified
        } else {
            Waiting::Polling
        },
    )
    .with_max_ttl(from.max_ttl.min(to.max_ttl))
    .with_min_lease(from.min_lease.max(to.min_lease))
    .with_max_held(match (from.max_held, to.max_held) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    })
    .with_holder(from.holder && to.holder)
    .with_lock_delay(from.lock_delay && to.lock_delay)
    .with_hold_at_least(from.hold_at_least && to.hold_at_least)
    // Notified when both parts notify: a change of either is read.
    .with_observers(
        if from.observers == Waiting::Notified && to.observers == Waiting::Notified {
            Waiting::Notified
        } else {
            Waiting::Polling
        },
    )
    // A permit on both backends would keep the count, not the slots: each
    // backend picks its own, so a permit would share a slot with a process
    // on either neighbouring URL (see the guide's migration section).
    .with_semaphore(None)
    // A reader-writer grant is taken on both, as a lock is.
    .with_rw_lock(match (from.rw_lock, to.rw_lock) {
        // No writer preference across the whole rollout: a step-2 writer
        // waits on `from`, so a step-3 reader, on `to` alone, can pass it
        // (between steps 1 and 2 it holds where both backends give it, as
        // the guide says). Waiting on both at once would deadlock with a
        // step-2 reader holding `from` and queued on `to` behind it.
        (Some(a), Some(b)) => Some(
            RwLockCapabilities::new()
                .with_writer_preference(false)
                .with_waiting(
                    if a.waiting == Waiting::Notified && b.waiting == Waiting::Notified {
                        Waiting::Notified
                    } else {
                        Waiting::Polling
                    },
                ),
        ),
        _ => None,
    })
}

impl fmt::Debug for MigratingLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("MigratingLock");
        match &self.urls {
            Some((from, to)) => d.field("from", from).field("to", to),
            None => d
                .field("from", &self.from.capabilities().backend)
                .field("to", &self.to.capabilities().backend),
        }
        .finish()
    }
}

fn invalid(url: &str, reason: impl Into<String>) -> LockError {
    LockError::InvalidUrl {
        url: redact_url(url),
        reason: reason.into(),
    }
}

/// The nested URLs of `migrate://?from=…&to=…`.
fn parse(raw: &str) -> Result<(String, String), LockError> {
    let url = LockUrl::parse(raw)?;
    url.expect_scheme(&["migrate"])?;
    if !url.hosts().is_empty() || !matches!(url.path(), "" | "/") || url.user().is_some() {
        return Err(url.invalid("expected migrate://?from=OLD_URL&to=NEW_URL (no host or path)"));
    }
    let mut options = url.options()?;
    let (from, to) = (options.text("from")?, options.text("to")?);
    options.finish()?;
    let (Some(from), Some(to)) = (from, to) else {
        return Err(
            url.invalid("both `from` and `to` are required: migrate://?from=OLD_URL&to=NEW_URL")
        );
    };
    for (which, nested) in [("from", &from), ("to", &to)] {
        if nested.to_ascii_lowercase().starts_with("migrate:") {
            return Err(url.invalid(format!(
                "`{which}` is itself a migrate:// URL; migrate one step at a time"
            )));
        }
    }
    Ok((from, to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_nested_urls_without_passwords() {
        let (from, to) =
            parse("migrate://?from=redis%3A%2F%2F%3As3cret%40h%3A1&to=postgres://u:pw2@db/x")
                .expect("parses");
        assert_eq!(from, "redis://:s3cret@h:1");
        let lock = MigratingLock {
            from: Arc::new(lock_core::MemoryLock::new()),
            to: Arc::new(lock_core::MemoryLock::new()),
            urls: Some((redact_url(&from), redact_url(&to))),
        };
        let shown = format!("{lock:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("pw2"),
            "{shown}"
        );
        assert!(shown.contains("h:1") && shown.contains("db/x"), "{shown}");
    }

    /// A lock whose single attempts take `delay` before asking `inner`.
    struct Slow {
        inner: lock_core::MemoryLock,
        delay: Duration,
    }

    #[async_trait]
    impl RawLock for Slow {
        async fn attempt_once(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
            tokio::time::sleep(self.delay).await;
            self.inner.try_acquire(req.name, req.opts).await
        }

        fn raw_capabilities(&self) -> Capabilities {
            self.inner.capabilities()
        }
    }

    /// A lock whose next `inspect` runs `then` after reading `inner`: a
    /// change that lands between the migrating lock's two reads.
    struct ChangesAfterRead {
        inner: lock_core::MemoryLock,
        then: std::sync::Mutex<Option<futures_util::future::BoxFuture<'static, ()>>>,
    }

    impl ChangesAfterRead {
        fn new(inner: &lock_core::MemoryLock) -> Self {
            ChangesAfterRead {
                inner: inner.clone(),
                then: std::sync::Mutex::new(None),
            }
        }

        fn then(&self, change: impl Future<Output = ()> + Send + 'static) {
            *self.then.lock().expect("hook") = Some(Box::pin(change));
        }
    }

    #[async_trait]
    impl RawLock for ChangesAfterRead {
        async fn attempt_once(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
            self.inner.try_acquire(req.name, req.opts).await
        }

        fn raw_capabilities(&self) -> Capabilities {
            self.inner.capabilities()
        }

        async fn raw_inspect(&self, name: &str) -> Result<LockInfo, LockError> {
            let info = self.inner.inspect(name).await?;
            let change = self.then.lock().expect("hook").take();
            if let Some(change) = change {
                change.await;
            }
            Ok(info)
        }
    }

    /// `from` and `to` over two memory locks whose tokens for "job" differ
    /// (`to`'s counter is ahead), with a hook on each one's `inspect`.
    async fn hooked() -> (MigratingLock, Arc<ChangesAfterRead>, Arc<ChangesAfterRead>) {
        let (from, to) = (lock_core::MemoryLock::new(), lock_core::MemoryLock::new());
        let opts = lock_core::LockOptions::new();
        for _ in 0..5 {
            let g = to.acquire("job", &opts).await.expect("acquire");
            assert!(g.release().await.expect("release"));
        }
        let (hf, ht) = (
            Arc::new(ChangesAfterRead::new(&from)),
            Arc::new(ChangesAfterRead::new(&to)),
        );
        let lock = MigratingLock::new(hf.clone(), ht.clone());
        (lock, hf, ht)
    }

    /// A migrating grant or release between the reads of the two parts is
    /// never reported with the `to` part's token: a migrating holder's
    /// token is `from`'s (an election observer would otherwise see a term
    /// from the other backend's sequence, and lose the terms after it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn inspect_never_mixes_the_parts_of_a_migrating_holder() {
        let opts = lock_core::LockOptions::new();
        // Granted between the reads.
        let (lock, from, _) = hooked().await;
        let holder = Arc::new(std::sync::Mutex::new(None));
        from.then({
            let (lock, holder) = (lock.clone(), holder.clone());
            async move {
                let g = lock.acquire("job", &lock_core::LockOptions::new()).await;
                *holder.lock().expect("holder") = Some(g.expect("acquire"));
            }
        });
        let info = lock.inspect("job").await.expect("inspect");
        let g = holder.lock().expect("holder").take().expect("granted");
        assert!(
            !info.held || info.fencing_token == g.fencing_token(),
            "granted token {:?}, reported {info:?}",
            g.fencing_token()
        );
        // Released between the reads.
        let (lock, from, to) = hooked().await;
        let g = lock.acquire("job", &opts).await.expect("acquire");
        let token = g.fencing_token();
        from.then(async move {
            assert!(g.release().await.expect("release"));
        });
        let info = lock.inspect("job").await.expect("inspect");
        assert!(
            !info.held || info.fencing_token == token,
            "held with token {token:?}, reported {info:?}"
        );
        let g = lock.acquire("job", &opts).await.expect("acquire");
        let token = g.fencing_token();
        to.then(async move {
            assert!(g.release().await.expect("release"));
        });
        let info = lock.inspect("job").await.expect("inspect");
        assert!(
            !info.held || info.fencing_token == token,
            "held with token {token:?}, reported {info:?}"
        );
        // A holder of `to` only (a process already on the new URL) is
        // reported with its own token.
        let (lock, _, _) = hooked().await;
        let only = lock.to_lock().acquire("job", &opts).await.expect("acquire");
        let info = lock.inspect("job").await.expect("inspect");
        assert_eq!(info.fencing_token, only.fencing_token());
        assert!(only.release().await.expect("release"));
    }

    /// A migrating holder whose `from` part ended first (lapsed, or
    /// released first, or taken away) leaves `to` held under its marked
    /// identity until that lease ends: `inspect` shows it held with no
    /// token or holder, not as a holder of `to` alone with a token of
    /// `to`'s sequence (an election observer took that for a new leader,
    /// and its term for a floor that hid the next leaders of `from`'s
    /// sequence).
    #[tokio::test]
    async fn the_rest_of_a_migrating_holder_shows_no_token() {
        let opts = lock_core::LockOptions::new().identity("api-2");
        let (from, to) = (lock_core::MemoryLock::new(), lock_core::MemoryLock::new());
        let lock = MigratingLock::new(Arc::new(from), Arc::new(to));
        let g = lock.acquire("job", &opts).await.expect("acquire");
        let to_view = lock.to_lock().inspect("job").await.expect("inspect to");
        assert_eq!(
            to_view.holder.map(|h| h.identity).as_deref(),
            Some("api-2 (migrating)")
        );
        assert!(lock.from_lock().force_release("job").await.expect("force"));
        let info = lock.inspect("job").await.expect("inspect");
        assert!(info.held, "`to` is still held: {info:?}");
        assert_eq!(
            (info.fencing_token, info.holder),
            (None, None),
            "the rest of a migrating holder shows no token or holder"
        );
        drop(g);
        // The identity stays within the limit, marked, however long.
        let long = super::to_part_options(
            &lock_core::LockOptions::new().identity("é".repeat(lock_core::MAX_IDENTITY_BYTES)),
        );
        let id = long.holder_identity();
        assert!(id.len() <= lock_core::MAX_IDENTITY_BYTES && id.ends_with(" (migrating)"));
    }

    /// A single attempt whose `to` part comes back after `from`'s lease
    /// ran out gives both back and says so with a transient error: the
    /// lock is free, so "held by someone else" would be untrue.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_single_attempt_outlived_by_from_is_unavailable_not_held() {
        use lock_core::{LockOptions, MemoryLock, Wait};
        let from = MemoryLock::new();
        let to = Slow {
            inner: MemoryLock::new(),
            delay: Duration::from_millis(500),
        };
        let opts = LockOptions::new()
            .ttl(Duration::from_millis(300))
            .wait(Wait::No)
            .auto_renew(false);
        let lock = MigratingLock::new(Arc::new(from.clone()), Arc::new(to));
        match lock.try_acquire("job", &opts).await {
            Err(LockError::Unavailable { backend, .. }) => assert_eq!(backend, BACKEND),
            other => panic!("expected Unavailable, got {other:?}"),
        }
        let again = from
            .try_acquire("job", &opts)
            .await
            .expect("try")
            .expect("`from` was given back");
        assert!(again.release().await.expect("release"));
    }

    /// Waiting for the new backend does not eat into the old backend's
    /// lease: the composed grant has (almost) a full TTL ahead of it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_wait_for_the_new_backend_leaves_a_full_lease() {
        use lock_core::{LockOptions, MemoryLock, Wait};
        let (from, to) = (MemoryLock::new(), MemoryLock::new());
        let ttl = Duration::from_millis(1500);
        let opts = LockOptions::new().ttl(ttl).wait(Wait::UpTo(ttl * 4));
        // Someone already on the new backend holds the lock for 1 s.
        let blocker = to.acquire("job", &opts).await.expect("blocker");
        let release_later = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert!(blocker.release().await.expect("release"));
        });
        let lock = MigratingLock::new(Arc::new(from), Arc::new(to));
        let g = lock.acquire("job", &opts).await.expect("acquire");
        let returned = Instant::now();
        release_later.await.expect("blocker task");
        let left = g
            .validity_deadline()
            .expect("a lease")
            .saturating_duration_since(returned);
        assert!(
            left >= ttl.mul_f64(0.8),
            "granted with {left:?} of a {ttl:?} lease left"
        );
        assert!(g.release().await.expect("release"));
    }
}
