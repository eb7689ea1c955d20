//! SQLite lock benchmark: distlock's lease-table lock against the lease
//! table a user writes by hand, in interleaved blocks
//! (`lock_testkit::bench::cycles`), on one file with commits flushed per
//! grant (`synchronous = FULL`, what fencing tokens needed before the
//! epoch) and without (`NORMAL`, distlock's default where the kernel tells
//! the boot id); and a permit of a semaphore of 4 against the permit table
//! a user writes by hand with the same guarantees; read and write grants
//! of a reader-writer lock against the reader-writer lease table a user
//! writes by hand with the same guarantees.
//!
//! ```sh
//! cargo bench -p lock-sql --features sqlite --bench sqlite
//! ```

use std::path::Path;
use std::time::Duration;

use std::sync::Arc;

use lock_core::{DistributedLock, LockOptions, Wait};
use lock_sql::{Identifier, SqliteConfig, SqliteLock};
use lock_testkit::bench::cycles::{Cycles, RW_READ, RW_WRITE};
use lock_testkit::bench::print_rw_mix;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

/// Cycles per variant in a block, and rounds of blocks (after one to warm up).
const BLOCK: usize = 50;
const ROUNDS: usize = 20;
const FLOOR_NORMAL: &str = "lease floor, NORMAL: upsert; release";
const FLOOR_FULL: &str = "lease floor, FULL: upsert; release";
const FLOOR_TX: &str =
    "lease floor, NORMAL, in a transaction: BEGIN IMMEDIATE; upsert; COMMIT; release";
const OURS: &str = "distlock, auto-renew off (NORMAL)";
const OURS_RENEWED: &str = "distlock acquire + release (NORMAL)";
const OURS_FULL: &str = "distlock on a FULL pool, auto-renew off";
const PERMIT_FLOOR: &str =
    "permit floor, NORMAL: BEGIN IMMEDIATE; limit check; lowest free slot upsert; COMMIT; release";
const OURS_PERMIT: &str = "distlock permit of 4, auto-renew off (NORMAL)";
/// The benchmark semaphore's limit.
const PERMITS: i64 = 4;
const RW_READ_FLOOR: &str =
    "read floor, NORMAL: BEGIN IMMEDIATE; guarded insert; counter read; COMMIT; release";
const RW_WRITE_FLOOR: &str =
    "write floor, NORMAL: BEGIN IMMEDIATE; guarded insert; counter upsert; COMMIT; release";

/// The hand-written reader-writer lock with distlock's guarantees: in one
/// `BEGIN IMMEDIATE` transaction, a lease row per holder inserted only if
/// no live lease conflicts (for a reader, also no live mark of a writer
/// that arrived before it: writer preference), then the write counter
/// raised (a writer, counted from the epoch) or read (a reader).
const RW_READ_GRANT: &str = "INSERT INTO bench_rw (name, owner, access, expires_at_ms, \
     arrival_ms, holder) SELECT ?1, ?2, 0, ?3, ?4, ?6 WHERE NOT EXISTS (SELECT 1 FROM bench_rw \
     WHERE name = ?1 AND expires_at_ms > ?5 AND (access = 1 OR (access = 2 AND arrival_ms <= ?4)))";
const RW_WRITE_GRANT: &str = "INSERT INTO bench_rw (name, owner, access, expires_at_ms, \
     arrival_ms, holder) SELECT ?1, ?2, 1, ?3, ?4, ?6 WHERE NOT EXISTS (SELECT 1 FROM bench_rw \
     WHERE name = ?1 AND expires_at_ms > ?5 AND access IN (0, 1))";
const RW_RAISE: &str = "INSERT INTO bench_rw_fence (name, fence) VALUES (?1, (?2 << 32) + 1) \
     ON CONFLICT(name) DO UPDATE SET fence = MAX(fence, ?2 << 32) + 1 RETURNING fence";
