//! The session-lock benchmark body, written once for Postgres and
//! MySQL/MariaDB, in interleaved blocks (`lock_testkit::bench::cycles`):
//! distlock in row and advisory mode, with and without the guard's
//! renewal, against the dialect's hand-written floors on plain sqlx (the
//! cheapest lock whose fencing token survives a crash of the server as
//! distlock's does, drawing it from the same counters, and the plain lock
//! a user writes without a token), and a permit of a semaphore of 4
//! against the hand-written permit with the same guarantees (the lowest
//! free slot row locked `FOR UPDATE SKIP LOCKED` with its limit, the
//! slot's token drawn beside the transaction), lock sets in advisory mode,
//! and reader-writer grants (row mode) against the hand-written
//! reader-writer lock with the same guarantees and against the lock; then
//! contended hand-offs with 8 clients, and 8 clients reading 90 % of the
//! time against writing only.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{Access, DistributedLock, LockOptions, Wait};
use lock_testkit::bench::cycles::{Cycles, RW_READ, RW_WRITE};
use lock_testkit::bench::{contend_on, print_handoff_round_trips, print_runs, print_rw_mix};

/// Cycles per variant in a block, and rounds of blocks (after one to warm up).
const BLOCK: usize = 50;
const ROUNDS: usize = 20;
const RTT: &str = "round trip: SELECT 1";
const ROW_FLOOR: &str = "row floor: BEGIN; FOR UPDATE; token upsert; ROLLBACK";
pub(crate) const ROW: &str = "distlock row, auto-renew off";
pub(crate) const ROW_RENEWED: &str = "distlock row acquire + release";
const ADVISORY: &str = "distlock advisory, auto-renew off";
const ADVISORY_RENEWED: &str = "distlock advisory acquire + release";
const ROW_PLAIN_FLOOR: &str = "row, no token: BEGIN; FOR UPDATE; ROLLBACK";
const ADVISORY_FLOOR: &str = "advisory floor: lock and token upsert; unlock";
const ADVISORY_PLAIN_FLOOR: &str = "advisory, no token: lock; unlock";
const ROW_PLAIN: &str = "distlock row, fencing=false";
const ADVISORY_PLAIN: &str = "distlock advisory, fencing=false";
const PERMIT_FLOOR: &str =
    "permit floor: BEGIN; lowest free slot FOR UPDATE SKIP LOCKED; token upsert; ROLLBACK";
const PERMIT: &str = "distlock permit of 4, auto-renew off";
const RW_READ_FLOOR: &str =
    "read floor: BEGIN; no writer's mark; FOR SHARE NOWAIT; latest token; ROLLBACK";
const RW_WRITE_FLOOR: &str = "write floor: BEGIN; FOR UPDATE NOWAIT; token upsert; ROLLBACK";
/// The reader-writer lock whose row the floors lock (made by distlock).
pub(crate) const RW_FLOOR_NAME: &str = "bench/rw-floor";
/// The semaphore's limit in the permit cycles.
pub(crate) const PERMITS: u32 = 4;
/// The semaphore whose rows the permit floor locks (made by distlock).
pub(crate) const PERMIT_FLOOR_NAME: &str = "bench/permit-floor";
const TASKS: usize = 8;
const RUN: Duration = Duration::from_secs(4);
const WORK: Duration = Duration::from_millis(1);

/// The counter reader-writer lock `name` draws its write tokens from, as
/// distlock names it (`lock-sql/src/rw.rs`).
pub(crate) fn rw_counter(name: &str) -> String {
    use sha2::Digest;
    format!(
        "\u{1}rw:{}",
        hex::encode(sha2::Sha256::digest(name.as_bytes()))
    )
}

/// Milliseconds since the Unix epoch by this machine's clock, as the
/// writers' marks count.
pub(crate) fn now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// A dialect's hand-written locks on plain connections: the floors
/// distlock is compared with.
pub(crate) trait Floors {
    /// One round trip.
    async fn ping(&mut self);
    /// The cheapest row lock with a token that survives a crash, on
    /// `name`'s row (the token drawn from distlock's counters).
    async fn fenced_row(&mut self, name: &str);
    /// The cheapest advisory lock with a token that survives a crash (the
    /// server's advisory lock and the token's upsert in one statement, the
    /// unlock).
    async fn fenced_advisory(&mut self, name: &str);
    /// The row lock without a token.
    async fn row_plain(&mut self, name: &str);
    /// The advisory lock without a token.
    async fn advisory_plain(&mut self, name: &str);
    /// The cheapest permit of [`PERMITS`] with distlock's guarantees, on
    /// the rows distlock made for semaphore `name`: in a transaction, the
    /// lowest free slot below the limit locked with its row's limit
    /// (checked), the slot's token upserted on the other connection, the
    /// transaction's end.
    async fn fenced_permit(&mut self, name: &str);

    /// The cheapest reader-writer lock with distlock's guarantees, on the
    /// row distlock made for reader-writer lock `name`: in a transaction,
    /// a reader looks for a waiting writer's live mark (writer preference),
    /// then shares the row without waiting and reads the latest write's
    /// token; a writer holds the row alone without waiting and draws its
    /// token on the other connection; then the transaction's end.
    async fn rw(&mut self, name: &str, access: Access);

    /// Cycles of the dialect's own, measured in every round after the
    /// floors.
    async fn more(&mut self, m: &mut Cycles) {
        let _ = m;
    }

    /// Comparisons (ours, baseline) of the dialect's own cycles.
    fn more_comparisons(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }
}

