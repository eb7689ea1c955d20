//! The SVG charts of `distlock compare`: the distribution of the
//! uncontended cycle's latency, and hand-offs per second under contention.

use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;

use super::{Outcome, Target};

type ChartResult = Result<(), Box<dyn std::error::Error>>;

const SIZE: (u32, u32) = (900, 540);

fn color(i: usize) -> RGBColor {
    const PALETTE: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
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
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (lo * 0.9, hi * 1.1)
    } else {
        (0.01, 100.0)
    };
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Uncontended acquire + release: latency distribution",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)?;
    chart
        .configure_mesh()
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
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
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
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
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
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
