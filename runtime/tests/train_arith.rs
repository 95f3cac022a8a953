//! The paper's modular-arithmetic tasks (`modarith-prec`, `modarith-brackets`
//! and its reading without `*`, `modarith-brackets-nomult`): formats, brackets balanced, every answer checked against an independent
//! evaluator (a recursive-descent parser with the usual precedence, written
//! here and sharing nothing with the generators), held-out sets disjoint
//! from training, and the paper's scaled accuracy. Skewed training rows
//! (`--skewed-rows`, every state-tracking task): answered as right, as
//! skewed as promised, and never in the evaluation sets, which stay
//! uniform.

use std::collections::HashSet;

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use stepgraph::train::data::skew::Symbols;
use stepgraph::train::data::tasks::is_eval_instance;
use stepgraph::train::data::{DataSpec, Dataset, Task};

const PLUS: u32 = 5;
const MINUS: u32 = 6;
const TIMES: u32 = 7;
const OPEN: u32 = 8;
const CLOSE: u32 = 9;

/// `expr := term (('+' | '-') term)*`, `term := unary ('*' unary)*`,
/// `unary := '-' unary | atom`, `atom := digit | '(' expr ')'`, in plain
/// integers; `None` for anything that does not parse to the end.
struct Parser<'a> {
    t: &'a [u32],
    at: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u32> {
        self.t.get(self.at).copied()
    }

    fn expr(&mut self) -> Option<i64> {
        let mut v = self.term()?;
        while let Some(op @ (PLUS | MINUS)) = self.peek() {
            self.at += 1;
            let r = self.term()?;
            v = if op == PLUS { v + r } else { v - r };
        }
        Some(v)
    }

    fn term(&mut self) -> Option<i64> {
        let mut v = self.unary()?;
        while self.peek() == Some(TIMES) {
            self.at += 1;
            v *= self.unary()?;
            // Keep the integers small; the answer is taken modulo 5 anyway.
            v = v.rem_euclid(5);
        }
        Some(v)
    }

    fn unary(&mut self) -> Option<i64> {
        if self.peek() == Some(MINUS) {
            self.at += 1;
            return Some(-self.unary()?);
        }
        match self.peek()? {
            d @ 0..5 => {
                self.at += 1;
                Some(i64::from(d))
            }
            OPEN => {
                self.at += 1;
                let v = self.expr()?;
                (self.peek() == Some(CLOSE)).then(|| self.at += 1)?;
                Some(v)
            }
            _ => None,
        }
    }
}

/// The value modulo 5 of a whole expression, or `None` if it is malformed.
fn evaluate(expr: &[u32]) -> Option<u32> {
    let mut p = Parser { t: expr, at: 0 };
    let v = p.expr()?;
    (p.at == expr.len()).then(|| u32::try_from(v.rem_euclid(5)).ok())?
}

fn rng(seed: u64) -> ChaCha20Rng {
    ChaCha20Rng::seed_from_u64(seed)
}

#[test]
fn the_evaluator_knows_precedence_brackets_and_unary_minus() {
    // 2 + 3 * 4 = 14 = 4 (mod 5); (2 + 3) * 4 = 20 = 0; -(3) = 2; 1 - - 2 = 3.
    assert_eq!(evaluate(&[2, PLUS, 3, TIMES, 4]), Some(4));
    assert_eq!(evaluate(&[OPEN, 2, PLUS, 3, CLOSE, TIMES, 4]), Some(0));
    assert_eq!(evaluate(&[OPEN, MINUS, 3, CLOSE]), Some(2));
    assert_eq!(evaluate(&[1, MINUS, MINUS, 2]), Some(3));
    assert_eq!(evaluate(&[OPEN, 1]), None);
    assert_eq!(evaluate(&[1, CLOSE]), None);
}

