//! Skewed training rows (`--skewed-rows`): a training row whose symbol
//! frequencies are drawn for that row instead of being uniform.
//!
//! A state-tracking solution turns its state by one angle per symbol, and an
//! angle a little off its exact value adds an error per occurrence. A row
//! of uniform symbols holds each value about `n / k` times (`k` values), so
//! a model trained on such rows only has to be exact enough for that count:
//! a parity model whose 1-bit turns by `0.994 pi` fits every 160-bit row
//! (about 80 ones, 0.5 pi of drift) and fails at 256 bits (about 128 ones).
//! A row whose frequencies are skewed can hold almost `n` of one value, so
//! the same error shows at the training size, where the loss can see it.
//! The drawn frequencies are a flat Dirichlet (every frequency vector
//! equally likely), once for the operands (bits) and once for the
//! operators of a row; everything else about the row (its size, grammar,
//! answer, split) is the task's own.
//!
//! A flat Dirichlet rarely leaves a symbol out of a row, and some errors
//! only show in rows that lack one: a modular product turns the state by
//! the discrete log of each factor, but a product through 0 is 0 whatever
//! came before, so a long zero-free product (the rows that show an inexact
//! product step) stays a few percent of skewed rows. `--skew-drop P` leaves
//! each value and each operator out of a skewed row with probability `P`
//! (one of each always stays) before the frequencies of the rest are drawn.
//! (Measured on the arithmetic, it did not make an inexact product exact:
//! the recipes do not use it; `tests/gpu/STATE-TRACKING.md`, round 22.)
//!
//! Skewed rows start once the curriculum has reached the training size
//! ([`super::DataSpec`]), and evaluation rows stay uniform: the paper's
//! task is what is scored.

use rand::Rng;
use rand_chacha::ChaCha20Rng;

/// How one row draws its symbols.
#[derive(Debug, Clone, PartialEq)]
pub enum Symbols {
    /// Every value and operator equally likely (the task as published);
    /// draws exactly as the generators always have, so a run without
    /// skewed rows sees the same stream as before the option existed.
    Uniform,
    /// Frequencies drawn for this row.
    Skewed {
        /// Cumulative weights of the values `0..values.len()`.
        values: Vec<f64>,
        /// Cumulative weights of the operators `+ - *`.
        operators: [f64; 3],
    },
}

impl Symbols {
    /// Draws a row's frequencies over `values` values and the three
    /// operators from a flat Dirichlet, after leaving each out with
    /// probability `drop` (0: no symbol left out, and no draw for it, so
    /// the stream is the one before `--skew-drop` existed).
    pub fn skewed(values: u32, drop: f64, rng: &mut ChaCha20Rng) -> Self {
        let v = cumulative_dirichlet(usize::try_from(values).unwrap_or(1), drop, rng);
        let o = cumulative_dirichlet(3, drop, rng);
        Self::Skewed {
            values: v,
            operators: [o[0], o[1], o[2]],
        }
    }

    /// Rows of one zero-free product (`--eval-products`): every operator
    /// `*` and every value in `1..values`, uniform; a product through 0
    /// would hide the discrete-log steps this probes.
    pub fn zero_free_products(values: u32) -> Self {
        let nonzero = values.saturating_sub(1).max(1);
        let values = (0..values)
            .map(|v| f64::from(v) / f64::from(nonzero))
            .collect();
        Self::Skewed {
            values,
            operators: [0.0, 0.0, 1.0],
        }
    }

    /// One value in `0..m` (`m` is the task's value count; a skewed row
    /// drew its weights for the same `m`).
    pub fn value(&self, m: u32, rng: &mut ChaCha20Rng) -> u32 {
        match self {
            Self::Uniform => rng.random_range(0..m),
            Self::Skewed { values, .. } => pick(values, rng).min(m.saturating_sub(1)),
        }
    }

