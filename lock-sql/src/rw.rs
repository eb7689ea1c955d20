//! Reader-writer locks on the session-lock engine (Postgres, MySQL/MariaDB),
//! written once; a [`Dialect`] gives the statements.
//!
//! **Rows.** Table `{t}_rw` has a row per name. A grant is an open
//! transaction on a connection of its own that holds the name's row
//! locked, without waiting (`NOWAIT`): shared by a reader (`FOR SHARE`;
//! MariaDB `LOCK IN SHARE MODE`), exclusive by a writer (`FOR UPDATE`), in
//! either mode of the lock (advisory locks have no shared form on MySQL).
//! The connection's end (a crash, a partition, the server's idle bound on a
//! hung holder) rolls the transaction back and frees the row, as for a row
//! lock.
//!
//! **Writer preference, readers' place.** The servers' own queues for a
//! row do not promise it, and a grant never waits in them. A waiter marks
//! itself in `{t}_rw_marks` with its arrival (the client's clock) and an
//! expiry that each of its attempts renews ([`MARK_TTL`], at least every
//! [`MARK_RENEWAL`]); a reader takes the row only when no live mark of a
//! writer that arrived at or before it is there, a writer only when no
//! live mark of a reader that arrived before it is (readers that queued
//! before a writer keep their place). A reader's mark is told apart by its
//! id ([`WaitMark::is_reader_id`]). A waiter that gives up, at any moment,
//! removes its mark ([`WaitMark`]).
//!
//! **Tokens.** Each write grant draws a token from the name's counter among
//! the locks' counters ([`counter_key`]: the counters' epochs, no flush per
//! grant) on the side connection once the row is held, with the holder
//! record; a read grant carries the counter's latest token, that of the
//! latest write (where the counter is gone, a crash having emptied the
//! counters' table before any write since, a token drawn for it: above
//! every write before the crash).
//!
//! **Waiters** poll (a release in this process wakes them at once).

use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::{
    Arrival, Attempt, MARK_RENEWAL, MARK_TTL, RawGuard, Request, WaitMark, acquire_by_polling,
};
use lock_core::{
    Access, LockError, LockGuard, RwHolderInfo, RwLockCapabilities, RwLockInfo, Waiting,
};
use tokio::time::Instant;

use crate::engine::{Dialect, Kept, SqlLock, guard, holder_record};
use crate::held::DeadBudget;
use crate::transaction::TransactionHandle;

/// What the session backends' reader-writer locks guarantee beyond their
/// locks'.
pub(crate) const RW: RwLockCapabilities = RwLockCapabilities::new()
    .with_writer_preference(true)
    .with_waiting(Waiting::Polling);

/// The counter reader-writer lock `name` draws its write tokens from,
/// among the locks' counters: a control character (no lock name begins so
/// by accident) and the SHA-256 of the name, so it fits the counters' key
/// whatever the name's length.
pub(crate) fn counter_key(name: &str) -> String {
    use sha2::Digest;
    format!(
        "\u{1}rw:{}",
        hex::encode(sha2::Sha256::digest(name.as_bytes()))
    )
}

/// The key this process's wake-ups use for reader-writer lock `name`
/// (apart from the lock and the semaphore of that name).
fn wake_key(name: &str) -> String {
    format!("\u{0}rw\u{0}{name}")
}

/// The expiry (this client's clock) before which a waiting writer's mark
/// counts as unused for `unused_for`: the clean-up of unused names
/// removes those (a waiter that crashed never removes its own).
pub(crate) fn marks_unused_before(unused_for: Duration) -> i64 {
    now_ms().saturating_sub(i64::try_from(unused_for.as_millis()).unwrap_or(i64::MAX))
}

/// Milliseconds since the Unix epoch by this client's clock: marks'
/// expiries, read as arrivals are. Skew between clients shifts how long a
/// dead writer's mark holds readers back, never exclusion.
pub(crate) fn now_ms() -> i64 {
    Arrival::now().millis_i64()
}

