//! A waiter's place in the file's line of waiters: a ticket row with a
//! heartbeat, taken when the lock is found held, kept while the waiter
//! polls, deleted when it is served or leaves.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::LockError;
use sqlx::AssertSqlSafe;
use tokio::time::Instant;

use super::lock::{BACKEND, Inner, ms, now_ms};
use crate::error::map_sqlx;

/// A waiter's ticket whose heartbeat is older than this is a dead waiter's
/// (a crashed or frozen process) and no longer holds its place.
pub(crate) const TICKET_STALE: Duration = Duration::from_secs(3);

/// How often a waiter refreshes its ticket's heartbeat.
const TICKET_REFRESH: Duration = Duration::from_secs(1);

/// A waiting `acquire`'s place in the file's queue of waiters: taken when
/// it first finds the lock held, kept alive while it polls, and deleted
/// when it is served (in the granting transaction) or leaves (on drop, in
/// the background).
pub(crate) struct Ticket {
    inner: Arc<Inner>,
    place: Arc<Mutex<Place>>,
}

/// What a [`Ticket`] knows of its row, shared with the task taking it.
#[derive(Default)]
struct Place {
    /// The ticket number and when its heartbeat was last written.
    taken: Option<(i64, Instant)>,
    /// The waiter left: a ticket being taken now is rolled back, never
    /// committed.
    left: bool,
}

impl Ticket {
    pub(crate) fn new(inner: &Arc<Inner>) -> Self {
        Ticket {
            inner: Arc::clone(inner),
            place: Arc::default(),
        }
    }

    /// For a test: whether anyone but the caller (the ticket, or a task
    /// still taking its row) has the ticket's place.
    #[cfg(test)]
    pub(crate) fn place_in_use(&self) -> impl Fn() -> bool + use<> {
        let place = Arc::clone(&self.place);
        move || Arc::strong_count(&place) > 1
    }

    fn place(&self) -> std::sync::MutexGuard<'_, Place> {
        lock_place(&self.place)
    }

    pub(crate) fn number(&self) -> Option<i64> {
        self.place().taken.map(|(n, _)| n)
    }

    /// Take a ticket if we have none; refresh its heartbeat if due.
    pub(crate) async fn keep(&self, name: &str) -> Result<(), LockError> {
        let failed = |e| map_sqlx(BACKEND, "queueing for a lock", e);
        let alive_until = now_ms().saturating_add(ms(TICKET_STALE));
        let current = self.place().taken;
        match current {
            None => self.take(name, alive_until).await?,
            Some((n, at)) if at.elapsed() >= TICKET_REFRESH => {
                let done = sqlx::query(AssertSqlSafe(self.inner.sql.refresh_ticket.as_str()))
                    .bind(n)
                    .bind(alive_until)
                    .execute(&self.inner.pool)
                    .await
                    .map_err(failed)?;
                // A ticket swept as stale (we were frozen): take a new one.
                self.place().taken = (done.rows_affected() == 1).then(|| (n, Instant::now()));
                if done.rows_affected() == 0 {
                    Box::pin(self.keep(name)).await?;
                }
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// Insert a ticket row in a task of its own, in a transaction that
    /// commits only if the waiter is still there once the row is written:
    /// a waiter dropped while the INSERT is under way (waiting for SQLite's
    /// write lock, say) cannot learn the number, and its row must never be
    /// seen, or a newcomer would find the line taken by nobody. From the
    /// moment the number is recorded the waiter owns the row, and a waiter
    /// dropped during the commit deletes it as any other ticket.
    async fn take(&self, name: &str, alive_until: i64) -> Result<(), LockError> {
        let (inner, place) = (Arc::clone(&self.inner), Arc::clone(&self.place));
        let name = name.to_owned();
        let taking = tokio::spawn(async move {
            let mut tx = inner.pool.begin_with("BEGIN IMMEDIATE").await?;
            let n: i64 = sqlx::query_scalar(AssertSqlSafe(inner.sql.take_ticket.as_str()))
                .bind(&name)
                .bind(alive_until)
                .fetch_one(&mut *tx)
                .await?;
            let left = {
                let mut place = lock_place(&place);
                if !place.left {
                    place.taken = Some((n, Instant::now()));
                }
                place.left
            };
            if left {
                return tx.rollback().await;
            }
            let committed = tx.commit().await;
            if committed.is_err() {
                let mut place = lock_place(&place);
                if place.taken.is_some_and(|(t, _)| t == n) {
                    place.taken = None;
                }
            }
            committed
        });
        match taking.await {
            Ok(taken) => taken.map_err(|e| map_sqlx(BACKEND, "queueing for a lock", e)),
            Err(e) => Err(LockError::Unavailable {
                backend: BACKEND,
                reason: format!("taking a place in line ended early: {e}"),
                source: None,
            }),
        }
    }

    /// The grant deleted the ticket.
    pub(crate) fn served(&self) {
        self.place().taken.take();
    }

    /// Leave the line: from now on no ticket is kept; the one held, if any
    /// (not served), is returned for deletion.
    fn quit(&self) -> Option<i64> {
        let mut place = self.place();
        place.left = true;
        place.taken.take().map(|(n, _)| n)
    }

    /// Delete the ticket, if it is still ours (not served).
    pub(crate) async fn leave(self) {
        if let Some(n) = self.quit() {
            forget_ticket(&self.inner, n).await;
        }
    }
}

fn lock_place(place: &Mutex<Place>) -> std::sync::MutexGuard<'_, Place> {
    place.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for Ticket {
    /// A waiter dropped mid-wait leaves the line in the background.
    fn drop(&mut self) {
        let Some(n) = self.quit() else {
            return;
        };
        let inner = Arc::clone(&self.inner);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { forget_ticket(&inner, n).await });
        }
    }
}

/// Delete ticket `n`, and any ticket long stale, through `conn`.
pub(crate) async fn drop_ticket<'c, E>(inner: &Inner, conn: E, n: i64) -> Result<(), sqlx::Error>
where
    E: sqlx::Executor<'c, Database = sqlx::Sqlite>,
{
    sqlx::query(AssertSqlSafe(inner.sql.drop_ticket.as_str()))
        .bind(n)
        .bind(now_ms() - ms(TICKET_STALE) * 10)
        .execute(conn)
        .await
        .map(drop)
}

/// [`drop_ticket`] outside any transaction; a failure leaves the ticket to
/// go stale by itself.
async fn forget_ticket(inner: &Inner, n: i64) {
    if let Err(e) = drop_ticket(inner, &inner.pool, n).await {
        tracing::debug!(target: "distlock", error = %e, "leaving the waiters' line failed; the ticket goes stale by itself");
    }
}