const RW_COUNTER: &str = "SELECT fence FROM bench_rw_fence WHERE name = ?1";
const RW_RELEASE: &str = "DELETE FROM bench_rw WHERE name = ?1 AND owner = ?2 \
     AND access IN (0, 1) AND expires_at_ms > ?3";

/// The hand-written permit with distlock's guarantees: in one `BEGIN
/// IMMEDIATE` transaction, refuse another limit than the live permits',
/// then take the lowest slot below the limit that no live lease holds and
/// bump its token (counted from the epoch), with the holder record.
const PERMIT_OTHER_LIMIT: &str = "SELECT lim FROM bench_permits WHERE name = ?1 \
     AND owner IS NOT NULL AND expires_at_ms > ?2 AND lim <> ?3 LIMIT 1";
const PERMIT_ACQUIRE: &str = "WITH RECURSIVE s(slot) AS (SELECT 0 UNION ALL \
     SELECT slot + 1 FROM s WHERE slot + 1 < ?3), \
     free AS (SELECT s.slot FROM s WHERE NOT EXISTS (SELECT 1 FROM bench_permits p \
     WHERE p.name = ?1 AND p.slot = s.slot AND p.owner IS NOT NULL AND p.expires_at_ms > ?2) \
     ORDER BY s.slot LIMIT 1) \
     INSERT INTO bench_permits (name, slot, owner, fence, expires_at_ms, lim, holder) \
     SELECT ?1, slot, ?4, (?7 << 32) + 1, ?5, ?3, ?6 FROM free WHERE true \
     ON CONFLICT(name, slot) DO UPDATE SET owner = excluded.owner, \
     fence = MAX(fence, ?7 << 32) + 1, expires_at_ms = excluded.expires_at_ms, \
     lim = excluded.lim, holder = excluded.holder RETURNING slot, fence";
const PERMIT_RELEASE: &str = "UPDATE bench_permits SET owner = NULL, expires_at_ms = 0 \
     WHERE name = ?1 AND slot = ?2 AND owner = ?3 AND expires_at_ms > ?4";

/// The hand-written lease-table lock with distlock's guarantees: a lease
/// that ends by itself, a token kept whole in the row and counted from the
/// epoch (read once, as distlock does), the holder record beside it; each
/// statement its own transaction.
const ACQUIRE: &str = "INSERT INTO bench_leases (name, owner, fence, expires_at_ms, holder) \
     VALUES (?1, ?2, (?5 << 32) + 1, ?3, ?6) \
     ON CONFLICT(name) DO UPDATE SET owner = excluded.owner, \
     fence = MAX(fence, ?5 << 32) + 1, expires_at_ms = excluded.expires_at_ms, \
     holder = excluded.holder \
     WHERE owner IS NULL OR expires_at_ms <= ?4 RETURNING fence";
const RELEASE: &str = "UPDATE bench_leases SET owner = NULL, expires_at_ms = 0 \
     WHERE name = ?1 AND owner = ?2 AND expires_at_ms > ?3";

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .expect("clock")
}

async fn pool(path: &Path, synchronous: SqliteSynchronous) -> SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(synchronous)
        .busy_timeout(Duration::from_secs(5));
    SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("pool")
}

/// One hand-written acquire and release of `name`; with `in_transaction`
/// the upsert runs in a `BEGIN IMMEDIATE` transaction, which is what makes
/// an acquisition cancel-safe (a release sent after a cancelled attempt
/// waits for its write lock), as distlock's is.
async fn floor(pool: &SqlitePool, name: &str, record: &[u8], in_transaction: bool) {
    let owner = format!("{:032x}", rand::random::<u128>());
    let now = now_ms();
    let acquire = sqlx::query_scalar::<_, i64>(ACQUIRE)
        .bind(name)
        .bind(&owner)
        .bind(now + 30_000)
        .bind(now)
        .bind(1_i64)
        .bind(record);
    let fence = if in_transaction {
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.expect("begin");
        let fence = acquire.fetch_optional(&mut *tx).await.expect("acquire");
        tx.commit().await.expect("commit");
        fence
    } else {
        acquire.fetch_optional(pool).await.expect("acquire")
    };
    assert!(fence.is_some(), "the floor's lock was free");
    let released = sqlx::query(RELEASE)
        .bind(name)
        .bind(&owner)
        .bind(now_ms())
        .execute(pool)
        .await
        .expect("release");
    assert_eq!(released.rows_affected(), 1);
}

