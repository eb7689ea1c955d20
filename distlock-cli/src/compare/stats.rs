//! The figures `distlock compare` reports: percentiles of cycle times, and
//! what the turns of a contended run add up to.

use std::time::{Duration, Instant};

/// One holder's turn in a contended run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Turn {
    /// When the lock was granted.
    pub granted: Instant,
    /// When it was given back.
    pub released: Instant,
    /// Which contending task held it.
    pub task: usize,
}

/// The median and the 99th percentile (nearest rank) of `sorted`, which
/// is in ascending order; zero for no samples.
pub(crate) fn p50_p99(sorted: &[Duration]) -> (Duration, Duration) {
    let rank = |q: f64| {
        let last = sorted.len().saturating_sub(1);
        sorted
            .get((last as f64 * q).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    (rank(0.5), rank(0.99))
}

/// What the turns of one service's contended slices add up to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Contention {
    /// Turns taken in all.
    pub acquisitions: usize,
    /// Turns that went to another task than the turn before, within a slice.
    pub handoffs: usize,
    /// p50 and p99 of the gap between one task's release and the next
    /// task's grant.
    pub handoff_gap: (Duration, Duration),
    /// The fewest and the most turns one task took.
    pub per_task: (usize, usize),
    /// The turns of every task, fewest first: how fairly the lock went
    /// round.
    pub turns: Vec<usize>,
}

impl Contention {
    /// The figures of `slices` of turns by `tasks` tasks: hand-offs are
    /// counted within a slice, never across two.
    pub(crate) fn of(slices: Vec<Vec<Turn>>, tasks: usize) -> Self {
        let mut per_task = vec![0usize; tasks];
        let mut gaps = Vec::new();
        let mut acquisitions = 0;
        for mut slice in slices {
            slice.sort_by_key(|turn| turn.granted);
            acquisitions += slice.len();
            let mut before: Option<Turn> = None;
            for turn in slice {
                if let Some(count) = per_task.get_mut(turn.task) {
                    *count += 1;
                }
                if let Some(prev) = before.filter(|prev| prev.task != turn.task) {
                    gaps.push(turn.granted.saturating_duration_since(prev.released));
                }
                before = Some(turn);
            }
        }
        gaps.sort_unstable();
        per_task.sort_unstable();
        Contention {
            acquisitions,
            handoffs: gaps.len(),
            handoff_gap: p50_p99(&gaps),
            per_task: (
                per_task.first().copied().unwrap_or(0),
                per_task.last().copied().unwrap_or(0),
            ),
            turns: per_task,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(p50_p99(&samples), (ms(51), ms(99)));
        assert_eq!(p50_p99(&[ms(7)]), (ms(7), ms(7)));
        assert_eq!(p50_p99(&[]), (Duration::ZERO, Duration::ZERO));
    }

    #[test]
    fn hand_offs_are_counted_within_a_slice() {
        let t0 = Instant::now();
        let turn = |at: u64, task| Turn {
            granted: t0 + ms(at),
            released: t0 + ms(at + 1),
            task,
        };
        // Out of order within a slice; task 0 twice in a row, then task 1
        // after a 2 ms gap. The second slice starts with task 1 again: no
        // hand-off across slices.
        let slices = vec![
            vec![turn(4, 1), turn(0, 0), turn(1, 0)],
            vec![turn(10, 1), turn(13, 0)],
        ];
        let c = Contention::of(slices, 3);
        assert_eq!(c.acquisitions, 5);
        assert_eq!(c.handoffs, 2);
        assert_eq!(c.handoff_gap, (ms(2), ms(2)));
        // Task 2 never held it.
        assert_eq!(c.per_task, (0, 3));
        assert_eq!(c.turns, vec![0, 2, 3]);
    }
}