    /// One operator token: `plus`, `plus + 1` or `plus + 2` (`+ - *`).
    pub fn operator(&self, plus: u32, rng: &mut ChaCha20Rng) -> u32 {
        match self {
            Self::Uniform => rng.random_range(plus..=plus + 2),
            Self::Skewed { operators, .. } => plus + pick(operators, rng),
        }
    }

    /// One of the first two operators (`+ -`, from id `plus`), for a task
    /// without `*`: uniform, or by the row's weights of those two.
    pub fn additive_operator(&self, plus: u32, rng: &mut ChaCha20Rng) -> u32 {
        match self {
            Self::Uniform => rng.random_range(plus..=plus + 1),
            // A row that left both out has only `*`, which this task
            // lacks: its additive operators are uniform.
            Self::Skewed { operators, .. } if operators[1] <= 0.0 => {
                rng.random_range(plus..=plus + 1)
            }
            Self::Skewed { operators, .. } => {
                // `operators` is cumulative: the first two outcomes,
                // renormalized, are a draw below the second's bound.
                let u = rng.random::<f64>() * operators[1];
                plus + u32::from(u >= operators[0])
            }
        }
    }
}

/// Cumulative weights of a flat Dirichlet over `k` outcomes: normalized
/// exponential draws (`-ln U`), the last entry exactly 1. With `drop > 0`
/// each outcome is first left out (weight 0) with that probability; when
/// all are, one drawn uniformly stays.
fn cumulative_dirichlet(k: usize, drop: f64, rng: &mut ChaCha20Rng) -> Vec<f64> {
    let k = k.max(1);
    let mut kept = vec![true; k];
    if drop > 0.0 {
        kept.iter_mut()
            .for_each(|b| *b = rng.random::<f64>() >= drop);
        if !kept.contains(&true) {
            kept[rng.random_range(0..k)] = true;
        }
    }
    let draws: Vec<f64> = kept
        .iter()
        .map(|&b| {
            if b {
                -(1.0 - rng.random::<f64>()).ln()
            } else {
                0.0
            }
        })
        .collect();
    let total: f64 = draws.iter().sum();
    let mut acc = 0.0;
    let mut out: Vec<f64> = draws
        .iter()
        .map(|d| {
            acc += d / total;
            acc
        })
        .collect();
    if let Some(last) = out.last_mut() {
        *last = 1.0;
    }
    out
}

