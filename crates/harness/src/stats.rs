//! Small, distribution-free statistics for the summary: medians with
//! order-statistic confidence intervals, paired differences, the
//! first-half / second-half drift check, and Jain's fairness index.
//!
//! Why order statistics and not a bootstrap: the interval
//! `[x(j), x(n-j+1)]` of the sorted sample covers the true median with a
//! probability given exactly by the binomial(n, 1/2) distribution, for any
//! continuous distribution of independent samples. It needs no resampling,
//! no seed and no tuning, and latency samples are far from normal.
//!
//! ```
//! use harness::stats::{median_estimate, jain_index};
//! let m = median_estimate(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]).unwrap();
//! assert_eq!(m.median_us, 4.0);
//! assert_eq!((m.ci95_low_us, m.ci95_high_us), (Some(1.0), Some(7.0)));
//! assert_eq!(jain_index(&[5, 5, 5, 5]), Some(1.0));
//! ```

use serde::{Deserialize, Serialize};

/// A median with its 95 % order-statistic confidence interval, in µs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MedianEstimate {
    /// Samples.
    pub count: u64,
    /// The sample median (mean of the two middle values for even counts).
    pub median_us: f64,
    /// Lower end of the 95 % interval for the true median; `None` below 6
    /// samples, where even `[min, max]` covers less than 95 %.
    pub ci95_low_us: Option<f64>,
    /// Upper end of the same interval.
    pub ci95_high_us: Option<f64>,
}

/// 0-based ranks `(lo, hi)` into `n` sorted samples such that
/// `[x[lo], x[hi]]` covers the median with probability >= `confidence`,
/// as narrow as that allows (symmetric); `None` if even `[min, max]` falls
/// short (n < 6 at 95 %).
pub fn median_ci_ranks(n: usize, confidence: f64) -> Option<(usize, usize)> {
    if n == 0 {
        return None;
    }
    // P(B <= k) for B ~ binomial(n, 1/2), summed in log space so that
    // 2^-n does not underflow for large n (those terms round to 0 instead).
    let tail = (1.0 - confidence) / 2.0;
    let nf = n as f64;
    let mut log_pmf = -nf * std::f64::consts::LN_2;
    let mut cdf = 0.0;
    // Largest j (1-based) with P(B <= j - 1) <= tail.
    let mut j = 0usize;
    for k in 0..n {
        cdf += log_pmf.exp();
        if cdf > tail {
            break;
        }
        j = k + 1;
        log_pmf += ((nf - k as f64) / (k as f64 + 1.0)).ln();
    }
    (j >= 1).then(|| (j - 1, n - j))
}

/// The median of `samples` (any order), with its 95 % interval.
pub fn median_estimate(samples: &[f64]) -> Option<MedianEstimate> {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    let ci = median_ci_ranks(n, 0.95).map(|(lo, hi)| (v[lo], v[hi]));
    Some(MedianEstimate {
        count: n as u64,
        median_us: median,
        ci95_low_us: ci.map(|c| c.0),
        ci95_high_us: ci.map(|c| c.1),
    })
}

/// The median of the paired differences `cycle - floor` (µs) of
/// `[floor_ns, cycle_ns]` pairs from the same iteration. Differencing
/// within an iteration cancels what both saw (a busy server, a slow
/// network moment), which the ratio of two separate medians does not.
pub fn paired_difference(pairs: &[[u64; 2]]) -> Option<MedianEstimate> {
    let d: Vec<f64> = pairs
        .iter()
        .map(|[floor, cycle]| (*cycle as f64 - *floor as f64) / 1000.0)
        .collect();
    median_estimate(&d)
}

/// Above this relative change of the median, the two halves of a run may
/// be said to [`Halves::differ`] (if their intervals also part).
pub const HALVES_MIN_RELATIVE_CHANGE: f64 = 0.10;

/// The run's first half of measured samples against its second half: a
/// run whose figure drifted (a cache filling, a compaction, a CPU
/// throttling) does not have one median.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Halves {
    /// The first half (in time order), µs.
    pub first: MedianEstimate,
    /// The second half (gets the middle sample when the count is odd), µs.
    pub second: MedianEstimate,
    /// (second median - first median) / first median: positive = slower
    /// later.
    pub relative_change: f64,
    /// The halves differ: the medians are more than
    /// [`HALVES_MIN_RELATIVE_CHANGE`] apart AND their 95 % intervals do not
    /// overlap. Both, because with many samples tiny shifts are
    /// "significant", and with few a large shift can be noise. `false`
    /// when a half is too small for an interval.
    pub differ: bool,
}