#[test]
fn modarith_prec_answers_follow_precedence() {
    let mut r = rng(21);
    let task = Task::ModarithPrec;
    let (mut differs, mut checked) = (0, 0);
    for n in [1, 2, 3, 5, 17, 80, 128] {
        for _ in 0..50 {
            let ex = task.generate(n, &mut r);
            let t = &ex.tokens;
            assert_eq!(t.len(), task.width(n));
            assert!(t.len() == 2 * n + 1);
            for (i, &x) in t[..2 * n - 1].iter().enumerate() {
                if i % 2 == 0 {
                    assert!(x < 5, "operand");
                } else {
                    assert!((PLUS..=TIMES).contains(&x), "operator");
                }
            }
            assert_eq!(t[2 * n - 1], 8, "`=` after the expression");
            assert_eq!(Some(t[2 * n]), evaluate(&t[..2 * n - 1]));
            assert_eq!(ex.answers, vec![2 * n - 1]);
            // Left to right would give another answer for many instances.
            let mut acc = t[0];
            for i in 1..n {
                let (op, a) = (t[2 * i - 1], t[2 * i]);
                acc = match op {
                    PLUS => (acc + a) % 5,
                    MINUS => (acc + 5 - a) % 5,
                    _ => acc * a % 5,
                };
            }
            differs += usize::from(acc != t[2 * n]);
            checked += 1;
        }
    }
    assert!(
        differs * 4 > checked,
        "precedence matters ({differs}/{checked})"
    );
}

#[test]
fn modarith_brackets_are_balanced_and_answered_right() {
    for task in [Task::ModarithBrackets, Task::ModarithBracketsNomult] {
        brackets_are_balanced_and_answered_right(task);
    }
}

fn brackets_are_balanced_and_answered_right(task: Task) {
    let mut r = rng(22);
    let mut depths = HashSet::new();
    for n in (1..=40).chain([159, 160, 255, 256]) {
        for _ in 0..30 {
            let ex = task.generate(n, &mut r);
            let t = &ex.tokens;
            assert_eq!(t.len(), n + 2, "n expression tokens, `=`, answer");
            let expr = &t[..n];
            let mut depth = 0i64;
            let mut deepest = 0;
            for &x in expr {
                assert!(x < 10, "expression tokens only: {x}");
                match x {
                    OPEN => depth += 1,
                    CLOSE => depth -= 1,
                    _ => {}
                }
                assert!(depth >= 0, "a `)` before its `(`");
                deepest = deepest.max(depth);
            }
            assert_eq!(depth, 0, "every `(` closed");
            depths.insert(deepest);
            assert_eq!(t[n], 10, "`=`");
            assert_eq!(Some(t[n + 1]), evaluate(expr), "{expr:?}");
            assert_eq!(ex.answers, vec![n]);
            if task == Task::ModarithBracketsNomult {
                assert!(!expr.contains(&TIMES), "no `*`: {expr:?}");
            }
        }
    }
    assert!(
        depths.iter().any(|&d| d >= 8),
        "{task:?}: deep nesting occurs: {depths:?}"
    );
    assert_eq!(task.pad(), 11);
    assert_eq!(task.vocab_size(), 12);
}

#[test]
fn every_binary_operator_and_short_form_occurs() {
    let mut r = rng(23);
    let mut seen = HashSet::new();
    for _ in 0..200 {
        let ex = Task::ModarithBrackets.generate(30, &mut r);
        seen.extend(ex.tokens.windows(2).map(|w| (w[0], w[1])));
    }
    // `(-a)`, `a + (`, `) * (`, `) - a`.
    for pair in [(OPEN, MINUS), (PLUS, OPEN), (TIMES, OPEN), (CLOSE, MINUS)] {
        assert!(seen.contains(&pair), "{pair:?}");
    }
}

