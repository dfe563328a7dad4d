//! Figures across repeated runs: a median with a bootstrap 95 % interval,
//! the ratio of two medians with its interval, and the call between two
//! backends ("A wins" only when the interval excludes a tie and the gap is
//! larger than what an A/A pair shows; otherwise "tie (within noise)").
//!
//! Every resample is drawn from a fixed seed, so re-rendering the same
//! `comparison.json` gives the same intervals, byte for byte.

use serde::{Deserialize, Serialize};

/// Bootstrap resamples per interval: 2,000 puts the 2.5 % and 97.5 %
/// quantiles on the 50th and 1,950th of them, stable to well under the
/// spread five repeats can resolve.
const RESAMPLES: usize = 2_000;

/// The generator's fixed seed (see the module docs).
const SEED: u64 = 0x6c6f_636b_6265_6e63; // "lockbenc"

/// A median over repeats with its bootstrap 95 % interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// Repeats it rests on.
    pub n: usize,
    /// The median of the repeats.
    pub median: f64,
    /// Lower end of the 95 % interval.
    pub lo: f64,
    /// Upper end of the 95 % interval.
    pub hi: f64,
}

impl Estimate {
    /// The median of `samples` with a percentile-bootstrap 95 % interval;
    /// `None` without samples. With one sample the interval is that
    /// sample: nothing to resample, which the page shows as n = 1.
    pub fn of(samples: &[f64]) -> Option<Self> {
        let mid = median(samples)?;
        let mut rng = SplitMix(SEED);
        let mut meds: Vec<f64> = (0..RESAMPLES)
            .filter_map(|_| median(&resample(samples, &mut rng)))
            .collect();
        let (lo, hi) = quantiles(&mut meds)?;
        Some(Self {
            n: samples.len(),
            median: mid,
            lo,
            hi,
        })
    }

    /// The ratio of `a`'s median to `b`'s, with a bootstrap 95 % interval
    /// (each side resampled on its own: the repeats are not paired).
    pub fn ratio(a: &[f64], b: &[f64]) -> Option<Self> {
        let (ma, mb) = (median(a)?, median(b)?);
        if mb == 0.0 {
            return None;
        }
        let mut rng = SplitMix(SEED ^ 0x5151);
        let mut rs: Vec<f64> = (0..RESAMPLES)
            .filter_map(|_| {
                let (x, y) = (
                    median(&resample(a, &mut rng))?,
                    median(&resample(b, &mut rng))?,
                );
                (y != 0.0).then(|| x / y)
            })
            .collect();
        let (lo, hi) = quantiles(&mut rs)?;
        Some(Self {
            n: a.len().min(b.len()),
            median: ma / mb,
            lo,
            hi,
        })
    }

    /// "1.23 [1.10–1.31]" with `digits` decimals.
    pub fn show(&self, digits: usize) -> String {
        if self.n < 2 {
            return format!("{:.digits$} (n = 1)", self.median);
        }
        format!(
            "{:.digits$} [{:.digits$}–{:.digits$}]",
            self.median, self.lo, self.hi
        )
    }
}

/// The call between the best candidate and the runner-up.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Call {
    /// `winner` is better; `ratio` = runner-up / winner for lower-is-better
    /// figures, winner / runner-up for higher-is-better (above 1 either way).
    Winner {
        /// The best backend.
        winner: String,
        /// The runner-up it beat.
        runner_up: String,
        /// How much better, with its interval.
        ratio: Estimate,
    },
    /// No defensible winner.
    Tie {
        /// The candidates within the tie (best first).
        between: Vec<String>,
        /// The interval of the best against the runner-up.
        ratio: Estimate,
        /// Why: the interval includes 1, or the gap is within the A/A noise.
        why: String,
    },
}

