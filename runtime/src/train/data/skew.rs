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
//! answer, split) is the task's own. Skewed rows start once the curriculum
//! has reached the training size ([`super::DataSpec`]), and evaluation
//! rows stay uniform: the paper's task is what is scored.

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
    /// operators from a flat Dirichlet.
    pub fn skewed(values: u32, rng: &mut ChaCha20Rng) -> Self {
        let v = cumulative_dirichlet(usize::try_from(values).unwrap_or(1), rng);
        let o = cumulative_dirichlet(3, rng);
        Self::Skewed {
            values: v,
            operators: [o[0], o[1], o[2]],
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
/// exponential draws (`-ln U`), the last entry exactly 1.
fn cumulative_dirichlet(k: usize, rng: &mut ChaCha20Rng) -> Vec<f64> {
    let draws: Vec<f64> = (0..k.max(1))
        .map(|_| -(1.0 - rng.random::<f64>()).ln())
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
            let s = Symbols::skewed(5, &mut rng);
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
            let s = Symbols::skewed(5, &mut rng);
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
            let c = cumulative_dirichlet(k, &mut rng);
            assert_eq!(c.len(), k);
            assert_eq!(c[k - 1], 1.0);
            assert!(c.windows(2).all(|w| w[0] <= w[1]));
        }
    }
}
