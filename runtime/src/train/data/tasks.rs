//! Synthetic tasks generated in-process: the state-tracking tasks the Mamba-3
//! paper reports (parity, modular arithmetic without brackets) and two
//! memory tasks (selective copying, multi-query associative recall).
//!
//! Every task has a *problem size* `n` (its "length"): training draws `n`
//! uniformly from `[min_len, L]` and evaluation uses fixed sizes, usually
//! larger than `L`, to measure length generalization (the paper trains on
//! lengths <= 160 and evaluates at 256; Table 5b). Supervision follows the
//! formal-language setup the paper's state-tracking numbers come from: the
//! model reads the whole instance and is scored only at **answer positions**
//! (the loss is masked to them, and accuracy counts only them). Each row is
//! one instance, right-padded with `PAD` (the model is causal, so padding
//! after the answer changes nothing it is scored on).
//!
//! Token formats (`[..]` = one token id; the prediction *at* a position is the
//! model's guess of the next token):
//!
//! * **parity** (vocab 4): `b_1 .. b_n [=] y [PAD]..` with bits `b_i` in
//!   `{0, 1}` (ids 0, 1), `[=]` = 2, `PAD` = 3, `y` = XOR of the bits. One
//!   answer: the prediction at `[=]`. Row width `n + 2`.
//! * **modarith** (vocab 10): `a_1 o_1 a_2 .. o_{n-1} a_n [=] r [PAD]..` with
//!   operands `a_i` in `0..5` (ids 0-4), operators `+ - *` (ids 5, 6, 7),
//!   `[=]` = 8, `PAD` = 9. `r` evaluates the expression **left to right**
//!   modulo 5 (no precedence, no brackets), so it is a pure state-tracking
//!   problem over Z_5: `r_1 = a_1`, `r_{i+1} = r_i o_i a_{i+1}`. One answer at
//!   `[=]`. Row width `2n + 1`.
//! * **copy** (selective copying, vocab 11): a region of `n` tokens holding
//!   `K = 4` data tokens (ids 0-7) at random positions, the rest `BLANK` (8),
//!   then `[SEP]` (9) and the `K` data tokens in order; `PAD` = 10. Answers:
//!   the predictions at `[SEP]` and at the first `K - 1` copied tokens.
//!   Row width `n + 1 + K`; `n >= K`.
//! * **mqar** (multi-query associative recall, vocab 65): `n` key-value pairs
//!   `k_1 v_1 .. k_n v_n` with distinct keys (ids 0-31) and values (ids
//!   32-63), then every key once more in a random order, each followed by its
//!   value; `PAD` = 64. Answers: the predictions at the queried keys. Row
//!   width `4n`; `1 <= n <= 32`.
//!
//! Train/eval split: an instance belongs to the eval split when a hash of its
//! tokens falls in one bucket out of [`EVAL_BUCKETS`]; each split rejects the
//! other's instances, so at every length both share no instance. Where the
//! instance space is too small to find one (e.g. parity with `n <= 3`),
//! sampling gives up after [`MAX_TRIES`] draws and keeps the last one:
//! disjointness is only meaningful where the space is large.

use rand::Rng;
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

/// One bucket of this many holds the eval split.
pub const EVAL_BUCKETS: u64 = 8;
/// Draws before a split gives up on rejecting the other split's instances.
pub const MAX_TRIES: usize = 256;

const COPY_K: usize = 4;
const COPY_ALPHABET: u32 = 8;
const MQAR_KEYS: u32 = 32;

/// A synthetic task (`--task`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// Parity of a bit string, answered after `[=]`.
    Parity,
    /// Left-to-right arithmetic modulo 5 without brackets.
    Modarith,
    /// Selective copying of 4 data tokens scattered in blanks.
    Copy,
    /// Multi-query associative recall.
    Mqar,
}

/// One generated instance: its tokens and the prediction positions scored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// Token ids, unpadded.
    pub tokens: Vec<u32>,
    /// Positions `p` whose prediction (of `tokens[p + 1]`) is scored.
    pub answers: Vec<usize>,
}

impl Task {
    /// Every task, for help texts and tests.
    pub const ALL: [Task; 4] = [Task::Parity, Task::Modarith, Task::Copy, Task::Mqar];

