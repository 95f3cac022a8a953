//! The modular-arithmetic tasks of the state-tracking benchmark the Mamba-3
//! paper takes from Grazzi et al. (2025), who take them from the xLSTM
//! paper's formal-language suite (Beck et al., 2024): numbers `0..5`, the
//! operators `+ - *`, every result modulo 5 (5 answer classes, so chance is
//! 1/5 and the paper's scaled accuracy is `(acc - 0.2) / 0.8`).
//!
//! * [`precedence`] — *without brackets*: `a_1 o_1 a_2 .. o_{n-1} a_n = r`
//!   evaluated with the usual precedence (`*` before `+ -`), as the xLSTM
//!   generator computes it. The state is (sum so far, current product
//!   term, its sign), a finite automaton, but not a group: `* 0` erases.
//! * [`brackets`] — *with brackets*: the recursive grammar of Grazzi et
//!   al.'s generator. An expression of exactly `n` tokens is, for `n < 5`,
//!   one of `a`, `- a`, `( a )`, `( - a )`; longer ones are
//!   `( L o R )` with `o` uniform over `+ - *`, the left part's length
//!   uniform in `1..=n-4` and the right part taking the remaining `n - 3 -
//!   |L|` tokens. Every binary operation is bracketed, so precedence never
//!   matters; nesting does (a closing bracket must restore the enclosing
//!   expression's partial value), which is what makes this the hardest
//!   column of the paper's table.
//! * [`brackets_without_times`] — the same grammar with `o` uniform over
//!   `+ -` only (the generator's `mult=False`; whether the paper's column
//!   used it is not stated, see the README). The value is then a signed sum
//!   of the operands, each operand's sign the parity of the `-` that
//!   enclose it: a linear function of the input, where with `*` a closing
//!   bracket multiplies two values computed at different depths.
//!
//! Token ids are task-local: operands 0-4, then the operators, brackets,
//! `=` and `PAD` (see [`super::tasks`] for each task's table).

use rand::Rng;
use rand_chacha::ChaCha20Rng;

use super::skew::Symbols;

/// The modulus of both tasks.
pub const MODULUS: u32 = 5;

/// `+`, `-`, `*` (both tasks).
pub const PLUS: u32 = 5;
/// `-` (binary in both tasks; also unary in `brackets`).
pub const MINUS: u32 = 6;
/// `*`.
pub const TIMES: u32 = 7;
/// `(` (brackets only).
pub const OPEN: u32 = 8;
/// `)` (brackets only).
pub const CLOSE: u32 = 9;

/// `=` of the task without brackets (the one after `*`).
pub const PRECEDENCE_EQ: u32 = 8;
/// `=` of the task with brackets (the one after `)`).
pub const BRACKETS_EQ: u32 = 10;

/// `n` operands joined by `n - 1` random operators (`2n - 1` tokens) and
/// the expression's value under the usual precedence, modulo 5.
pub fn precedence(n: usize, rng: &mut ChaCha20Rng) -> (Vec<u32>, u32) {
    precedence_from(n, &Symbols::Uniform, rng)
}

/// [`precedence`] with the row's symbols drawn as `symbols` says.
pub fn precedence_from(n: usize, symbols: &Symbols, rng: &mut ChaCha20Rng) -> (Vec<u32>, u32) {
    let mut tokens = Vec::with_capacity(2 * n);
    let first: u32 = symbols.value(MODULUS, rng);
    tokens.push(first);
    // sum of the finished terms, the term being multiplied, its sign
    let (mut sum, mut term, mut negative) = (0u32, first, false);
    for _ in 1..n {
        let op = symbols.operator(PLUS, rng);
        let a = symbols.value(MODULUS, rng);
        tokens.extend([op, a]);
        if op == TIMES {
            term = term * a % MODULUS;
        } else {
            sum = add_signed(sum, term, negative);
            term = a;
            negative = op == MINUS;
        }
    }
    (tokens, add_signed(sum, term, negative))
}

/// `sum ± term` modulo 5.
fn add_signed(sum: u32, term: u32, negative: bool) -> u32 {
    if negative {
        (sum + MODULUS - term) % MODULUS
    } else {
        (sum + term) % MODULUS
    }
}

/// A bracketed expression of exactly `n >= 1` tokens (the grammar of the
/// module docs) and its value modulo 5.
///
/// Recursion depth is at most `n / 4 + 1`; callers bound `n`
/// (`Task::max_len`).
pub fn brackets(n: usize, rng: &mut ChaCha20Rng) -> (Vec<u32>, u32) {
    brackets_from(n, Ops::All, &Symbols::Uniform, rng)
}

