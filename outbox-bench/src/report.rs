//! What a run prints and keeps: a table per scenario, one JSON line per
//! figure, and the targets checked against the figures of the same run.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::stats::Samples;

/// One contender's figure in one scenario.
#[derive(Clone, Debug)]
pub struct Figure {
    /// Scenario name, e.g. `drain-postgres`.
    pub scenario: String,
    /// Who was measured, e.g. `relay-per-key` or `seed-batched-4w`.
    pub contender: String,
    /// What was measured, e.g. `events/s` or `p99 ms`.
    pub metric: String,
    /// One value per round.
    pub samples: Samples,
    /// True when a larger value is better.
    pub higher_is_better: bool,
}

/// A target: `numerator / denominator` must reach (or stay under) `bound`.
#[derive(Clone, Debug, Serialize)]
pub struct TargetCheck {
    /// Which target, in the words.
    pub name: String,
    /// The measured value (a ratio or an absolute figure).
    pub measured: f64,
    /// The bound.
    pub bound: f64,
    /// `>=` or `<=`.
    pub relation: &'static str,
    /// Whether the run met it.
    pub met: bool,
}

impl TargetCheck {
    /// `measured >= bound`.
    pub fn at_least(name: impl Into<String>, measured: f64, bound: f64) -> Self {
        Self {
            name: name.into(),
            measured,
            bound,
            relation: ">=",
            met: measured >= bound,
        }
    }

    /// A figure worth a line among the targets that has no bound.
    pub fn reported(name: impl Into<String>, measured: f64) -> Self {
        Self {
            name: name.into(),
            measured,
            bound: f64::NAN,
            relation: "--",
            met: true,
        }
    }

    /// `measured <= bound`.
    pub fn at_most(name: impl Into<String>, measured: f64, bound: f64) -> Self {
        Self {
            name: name.into(),
            measured,
            bound,
            relation: "<=",
            met: measured <= bound,
        }
    }
}

#[derive(Serialize)]
struct FigureLine<'a> {
    kind: &'static str,
    scenario: &'a str,
    contender: &'a str,
    metric: &'a str,
    median: f64,
    min: f64,
    max: f64,
    spread_percent: f64,
    higher_is_better: bool,
    rounds: &'a [f64],
}

#[derive(Serialize)]
struct TargetLine<'a> {
    kind: &'static str,
    #[serde(flatten)]
    check: &'a TargetCheck,
}

/// Everything one invocation measured, written as it arrives.
pub struct Report {
    figures: Vec<Figure>,
    targets: Vec<TargetCheck>,
    json: std::fs::File,
    out_dir: PathBuf,
}

impl Report {
    /// A report writing `results.jsonl` into `out_dir` (created if missing).
    pub fn create(out_dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(out_dir)?;
        let json = std::fs::File::create(out_dir.join("results.jsonl"))?;
        Ok(Self {
            figures: Vec::new(),
            targets: Vec::new(),
            json,
            out_dir: out_dir.to_path_buf(),
        })
    }

    /// Where plots go.
    pub fn out_dir(&self) -> &Path {
        &self.out_dir
    }

    /// Records a figure and writes its JSON line.
    pub fn figure(&mut self, figure: Figure) {
        let (min, max) = figure.samples.range();
        let line = FigureLine {
            kind: "figure",
            scenario: &figure.scenario,
            contender: &figure.contender,
            metric: &figure.metric,
            median: figure.samples.median(),
            min,
            max,
            spread_percent: figure.samples.spread_percent(),
            higher_is_better: figure.higher_is_better,
            rounds: &figure.samples.0,
        };
        self.write_line(&line);
        self.figures.push(figure);
    }

    /// Records a target check and writes its JSON line.
    pub fn target(&mut self, check: TargetCheck) {
        self.write_line(&TargetLine {
            kind: "target",
            check: &check,
        });
        self.targets.push(check);
    }

    /// The median of a recorded figure.
    pub fn median(&self, scenario: &str, contender: &str, metric: &str) -> Option<f64> {
        self.figures
            .iter()
            .find(|f| f.scenario == scenario && f.contender == contender && f.metric == metric)
            .map(|f| f.samples.median())
    }

    /// The worst round of a recorded figure (the largest value of a figure
    /// where lower is better, the smallest otherwise).
    pub fn worst(&self, scenario: &str, contender: &str, metric: &str) -> Option<f64> {
        self.figures
            .iter()
            .find(|f| f.scenario == scenario && f.contender == contender && f.metric == metric)
            .map(|f| {
                let (min, max) = f.samples.range();
                if f.higher_is_better { min } else { max }
            })
    }

    /// All figures so far.
    pub fn figures(&self) -> &[Figure] {
        &self.figures
    }

    /// Prints one scenario's table.
    pub fn print_scenario(&self, scenario: &str) {
        println!("\n## {scenario}");
        println!(
            "| {:<28} | {:<14} | {:>12} | {:>12} | {:>12} | {:>7} |",
            "contender", "metric", "median", "min", "max", "spread"
        );
        println!(
            "|{:-<30}|{:-<16}|{:->14}|{:->14}|{:->14}|{:->9}|",
            "", "", "", "", "", ""
        );
        for f in self.figures.iter().filter(|f| f.scenario == scenario) {
            let (min, max) = f.samples.range();
            println!(
                "| {:<28} | {:<14} | {:>12} | {:>12} | {:>12} | {:>6.1}% |",
                f.contender,
                f.metric,
                fmt(f.samples.median()),
                fmt(min),
                fmt(max),
                f.samples.spread_percent()
            );
        }
    }

    /// Prints every target of the run.
    pub fn print_targets(&self) {
        if self.targets.is_empty() {
            return;
        }
        println!("\n## targets");
        println!(
            "| {:<62} | {:>10} | {:>10} | {:<4} |",
            "target", "measured", "bound", "met"
        );
        println!("|{:-<64}|{:->12}|{:->12}|{:-<6}|", "", "", "", "");
        for t in &self.targets {
            println!(
                "| {:<62} | {:>10} | {} {:>7} | {:<4} |",
                t.name,
                fmt(t.measured),
                t.relation,
                fmt(t.bound),
                if t.bound.is_nan() {
                    "info"
                } else if t.met {
                    "yes"
                } else {
                    "NO"
                }
            );
        }
    }

    fn write_line(&mut self, line: &impl Serialize) {
        let text = serde_json::to_string(line).expect("figures serialise");
        writeln!(self.json, "{text}").expect("results.jsonl is writable");
    }
}

/// Three significant-ish digits without scientific notation.
pub fn fmt(value: f64) -> String {
    if value.is_nan() {
        "-".into()
    } else if value.abs() >= 1000.0 {
        format!("{value:.0}")
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.3}")
    }
}