    /// The `--task` name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Parity => "parity",
            Self::Modarith => "modarith",
            Self::Copy => "copy",
            Self::Mqar => "mqar",
        }
    }

    /// Vocabulary size (including `PAD`).
    pub fn vocab_size(self) -> usize {
        usize::try_from(self.pad() + 1).unwrap_or(usize::MAX)
    }

    /// The padding token id (the largest id).
    pub fn pad(self) -> u32 {
        match self {
            Self::Parity => 3,
            Self::Modarith => 9,
            Self::Copy => 10,
            Self::Mqar => 2 * MQAR_KEYS,
        }
    }

    /// Smallest problem size.
    pub fn min_len(self) -> usize {
        match self {
            Self::Copy => COPY_K,
            _ => 1,
        }
    }

    /// Largest problem size (MQAR has only 32 distinct keys).
    pub fn max_len(self) -> usize {
        match self {
            Self::Mqar => usize::try_from(MQAR_KEYS).unwrap_or(usize::MAX),
            _ => 1 << 20,
        }
    }

    /// Row width (tokens, i.e. `T + 1`) of an instance of size `n`.
    pub fn width(self, n: usize) -> usize {
        match self {
            Self::Parity => n + 2,
            Self::Modarith => 2 * n + 1,
            Self::Copy => n + 1 + COPY_K,
            Self::Mqar => 4 * n,
        }
    }

    /// Draws one instance of size `n` (clamped to the task's range).
    pub fn generate(self, n: usize, rng: &mut ChaCha20Rng) -> Example {
        let n = n.clamp(self.min_len(), self.max_len());
        match self {
            Self::Parity => {
                let mut tokens: Vec<u32> = (0..n).map(|_| rng.random_range(0..2)).collect();
                let y = tokens.iter().fold(0, |a, &b| a ^ b);
                tokens.extend([2, y]);
                Example {
                    tokens,
                    answers: vec![n],
                }
            }
            Self::Modarith => {
                let mut tokens = Vec::with_capacity(2 * n + 1);
                let mut acc: u32 = rng.random_range(0..5);
                tokens.push(acc);
                for _ in 1..n {
                    let op: u32 = rng.random_range(5..8);
                    let a: u32 = rng.random_range(0..5);
                    acc = match op {
                        5 => (acc + a) % 5,
                        6 => (acc + 5 - a) % 5,
                        _ => (acc * a) % 5,
                    };
                    tokens.extend([op, a]);
                }
                tokens.extend([8, acc]);
                Example {
                    tokens,
                    answers: vec![2 * n - 1],
                }
            }
            Self::Copy => {
                let mut tokens = vec![COPY_ALPHABET; n];
                // K distinct positions in order: a partial Fisher-Yates shuffle.
                let mut slots: Vec<usize> = (0..n).collect();
                for i in 0..COPY_K {
                    let j = rng.random_range(i..n);
                    slots.swap(i, j);
                }
                let mut picked = slots[..COPY_K].to_vec();
                picked.sort_unstable();
                let data: Vec<u32> = (0..COPY_K)
                    .map(|_| rng.random_range(0..COPY_ALPHABET))
                    .collect();
                for (&p, &d) in picked.iter().zip(&data) {
                    tokens[p] = d;
                }
                tokens.push(COPY_ALPHABET + 1);
                tokens.extend(&data);
                Example {
                    tokens,
                    answers: (n..n + COPY_K).collect(),
                }
            }
            Self::Mqar => {
                let mut keys: Vec<u32> = (0..MQAR_KEYS).collect();
                for i in 0..n {
                    let j = rng.random_range(i..keys.len());
                    keys.swap(i, j);
                }
                keys.truncate(n);
                let values: Vec<u32> = (0..n)
                    .map(|_| MQAR_KEYS + rng.random_range(0..MQAR_KEYS))
                    .collect();
                let mut tokens = Vec::with_capacity(4 * n);
                for (&k, &v) in keys.iter().zip(&values) {
                    tokens.extend([k, v]);
                }
                let mut order: Vec<usize> = (0..n).collect();
                for i in 0..n {
                    let j = rng.random_range(i..n);
                    order.swap(i, j);
                }
                for &i in &order {
                    tokens.extend([keys[i], values[i]]);
                }
                Example {
                    tokens,
                    answers: (0..n).map(|i| 2 * n + 2 * i).collect(),
                }
            }
        }
    }

    /// Draws an instance of size `n` from one split (`eval` or train),
    /// rejecting the other split's instances (see the module docs).
    pub fn sample(self, n: usize, eval: bool, rng: &mut ChaCha20Rng) -> Example {
        let mut ex = self.generate(n, rng);
        for _ in 1..MAX_TRIES {
            if is_eval_instance(&ex.tokens) == eval {
                break;
            }
            ex = self.generate(n, rng);
        }
        ex
    }

    /// Fraction of answers a uniform guess over the answer alphabet gets
    /// right (for the paper's scaled accuracy `(acc - chance) / (1 - chance)`).
    pub fn chance(self) -> f64 {
        match self {
            Self::Parity => 0.5,
            Self::Modarith => 0.2,
            Self::Copy => 1.0 / f64::from(COPY_ALPHABET),
            Self::Mqar => 1.0 / f64::from(MQAR_KEYS),
        }
    }
}

impl std::str::FromStr for Task {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| format!("unknown task `{s}` (expected parity, modarith, copy or mqar)"))
    }
}

/// Whether an instance belongs to the eval split (FNV-1a of its tokens, then
/// a murmur3 finalizer: FNV's low bits depend only on the inputs' low bits,
/// which for 2-symbol tasks would leave some buckets unreachable).
pub fn is_eval_instance(tokens: &[u32]) -> bool {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in tokens {
        for b in t.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h.is_multiple_of(EVAL_BUCKETS)
}
