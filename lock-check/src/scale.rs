//! `lock-check scale`: one client acquires many distinct names (auto-renewed,
//! a short TTL so that renewal runs all the time), holds them all, then
//! releases them, and reports what that cost: locks held, spurious losses,
//! the process's memory and CPU, the server's request rate beside the
//! renewal rate the locks need, the acquisition rate and the release time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use distlock::{DistributedLock, LockError, LockGuard, LockOptions, Wait};
use futures_util::StreamExt;
use serde::Serialize;
use tokio::time::Instant;

use crate::server_stats::requests_served;

/// Acquisitions (and releases) in flight at once.
const PARALLEL: usize = 64;

/// One scale run.
#[derive(Debug, Clone)]
pub struct ScaleConfig {
    /// The lock URL.
    pub url: String,
    /// How many distinct names to hold.
    pub locks: usize,
    /// The locks' TTL (auto-renewed about every third of it).
    pub ttl: Duration,
    /// How long to hold them all.
    pub hold: Duration,
}

/// What a scale run measured.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleReport {
    /// The backend's name.
    pub backend: String,
    /// The URL, without credentials.
    pub url: String,
    /// Locks asked for.
    pub locks: usize,
    /// Locks granted.
    pub held: usize,
    /// The first acquisition error, if any (acquiring stops at a
    /// `LimitReached`).
    pub acquire_error: Option<String>,
    /// Locks lost while held (none was taken away: every loss is spurious).
    pub lost: usize,
    /// The first loss's reason.
    pub first_loss: Option<String>,
    /// Acquisitions per second.
    pub acquires_per_s: f64,
    /// Resident memory (MiB) before connecting, with all held, at the end,
    /// and the peak.
    pub rss_mib: [f64; 4],
    /// The client's CPU while holding, in % of one core.
    pub hold_cpu_pct: f64,
    /// Requests per second the server(s) served while the locks were held
    /// (their own counters), if the backend has a server.
    pub server_requests_per_s: Option<f64>,
    /// Renewals per second the held locks need (held ÷ (TTL / 3)).
    pub renewals_per_s: f64,
    /// Seconds to release them all.
    pub release_s: f64,
    /// Releases that failed or found the lock no longer ours.
    pub release_failures: usize,
}

/// Run one scale measurement.
pub async fn run(cfg: &ScaleConfig) -> Result<ScaleReport, LockError> {
    let rss_start = memory().0;
    let locks = distlock::connect(&cfg.url).await?;
    let backend = locks.capabilities().backend.to_string();
    let prefix = format!("scale/{}/{:x}", cfg.locks, rand::random::<u32>());
    let (guards, acquire_error, acquire_time) = acquire_all(&locks, &prefix, cfg).await;
    let held = guards.len();
    let rss_held = memory().0;

    let served_before = requests_served(&cfg.url).await;
    let cpu_before = cpu_time();
    let hold_started = Instant::now();
    tokio::time::sleep(cfg.hold).await;
    let cpu = cpu_time().saturating_sub(cpu_before);
    let held_for = hold_started.elapsed();
    let served_after = requests_served(&cfg.url).await;

    let losses: Vec<String> = guards
        .iter()
        .filter_map(|g| g.is_lost().map(|r| format!("{}: {r}", g.name())))
        .collect();

    let release_started = Instant::now();
    let release_failures = futures_util::stream::iter(guards)
        .map(|g| async move { !matches!(g.release().await, Ok(true)) })
        .buffer_unordered(PARALLEL)
        .filter(|failed| std::future::ready(*failed))
        .count()
        .await;
    let release_s = release_started.elapsed().as_secs_f64();
    drop(locks);
    let (rss_end, rss_peak) = memory();

    let server_requests_per_s = match (served_before, served_after) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / held_for.as_secs_f64()),
        _ => None,
    };
    Ok(ScaleReport {
        backend,
        url: distlock::redact_url(&cfg.url),
        locks: cfg.locks,
        held,
        acquire_error,
        lost: losses.len(),
        first_loss: losses.into_iter().next(),
        acquires_per_s: held as f64 / acquire_time.as_secs_f64().max(1e-9),
        rss_mib: [rss_start, rss_held, rss_end, rss_peak],
        hold_cpu_pct: 100.0 * cpu.as_secs_f64() / held_for.as_secs_f64(),
        server_requests_per_s,
        renewals_per_s: held as f64 / (cfg.ttl.as_secs_f64() / 3.0),
        release_s,
        release_failures,
    })
}

