//! SQLite's batched writes for held leases: the extends (the watchdog's
//! renewals) and the releases that arrive together share one `BEGIN
//! IMMEDIATE` transaction, so one commit (and, where commits are flushed,
//! one fsync of the WAL) serves them all, and within it one statement
//! serves up to [`CHUNK`] leases. Without it a client holding thousands of
//! renewed locks spends the file's single write lock on one commit per
//! renewal, falls behind, and its leases run out. A batch of one is a
//! single statement.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::{BatchFn, Batcher};
use sqlx::AssertSqlSafe;
use sqlx::query::QueryScalar;
use sqlx::sqlite::{Sqlite, SqliteArguments, SqlitePool};

use super::gate::WriteGate;
use crate::error::map_sqlx;
use crate::ident::Identifier;

/// The most leases one transaction touches.
const MAX_BATCH: usize = 1024;

/// The leases one statement touches; a shorter chunk is padded with NULL
/// rows (which match nothing), so each statement has one fixed text.
const CHUNK: usize = 64;

/// One held lease, as the batched statements bind it.
pub(crate) struct Held {
    pub(crate) name: String,
    pub(crate) owner_hex: String,
}

/// An extend: the lease and its new length.
pub(crate) struct Extension {
    pub(crate) held: Held,
    pub(crate) ttl: Duration,
}

/// Where batches write: the pool, and this process's write turns for the
/// file (batches go ahead of acquisitions).
#[derive(Clone)]
pub(crate) struct Writes {
    pub(crate) backend: &'static str,
    pub(crate) pool: SqlitePool,
    pub(crate) gate: Arc<WriteGate>,
}

type Scalar<'q> = QueryScalar<'q, Sqlite, String, SqliteArguments>;

/// How a batch's statement takes its items.
struct Shape<I> {
    /// The statement for [`CHUNK`] items: a CTE `b` of one row per item,
    /// then the transaction's clock (Unix ms) as the last parameter;
    /// answers the names it changed.
    sql: String,
    /// The same for one item, bound the same way, as a plain statement: a
    /// batch of one runs it on its own, without a transaction around it
    /// (one round trip to SQLite's thread instead of three, no padding).
    single: String,
    /// Binds one item, given the clock.
    bind: for<'q> fn(Scalar<'q>, &'q I, i64) -> Scalar<'q>,
    /// Binds one NULL row.
    pad: for<'q> fn(Scalar<'q>) -> Scalar<'q>,
    /// The item's lock name.
    name: fn(&I) -> &str,
}

/// `rows` rows of `columns` parameters each.
fn values(columns: usize, rows: usize) -> String {
    let row = format!("({})", vec!["?"; columns].join(", "));
    vec![row; rows].join(", ")
}

/// Extends each lease still held by its owner to now + its TTL; each item
/// answers whether its lease was still ours.
pub(crate) fn extends(to: Writes, table: &Identifier) -> Batcher<Extension, bool> {
    let t = table.as_str();
    let sql = |rows: usize| {
        format!(
            "WITH b(name, owner, ttl) AS (VALUES {}) \
             UPDATE \"{t}\" SET expires_at_ms = ?{now} + \
             (SELECT b.ttl FROM b WHERE b.name = \"{t}\".name) \
             WHERE name IN (SELECT name FROM b) AND (name, owner) IN (SELECT name, owner FROM b) \
             AND expires_at_ms > ?{now} RETURNING name",
            values(3, rows),
            now = 3 * rows + 1,
        )
    };
    let shape = Shape {
        sql: sql(CHUNK),
        single: format!(
            "UPDATE \"{t}\" SET expires_at_ms = ?4 + ?3 \
             WHERE name = ?1 AND owner = ?2 AND expires_at_ms > ?4 RETURNING name"
        ),
        bind: |q, x: &Extension, _now| {
            q.bind(&x.held.name)
                .bind(&x.held.owner_hex)
                .bind(super::lock::ms(x.ttl))
        },
        pad: |q| {
            q.bind(None::<String>)
                .bind(None::<String>)
                .bind(None::<i64>)
        },
        name: |x| &x.held.name,
    };
    batched(to, "extending locks", shape)
}