#[test]
fn without_times_both_binary_operators_come_equally_often() {
    let mut r = rng(24);
    let (mut plus, mut minus) = (0usize, 0usize);
    for _ in 0..400 {
        let ex = Task::ModarithBracketsNomult.generate(60, &mut r);
        // A binary operator follows an operand or a `)`; a unary `-`
        // follows `(` or starts the row.
        for w in ex.tokens[..60].windows(2) {
            if w[0] < 5 || w[0] == CLOSE {
                plus += usize::from(w[1] == PLUS);
                minus += usize::from(w[1] == MINUS);
            }
        }
    }
    let f = share(plus, plus + minus);
    assert!(
        (0.45..0.55).contains(&f),
        "share of `+`: {f} ({plus}, {minus})"
    );
}

#[test]
fn without_times_the_answer_is_a_signed_sum_of_the_operands() {
    // Each operand counts with the sign of the `-` around it: flipping one
    // operand by 1 moves the answer by +-1, never by another amount, which
    // a row with `*` does not promise.
    let mut r = rng(25);
    for _ in 0..200 {
        let ex = Task::ModarithBracketsNomult.generate(40, &mut r);
        let expr = &ex.tokens[..40];
        let v = evaluate(expr).unwrap();
        for (i, &t) in expr.iter().enumerate().filter(|&(_, &t)| t < 5) {
            let mut e = expr.to_vec();
            e[i] = (t + 1) % 5;
            let w = evaluate(&e).unwrap();
            assert!(w == (v + 1) % 5 || w == (v + 4) % 5, "{expr:?} at {i}");
        }
    }
}

#[test]
fn held_out_sets_are_disjoint_from_training() {
    for (task, train_len) in [
        (Task::ModarithPrec, 10),
        (Task::ModarithBrackets, 20),
        (Task::ModarithBracketsNomult, 20),
    ] {
        let spec = DataSpec::task(task, train_len, vec![train_len, 2 * train_len]);
        let mut data = Dataset::new(&spec, 5, 32).unwrap();
        let eval: HashSet<Vec<u32>> = data
            .eval_sets()
            .iter()
            .flat_map(|s| &s.batches)
            .flat_map(|b| b.tokens.chunks(b.width).map(<[u32]>::to_vec))
            .map(|row| row.into_iter().filter(|&t| t != task.pad()).collect())
            .collect();
        assert!(eval.iter().all(|t| is_eval_instance(t)), "{task:?}");
        let mut compared = 0;
        for _ in 0..20 {
            let b = data.next_batch(64).unwrap();
            for row in b.tokens.chunks(b.width) {
                let inst: Vec<u32> = row.iter().copied().filter(|&t| t != task.pad()).collect();
                // Tiny instances may be shared (too few exist to keep apart).
                if inst.len() > 8 {
                    assert!(!is_eval_instance(&inst), "{task:?}: {inst:?}");
                    assert!(
                        !eval.contains(&inst),
                        "{task:?}: an eval instance in training"
                    );
                    compared += 1;
                }
            }
        }
        assert!(compared > 500, "{task:?}: {compared}");
    }
}

#[test]
fn scaled_accuracy_is_zero_at_chance_and_100_when_perfect() {
    for task in [
        Task::Parity,
        Task::ModarithPrec,
        Task::ModarithBrackets,
        Task::ModarithBracketsNomult,
    ] {
        assert!(task.scaled_accuracy(task.chance()).abs() < 1e-12);
        assert!((task.scaled_accuracy(1.0) - 1.0).abs() < 1e-12);
    }
    assert!((Task::ModarithBrackets.scaled_accuracy(0.9) - 0.875).abs() < 1e-12);
    assert_eq!(Task::Parity.modulus(), Some(2));
    assert_eq!(Task::ModarithBrackets.modulus(), Some(5));
}