/// Picks the best of `candidates` (name, samples across repeats), lower
/// or higher being better. A winner is named only when the interval of
/// the ratio to the runner-up lies wholly beyond 1 AND its lower end is
/// beyond the noise floor (`noise`, a relative difference an A/A pair
/// showed, e.g. 0.04 for 4 %). `None` with fewer than two candidates.
pub fn call(candidates: &[(String, Vec<f64>)], lower_is_better: bool, noise: f64) -> Option<Call> {
    let mut ranked: Vec<(&String, &Vec<f64>, f64)> = candidates
        .iter()
        .filter_map(|(n, s)| median(s).map(|m| (n, s, m)))
        .collect();
    ranked.sort_by(|a, b| {
        let o = a.2.total_cmp(&b.2);
        if lower_is_better {
            o
        } else {
            o.reverse()
        }
    });
    let [(best, bs, _), (second, ss, _), ..] = ranked.as_slice() else {
        return None;
    };
    // Oriented so that above 1 means "the best really is better".
    let ratio = if lower_is_better {
        Estimate::ratio(ss, bs)?
    } else {
        Estimate::ratio(bs, ss)?
    };
    if ratio.lo > 1.0 + noise {
        return Some(Call::Winner {
            winner: (*best).clone(),
            runner_up: (*second).clone(),
            ratio,
        });
    }
    let why = if ratio.lo <= 1.0 {
        format!(
            "the 95 % interval of the ratio, {}, includes 1",
            ratio.show(2)
        )
    } else {
        format!(
            "the interval {} does not clear the A/A noise floor of {:.1} %",
            ratio.show(2),
            noise * 100.0
        )
    };
    // Everyone the best cannot be told apart from, not only the runner-up.
    let mut between = vec![(*best).clone()];
    for (n, s, _) in ranked.iter().skip(1) {
        let r = if lower_is_better {
            Estimate::ratio(s, bs)
        } else {
            Estimate::ratio(bs, s)
        };
        if r.is_some_and(|r| r.lo <= 1.0 + noise) {
            between.push((*n).clone());
        }
    }
    Some(Call::Tie {
        between,
        ratio,
        why,
    })
}

/// A target ("at most `limit`") against an interval: met when the whole
/// interval is within it, missed when the whole interval is beyond it,
/// otherwise inconclusive (more repeats, or a quieter machine, decide).
pub fn target(e: &Estimate, limit: f64) -> &'static str {
    if e.n < 2 {
        "inconclusive (n = 1)"
    } else if e.hi <= limit {
        "met"
    } else if e.lo > limit {
        "missed"
    } else {
        "inconclusive"
    }
}

/// The noise floor an A/A pair shows: the farthest end of the interval of
/// their ratio from 1 (0 when they never differ).
pub fn noise_floor(a: &[f64], a_again: &[f64]) -> Option<f64> {
    let r = Estimate::ratio(a, a_again)?;
    Some((r.hi - 1.0).abs().max((1.0 - r.lo).abs()))
}

/// The median; `None` without finite samples.
pub fn median(samples: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// The 2.5 % and 97.5 % quantiles (nearest rank).
fn quantiles(v: &mut [f64]) -> Option<(f64, f64)> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    // Nearest rank of the 2.5 % and 97.5 % quantiles: ceil(q·n), 1-based.
    let n = v.len();
    let rank = |per_mille: usize| (per_mille * n).div_ceil(1000).clamp(1, n) - 1;
    Some((v[rank(25)], v[rank(975)]))
}

fn resample(samples: &[f64], rng: &mut SplitMix) -> Vec<f64> {
    (0..samples.len())
        .filter_map(|_| samples.get(rng.below(samples.len())).copied())
        .collect()
}

