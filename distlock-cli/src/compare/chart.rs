//! The SVG charts of `distlock compare`: the distribution of the
//! uncontended cycle's latency, hand-offs per second under contention, and
//! how fairly the lock went round the contending tasks.

use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;

use super::{Outcome, Target};

type ChartResult = Result<(), Box<dyn std::error::Error>>;

const SIZE: (u32, u32) = (960, 600);

/// The title's font.
const CAPTION: (&str, u32) = ("sans-serif", 26);
/// The axis descriptions' font.
const AXIS: (&str, u32) = ("sans-serif", 19);
/// The tick labels' and the legend's font.
const LABEL: (&str, u32) = ("sans-serif", 17);

fn color(i: usize) -> RGBColor {
    const PALETTE: [RGBColor; 10] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    PALETTE[i % PALETTE.len()]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The latency distribution (cumulative: the share of cycles at most x ms,
/// x on a log scale), one line per service.
pub(super) fn latency(path: &Path, targets: &[Target], outcomes: &[Outcome]) -> ChartResult {
    let measured: Vec<(usize, &[Duration])> = outcomes
        .iter()
        .enumerate()
        .filter_map(|(i, o)| o.uncontended.as_ref().ok().map(|u| (i, &u.samples[..])))
        .filter(|(_, s)| !s.is_empty())
        .collect();
    let lo = measured
        .iter()
        .filter_map(|(_, s)| s.first())
        .map(|d| ms(*d))
        .fold(f64::INFINITY, f64::min);
    let hi = measured
        .iter()
        .filter_map(|(_, s)| s.last())
        .map(|d| ms(*d))
        .fold(0.0, f64::max);
    // Whole decades, so that every decade gets its ticks (the axis puts
    // them from the first power of ten on).
    let (lo, hi) = if lo.is_finite() && hi > lo {
        // (A hair below the power of ten: the axis finds its first
        // decade by rounding a logarithm up.)
        (
            10f64.powf(lo.log10().floor()) * 0.999,
            10f64.powf(hi.log10().ceil()),
        )
    } else {
        (0.01, 100.0)
    };
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Uncontended acquire + release: latency distribution",
            CAPTION,
        )
        .margin(20)
        .x_label_area_size(56)
        .y_label_area_size(72)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)?;
    chart
        .configure_mesh()
        // Enough key points for 2×, 3×, … 9× in every decade; labels on
        // 1, 2 and 5 of each.
        .x_labels(80)
        .x_label_formatter(&|x| one_two_five(*x))
        .label_style(LABEL)
        .axis_desc_style(AXIS)
        .bold_line_style(BLACK.mix(0.15))
        .light_line_style(TRANSPARENT)
        .x_desc("latency (ms, log scale)")
        .y_desc("share of cycles at most this long")
        .draw()?;
    for (i, samples) in measured {
        let step = (samples.len() / 400).max(1);
        let n = samples.len() as f64;
        let points = samples
            .iter()
            .enumerate()
            .filter(|(k, _)| k % step == 0 || *k == samples.len() - 1)
            .map(|(k, d)| (ms(*d), (k + 1) as f64 / n));
        let c = color(i);
        chart
            .draw_series(LineSeries::new(points, c.stroke_width(2)))?
            .label(targets[i].label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present()?;
    Ok(())
}

/// Hand-offs per second under contention: a group of bars per service, one
/// bar per task count above one.
pub(super) fn handoffs(path: &Path, targets: &[Target], outcomes: &[Outcome]) -> ChartResult {
    let counts: Vec<usize> = outcomes
        .first()
        .map(|o| {
            o.contended
                .iter()
                .map(|(n, _)| *n)
                .filter(|&n| n > 1)
                .collect()
        })
        .unwrap_or_default();
    let rate = |o: &Outcome, tasks: usize| -> f64 {
        o.contended
            .iter()
            .find(|(n, _)| *n == tasks)
            .and_then(|(_, r)| r.as_ref().ok())
            .map_or(0.0, |c| {
                c.run.handoffs as f64 / c.ran.as_secs_f64().max(f64::EPSILON)
            })
    };
    let top = outcomes
        .iter()
        .flat_map(|o| counts.iter().map(move |&n| rate(o, n)))
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.15;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let labels: Vec<String> = targets.iter().map(|t| t.label.clone()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Contended: hand-offs per second (higher is better)",
            CAPTION,
        )
        .margin(20)
        .x_label_area_size(56)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..targets.len() as f64, 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(targets.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let centre = x - x.floor();
            if (centre - 0.5).abs() < 1e-6 {
                labels.get(x.floor() as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .label_style(LABEL)
        .axis_desc_style(AXIS)
        .bold_line_style(BLACK.mix(0.15))
        .light_line_style(TRANSPARENT)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .y_desc("hand-offs per second")
        .draw()?;
    let width = 0.8 / counts.len().max(1) as f64;
    for (k, &tasks) in counts.iter().enumerate() {
        let c = color(k);
        chart
            .draw_series(outcomes.iter().enumerate().map(|(i, o)| {
                let x0 = i as f64 + 0.1 + k as f64 * width;
                Rectangle::new([(x0, 0.0), (x0 + width * 0.9, rate(o, tasks))], c.filled())
            }))?
            .label(format!("{tasks} tasks"))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present()?;
    Ok(())
}

/// The chart's legend, boxed, at `at`.
fn legend<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    at: SeriesLabelPosition,
) -> ChartResult {
    chart
        .configure_series_labels()
        .position(at)
        .label_font(LABEL)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// A tick label on a log axis: `x` where it is 1, 2 or 5 times a power of
/// ten (`0.2`, `1`, `50`), nothing elsewhere.
fn one_two_five(x: f64) -> String {
    if x <= 0.0 {
        return String::new();
    }
    let decade = 10f64.powf(x.log10().floor());
    let mantissa = x / decade;
    let near = |m: f64| (mantissa - m).abs() < 1e-6 * m;
    if !(near(1.0) || near(2.0) || near(5.0)) {
        return String::new();
    }
    let digits = usize::try_from(-(x.log10().floor() as i64)).unwrap_or(0);
    format!("{x:.digits$}")
}

/// How fairly the lock went round, with the most tasks of the run: each
/// service's tasks from the fewest turns to the most, as a share of an
/// equal split (1 = every task got as many turns as the others).
pub(super) fn fairness(path: &Path, targets: &[Target], outcomes: &[Outcome]) -> ChartResult {
    let runs: Vec<(usize, Vec<f64>)> = outcomes
        .iter()
        .enumerate()
        .filter_map(|(i, o)| {
            let (_, run) = o.contended.iter().max_by_key(|(tasks, _)| *tasks)?;
            let turns = &run.as_ref().ok()?.run.turns;
            let total: usize = turns.iter().sum();
            (turns.len() > 1 && total > 0).then(|| {
                let equal = total as f64 / turns.len() as f64;
                (i, turns.iter().map(|&t| t as f64 / equal).collect())
            })
        })
        .collect();
    let tasks = runs.iter().map(|(_, r)| r.len()).max().unwrap_or(2);
    // Room above an equal share for the legend, top left, where the
    // fewest turns (at most an equal share) leave the chart empty.
    let top = (runs
        .iter()
        .flat_map(|(_, r)| r.iter().copied())
        .fold(1.0, f64::max)
        * 1.1)
        .max(2.2);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Contended, {tasks} tasks: turns per task, fewest to most"),
            CAPTION,
        )
        .margin(20)
        .x_label_area_size(56)
        .y_label_area_size(80)
        .build_cartesian_2d(1..tasks, 0.0..top)?;
    chart
        .configure_mesh()
        .x_labels(tasks)
        .label_style(LABEL)
        .axis_desc_style(AXIS)
        .bold_line_style(BLACK.mix(0.15))
        .light_line_style(TRANSPARENT)
        .x_desc("task, from the fewest turns to the most")
        .y_desc("turns ÷ an equal share (1 = fair)")
        .draw()?;
    for (i, shares) in runs {
        let c = color(i);
        let points: Vec<(usize, f64)> = shares
            .into_iter()
            .enumerate()
            .map(|(k, s)| (k + 1, s))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))?
            .label(targets[i].label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(points.into_iter().map(|p| Circle::new(p, 4, c.filled())))?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::one_two_five;

    #[test]
    fn log_ticks_are_labelled_on_one_two_and_five() {
        let labels: Vec<String> = [0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 4.0, 5.0, 10.0, 20.0]
            .into_iter()
            .map(one_two_five)
            .collect();
        assert_eq!(
            labels,
            ["0.1", "0.2", "", "0.5", "1", "2", "", "5", "10", "20"]
        );
    }
}
