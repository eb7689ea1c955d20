//! Uncontended cycles of several variants of one lock (the hand-written
//! floor, a peer library, distlock with and without renewal) measured side
//! by side: in rounds, each variant running a block of cycles in turn, so
//! that all of them see the same machine and server. For each variant it
//! reports wall time per cycle (p50, p99), the client process's CPU time
//! per cycle, and the TCP segments per cycle on this host (client and
//! server both, read from `/proc/net/snmp`: the round trips a cycle costs),
//! and for chosen pairs the ratios.
//!
//! ```no_run
//! # async fn demo() {
//! use lock_testkit::bench::cycles::Cycles;
//! let mut m = Cycles::new("example", 100);
//! for round in 0..=10 {
//!     m.warm_up(round == 0);
//!     m.measure("floor", async |_| { /* the hand-written cycle */ }).await;
//!     m.measure("distlock", async |_| { /* acquire + release */ }).await;
//! }
//! m.print();
//! m.compare("distlock", "floor");
//! # }
//! ```
//!
//! CPU time is the whole process's (every runtime thread, so a watchdog's
//! work counts), summed over a block and divided by its cycles; the figure
//! is the median over blocks. Segments are counted host-wide, so other
//! traffic can only add to them: the figure is the smallest over blocks.

use std::time::{Duration, Instant};

use lock_core::{Access, DistributedLock, LockOptions, LockSetExt};
use rustix::time::{ClockId, clock_gettime};

use super::{percentiles, us};

/// How many names the lock-set cycles take ([`Cycles::measure_sets`]).
pub const SET_NAMES: usize = 8;
/// The label of a set of [`SET_NAMES`] names taken by `try_acquire_all`
/// and released.
pub const SET_ALL: &str = "lock set: try_acquire_all of 8 names + release";
/// The label of the same names taken by one `try_acquire` each, one after
/// another, and released one by one.
pub const SET_SINGLES: &str = "8 try_acquire + 8 release, one by one";
/// The label of the set taken by `try_acquire_all` name by name, in
/// order, where the backend would take it in one request
/// ([`Capabilities::atomic_sets`](lock_core::Capabilities::atomic_sets)
/// said 0), and released.
pub const SET_ORDERED: &str = "lock set: try_acquire_all name by name + release";

/// The label of a reader-writer lock taken for reading and released
/// ([`Cycles::measure_rw`]).
pub const RW_READ: &str = "reader-writer lock: acquire_read + release";
/// The label of a reader-writer lock taken for writing and released.
pub const RW_WRITE: &str = "reader-writer lock: acquire_write + release";

/// One variant's samples.
struct Variant {
    label: String,
    /// Cycles run so far, warm-up included (the index handed to the cycle).
    cycles: usize,
    /// Wall time of every recorded cycle.
    wall: Vec<Duration>,
    /// Process CPU time per cycle, one figure per recorded block.
    cpu: Vec<Duration>,
    /// TCP segments per cycle, one figure per recorded block.
    segments: Vec<f64>,
}

/// The figures of one variant: see the module's documentation.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// p50 and p99 wall time of a cycle.
    pub wall: (Duration, Duration),
    /// Client CPU time per cycle (median over blocks).
    pub cpu: Duration,
    /// TCP segments per cycle, both directions (smallest over blocks); NaN
    /// where the host does not say.
    pub segments: f64,
}

/// Variants of an uncontended cycle, measured in interleaved blocks.
pub struct Cycles {
    title: String,
    block: usize,
    warm_up: bool,
    variants: Vec<Variant>,
}

impl Cycles {
    /// Measurements titled `title`, `block` cycles of a variant at a time.
    pub fn new(title: impl Into<String>, block: usize) -> Self {
        Cycles {
            title: title.into(),
            block: block.max(1),
            warm_up: false,
            variants: Vec::new(),
        }
    }

    /// Whether the blocks measured from now on only warm up (connections,
    /// caches, the server's plans) and are left out of the figures.
    pub fn warm_up(&mut self, warm_up: bool) {
        self.warm_up = warm_up;
    }

    /// Run one block of the variant `label` (created on first use): `cycle`
    /// is called with a number that is new for every cycle of the variant
    /// and does one whole cycle (acquire and release). A cycle that fails
    /// should panic: a benchmark measures only cycles that worked.
    pub async fn measure(&mut self, label: &str, mut cycle: impl AsyncFnMut(usize)) {
        let at = match self.variants.iter().position(|v| v.label == label) {
            Some(at) => at,
            None => {
                self.variants.push(Variant {
                    label: label.to_string(),
                    cycles: 0,
                    wall: Vec::new(),
                    cpu: Vec::new(),
                    segments: Vec::new(),
                });
                self.variants.len() - 1
            }
        };
        let variant = &mut self.variants[at];
        let mut wall = Vec::with_capacity(self.block);
        let segments = tcp_segments_sent();
        let cpu = process_cpu_time();
        for _ in 0..self.block {
            let t = Instant::now();
            cycle(variant.cycles).await;
            wall.push(t.elapsed());
            variant.cycles += 1;
        }
        let cpu = process_cpu_time().saturating_sub(cpu);
        let segments = match (segments, tcp_segments_sent()) {
            (Some(before), Some(after)) => after.saturating_sub(before) as f64,
            _ => f64::NAN,
        };
        if !self.warm_up {
            variant.wall.extend(wall);
            variant
                .cpu
                .push(cpu / u32::try_from(self.block).unwrap_or(u32::MAX));
            variant.segments.push(segments / self.block as f64);
        }
    }

