//! Semaphores on the session-lock engine (Postgres, MySQL/MariaDB), written
//! once; a [`Dialect`] gives the statements.
//!
//! **Rows.** Table `{t}_permits` has a row per `(name, slot)` and a row
//! `(name, -1)`, each carrying the name's limit (`lim`). A permit is an
//! open transaction on a connection of its own that holds one slot row
//! locked (`FOR UPDATE`), in either mode of the lock (advisory locks have
//! no "any one of N"). Taking a slot is one statement: the lowest slot
//! below the limit whose row nobody holds (`FOR UPDATE SKIP LOCKED`), with
//! the row's limit. The connection's end (a crash, a partition, the
//! server's idle bound on a hung holder) rolls the transaction back and
//! frees the slot, as for a row lock.
//!
//! **The limit.** Every row of a name carries the same limit, changed only
//! by a transaction that holds all of them (`FOR UPDATE NOWAIT`), which it
//! cannot while any permit is held. So the limit read from a locked slot
//! row is the limit every holder asked with: a request with another
//! limit is refused (`InvalidOptions` naming both) unless no permit is
//! held, when it sets its own. A name's rows are created by the same
//! transaction (its `-1` row first: two clients creating one name at once
//! take turns on it).
//!
//! **Tokens.** Each slot's token is drawn from the name's counters of the
//! locks ([`counter_key`]: the counters' epochs, no flush per grant), on
//! the side connection once the slot is held, with the holder record.
//!
//! **Waiters** poll (a release in this process wakes them at once): no
//! server wait covers "any one of N rows", so they are not served in
//! arrival order.

use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::{Attempt, Request, acquire_by_polling, limit_mismatch};
use lock_core::{
    Backoff, LockError, LockGuard, PermitInfo, SemaphoreCapabilities, SemaphoreInfo, Waiting,
};
use tokio::time::Instant;

use crate::engine::{Dialect, Kept, SqlLock, guard, holder_record};
use crate::held::DeadBudget;
use crate::transaction::TransactionHandle;

/// The largest semaphore limit.
pub(crate) const MAX_LIMIT: u32 = 1024;

/// What the session backends' semaphores guarantee beyond their locks'.
pub(crate) const SEMAPHORE: SemaphoreCapabilities =
    SemaphoreCapabilities::new(MAX_LIMIT).with_waiting(Waiting::Polling);

/// How many times a request whose limit differs from the rows' (or whose
/// name has no rows yet) tries to set its own before it is refused: every
/// try counts, whether another client's permits kept it from setting the
/// limit or another client set its own limit again before this one could
/// take a slot, so that two clients asking with two limits cannot undo
/// each other's for ever.
const LIMIT_TRIES: u32 = 5;

/// The pause before the next look after try `n` at setting a limit.
fn limit_backoff() -> Backoff {
    Backoff::default()
        .with_initial(Duration::from_millis(5))
        .with_max(Duration::from_millis(80))
}

/// What a dialect's attempt at a slot found
/// ([`Dialect::take_slot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// The slot, locked in the permit's open transaction.
    Slot(u32),
    /// Every slot below the limit is held.
    Full,
    /// The name's rows carry another limit.
    OtherLimit(u32),
    /// The name has no rows yet.
    Missing,
}

/// The counter a permit on `slot` of semaphore `name` draws its tokens
/// from, among the locks' counters: a control character (no lock name
/// begins so by accident), the slot and the SHA-256 of the name, so it
/// fits the counters' key whatever the name's length.
pub(crate) fn counter_key(name: &str, slot: u32) -> String {
    use sha2::Digest;
    format!(
        "\u{1}permit:{slot}:{}",
        hex::encode(sha2::Sha256::digest(name.as_bytes()))
    )
}

/// The key this process's wake-ups use for semaphore `name` (apart from
/// the lock of that name).
fn wake_key(name: &str) -> String {
    format!("\u{0}permits\u{0}{name}")
}

