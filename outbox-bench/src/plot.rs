//! PNG plots of a run: one bar chart per scenario and metric (median, with
//! the rounds' min–max as a whisker). Written next to `results.jsonl`.

use plotters::prelude::*;

use crate::env::Error;
use crate::report::{Figure, Report};

/// Draws one chart per (scenario, metric) of `report`.
pub fn draw(report: &Report) -> Result<(), Error> {
    let mut groups: Vec<(String, String)> = Vec::new();
    for f in report.figures() {
        let key = (f.scenario.clone(), f.metric.clone());
        if !groups.contains(&key) {
            groups.push(key);
        }
    }
    for (scenario, metric) in groups {
        let figures: Vec<&Figure> = report
            .figures()
            .iter()
            .filter(|f| f.scenario == scenario && f.metric == metric)
            .collect();
        let file = format!("{scenario}-{}.png", slug(&metric));
        bars(&report.out_dir().join(file), &scenario, &metric, &figures)?;
    }
    Ok(())
}

fn slug(metric: &str) -> String {
    metric
        .replace('µ', "u")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect::<String>()
        .trim_matches('_')
        .to_string()
}

fn bars(
    path: &std::path::Path,
    scenario: &str,
    metric: &str,
    figures: &[&Figure],
) -> Result<(), Error> {
    let top = figures
        .iter()
        .map(|f| f.samples.range().1)
        .fold(0.0f64, f64::max)
        .max(f64::MIN_POSITIVE)
        * 1.15;
    let width = (160 + 130 * figures.len()) as u32;
    let root = BitMapBackend::new(path, (width.max(640), 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{scenario}: {metric} (median, min-max of rounds)"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((0..figures.len()).into_segmented(), 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(metric)
        .x_labels(figures.len())
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => figures
                .get(*i)
                .map(|f| f.contender.clone())
                .unwrap_or_default(),
            _ => String::new(),
        })
        .draw()?;
    let colour = |f: &Figure| {
        if f.contender.starts_with("relay") || f.contender == "notify" {
            RGBColor(31, 119, 180)
        } else {
            RGBColor(150, 150, 150)
        }
    };
    chart.draw_series(figures.iter().enumerate().map(|(i, f)| {
        let median = f.samples.median();
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(i), 0.0),
                (SegmentValue::Exact(i + 1), median),
            ],
            colour(f).filled(),
        );
        bar.set_margin(0, 0, 14, 14);
        bar
    }))?;
    chart.draw_series(figures.iter().enumerate().map(|(i, f)| {
        let (min, max) = f.samples.range();
        PathElement::new(
            vec![
                (SegmentValue::CenterOf(i), min),
                (SegmentValue::CenterOf(i), max),
            ],
            BLACK.stroke_width(2),
        )
    }))?;
    chart.draw_series(figures.iter().enumerate().map(|(i, f)| {
        Text::new(
            crate::report::fmt(f.samples.median()),
            (SegmentValue::CenterOf(i), f.samples.range().1 + top * 0.02),
            ("sans-serif", 13),
        )
    }))?;
    root.present()?;
    Ok(())
}