/// One hand-written permit of `name`, taken and given back.
async fn permit_floor(pool: &SqlitePool, name: &str, record: &[u8]) {
    let owner = format!("{:032x}", rand::random::<u128>());
    let now = now_ms();
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.expect("begin");
    let other: Option<i64> = sqlx::query_scalar(PERMIT_OTHER_LIMIT)
        .bind(name)
        .bind(now)
        .bind(PERMITS)
        .fetch_optional(&mut *tx)
        .await
        .expect("limit check");
    assert!(other.is_none(), "one limit");
    let (slot, _fence): (i64, i64) = sqlx::query_as(PERMIT_ACQUIRE)
        .bind(name)
        .bind(now)
        .bind(PERMITS)
        .bind(&owner)
        .bind(now + 30_000)
        .bind(record)
        .bind(1_i64)
        .fetch_one(&mut *tx)
        .await
        .expect("a free slot");
    tx.commit().await.expect("commit");
    let released = sqlx::query(PERMIT_RELEASE)
        .bind(name)
        .bind(slot)
        .bind(&owner)
        .bind(now_ms())
        .execute(pool)
        .await
        .expect("release");
    assert_eq!(released.rows_affected(), 1);
}

/// One hand-written reader-writer grant of `name` (see [`RW_READ_GRANT`]),
/// taken and given back.
async fn rw_floor(pool: &SqlitePool, name: &str, record: &[u8], write: bool) {
    let owner = format!("{:032x}", rand::random::<u128>());
    let now = now_ms();
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.expect("begin");
    let granted = sqlx::query(if write { RW_WRITE_GRANT } else { RW_READ_GRANT })
        .bind(name)
        .bind(&owner)
        .bind(now + 30_000)
        .bind(now)
        .bind(now)
        .bind(record)
        .execute(&mut *tx)
        .await
        .expect("grant");
    assert_eq!(granted.rows_affected(), 1, "the floor's lock was free");
    let fence: Option<i64> = if write {
        sqlx::query_scalar(RW_RAISE)
            .bind(name)
            .bind(1_i64)
            .fetch_optional(&mut *tx)
            .await
            .expect("raise")
    } else {
        sqlx::query_scalar(RW_COUNTER)
            .bind(name)
            .fetch_optional(&mut *tx)
            .await
            .expect("counter")
    };
    assert!(!write || fence.is_some());
    tx.commit().await.expect("commit");
    let released = sqlx::query(RW_RELEASE)
        .bind(name)
        .bind(&owner)
        .bind(now_ms())
        .execute(pool)
        .await
        .expect("release");
    assert_eq!(released.rows_affected(), 1);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = tempfile::tempdir_in(std::env::current_dir().expect("cwd")).expect("temp dir");
    let path = dir.path().join("bench.db");
    let (normal, full) = (
        pool(&path, SqliteSynchronous::Normal).await,
        pool(&path, SqliteSynchronous::Full).await,
    );
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench_leases (name TEXT PRIMARY KEY NOT NULL, owner TEXT, \
         fence INTEGER NOT NULL DEFAULT 0, expires_at_ms INTEGER NOT NULL DEFAULT 0, holder BLOB) \
         WITHOUT ROWID",
    )
    .execute(&normal)
    .await
    .expect("floor table");
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench_permits (name TEXT NOT NULL, slot INTEGER NOT NULL, \
         owner TEXT, fence INTEGER NOT NULL DEFAULT 0, expires_at_ms INTEGER NOT NULL DEFAULT 0, \
         lim INTEGER NOT NULL DEFAULT 0, holder BLOB, PRIMARY KEY (name, slot)) WITHOUT ROWID",
    )
    .execute(&normal)
    .await
    .expect("permit floor table");
    for table in [
        "CREATE TABLE IF NOT EXISTS bench_rw (name TEXT NOT NULL, owner TEXT NOT NULL, \
         access INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL, arrival_ms INTEGER NOT NULL, \
         holder BLOB, PRIMARY KEY (name, owner)) WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS bench_rw_fence (name TEXT PRIMARY KEY, \
         fence INTEGER NOT NULL) WITHOUT ROWID",
    ] {
        sqlx::query(table)
            .execute(&normal)
            .await
            .expect("reader-writer floor table");
    }
    let ours = SqliteLock::open(&path, SqliteConfig::default())
        .await
        .expect("open");
    let ours_full = SqliteLock::with_pool(full.clone(), Identifier::default_table())
        .await
        .expect("with_pool");
    let record = LockOptions::new().holder_record().as_bytes().to_vec();
    let opts = LockOptions::new().auto_renew(false).wait(Wait::Forever);
    let renewed = LockOptions::new().wait(Wait::Forever);
    let permit = opts.clone().permits(PERMITS as u32);
    let mut m = Cycles::new("sqlite", BLOCK);
    for round in 0..=ROUNDS {
        m.warm_up(round == 0);
        m.measure(FLOOR_NORMAL, async |_| {
            floor(&normal, "bench/floor", &record, false).await
        })
        .await;
        m.measure(FLOOR_TX, async |_| {
            floor(&normal, "bench/floor", &record, true).await
        })
        .await;
        m.measure(FLOOR_FULL, async |_| {
            floor(&full, "bench/floor", &record, false).await
        })
        .await;
        m.measure_lock(OURS, &ours, "bench/ours", &opts).await;
        m.measure_lock(OURS_RENEWED, &ours, "bench/ours", &renewed)
            .await;
        m.measure_lock(OURS_FULL, &ours_full, "bench/ours", &opts)
            .await;
        m.measure(PERMIT_FLOOR, async |_| {
            permit_floor(&normal, "bench/permit-floor", &record).await
        })
        .await;
        m.measure_lock(OURS_PERMIT, &ours, "bench/permit", &permit)
            .await;
        m.measure_sets(&ours, "bench/set/", &opts).await;
        m.measure(RW_READ_FLOOR, async |_| {
            rw_floor(&normal, "bench/rw-floor", &record, false).await
        })
        .await;
        m.measure(RW_WRITE_FLOOR, async |_| {
            rw_floor(&normal, "bench/rw-floor", &record, true).await
        })
        .await;
        m.measure_rw(&ours, "bench/rw", &opts).await;
    }
    m.print();
    for (a, b) in [
        (OURS, FLOOR_NORMAL),
        (OURS_RENEWED, FLOOR_NORMAL),
        (OURS, FLOOR_TX),
        (OURS_RENEWED, FLOOR_TX),
        (FLOOR_TX, FLOOR_NORMAL),
        (OURS_FULL, FLOOR_FULL),
        (OURS, OURS_FULL),
        (FLOOR_NORMAL, FLOOR_FULL),
        (OURS_PERMIT, PERMIT_FLOOR),
        (OURS_PERMIT, OURS),
        (RW_READ, RW_READ_FLOOR),
        (RW_WRITE, RW_WRITE_FLOOR),
    ] {
        m.compare(a, b);
    }
    m.compare_sets();
    m.compare_rw(OURS);
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(Arc::new(ours.clone()) as Arc<dyn DistributedLock>);
    }
    let mix = LockOptions::new()
        .auto_renew(false)
        .wait_timeout(Duration::from_secs(30));
    print_rw_mix(
        "sqlite",
        clients,
        "bench/rw-mix",
        mix,
        Duration::from_secs(4),
    )
    .await;
}