/// Splits time-ordered samples (µs) into halves and compares their medians.
/// `None` below 2 samples.
pub fn halves(samples_in_time_order: &[f64]) -> Option<Halves> {
    let n = samples_in_time_order.len();
    if n < 2 {
        return None;
    }
    let (a, b) = samples_in_time_order.split_at(n / 2);
    let first = median_estimate(a)?;
    let second = median_estimate(b)?;
    let relative_change = if first.median_us != 0.0 {
        (second.median_us - first.median_us) / first.median_us
    } else {
        0.0
    };
    let apart = match (
        first.ci95_low_us,
        first.ci95_high_us,
        second.ci95_low_us,
        second.ci95_high_us,
    ) {
        (Some(lo1), Some(hi1), Some(lo2), Some(hi2)) => hi1 < lo2 || hi2 < lo1,
        _ => false,
    };
    Some(Halves {
        differ: apart && relative_change.abs() > HALVES_MIN_RELATIVE_CHANGE,
        first,
        second,
        relative_change,
    })
}

/// Jain's fairness index of shares `x`: `(sum x)^2 / (n * sum x^2)`, from
/// 1/n (one gets everything) to 1 (all equal). `None` for no shares or
/// all zero.
pub fn jain_index(x: &[u64]) -> Option<f64> {
    let sum: f64 = x.iter().map(|v| *v as f64).sum();
    let squares: f64 = x.iter().map(|v| (*v as f64).powi(2)).sum();
    (!x.is_empty() && squares > 0.0).then(|| sum * sum / (x.len() as f64 * squares))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

    use super::*;

    #[test]
    fn order_statistic_ranks_match_the_binomial_tables() {
        // Classic table values for the 95 % median interval (1-based
        // j = lo + 1): n = 6 -> 1, 10 -> 2, 20 -> 6, 100 -> 40.
        assert_eq!(median_ci_ranks(5, 0.95), None);
        assert_eq!(median_ci_ranks(6, 0.95), Some((0, 5)));
        assert_eq!(median_ci_ranks(10, 0.95), Some((1, 8)));
        assert_eq!(median_ci_ranks(20, 0.95), Some((5, 14)));
        assert_eq!(median_ci_ranks(100, 0.95), Some((39, 60)));
        // Large n: about n/2 -+ 0.98 sqrt(n), and no underflow trouble.
        let (lo, hi) = median_ci_ranks(1_000_000, 0.95).unwrap();
        assert!((499_000..499_030).contains(&lo), "{lo}");
        assert_eq!(hi, 999_999 - lo);
    }

    #[test]
    fn the_interval_covers_the_median_about_95_percent_of_the_time() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut covered = 0;
        for _ in 0..2000 {
            // Exponential samples with median ln 2.
            let s: Vec<f64> = (0..41).map(|_| -(1.0 - rng.random::<f64>()).ln()).collect();
            let m = median_estimate(&s).unwrap();
            if m.ci95_low_us.unwrap() <= 2f64.ln() && 2f64.ln() <= m.ci95_high_us.unwrap() {
                covered += 1;
            }
        }
        // At least 95 % by construction (exactly 97.2 % at n = 41).
        assert!((1880..=1980).contains(&covered), "{covered}");
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median_estimate(&[3.0, 1.0, 2.0]).unwrap().median_us, 2.0);
        assert_eq!(
            median_estimate(&[4.0, 1.0, 2.0, 3.0]).unwrap().median_us,
            2.5
        );
        assert!(median_estimate(&[]).is_none());
        assert_eq!(median_estimate(&[1.0]).unwrap().ci95_low_us, None);
    }

    #[test]
    fn jain_index_on_known_inputs() {
        assert_eq!(jain_index(&[10, 10, 10, 10]), Some(1.0));
        // One of n gets everything: 1/n.
        assert_eq!(jain_index(&[0, 0, 12, 0]), Some(0.25));
        // (1+2+3)^2 / (3 * (1+4+9)) = 36/42.
        assert!((jain_index(&[1, 2, 3]).unwrap() - 36.0 / 42.0).abs() < 1e-12);
        // (3+1)^2 / (2 * (9+1)) = 0.8.
        assert!((jain_index(&[3, 1]).unwrap() - 0.8).abs() < 1e-12);
        assert_eq!(jain_index(&[]), None);
        assert_eq!(jain_index(&[0, 0]), None);
    }
}
