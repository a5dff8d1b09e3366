//! Percentiles and summaries of measured samples.

use std::time::Duration;

use serde::Serialize;

/// Latency summary of one measured operation, in microseconds.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Latency {
    pub n: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    pub max_us: f64,
}

/// Nearest-rank quantile of sorted values (`q` in 0..=1).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

pub fn latency(samples: &[Duration]) -> Latency {
    let us = sorted(samples.iter().map(|d| d.as_secs_f64() * 1e6).collect());
    if us.is_empty() {
        return Latency::default();
    }
    Latency {
        n: us.len(),
        p50_us: quantile(&us, 0.50),
        p99_us: quantile(&us, 0.99),
        mean_us: us.iter().sum::<f64>() / us.len() as f64,
        max_us: us[us.len() - 1],
    }
}

/// Requests one operation sent, over the counted iterations.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Count {
    pub n: usize,
    pub median: u64,
    pub min: u64,
    pub max: u64,
    pub mean: f64,
}

pub fn count(samples: &[u64]) -> Option<Count> {
    if samples.is_empty() {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_unstable();
    Some(Count {
        n: v.len(),
        median: v[(v.len() - 1) / 2],
        min: v[0],
        max: v[v.len() - 1],
        mean: v.iter().sum::<u64>() as f64 / v.len() as f64,
    })
}

/// `1.23 ms`, `456 µs`, `2.1 s`.
pub fn fmt_us(us: f64) -> String {
    if !us.is_finite() {
        "—".into()
    } else if us >= 1e6 {
        format!("{:.2} s", us / 1e6)
    } else if us >= 1e4 {
        format!("{:.0} ms", us / 1e3)
    } else if us >= 1e3 {
        format!("{:.2} ms", us / 1e3)
    } else if us >= 10.0 {
        format!("{us:.0} µs")
    } else {
        format!("{us:.1} µs")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        let v = sorted((1..=100).map(f64::from).collect());
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert_eq!(quantile(&[7.0], 0.99), 7.0);
        let c = count(&[1, 2, 2, 9]).unwrap();
        assert_eq!((c.median, c.min, c.max), (2, 1, 9));
        assert_eq!(fmt_us(1500.0), "1.50 ms");
        assert_eq!(fmt_us(250.0), "250 µs");
    }
}