    /// [`measure`](Self::measure) a block of distlock cycles: acquire
    /// `name` on `lock` with `opts`, then release it, which must find it
    /// still held.
    pub async fn measure_lock(
        &mut self,
        label: &str,
        lock: &dyn DistributedLock,
        name: &str,
        opts: &LockOptions,
    ) {
        self.measure(label, async |_| {
            let guard = lock.acquire(name, opts).await.expect("acquire");
            assert!(
                guard.release().await.expect("release"),
                "released a lock no longer held"
            );
        })
        .await;
    }

    /// A block of [`SET_ALL`] cycles and one of [`SET_SINGLES`] on
    /// `lock`, on the names `PREFIX0` to `PREFIX7`; compare them with
    /// [`compare_sets`](Self::compare_sets).
    pub async fn measure_sets(
        &mut self,
        lock: &dyn DistributedLock,
        prefix: &str,
        opts: &LockOptions,
    ) {
        let names: Vec<String> = (0..SET_NAMES).map(|i| format!("{prefix}{i}")).collect();
        self.measure(SET_ALL, async |_| take_set(lock, &names, opts).await)
            .await;
        if lock.capabilities().atomic_sets >= SET_NAMES {
            let ordered = NameByName(lock);
            self.measure(SET_ORDERED, async |_| {
                take_set(&ordered, &names, opts).await;
            })
            .await;
        }
        self.measure(SET_SINGLES, async |_| {
            let mut guards = Vec::with_capacity(SET_NAMES);
            for name in &names {
                let guard = lock.try_acquire(name, opts).await.expect("try_acquire");
                guards.push(guard.expect("a free name"));
            }
            for guard in guards {
                assert!(guard.release().await.expect("release"), "a lock was lost");
            }
        })
        .await;
    }

    /// A block of [`RW_READ`] cycles and one of [`RW_WRITE`] on `lock`'s
    /// reader-writer lock `name`, where the backend offers them; compare
    /// them with the lock's own cycle by [`compare_rw`](Self::compare_rw).
    pub async fn measure_rw(&mut self, lock: &dyn DistributedLock, name: &str, opts: &LockOptions) {
        if lock.capabilities().rw_lock.is_none() {
            return;
        }
        for (label, access) in [(RW_READ, Access::Read), (RW_WRITE, Access::Write)] {
            let opts = opts.clone().access(access);
            self.measure_lock(label, lock, name, &opts).await;
        }
    }

    /// The reader-writer cycles against the lock's cycle `lock_label`.
    pub fn compare_rw(&self, lock_label: &str) {
        self.compare(RW_READ, lock_label);
        self.compare(RW_WRITE, lock_label);
    }

    /// The lock set against the same names one by one: see
    /// [`measure_sets`](Self::measure_sets).
    pub fn compare_sets(&self) -> Option<Ratios> {
        // Where the backend takes a set in one request: that request
        // against the same set taken name by name.
        self.compare(SET_ALL, SET_ORDERED);
        self.compare(SET_ORDERED, SET_SINGLES);
        self.compare(SET_ALL, SET_SINGLES)
    }

    /// The figures of the variant `label`, if it was measured.
    pub fn figures(&self, label: &str) -> Option<Figures> {
        let v = self.variants.iter().find(|v| v.label == label)?;
        let mut cpu = v.cpu.clone();
        cpu.sort_unstable();
        Some(Figures {
            wall: percentiles(v.wall.clone()),
            cpu: cpu.get(cpu.len() / 2).copied().unwrap_or_default(),
            segments: v.segments.iter().copied().fold(f64::NAN, f64::min),
        })
    }

    /// Print every variant's figures, in the order they were first measured.
    pub fn print(&self) {
        let blocks = self.variants.first().map_or(0, |v| v.cpu.len());
        let width = self
            .variants
            .iter()
            .map(|v| v.label.len())
            .max()
            .unwrap_or(0);
        println!(
            "\n{}: uncontended cycle, {blocks} rounds of {} cycles per variant, interleaved",
            self.title, self.block
        );
        println!(
            "  {:<width$} {:>9} {:>9} {:>12} {:>12}",
            "", "p50 µs", "p99 µs", "CPU µs/cycle", "segs/cycle"
        );
        for v in &self.variants {
            if let Some(f) = self.figures(&v.label) {
                println!(
                    "  {:<width$} {:>9.1} {:>9.1} {:>12.1} {:>12.1}",
                    v.label,
                    us(f.wall.0),
                    us(f.wall.1),
                    us(f.cpu),
                    f.segments
                );
            }
        }
    }