/// [`brackets`] with binary operators `+ -` only.
pub fn brackets_without_times(n: usize, rng: &mut ChaCha20Rng) -> (Vec<u32>, u32) {
    brackets_from(n, Ops::Additive, &Symbols::Uniform, rng)
}

/// The binary operators a bracketed expression draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ops {
    /// `+ - *`.
    All,
    /// `+ -`.
    Additive,
}

/// [`brackets`] (or [`brackets_without_times`]) with the operands and
/// binary operators drawn as `symbols` says (the tree's shape and the
/// unary minus forms stay the grammar's).
pub fn brackets_from(
    n: usize,
    ops: Ops,
    symbols: &Symbols,
    rng: &mut ChaCha20Rng,
) -> (Vec<u32>, u32) {
    let mut tokens = Vec::with_capacity(n);
    let value = bracketed(n.max(1), ops, symbols, rng, &mut tokens);
    (tokens, value)
}

fn bracketed(
    n: usize,
    ops: Ops,
    symbols: &Symbols,
    rng: &mut ChaCha20Rng,
    out: &mut Vec<u32>,
) -> u32 {
    let negate = |v: u32| (MODULUS - v) % MODULUS;
    if n < 5 {
        let a = symbols.value(MODULUS, rng);
        return match n {
            1 => {
                out.push(a);
                a
            }
            2 => {
                out.extend([MINUS, a]);
                negate(a)
            }
            3 => {
                out.extend([OPEN, a, CLOSE]);
                a
            }
            _ => {
                out.extend([OPEN, MINUS, a, CLOSE]);
                negate(a)
            }
        };
    }
    let left_len = rng.random_range(1..=n - 4);
    let right_len = n - 3 - left_len;
    let op = match ops {
        Ops::All => symbols.operator(PLUS, rng),
        Ops::Additive => symbols.additive_operator(PLUS, rng),
    };
    out.push(OPEN);
    let left = bracketed(left_len, ops, symbols, rng, out);
    out.push(op);
    let right = bracketed(right_len, ops, symbols, rng, out);
    out.push(CLOSE);
    match op {
        PLUS => (left + right) % MODULUS,
        MINUS => (left + MODULUS - right) % MODULUS,
        _ => left * right % MODULUS,
    }
}

/// The number of operands in the longest product term (operands joined by
/// `*`) of a [`precedence`] expression that holds no zero: the longest
/// chain of multiplications whose value the model has to carry, since a
/// zero makes a term 0 whatever else it holds. 0 when every term holds a
/// zero. `expr` is the expression alone (`a_1 o_1 .. a_n`, no `=`).
pub fn longest_unit_term(expr: &[u32]) -> usize {
    let mut best = 0;
    // operands so far in the current term, and whether one was 0
    let (mut len, mut zero) = (0, false);
    for (i, &t) in expr.iter().enumerate() {
        if i % 2 == 0 {
            len += 1;
            zero |= t == 0;
        } else if t != TIMES {
            if !zero {
                best = best.max(len);
            }
            (len, zero) = (0, false);
        }
    }
    if !zero {
        best = best.max(len);
    }
    best
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn every_length_is_exact() {
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        for n in 1..200 {
            assert_eq!(brackets(n, &mut rng).0.len(), n);
            assert_eq!(brackets_without_times(n, &mut rng).0.len(), n);
            assert_eq!(precedence(n, &mut rng).0.len(), 2 * n - 1);
        }
    }

    #[test]
    fn unit_terms() {
        // 2 * 3 + 4 * 0 * 1 - 1 * 2 * 4 * 3
        let expr = [
            2, TIMES, 3, PLUS, 4, TIMES, 0, TIMES, 1, MINUS, 1, TIMES, 2, TIMES, 4, TIMES, 3,
        ];
        assert_eq!(longest_unit_term(&expr), 4);
        assert_eq!(longest_unit_term(&[0, TIMES, 3, PLUS, 0]), 0);
        assert_eq!(longest_unit_term(&[3]), 1);
        assert_eq!(longest_unit_term(&[1, PLUS, 2, MINUS, 3]), 1);
        // the last term counts too
        assert_eq!(longest_unit_term(&[0, PLUS, 2, TIMES, 2, TIMES, 3]), 3);
    }

    #[test]
    fn short_forms() {
        let mut rng = ChaCha20Rng::seed_from_u64(8);
        let (t, v) = brackets(2, &mut rng);
        assert_eq!((t[0], (t[1] + v) % MODULUS), (MINUS, 0));
        let (t, v) = brackets(3, &mut rng);
        assert_eq!((t[0], t[1], t[2]), (OPEN, v, CLOSE));
    }
}