#[test]
fn the_first_lattice_is_the_modulus_and_the_units_of_z5_have_order_4() {
    for task in Task::ALL {
        assert_eq!(task.lattices().first().copied(), task.modulus(), "{task:?}");
    }
    // The second arithmetic lattice: 2 generates the units of Z5 in 4 steps.
    let powers: Vec<u32> = (0..4)
        .scan(1, |p, _| {
            let v = *p;
            *p = *p * 2 % 5;
            Some(v)
        })
        .collect();
    assert_eq!(powers, [1, 2, 4, 3]);
    assert_eq!(Task::ModarithPrec.lattices(), [5, 4]);
}

#[test]
fn the_new_tasks_parse_and_serialize_by_name() {
    for (name, task) in [
        ("modarith-prec", Task::ModarithPrec),
        ("modarith-brackets", Task::ModarithBrackets),
        ("modarith-brackets-nomult", Task::ModarithBracketsNomult),
    ] {
        assert_eq!(name.parse::<Task>(), Ok(task));
        assert_eq!(task.name(), name);
        assert_eq!(serde_json::to_string(&task).unwrap(), format!("\"{name}\""));
    }
}

/// The answer of any state-tracking row, computed here: parity's XOR,
/// `modarith`'s left-to-right value, the evaluator for the other two.
fn reference_answer(task: Task, expr: &[u32]) -> Option<u32> {
    match task {
        Task::Parity => Some(expr.iter().fold(0, |a, &b| a ^ b)),
        Task::Modarith => {
            let mut acc = expr[0];
            for pair in expr[1..].chunks(2) {
                acc = match pair[0] {
                    PLUS => (acc + pair[1]) % 5,
                    MINUS => (acc + 5 - pair[1]) % 5,
                    _ => acc * pair[1] % 5,
                };
            }
            Some(acc)
        }
        _ => evaluate(expr),
    }
}

/// A share of one value that uniform rows of 20 or more values almost
/// never reach and skewed ones often do: 0.85 of two values, 0.55 of five
/// (a flat Dirichlet's largest share passes it with odds 0.3 and 0.2).
fn lopsided_share(values: u32) -> f64 {
    1.0 / f64::from(values) + 0.35
}

/// `part / whole` for counts.
fn share(part: usize, whole: usize) -> f64 {
    let f = |n: usize| f64::from(u32::try_from(n).unwrap());
    f(part) / f(whole)
}

const STATE_TRACKING: [Task; 5] = [
    Task::Parity,
    Task::Modarith,
    Task::ModarithPrec,
    Task::ModarithBrackets,
    Task::ModarithBracketsNomult,
];

#[test]
fn skewed_rows_are_answered_right_and_skewed() {
    let mut r = rng(31);
    for task in STATE_TRACKING {
        let values = task.modulus().unwrap();
        // The largest share one value takes in a row, over many rows.
        let mut top_share: f64 = 0.0;
        for n in [1, 2, 7, 40, 160] {
            for i in 0..60 {
                // Half the rows leave symbols out (`--skew-drop`): rows of
                // one operator or without some values are answered right too.
                let drop = if i % 2 == 0 { 0.0 } else { 0.5 };
                let symbols = task.skewed_symbols(drop, &mut r);
                let ex = task.sample_from(n, false, &symbols, &mut r);
                let t = &ex.tokens;
                assert_eq!(t.len(), task.width(n), "{task:?}");
                let eq = *ex.answers.first().unwrap();
                let expr = &t[..eq];
                assert_eq!(
                    Some(t[eq + 1]),
                    reference_answer(task, expr),
                    "{task:?}: {expr:?}"
                );
                if task == Task::ModarithBracketsNomult {
                    assert!(!expr.contains(&TIMES), "skewed, still no `*`: {expr:?}");
                }
                let operands: Vec<u32> = expr.iter().copied().filter(|&x| x < values).collect();
                if n == 160 {
                    let most = (0..values)
                        .map(|v| operands.iter().filter(|&&x| x == v).count())
                        .max()
                        .unwrap();
                    top_share = top_share.max(share(most, operands.len()));
                }
            }
        }
        // Uniform rows of this size keep every value near 1 / values.
        assert!(
            top_share > lopsided_share(values),
            "{task:?}: at most {top_share} of one value"
        );
    }
}