    /// Print and return `ours` against `baseline`: p50, p99, CPU per cycle
    /// and segments per cycle, each as `ours / baseline`. The line starts
    /// with the title and contains `÷`, for `scripts/bench.sh`'s summary.
    /// `None` (and nothing printed) if either was not measured.
    pub fn compare(&self, ours: &str, baseline: &str) -> Option<Ratios> {
        let (a, b) = (self.figures(ours)?, self.figures(baseline)?);
        let ratio = |x: Duration, y: Duration| x.as_secs_f64() / y.as_secs_f64();
        let r = Ratios {
            p50: ratio(a.wall.0, b.wall.0),
            p99: ratio(a.wall.1, b.wall.1),
            cpu: ratio(a.cpu, b.cpu),
            segments: a.segments / b.segments,
        };
        println!(
            "  {}: {ours} ÷ {baseline}: p50 {:.2}x  p99 {:.2}x  CPU {:.2}x  segments {:.2}x ({:.1} / {:.1})",
            self.title, r.p50, r.p99, r.cpu, r.segments, a.segments, b.segments
        );
        Some(r)
    }
}

/// One variant's figures divided by another's.
#[derive(Debug, Clone, Copy)]
pub struct Ratios {
    /// p50 wall time.
    pub p50: f64,
    /// p99 wall time.
    pub p99: f64,
    /// CPU time per cycle.
    pub cpu: f64,
    /// TCP segments per cycle.
    pub segments: f64,
}

/// CPU time the whole process has used.
pub(crate) fn process_cpu_time() -> Duration {
    let t = clock_gettime(ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// The host's count of TCP segments sent (`Tcp: OutSegs` in
/// `/proc/net/snmp`), if it can be read.
fn tcp_segments_sent() -> Option<u64> {
    let snmp = std::fs::read_to_string("/proc/net/snmp").ok()?;
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next()?, tcp.next()?);
    let at = names.split_whitespace().position(|n| n == "OutSegs")?;
    values.split_whitespace().nth(at)?.parse().ok()
}

/// One cycle of a lock set: `names` taken by `try_acquire_all` on `lock`
/// (free), then released.
async fn take_set(lock: &dyn DistributedLock, names: &[String], opts: &LockOptions) {
    let set = lock
        .try_acquire_all(names, opts)
        .await
        .expect("try_acquire_all")
        .expect("a free set");
    assert!(set.release().await.expect("release"), "a member was lost");
}

/// `lock` with its sets taken name by name: its capabilities say 0
/// [`atomic_sets`](lock_core::Capabilities::atomic_sets), everything else
/// forwards.
struct NameByName<'a>(&'a dyn DistributedLock);

#[async_trait::async_trait]
impl DistributedLock for NameByName<'_> {
    async fn try_acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<lock_core::LockGuard>, lock_core::LockError> {
        self.0.try_acquire(name, opts).await
    }

    async fn acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<lock_core::LockGuard, lock_core::LockError> {
        self.0.acquire(name, opts).await
    }

    fn capabilities(&self) -> lock_core::Capabilities {
        self.0.capabilities().with_atomic_sets(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_counts_segments_and_cpu_time() {
        let before = tcp_segments_sent().expect("/proc/net/snmp has Tcp: OutSegs");
        assert!(tcp_segments_sent().expect("again") >= before);
        let cpu = process_cpu_time();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        assert!(process_cpu_time() > cpu, "{x}");
    }

    #[tokio::test]
    async fn blocks_are_recorded_after_the_warm_up() {
        let mut m = Cycles::new("test", 4);
        let mut seen = Vec::new();
        for round in 0..3 {
            m.warm_up(round == 0);
            m.measure("a", async |i| seen.push(i)).await;
            m.measure("b", async |_| tokio::task::yield_now().await)
                .await;
        }
        assert_eq!(seen, (0..12).collect::<Vec<_>>());
        let a = m.figures("a").expect("a was measured");
        assert!(a.wall.0 <= a.wall.1);
        assert!(a.segments >= 0.0);
        assert_eq!(m.variants[0].wall.len(), 8, "the warm-up round is left out");
        assert_eq!(m.variants[0].cpu.len(), 2);
        assert!(m.compare("a", "b").is_some());
        assert!(m.compare("a", "c").is_none());
    }

    #[tokio::test]
    async fn a_lock_cycle_acquires_and_releases() {
        let lock = lock_core::MemoryLock::new();
        let opts = LockOptions::new().wait(lock_core::Wait::No);
        let mut m = Cycles::new("memory", 5);
        m.measure_lock("memory", &lock, "bench/memory", &opts).await;
        assert_eq!(m.variants[0].wall.len(), 5);
        let free = lock.try_acquire("bench/memory", &opts).await;
        assert!(
            matches!(free, Ok(Some(_))),
            "every cycle released: {free:?}"
        );
    }
}