/// Acquire `cfg.locks` names, `PARALLEL` at a time; after the first
/// `LimitReached` no new acquisition starts, and those in flight finish:
/// the guards, the first error, the time taken.
async fn acquire_all(
    locks: &Arc<dyn DistributedLock>,
    prefix: &str,
    cfg: &ScaleConfig,
) -> (Vec<LockGuard>, Option<String>, Duration) {
    let opts = LockOptions::new()
        .ttl(cfg.ttl)
        .wait(Wait::UpTo(Duration::from_secs(30)))
        .auto_renew(true);
    let started = Instant::now();
    let limited = Arc::new(AtomicBool::new(false));
    let mut guards = Vec::with_capacity(cfg.locks);
    let mut first_error = None;
    let mut attempts = futures_util::stream::iter(0..cfg.locks)
        .map(|i| {
            let (locks, opts, limited) = (Arc::clone(locks), opts.clone(), Arc::clone(&limited));
            let name = format!("{prefix}/{i}");
            async move {
                if limited.load(Ordering::Relaxed) {
                    return None;
                }
                let attempt = locks.acquire(&name, &opts).await;
                if let Err(LockError::LimitReached { .. }) = attempt {
                    limited.store(true, Ordering::Relaxed);
                }
                Some(attempt)
            }
        })
        .buffer_unordered(PARALLEL);
    while let Some(attempt) = attempts.next().await {
        match attempt {
            Some(Ok(guard)) => guards.push(guard),
            Some(Err(e)) => {
                first_error.get_or_insert_with(|| e.to_string());
            }
            None => {}
        }
    }
    (guards, first_error, started.elapsed())
}

/// Resident and peak resident memory of this process, in MiB.
fn memory() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
}

/// User plus system CPU time of this process so far (`/proc/self/stat`, in
/// USER_HZ = 100 ticks per second, fixed by the Linux ABI).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13
    // after the state field that follows ')'.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// A Markdown table of scale reports.
pub fn table(reports: &[ScaleReport]) -> String {
    let mut out = String::from(
        "| backend | locks | held | lost | acquires/s | RSS MiB start / held / end / peak | CPU holding | server req/s (renewals/s needed) | release s | note |\n\
         |---|---:|---:|---:|---:|---|---:|---|---:|---|\n",
    );
    for r in reports {
        let server = match r.server_requests_per_s {
            Some(s) => format!("{s:.0} ({:.0})", r.renewals_per_s),
            None => format!("in-process ({:.0})", r.renewals_per_s),
        };
        let note = r
            .acquire_error
            .as_deref()
            .or(r.first_loss.as_deref())
            .unwrap_or("");
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.0} | {:.0} / {:.0} / {:.0} / {:.0} | {:.0} % | {} | {:.1} | {} |\n",
            r.backend,
            r.locks,
            r.held,
            r.lost,
            r.acquires_per_s,
            r.rss_mib[0],
            r.rss_mib[1],
            r.rss_mib[2],
            r.rss_mib[3],
            r.hold_cpu_pct,
            server,
            r.release_s,
            note.chars().take(120).collect::<String>(),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_and_cpu() {
        let (rss, peak) = memory();
        assert!(rss > 0.0 && peak >= rss, "{rss} {peak}");
        // The kernel counts CPU time in ticks (10 ms), and a process of its
        // own (as under cargo-nextest) on a loaded machine may have had
        // none yet: spin until one is counted, for at most five seconds
        // of wall time.
        let spin = std::time::Instant::now();
        while cpu_time() == Duration::ZERO && spin.elapsed() < Duration::from_secs(5) {
            for _ in 0..100_000 {
                std::hint::black_box(());
            }
        }
        assert!(
            cpu_time() > Duration::ZERO,
            "no CPU time counted in 5 s of spinning"
        );
    }

    #[tokio::test]
    async fn a_memory_run_holds_every_lock() {
        let report = run(&ScaleConfig {
            url: "memory://".to_string(),
            locks: 200,
            ttl: Duration::from_millis(600),
            hold: Duration::from_millis(700),
        })
        .await
        .expect("runs");
        assert_eq!(
            (report.held, report.lost, report.release_failures),
            (200, 0, 0)
        );
        assert!(report.server_requests_per_s.is_none());
        assert!(table(&[report]).contains("| memory | 200 | 200 | 0 |"));
    }
}