/// SplitMix64: enough randomness for resampling indices, and no
/// dependency for it.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        // n fits in u64 on every target we build; the remainder is < n.
        usize::try_from(self.next() % n as u64).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(n: &str, v: &[f64]) -> (String, Vec<f64>) {
        (n.to_string(), v.to_vec())
    }

    #[test]
    fn median_and_interval() {
        let e = Estimate::of(&[5.0, 1.0, 3.0, 2.0, 4.0]).unwrap();
        assert_eq!(e.median, 3.0);
        assert!(
            e.lo <= 3.0 && e.hi >= 3.0 && e.lo >= 1.0 && e.hi <= 5.0,
            "{e:?}"
        );
        assert!(e.lo < e.hi);
        assert_eq!(Estimate::of(&[]), None);
        let one = Estimate::of(&[7.0]).unwrap();
        assert_eq!((one.lo, one.median, one.hi), (7.0, 7.0, 7.0));
        // Deterministic: the page re-renders byte for byte.
        assert_eq!(
            Estimate::of(&[1.0, 9.0, 4.0]),
            Estimate::of(&[1.0, 9.0, 4.0])
        );
    }

    #[test]
    fn overlapping_repeats_are_a_tie() {
        let c = call(
            &[
                named("a", &[100.0, 104.0, 98.0, 101.0, 103.0]),
                named("b", &[102.0, 99.0, 105.0, 100.0, 97.0]),
            ],
            true,
            0.0,
        )
        .unwrap();
        assert!(
            matches!(&c, Call::Tie { between, .. } if between.len() == 2),
            "{c:?}"
        );
    }

    #[test]
    fn separated_repeats_name_the_winner() {
        let c = call(
            &[
                named("slow", &[200.0, 210.0, 205.0, 198.0, 207.0]),
                named("fast", &[100.0, 104.0, 98.0, 101.0, 103.0]),
            ],
            true,
            0.0,
        )
        .unwrap();
        match c {
            Call::Winner {
                winner,
                runner_up,
                ratio,
            } => {
                assert_eq!((winner.as_str(), runner_up.as_str()), ("fast", "slow"));
                assert!(ratio.lo > 1.8 && ratio.hi < 2.2, "{ratio:?}");
            }
            other => panic!("{other:?}"),
        }
        // Higher is better: the same figures pick the other one.
        let c = call(
            &[
                named("slow", &[200.0, 210.0, 205.0, 198.0, 207.0]),
                named("fast", &[100.0, 104.0, 98.0, 101.0, 103.0]),
            ],
            false,
            0.0,
        )
        .unwrap();
        assert!(
            matches!(&c, Call::Winner { winner, .. } if winner == "slow"),
            "{c:?}"
        );
    }

    #[test]
    fn a_gap_inside_the_noise_floor_is_a_tie() {
        let cands = [
            named("a", &[100.0, 100.5, 100.2, 100.1, 100.4]),
            named("b", &[103.0, 103.2, 103.1, 103.4, 103.3]),
        ];
        assert!(matches!(call(&cands, true, 0.0), Some(Call::Winner { .. })));
        let c = call(&cands, true, 0.05).unwrap();
        assert!(
            matches!(&c, Call::Tie { why, .. } if why.contains("noise floor")),
            "{c:?}"
        );
    }

    #[test]
    fn targets_are_met_missed_or_inconclusive() {
        let e = |lo, hi| Estimate {
            n: 5,
            median: (lo + hi) / 2.0,
            lo,
            hi,
        };
        assert_eq!(target(&e(1.05, 1.12), 1.15), "met");
        assert_eq!(target(&e(1.16, 1.30), 1.15), "missed");
        assert_eq!(target(&e(1.10, 1.20), 1.15), "inconclusive");
    }

    #[test]
    fn a_and_a_again_make_a_small_noise_floor() {
        let n = noise_floor(
            &[100.0, 103.0, 99.0, 101.0, 102.0],
            &[101.0, 100.0, 104.0, 99.0, 102.0],
        )
        .unwrap();
        assert!(n > 0.0 && n < 0.06, "{n}");
        assert_eq!(call(&[named("only", &[1.0])], true, 0.0), None);
    }
}