#[test]
fn uniform_symbols_draw_the_published_rows() {
    for task in STATE_TRACKING {
        let (mut a, mut b) = (rng(32), rng(32));
        for n in [1, 5, 33] {
            assert_eq!(
                task.generate(n, &mut a),
                task.generate_from(n, &Symbols::Uniform, &mut b)
            );
        }
    }
}

#[test]
fn skewed_training_rows_leave_the_eval_sets_alone() {
    for task in STATE_TRACKING {
        let spec = |skewed_rows, skew_drop| DataSpec::Task {
            task,
            train_len: 40,
            eval_lens: vec![40, 80],
            curriculum: 0,
            curriculum_gate: 0.0,
            curriculum_start: 0,
            train_min_len: 0,
            skewed_rows,
            skew_drop,
            eval_mix: None,
            eval_products: None,
        };
        let rows = |d: &Dataset| -> Vec<Vec<u32>> {
            d.eval_sets()
                .iter()
                .flat_map(|s| &s.batches)
                .flat_map(|b| b.tokens.chunks(b.width).map(<[u32]>::to_vec))
                .collect()
        };
        let plain = Dataset::new(&spec(0.0, 0.0), 6, 32).unwrap();
        let mut zero_free = [0; 2];
        for (drop, zero_free) in [0.0, 0.5].into_iter().zip(&mut zero_free) {
            let mut skewed = Dataset::new(&spec(0.5, drop), 6, 32).unwrap();
            let eval = rows(&skewed);
            assert_eq!(rows(&plain), eval, "{task:?}: eval rows changed");
            let eval: HashSet<Vec<u32>> = eval.into_iter().collect();
            // Half the training rows skewed: some rows far from uniform, none
            // an eval instance.
            let values = task.modulus().unwrap();
            let mut lopsided = 0;
            for _ in 0..10 {
                let b = skewed.next_batch(64).unwrap();
                for row in b.tokens.chunks(b.width) {
                    let inst: Vec<u32> = row.iter().copied().filter(|&t| t != task.pad()).collect();
                    if inst.len() > 20 {
                        assert!(!is_eval_instance(&inst), "{task:?}: {inst:?}");
                        assert!(!eval.contains(row), "{task:?}: an eval row in training");
                        let operands: Vec<u32> = inst[..inst.len() - 2]
                            .iter()
                            .copied()
                            .filter(|&x| x < values)
                            .collect();
                        let most = (0..values)
                            .map(|v| operands.iter().filter(|&&x| x == v).count())
                            .max()
                            .unwrap();
                        lopsided +=
                            usize::from(share(most, operands.len()) > lopsided_share(values));
                        *zero_free += usize::from(!operands.contains(&0));
                    }
                }
            }
            assert!(lopsided > 10, "{task:?}: {lopsided} lopsided rows");
        }
        // `--skew-drop 0.5` leaves 0 out of about half the skewed rows; a
        // flat Dirichlet alone rarely keeps a row of 20+ tokens free of it.
        assert!(
            zero_free[1] >= zero_free[0] + 25,
            "{task:?}: rows without 0, {zero_free:?}"
        );
    }
}