/// Frees each lease still held by its owner; each item answers whether its
/// lease was still ours.
pub(crate) fn releases(to: Writes, table: &Identifier) -> Batcher<Held, bool> {
    let t = table.as_str();
    let sql = |rows: usize| {
        format!(
            "WITH b(name, owner) AS (VALUES {}) \
             UPDATE \"{t}\" SET owner = NULL, expires_at_ms = 0 \
             WHERE name IN (SELECT name FROM b) AND (name, owner) IN (SELECT name, owner FROM b) \
             AND expires_at_ms > ?{now} RETURNING name",
            values(2, rows),
            now = 2 * rows + 1,
        )
    };
    let shape = Shape {
        sql: sql(CHUNK),
        single: format!(
            "UPDATE \"{t}\" SET owner = NULL, expires_at_ms = 0 \
             WHERE name = ?1 AND owner = ?2 AND expires_at_ms > ?3 RETURNING name"
        ),
        bind: |q, x: &Held, _now| q.bind(&x.name).bind(&x.owner_hex),
        pad: |q| q.bind(None::<String>).bind(None::<String>),
        name: |x| &x.name,
    };
    batched(to, "releasing locks", shape)
}

/// One transaction running `shape`'s statement on chunks of the items. A
/// name appears at most once per chunk (a stale release beside the live
/// one goes in a later chunk), so the names changed tell the items apart.
fn batched<I: Send + Sync + 'static>(
    to: Writes,
    doing: &'static str,
    shape: Shape<I>,
) -> Batcher<I, bool> {
    let backend = to.backend;
    let shape = Arc::new(shape);
    let run: BatchFn<I, bool> = Arc::new(move |items: Vec<I>| {
        let (to, shape) = (to.clone(), Arc::clone(&shape));
        Box::pin(async move {
            let failed = |e| map_sqlx(to.backend, doing, e);
            let _turn = to.gate.urgent().await;
            if let [item] = items.as_slice() {
                let now = super::lock::now_ms();
                let query = sqlx::query_scalar(AssertSqlSafe(shape.single.as_str()));
                let changed: Option<String> = (shape.bind)(query, item, now)
                    .bind(now)
                    .fetch_optional(&to.pool)
                    .await
                    .map_err(failed)?;
                return Ok(vec![changed.is_some()]);
            }
            let mut tx = to
                .pool
                .begin_with("BEGIN IMMEDIATE")
                .await
                .map_err(failed)?;
            let now = super::lock::now_ms();
            let mut out = vec![false; items.len()];
            let mut pending: Vec<usize> = (0..items.len()).collect();
            while !pending.is_empty() {
                let mut names = HashSet::new();
                let (mut chunk, mut later) = (Vec::new(), Vec::new());
                for i in pending {
                    if chunk.len() < CHUNK && names.insert((shape.name)(&items[i])) {
                        chunk.push(i);
                    } else {
                        later.push(i);
                    }
                }
                let mut query = sqlx::query_scalar(AssertSqlSafe(shape.sql.as_str()));
                for &i in &chunk {
                    query = (shape.bind)(query, &items[i], now);
                }
                for _ in chunk.len()..CHUNK {
                    query = (shape.pad)(query);
                }
                let changed: HashSet<String> = query
                    .bind(now)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(failed)?
                    .into_iter()
                    .collect();
                for &i in &chunk {
                    out[i] = changed.contains((shape.name)(&items[i]));
                }
                pending = later;
            }
            tx.commit().await.map_err(failed)?;
            Ok(out)
        })
    });
    Batcher::new(backend, MAX_BATCH, run)
}