/// One attempt at a permit of `req.name` among `limit` on `lock`.
pub(crate) async fn attempt<D: Dialect>(
    lock: &SqlLock<D>,
    req: Request<'_>,
    limit: u32,
) -> Result<Attempt, LockError> {
    let dialect = lock.dialect();
    let core = dialect.core();
    let backend = D::CAPABILITIES.backend;
    let (name, opts) = (req.name, req.opts);
    let mut pinned = core
        .pool
        .pinned()
        .await
        .map_err(|e| e.into_error(backend, "acquiring a permit"))?;
    let sent_at = Instant::now();
    let mut dead = DeadBudget::new();
    let mut tries = 0;
    let slot = loop {
        let found = match dialect
            .take_slot(&mut pinned, name, limit, opts.ttl)
            .await?
        {
            Ok(found) => found,
            Err(e) if !crate::error::connection_lost(&e) => {
                return Err(dialect.permit_error(e));
            }
            // A pooled connection that died while idle is replaced.
            Err(e) => {
                core.pool
                    .replace_if_dead(&mut pinned, e, &mut dead, backend)
                    .await?;
                continue;
            }
        };
        let held = match found {
            Found::Slot(slot) => break slot,
            Found::Full => {
                dialect.put_back_permit(pinned).await;
                return Ok(Attempt::Held { expires_in: None });
            }
            Found::OtherLimit(held) => Some(held),
            Found::Missing => None,
        };
        if tries >= LIMIT_TRIES {
            dialect.put_back_permit(pinned).await;
            return match held {
                Some(held) => Err(limit_mismatch(name, limit, held)),
                // Another client creates the name's rows: as if held.
                None => Ok(Attempt::Held { expires_in: None }),
            };
        }
        tries += 1;
        let conn = pinned.conn(backend)?;
        let set = dialect
            .set_limit(conn, name, limit)
            .await
            .map_err(|e| dialect.permit_error(e))?;
        // The usual way in for a new name: its rows made, a slot next.
        if set && tries == 1 {
            continue;
        }
        // Someone holds a permit with the other limit, or another client
        // sets its limit now (perhaps over ours): look again after a
        // moment, jittered, so that two such clients fall out of step.
        tokio::time::sleep(limit_backoff().delay(tries)).await;
    };
    let record = holder_record(core, req);
    let counter = counter_key(name, slot);
    let handle = Arc::new(TransactionHandle::new(
        Arc::clone(lock.dialect_arc()),
        name,
        wake_key(name),
        pinned,
    ));
    let token = match core.fencing {
        true => {
            let bytes = record.as_ref().map_or(&[][..], |r| r.as_bytes());
            match dialect.draw_on_side(&counter, bytes).await {
                Ok(token) => token,
                Err(e) => {
                    // The slot goes with its connection.
                    handle.close().await;
                    return Err(e);
                }
            }
        }
        false => 0,
    };
    let kept = Kept {
        counter: &counter,
        slot: Some(slot),
    };
    let guard = guard(lock, req, handle, (token, sent_at), record, kept).await?;
    Ok(Attempt::Acquired(guard))
}

/// Wait for a permit on `lock`, polling; a release in this process wakes
/// the wait at once.
pub(crate) async fn wait<D: Dialect>(
    lock: &SqlLock<D>,
    req: Request<'_>,
    limit: u32,
) -> Result<Option<LockGuard>, LockError> {
    let wake = lock.dialect().core().wakeups.subscribe(&wake_key(req.name));
    acquire_by_polling(req, Some(wake), |_| attempt(lock, req, limit)).await
}

/// The limit and the permits held now on `lock`: the slots whose rows are
/// locked, each with its counter's latest token and holder record (a
/// grant still drawing its token shows its slot's previous one).
pub(crate) async fn inspect<D: Dialect>(
    lock: &SqlLock<D>,
    name: &str,
) -> Result<SemaphoreInfo, LockError> {
    let dialect = lock.dialect();
    let Some((limit, slots)) = dialect.held_slots(name).await? else {
        return Ok(SemaphoreInfo::free());
    };
    if slots.is_empty() {
        return Ok(SemaphoreInfo::free());
    }
    let backend = D::CAPABILITIES.backend;
    let mut permits = Vec::with_capacity(slots.len());
    for slot in slots {
        let mut permit = PermitInfo::new(slot);
        if dialect.core().fencing
            && let Some((token, record)) = dialect.latest_grant(&counter_key(name, slot)).await?
        {
            let holder = record
                .filter(|r| !r.is_empty())
                .map(|r| lock_core::raw::HolderRecord::decode_for(backend, name, &r))
                .transpose()?;
            permit = permit.with_fencing_token(Some(token)).with_holder(holder);
        }
        permits.push(permit);
    }
    Ok(SemaphoreInfo::held(limit, permits))
}