#[test]
fn skewed_rows_wait_for_the_curriculums_end() {
    let spec = |skewed_rows| DataSpec::Task {
        task: Task::Parity,
        train_len: 40,
        eval_lens: vec![40],
        curriculum: 20,
        curriculum_gate: 0.0,
        curriculum_start: 0,
        train_min_len: 0,
        skewed_rows,
        skew_drop: 0.0,
        eval_mix: None,
        eval_products: None,
    };
    let mut plain = Dataset::new(&spec(0.0), 8, 16).unwrap();
    let mut skewed = Dataset::new(&spec(1.0), 8, 16).unwrap();
    // While the largest size grows, the two runs draw the same rows.
    for _ in 0..10 {
        assert_eq!(
            plain.next_batch(16).unwrap(),
            skewed.next_batch(16).unwrap()
        );
    }
    for _ in 10..25 {
        plain.next_batch(16).unwrap();
        skewed.next_batch(16).unwrap();
    }
    // After it, every row of the skewed run is skewed: rows of mostly
    // ones or mostly zeros, which uniform bits almost never give.
    let lopsided = |d: &mut Dataset| {
        let b = d.next_batch(256).unwrap();
        b.tokens
            .chunks(b.width)
            .filter(|row| {
                let bits: Vec<u32> = row.iter().copied().take_while(|&t| t < 2).collect();
                let ones = bits.iter().filter(|&&t| t == 1).count();
                bits.len() >= 30 && (ones * 10 > bits.len() * 8 || ones * 10 < bits.len() * 2)
            })
            .count()
    };
    assert!(lopsided(&mut skewed) >= 10);
    assert!(lopsided(&mut plain) <= 1);
}

#[test]
fn rows_that_leave_symbols_out_stay_out_of_the_held_out_half() {
    // A high drop leaves many rows with one value and one operator: one
    // instance per size, which only new frequencies move out of the
    // held-out half.
    for task in STATE_TRACKING {
        let mut r = rng(40);
        for n in [8, 40, 160] {
            for _ in 0..100 {
                let ex = task.sample_skewed(n, 0.9, &mut r);
                assert!(!is_eval_instance(&ex.tokens), "{task:?}: {:?}", ex.tokens);
            }
        }
    }
    // Without a drop, the draws are those of the skewed rows before it.
    let (mut a, mut b) = (rng(41), rng(41));
    for task in STATE_TRACKING {
        for _ in 0..50 {
            let symbols = task.skewed_symbols(0.0, &mut b);
            assert_eq!(
                task.sample_skewed(40, 0.0, &mut a),
                task.sample_from(40, false, &symbols, &mut b)
            );
        }
    }
}

#[test]
fn the_products_probe_holds_zero_free_products_answered_right() {
    for task in [Task::Modarith, Task::ModarithPrec] {
        let spec = |k| {
            let mut spec = DataSpec::task(task, 20, vec![20, 40]);
            if let DataSpec::Task {
                eval_mix,
                eval_products,
                ..
            } = &mut spec
            {
                (*eval_mix, *eval_products) = (Some([10, 40]), k);
            }
            spec
        };
        let plain = Dataset::new(&spec(None), 4, 64).unwrap();
        let probed = Dataset::new(&spec(Some(8)), 4, 64).unwrap();
        let (a, b) = (plain.eval_sets(), probed.eval_sets());
        assert_eq!(b.len(), a.len() + 1, "{task:?}");
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.batches, y.batches, "{task:?}: {} changed", x.label);
        }
        let probe = b.last().unwrap();
        assert_eq!((probe.label.as_str(), probe.length), ("products 8", None));
        let mut values = HashSet::new();
        for batch in &probe.batches {
            assert_eq!(batch.width, task.width(8), "{task:?}");
            for row in batch.tokens.chunks(batch.width) {
                // 8 operands, 7 `*`, then `=` and the answer.
                let expr = &row[..15];
                assert!(
                    expr.iter().skip(1).step_by(2).all(|&t| t == TIMES),
                    "{row:?}"
                );
                let operands: Vec<u32> = expr.iter().copied().step_by(2).collect();
                assert!(operands.iter().all(|&v| (1..5).contains(&v)), "{row:?}");
                let answer = row[16];
                assert_eq!(Some(answer), reference_answer(task, expr), "{row:?}");
                assert_ne!(answer, 0, "a product of units is never 0");
                values.extend(operands);
            }
        }
        assert_eq!(values.len(), 4, "{task:?}: every unit appears");
    }
}
