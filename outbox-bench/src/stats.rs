//! Rounds, medians and spreads: every figure is the median of interleaved runs.

/// The measurements of one contender on one metric, one per round.
#[derive(Clone, Debug, Default)]
pub struct Samples(pub Vec<f64>);

impl Samples {
    /// The middle value (mean of the two middles for an even count).
    pub fn median(&self) -> f64 {
        percentile_sorted(&self.sorted(), 50.0)
    }

    /// Smallest and largest value.
    pub fn range(&self) -> (f64, f64) {
        let sorted = self.sorted();
        (
            sorted.first().copied().unwrap_or(f64::NAN),
            sorted.last().copied().unwrap_or(f64::NAN),
        )
    }

    /// (max - min) / median, as a percentage: how far the rounds disagree.
    pub fn spread_percent(&self) -> f64 {
        let (min, max) = self.range();
        let median = self.median();
        if median == 0.0 {
            0.0
        } else {
            (max - min) / median * 100.0
        }
    }

    fn sorted(&self) -> Vec<f64> {
        let mut values = self.0.clone();
        values.sort_by(f64::total_cmp);
        values
    }
}

/// The `p`-th percentile (0–100) of sorted values, nearest-rank with
/// linear interpolation.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let rank = p / 100.0 * (n - 1) as f64;
            let low = rank.floor() as usize;
            let high = rank.ceil() as usize;
            let weight = rank - low as f64;
            sorted[low] * (1.0 - weight) + sorted[high] * weight
        }
    }
}

/// Percentiles of raw observations (latencies), sorted once.
pub fn percentiles(values: &mut [f64], ps: &[f64]) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    ps.iter().map(|p| percentile_sorted(values, *p)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_spread() {
        let s = Samples(vec![10.0, 30.0, 20.0]);
        assert_eq!(s.median(), 20.0);
        assert_eq!(s.range(), (10.0, 30.0));
        assert_eq!(s.spread_percent(), 100.0);
        assert_eq!(Samples(vec![1.0, 2.0, 3.0, 4.0]).median(), 2.5);
    }

    #[test]
    fn percentiles_interpolate() {
        let mut v: Vec<f64> = (1..=101).map(f64::from).collect();
        assert_eq!(percentiles(&mut v, &[50.0, 99.0]), vec![51.0, 100.0]);
    }
}