/// One attempt at `access` to `req.name` on `lock`, as a newcomer arriving
/// at `arrival` or as the waiter `mark`, which marks itself if refused.
pub(crate) async fn attempt<D: Dialect>(
    lock: &SqlLock<D>,
    req: Request<'_>,
    access: Access,
    arrival: Arrival,
    mark: Option<&WaitMark>,
) -> Result<Attempt, LockError> {
    let dialect = lock.dialect();
    let core = dialect.core();
    let backend = D::CAPABILITIES.backend;
    let (name, opts) = (req.name, req.opts);
    let mut pinned = core
        .pool
        .pinned()
        .await
        .map_err(|e| e.into_error(backend, "acquiring a reader-writer lock"))?;
    let sent_at = Instant::now();
    let mut dead = DeadBudget::new();
    let granted = loop {
        match dialect
            .take_rw(
                &mut pinned,
                name,
                access,
                (arrival.millis_i64(), now_ms()),
                opts.ttl,
            )
            .await?
        {
            Ok(granted) => break granted,
            Err(e) if !crate::error::connection_lost(&e) => return Err(dialect.rw_error(e)),
            // A pooled connection that died while idle is replaced.
            Err(e) => {
                core.pool
                    .replace_if_dead(&mut pinned, e, &mut dead, backend)
                    .await?;
            }
        }
    };
    if !granted {
        let Some(mark) = mark else {
            dialect.put_back_permit(pinned).await;
            return Ok(Attempt::Held { expires_in: None });
        };
        // On the same connection: a waiter's first refusal marks it without
        // waiting for another (on a cold pool, opening one).
        let expires = now_ms().saturating_add(i64::try_from(MARK_TTL.as_millis()).unwrap_or(0));
        mark.placing();
        // (On an error the connection is dropped, so closed: it may have
        // broken.)
        dialect
            .mark_rw(&mut pinned, name, mark.id(), arrival.millis_i64(), expires)
            .await?;
        dialect.put_back_permit(pinned).await;
        // Back before the mark lapses.
        return Ok(Attempt::Held {
            expires_in: Some(MARK_RENEWAL),
        });
    }
    if let Some(mark) = mark {
        // Granted: its mark holds nobody back any more; removed before the
        // caller hears (a waiter granted at its first attempt put none).
        if let Err(e) = mark.remove().await {
            tracing::debug!(target: "distlock", error = %e.report(), "removing a granted writer's mark failed; it lapses by itself");
        }
    }
    let counter = counter_key(name);
    let handle = Arc::new(TransactionHandle::new(
        Arc::clone(lock.dialect_arc()),
        name,
        wake_key(name),
        pinned,
    ));
    // A writer draws a new token and keeps its holder record beside it; a
    // reader carries the latest write's (and rewrites no record).
    let drawn = match (core.fencing, access) {
        (false, _) => Ok((0, None)),
        (true, Access::Write) => {
            let record = holder_record(core, req);
            let bytes = record.as_ref().map_or(&[][..], |r| r.as_bytes());
            dialect
                .draw_on_side(&counter, bytes)
                .await
                .map(|token| (token, record))
        }
        // Where the counter is gone (a server crash emptied the counters'
        // table; no write yet), a token drawn now: above every write
        // before the crash, as the next write's will be above it.
        (true, _) => match dialect.latest_grant(&counter).await {
            Ok(Some((token, _))) => Ok((token, None)),
            Ok(None) => dialect
                .draw_on_side(&counter, &[])
                .await
                .map(|token| (token, None)),
            Err(e) => Err(e),
        },
    };
    let (token, record) = match drawn {
        Ok(drawn) => drawn,
        Err(e) => {
            // The grant goes with its connection.
            handle.close().await;
            return Err(e);
        }
    };
    let kept = Kept {
        counter: &counter,
        slot: None,
    };
    let guard = guard(lock, req, handle, (token, sent_at), record, kept).await?;
    Ok(Attempt::Acquired(guard.with_access(Some(access))))
}

/// Wait for `access` on `lock`, polling; a release in this process wakes
/// the wait at once. The waiter marks itself at its first refusal and
/// renews the mark at each attempt.
pub(crate) async fn wait<D: Dialect>(
    lock: &SqlLock<D>,
    req: Request<'_>,
    access: Access,
) -> Result<Option<LockGuard>, LockError> {
    let wake = lock.dialect().core().wakeups.subscribe(&wake_key(req.name));
    let arrival = Arrival::now();
    let removal = |for_good: bool| -> lock_core::raw::Unmark {
        let (dialect, name) = (Arc::clone(lock.dialect_arc()), req.name.to_string());
        Arc::new(move |id| {
            let (dialect, name) = (Arc::clone(&dialect), name.clone());
            Box::pin(async move { dialect.unmark_rw(&name, &id, for_good).await })
        })
    };
    // A wait dropped while its mark may be on its way on the attempt's
    // connection removes it on another: for good, so that the mark cannot
    // land after its removal.
    let mark = WaitMark::new(access, arrival, removal(false)).with_drop_removal(removal(true));
    acquire_by_polling(req, Some(wake), |_| {
        attempt(lock, req, access, arrival, Some(&mark))
    })
    .await
}

/// How reader-writer lock `name` is held now on `lock` (its row probed
/// without waiting), the latest write's token and the live marks of
/// waiting writers. A writer is listed with the token; readers are not
/// (the server does not tell how many share the row).
pub(crate) async fn inspect<D: Dialect>(
    lock: &SqlLock<D>,
    name: &str,
) -> Result<RwLockInfo, LockError> {
    let dialect = lock.dialect();
    let (mode, marks) = dialect.rw_state(name, now_ms()).await?;
    let token = match dialect.core().fencing {
        true => dialect
            .latest_grant(&counter_key(name))
            .await?
            .map(|(token, _)| token),
        false => None,
    };
    let mut info = RwLockInfo::free()
        .with_fencing_token(token)
        .with_waiting(Some(marks), None);
    info.mode = mode;
    if mode == Some(Access::Write) {
        info.holders = vec![RwHolderInfo::new(Access::Write).with_fencing_token(token)];
    }
    Ok(info)
}