/// The first outcome whose cumulative weight exceeds a uniform draw.
fn pick(cumulative: &[f64], rng: &mut ChaCha20Rng) -> u32 {
    let u: f64 = rng.random();
    let i = cumulative
        .iter()
        .position(|&c| u < c)
        .unwrap_or(cumulative.len().saturating_sub(1));
    u32::try_from(i).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn skewed_rows_spread_their_frequencies_and_stay_in_range() {
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        // Over many rows the most frequent value's share ranges from about
        // uniform to almost all: the spread the option exists for.
        let mut shares = Vec::new();
        for _ in 0..400 {
            let s = Symbols::skewed(5, 0.0, &mut rng);
            let mut counts = [0u32; 5];
            for _ in 0..200 {
                let v = s.value(5, &mut rng);
                counts[usize::try_from(v).unwrap()] += 1;
                assert!((5..8).contains(&s.operator(5, &mut rng)));
            }
            shares.push(f64::from(*counts.iter().max().unwrap()) / 200.0);
        }
        let most = shares.iter().copied().fold(0.0, f64::max);
        let least = shares.iter().copied().fold(1.0, f64::min);
        assert!(most > 0.8, "no row was dominated by one value: {most}");
        assert!(least < 0.35, "no row was near uniform: {least}");
    }

    #[test]
    fn additive_operators_follow_the_rows_weights_of_plus_and_minus() {
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        let mut shares = Vec::new();
        for _ in 0..300 {
            let s = Symbols::skewed(5, 0.0, &mut rng);
            let Symbols::Skewed { operators, .. } = &s else {
                unreachable!("skewed() draws weights")
            };
            let expected = operators[0] / operators[1];
            let plus = (0..400)
                .map(|_| s.additive_operator(5, &mut rng))
                .inspect(|op| assert!((5..7).contains(op)))
                .filter(|&op| op == 5)
                .count();
            let got = f64::from(u32::try_from(plus).unwrap()) / 400.0;
            assert!((got - expected).abs() < 0.1, "{got} against {expected}");
            shares.push(got);
        }
        assert!(shares.iter().any(|&f| f > 0.9) && shares.iter().any(|&f| f < 0.1));
    }

    #[test]
    fn the_uniform_draw_is_the_generators_own() {
        let mut a = ChaCha20Rng::seed_from_u64(9);
        let mut b = ChaCha20Rng::seed_from_u64(9);
        for _ in 0..100 {
            assert_eq!(Symbols::Uniform.value(5, &mut a), b.random_range(0..5));
            assert_eq!(Symbols::Uniform.operator(5, &mut a), b.random_range(5..=7));
            // `modarith` drew its operators from the half-open range
            assert_eq!(Symbols::Uniform.operator(5, &mut a), b.random_range(5..8));
        }
    }

    #[test]
    fn cumulative_weights_end_at_one() {
        let mut rng = ChaCha20Rng::seed_from_u64(4);
        for k in 1..8 {
            let c = cumulative_dirichlet(k, 0.0, &mut rng);
            assert_eq!(c.len(), k);
            assert_eq!(c[k - 1], 1.0);
            assert!(c.windows(2).all(|w| w[0] <= w[1]));
        }
    }

    #[test]
    fn dropped_symbols_never_appear_and_one_of_each_stays() {
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        let (mut without_zero, mut only_times, rows) = (0u32, 0u32, 2000u32);
        for _ in 0..rows {
            let s = Symbols::skewed(5, 0.5, &mut rng);
            let Symbols::Skewed { values, operators } = &s else {
                unreachable!("skewed() draws weights")
            };
            assert_eq!((values[4], operators[2]), (1.0, 1.0));
            let mut seen = [false; 5];
            for _ in 0..300 {
                seen[usize::try_from(s.value(5, &mut rng)).unwrap()] = true;
                assert!((5..8).contains(&s.operator(5, &mut rng)));
                assert!((5..7).contains(&s.additive_operator(5, &mut rng)));
            }
            // A symbol left out has weight 0: its cumulative step is flat.
            for (v, &was_seen) in seen.iter().enumerate() {
                let below = if v == 0 { 0.0 } else { values[v - 1] };
                assert!(
                    !was_seen || values[v] > below,
                    "value {v} drawn with weight 0"
                );
            }
            without_zero += u32::from(values[0] == 0.0);
            only_times += u32::from(operators[1] == 0.0);
        }
        // Each value is left out half the time (slightly less: one stays);
        // `*` alone is (1/8) / (7/8) of the rows, plus the rows where all
        // three were left out and `*` was the one kept back (1/8 * 1/3).
        let share = |n: u32| f64::from(n) / f64::from(rows);
        assert!(
            (share(without_zero) - 0.5).abs() < 0.05,
            "{}",
            share(without_zero)
        );
        assert!(
            (share(only_times) - 1.0 / 6.0).abs() < 0.04,
            "{}",
            share(only_times)
        );
    }

    #[test]
    fn no_drop_keeps_the_flat_dirichlets_stream() {
        let mut a = ChaCha20Rng::seed_from_u64(12);
        let mut b = ChaCha20Rng::seed_from_u64(12);
        for k in 1..6 {
            let draws: Vec<f64> = (0..k).map(|_| -(1.0 - b.random::<f64>()).ln()).collect();
            let total: f64 = draws.iter().sum();
            let c = cumulative_dirichlet(k, 0.0, &mut a);
            assert!((c[0] - draws[0] / total).abs() < 1e-15);
        }
        assert_eq!(a.random::<u64>(), b.random::<u64>());
    }
}
