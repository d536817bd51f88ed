//! Charts as inline SVG, drawn on the server: nothing to load, nothing to
//! run, readable at a glance (a line or bars over the last hour, the
//! largest value and the time axis labelled).

use std::fmt::Write;

const WIDTH: f64 = 560.0;
const HEIGHT: f64 = 120.0;
const LEFT: f64 = 48.0;
const BOTTOM: f64 = 18.0;

/// How a chart draws its points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// A line through the points (levels: backlog, age).
    Line,
    /// A bar per point (counts per interval: failures per minute).
    Bars,
}

/// One chart: `points` are (seconds before now, value), over the last
/// `span` seconds.
pub fn svg(
    id: &str,
    title: &str,
    unit: &str,
    shape: Shape,
    points: &[(f64, f64)],
    span: f64,
) -> String {
    let top = points.iter().map(|p| p.1).fold(0.0, f64::max);
    let scale = if top > 0.0 { top * 1.1 } else { 1.0 };
    let x = |ago: f64| LEFT + (WIDTH - LEFT) * (1.0 - (ago / span).clamp(0.0, 1.0));
    let y = |value: f64| (HEIGHT - BOTTOM) * (1.0 - value / scale);
    let mut out = format!(
        r#"<figure class="chart"><figcaption>{}</figcaption><svg id="{id}" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{}" data-points="{}">"#,
        super::html::esc(title),
        super::html::esc(title),
        points.len()
    );
    let _ = write!(
        out,
        r##"<line x1="{LEFT}" y1="{base}" x2="{WIDTH}" y2="{base}" stroke="#999"/><line x1="{LEFT}" y1="{top_y:.1}" x2="{WIDTH}" y2="{top_y:.1}" stroke="#e5e7eb"/><text x="{}" y="{}" text-anchor="start">{}</text><text x="{}" y="{base}" text-anchor="end">0</text>"##,
        LEFT + 4.0,
        // Under the top line; at the top when everything is 0.
        if top > 0.0 { y(top) + 10.0 } else { 12.0 },
        super::html::esc(&format!("{} {unit}", round(top))),
        LEFT - 4.0,
        top_y = y(top),
        base = HEIGHT - BOTTOM,
    );
    let minutes = (span / 60.0).round();
    let labels = [
        (format!("-{minutes} min"), span),
        (format!("-{} min", minutes / 2.0), span / 2.0),
        ("now".to_string(), 0.0),
    ];
    for (label, ago) in labels {
        let anchor = if ago == 0.0 { "end" } else { "middle" };
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{}" text-anchor="{anchor}">{label}</text>"#,
            x(ago).max(LEFT + 20.0),
            HEIGHT - 2.0
        );
    }
    match shape {
        Shape::Line if !points.is_empty() => {
            let path = points
                .iter()
                .map(|&(ago, value)| format!("{:.1},{:.1}", x(ago), y(value)))
                .collect::<Vec<_>>()
                .join(" ");
            let _ = write!(
                out,
                r##"<polyline fill="none" stroke="#2563eb" stroke-width="2" points="{path}"/>"##
            );
        }
        Shape::Bars => {
            let width = ((WIDTH - LEFT) / (span / 60.0)).max(2.0) - 1.0;
            for &(minutes_ago, value) in points {
                let _ = write!(
                    out,
                    r##"<rect x="{:.1}" y="{:.1}" width="{width:.1}" height="{:.1}" fill="#dc2626"><title>{} {unit}</title></rect>"##,
                    x((minutes_ago + 1.0) * 60.0),
                    y(value),
                    (HEIGHT - BOTTOM) - y(value),
                    round(value)
                );
            }
        }
        Shape::Line => {}
    }
    out.push_str("</svg></figure>");
    out
}

fn round(value: f64) -> String {
    if value >= 10.0 || value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_chart_draws_every_point_within_its_box() {
        let drawn = svg(
            "c",
            "Backlog",
            "events",
            Shape::Line,
            &[(3600.0, 0.0), (1800.0, 50.0), (0.0, 100.0)],
            3600.0,
        );
        let points = drawn
            .split("<polyline")
            .nth(1)
            .unwrap()
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        let xy: Vec<(f64, f64)> = points
            .split(' ')
            .map(|p| {
                let (x, y) = p.split_once(',').unwrap();
                (x.parse().unwrap(), y.parse().unwrap())
            })
            .collect();
        assert_eq!(xy.len(), 3);
        assert!(
            xy.iter()
                .all(|&(x, y)| (LEFT..=WIDTH).contains(&x) && (0.0..=HEIGHT).contains(&y))
        );
        assert!(
            xy[0].1 > xy[1].1 && xy[1].1 > xy[2].1,
            "higher values are drawn higher: {xy:?}"
        );
        assert!(drawn.contains(">100 events<"), "{drawn}");
    }

    #[test]
    fn bars_are_drawn_per_minute_and_titles_are_escaped() {
        let drawn = svg(
            "f",
            "<Failures>",
            "per min",
            Shape::Bars,
            &[(2.0, 3.0), (0.0, 1.0)],
            3600.0,
        );
        assert_eq!(drawn.matches("<rect").count(), 2);
        assert!(drawn.contains("&lt;Failures&gt;"));
        assert!(!drawn.contains("<Failures>"));
    }
}