/// Measure distlock on the server at `url` (clients made by `connect`)
/// against `floors`, and print the report.
pub(crate) async fn run<L, F>(url: &str, connect: impl AsyncFn(&str) -> L, floors: &mut F)
where
    L: DistributedLock + 'static,
    F: Floors,
{
    let row = connect(url).await;
    let advisory = connect(&format!("{url}?mode=advisory")).await;
    let row_plain = connect(&format!("{url}?fencing=false")).await;
    let advisory_plain = connect(&format!("{url}?mode=advisory&fencing=false")).await;
    let opts = LockOptions::new().auto_renew(false).wait(Wait::Forever);
    // Create the rows the raw cycles lock.
    for name in ["bench/raw", "bench/row", "bench/row-plain"] {
        row.acquire(name, &opts)
            .await
            .expect("warm")
            .release()
            .await
            .expect("release");
    }
    // Create the permit floor's rows.
    let permit = opts.clone().permits(PERMITS);
    row.acquire(PERMIT_FLOOR_NAME, &permit)
        .await
        .expect("warm")
        .release()
        .await
        .expect("release");
    // Create the reader-writer floor's row and counter.
    row.acquire(RW_FLOOR_NAME, &opts.clone().access(Access::Write))
        .await
        .expect("warm")
        .release()
        .await
        .expect("release");
    let renewed = LockOptions::new().wait(Wait::Forever);
    let distlock: [(&str, &L, &str, &LockOptions); 6] = [
        (ROW, &row, "bench/row", &opts),
        (ROW_RENEWED, &row, "bench/row", &renewed),
        (ADVISORY, &advisory, "bench/advisory", &opts),
        (ADVISORY_RENEWED, &advisory, "bench/advisory", &renewed),
        (ROW_PLAIN, &row_plain, "bench/row-plain", &opts),
        (
            ADVISORY_PLAIN,
            &advisory_plain,
            "bench/advisory-plain",
            &opts,
        ),
    ];
    let mut m = Cycles::new(row.capabilities().backend, BLOCK);
    for round in 0..=ROUNDS {
        m.warm_up(round == 0);
        m.measure(RTT, async |_| floors.ping().await).await;
        m.measure(ROW_FLOOR, async |_| floors.fenced_row("bench/raw").await)
            .await;
        m.measure(ADVISORY_FLOOR, async |_| {
            floors.fenced_advisory("bench/raw").await
        })
        .await;
        floors.more(&mut m).await;
        m.measure(ROW_PLAIN_FLOOR, async |_| {
            floors.row_plain("bench/raw").await
        })
        .await;
        m.measure(ADVISORY_PLAIN_FLOOR, async |_| {
            floors.advisory_plain("bench/raw-plain").await
        })
        .await;
        for (label, lock, name, opts) in distlock {
            m.measure_lock(label, lock, name, opts).await;
        }
        m.measure(PERMIT_FLOOR, async |_| {
            floors.fenced_permit(PERMIT_FLOOR_NAME).await
        })
        .await;
        m.measure_lock(PERMIT, &row, "bench/permit", &permit).await;
        m.measure_sets(&advisory, "bench/set/", &opts).await;
        m.measure(RW_READ_FLOOR, async |_| {
            floors.rw(RW_FLOOR_NAME, Access::Read).await
        })
        .await;
        m.measure(RW_WRITE_FLOOR, async |_| {
            floors.rw(RW_FLOOR_NAME, Access::Write).await
        })
        .await;
        m.measure_rw(&row, "bench/rw", &opts).await;
    }
    m.print();
    let comparisons = [
        (ROW, ROW_FLOOR),
        (ROW_RENEWED, ROW_FLOOR),
        (ADVISORY, ADVISORY_FLOOR),
        (ADVISORY_RENEWED, ADVISORY_FLOOR),
        (ROW, ROW_PLAIN_FLOOR),
        (ADVISORY, ADVISORY_PLAIN_FLOOR),
        (ROW_PLAIN, ROW_PLAIN_FLOOR),
        (ADVISORY_PLAIN, ADVISORY_PLAIN_FLOOR),
        // What drawing a token costs a lock written by hand: the row the
        // grant writes (the name's counter and holder record).
        (ROW_FLOOR, ROW_PLAIN_FLOOR),
        (ADVISORY_FLOOR, ADVISORY_PLAIN_FLOOR),
        (PERMIT, PERMIT_FLOOR),
        (RW_READ, RW_READ_FLOOR),
        (RW_WRITE, RW_WRITE_FLOOR),
    ];
    for &(ours, floor) in comparisons.iter().chain(floors.more_comparisons()) {
        m.compare(ours, floor);
    }
    m.compare_sets();
    m.compare_rw(ROW);

    for (mode, base) in [
        ("row", url.to_string()),
        ("advisory", format!("{url}?mode=advisory")),
    ] {
        let mut clients = Vec::new();
        for _ in 0..TASKS {
            clients.push(Arc::new(connect(&base).await) as Arc<dyn DistributedLock>);
        }
        let o = LockOptions::new()
            .auto_renew(false)
            .wait_timeout(Duration::from_secs(30));
        let run = contend_on(clients, "bench/contended", o, WORK, Duration::ZERO, RUN).await;
        print_runs(
            &format!(
                "{TASKS} tasks, a client each, {mode} mode; 1 ms of work inside, re-acquire at once"
            ),
            RUN,
            &[("distlock", &run)],
        );
        if let Some(rtt) = m.figures(RTT) {
            print_handoff_round_trips(&[("distlock", &run)], rtt.wall.0);
        }
    }
    let mut clients = Vec::new();
    for _ in 0..TASKS {
        clients.push(Arc::new(connect(url).await) as Arc<dyn DistributedLock>);
    }
    let mix = LockOptions::new()
        .auto_renew(false)
        .wait_timeout(Duration::from_secs(30));
    print_rw_mix(
        row.capabilities().backend,
        clients,
        "bench/rw-mix",
        mix,
        RUN,
    )
    .await;
}
