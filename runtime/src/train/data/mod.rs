//! Training data: synthetic tasks ([`tasks`], the arithmetic generators in
//! [`arith`]) and token files ([`file`](mod@file)),
//! behind one [`Dataset`] that hands out training batches and fixed eval sets;
//! a task's training sizes follow its curriculum (`curriculum`), and its
//! training rows may draw skewed symbol frequencies ([`skew`]).
//!
//! Everything is deterministic from the seed. Training batches come from one
//! ChaCha20 stream; its word position is the *data position* saved in
//! checkpoints ([`DataPosition`]), so a resumed run draws exactly the batches
//! the uninterrupted run would have drawn. Eval sets come from a separate
//! stream (seed-derived) and are generated once, so every evaluation scores
//! the same instances.

pub mod arith;
mod curriculum;
pub mod file;
mod pack;
pub mod skew;
pub mod tasks;

use std::path::PathBuf;

use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use curriculum::Curriculum;
pub use file::{DataFormat, FileData, Fingerprint};
pub use tasks::{Example, Task};

use crate::train::TrainError;

/// One batch as the host hands it to an engine: `rows` rows of `width`
/// token ids (`width = T + 1`: inputs are `[:, :-1]`, targets `[:, 1:]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Rows B.
    pub rows: usize,
    /// Tokens per row, `T + 1`.
    pub width: usize,
    /// Row-major `[rows, width]` ids.
    pub tokens: Vec<u32>,
    /// Which of the `rows * (width - 1)` predictions are scored (loss and
    /// accuracy); `None`: all of them (language modelling).
    pub mask: Option<Vec<bool>>,
    /// Which of the `rows * (width - 1)` input positions start an instance
    /// inside a row ([`Batch::packed`]); `None`: one instance a row.
    pub resets: Option<Vec<bool>>,
}

impl Batch {
    /// Predictions per row, `T`.
    pub fn seq_len(&self) -> usize {
        self.width.saturating_sub(1)
    }

    /// Whether prediction `i` (row-major over `[rows, T]`) is scored.
    pub fn scored(&self, i: usize) -> bool {
        self.mask
            .as_ref()
            .is_none_or(|m| m.get(i).copied().unwrap_or(false))
    }

    /// Number of scored predictions.
    pub fn scored_count(&self) -> usize {
        match &self.mask {
            Some(m) => m.iter().filter(|&&b| b).count(),
            None => self.rows * self.seq_len(),
        }
    }

    /// Rows `start..end` as their own batch.
    pub fn slice_rows(&self, start: usize, end: usize) -> Batch {
        let t = self.seq_len();
        Batch {
            rows: end - start,
            width: self.width,
            tokens: self.tokens[start * self.width..end * self.width].to_vec(),
            mask: self.mask.as_ref().map(|m| m[start * t..end * t].to_vec()),
            resets: self.resets.as_ref().map(|m| m[start * t..end * t].to_vec()),
        }
    }

    /// The batch cut to its longest row: the fewest predictions, a multiple
    /// of `step` (at most this batch's), that keep every scored one. The
    /// model is causal, so no scored prediction sees the columns cut (each
    /// row's instance ends at its last answer; what follows is padding).
    /// A batch that scores every prediction (a `--data` file) is returned
    /// whole.
    pub fn trimmed(&self, step: usize) -> Batch {
        let t = self.seq_len();
        let Some(mask) = &self.mask else {
            return self.clone();
        };
        let need = mask
            .chunks(t.max(1))
            .filter_map(|row| row.iter().rposition(|&b| b))
            .map(|p| p + 1)
            .max()
            .unwrap_or(1);
        let len = need
            .div_ceil(step.max(1))
            .saturating_mul(step.max(1))
            .min(t);
        if len == t {
            return self.clone();
        }
        let width = len + 1;
        let mut tokens = Vec::with_capacity(self.rows * width);
        let mut kept = Vec::with_capacity(self.rows * len);
        for (row, m) in self.tokens.chunks(self.width).zip(mask.chunks(t.max(1))) {
            tokens.extend_from_slice(&row[..width]);
            kept.extend_from_slice(&m[..len]);
        }
        let resets = self.resets.as_ref().map(|r| {
            r.chunks(t.max(1))
                .flat_map(|row| row[..len].iter().copied())
                .collect()
        });
        Batch {
            rows: self.rows,
            width,
            tokens,
            mask: Some(kept),
            resets,
        }
    }

    /// Every width [`Self::trimmed`] can give a batch of `width`, narrowest
    /// first, `width` itself last.
    pub fn trimmed_widths(width: usize, step: usize) -> Vec<usize> {
        let t = width.saturating_sub(1);
        let step = step.max(1);
        (1..=t.div_ceil(step))
            .map(|k| (k * step).min(t) + 1)
            .collect()
    }

    /// Pads task instances to one width and marks their answer positions.
    pub fn from_examples(examples: &[Example], width: usize, pad: u32) -> Batch {
        let t = width.saturating_sub(1);
        let mut tokens = Vec::with_capacity(examples.len() * width);
        let mut mask = vec![false; examples.len() * t];
        for (r, ex) in examples.iter().enumerate() {
            let start = tokens.len();
            tokens.extend(ex.tokens.iter().take(width));
            tokens.resize(start + width, pad);
            for &p in ex.answers.iter().filter(|&&p| p < t) {
                mask[r * t + p] = true;
            }
        }
        Batch {
            rows: examples.len(),
            width,
            tokens,
            mask: Some(mask),
            resets: None,
        }
    }
}

/// Where the data comes from: what `--task` / `--data` chose. Saved in
/// checkpoints so a resume with other data is refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum DataSpec {
    /// A synthetic task trained on sizes `min_len..=train_len`.
    Task {
        /// Which task.
        task: Task,
        /// Largest training problem size L.
        train_len: usize,
        /// Problem sizes evaluated.
        eval_lens: Vec<usize>,
        /// Training batches over which the largest drawn size grows
        /// linearly from the task's minimum to `train_len` (0: all sizes
        /// from the first batch). Long instances of a state-tracking task
        /// carry almost no gradient signal until short ones are solved.
        #[serde(default)]
        curriculum: u64,
        /// With a curriculum: the smoothed training loss below which the
        /// curriculum advances (0: it advances every batch). A gated
        /// curriculum holds the largest size until the model fits the
        /// sizes it has, so a run that starts learning late is not handed
        /// long rows it cannot learn from yet.
        #[serde(default)]
        curriculum_gate: f64,
        /// With a curriculum: the largest size of its first batch (0: the
        /// task's smallest), from which it grows linearly to `train_len`.
        /// The smallest size drawn stays the task's. The paper's protocol
        /// starts its curriculum at rows of 40 tokens (20 operands of
        /// `modarith-prec`), so short rows are learned before long ones come.
        #[serde(default)]
        curriculum_start: usize,
        /// Smallest size a training row draws once the curriculum has
        /// reached `train_len` (0: the task's smallest). Until then rows
        /// are drawn as without it, so a run is the same as one without a
        /// floor up to the curriculum's end; after it each row's size is
        /// uniform in `train_min_len..=train_len`. Full-length rows hold
        /// more of a task's long-range structure (`modarith-prec`'s long
        /// product chains are rare in short rows).
        #[serde(default)]
        train_min_len: usize,
        /// Fraction of training rows whose operand and operator frequencies
        /// are drawn per row (`--skewed-rows`, [`skew`]; 0: every row
        /// uniform, as published), once the curriculum has reached
        /// `train_len` (rows before are uniform, as without it: skewed rows
        /// from the first step kept a CPU parity run from learning its
        /// training size). Evaluation rows are always uniform.
        #[serde(default)]
        skewed_rows: f64,
        /// Probability that a value or an operator is left out of a skewed
        /// row altogether (`--skew-drop`, [`skew`]; 0: every symbol keeps a
        /// drawn share). Only with `skewed_rows > 0`.
        #[serde(default)]
        skew_drop: f64,
        /// One more eval set whose rows draw their size uniformly from
        /// `lo..=hi` (`--eval-mix LO-HI`; `None`: none): the validation
        /// protocol of the paper's sources, which score one accuracy over
        /// rows of 40-256 tokens, beside the sets of one size each.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        eval_mix: Option<[usize; 2]>,
        /// One more eval set of zero-free products of this many factors
        /// (`--eval-products K`; arithmetic without brackets only): every
        /// operator `*`, every operand non-zero, so its accuracy over the
        /// steps shows when (and whether) a run's product step is exact.
        /// A probe outside the task's distribution, not a score of it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        eval_products: Option<usize>,
    },
    /// A token file.
    File {
        /// The file.
        path: PathBuf,
        /// Its encoding.
        format: DataFormat,
        /// Vocabulary (given, or 256 for bytes).
        vocab_size: Option<usize>,
        /// Held-out fraction at the end of the file.
        eval_fraction: f64,
        /// Window length T.
        seq_len: usize,
    },
}

impl DataSpec {
    /// A task run of `train_len` scored at `eval_lens`, every other option
    /// off (no curriculum, uniform rows, no extra eval sets): the spec the
    /// options start from.
    pub fn task(task: Task, train_len: usize, eval_lens: Vec<usize>) -> Self {
        Self::Task {
            task,
            train_len,
            eval_lens,
            curriculum: 0,
            curriculum_gate: 0.0,
            curriculum_start: 0,
            train_min_len: 0,
            skewed_rows: 0.0,
            skew_drop: 0.0,
            eval_mix: None,
            eval_products: None,
        }
    }

    /// This task spec with a curriculum over `steps` batches whose largest
    /// size starts at `start` (`--curriculum`, `--curriculum-start`); a
    /// file spec is returned as it is.
    #[must_use]
    pub fn with_curriculum(mut self, steps: u64, start: usize) -> Self {
        if let Self::Task {
            curriculum,
            curriculum_start,
            ..
        } = &mut self
        {
            *curriculum = steps;
            *curriculum_start = start;
        }
        self
    }

    /// A short description for messages (`task parity, train_len 16, eval 16,32`).
    pub fn summary(&self) -> String {
        match self {
            Self::Task {
                task,
                train_len,
                eval_lens,
                curriculum,
                curriculum_gate,
                curriculum_start,
                train_min_len,
                skewed_rows,
                skew_drop,
                eval_mix,
                eval_products,
            } => format!(
                "`task {}, train_len {train_len}{}{}{}, eval {}{}{}{}{}{}`",
                task.name(),
                if *train_min_len > 0 {
                    format!(", train_min_len {train_min_len}")
                } else {
                    String::new()
                },
                if *skewed_rows > 0.0 {
                    format!(", skewed_rows {skewed_rows}")
                } else {
                    String::new()
                },
                if *skew_drop > 0.0 {
                    format!(", skew_drop {skew_drop}")
                } else {
                    String::new()
                },
                eval_lens
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
                eval_mix.map_or_else(String::new, |[lo, hi]| format!(", eval mix {lo}-{hi}")),
                eval_products.map_or_else(String::new, |k| format!(", eval products {k}")),
                if *curriculum > 0 {
                    format!(", curriculum {curriculum}")
                } else {
                    String::new()
                },
                if *curriculum > 0 && *curriculum_start > 0 {
                    format!(" from {curriculum_start}")
                } else {
                    String::new()
                },
                if *curriculum_gate > 0.0 {
                    format!(", gated below loss {curriculum_gate}")
                } else {
                    String::new()
                }
            ),
            Self::File {
                path,
                format,
                vocab_size,
                eval_fraction,
                seq_len,
            } => format!(
                "`{} ({}{}), seq_len {seq_len}, eval_fraction {eval_fraction}`",
                path.display(),
                format.name(),
                vocab_size.map_or_else(String::new, |v| format!(", vocab {v}"))
            ),
        }
    }
}

/// The state of the training stream, saved in checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DataPosition {
    /// Training batches drawn so far.
    pub batches: u64,
    /// Word position of the training ChaCha20 stream.
    pub word_pos: u128,
    /// Batches a gated curriculum has advanced over (equal to `batches`
    /// without a gate).
    pub clock: u64,
    /// The gate's smoothed training loss (`None` before the first step).
    pub smoothed_loss: Option<f64>,
}

/// Weight of the newest loss in the gate's exponential average: about the
/// last 50 steps count, so one lucky batch does not open the gate.
const GATE_SMOOTHING: f64 = 0.02;

/// A fixed evaluation set: its label, problem size (tasks) and batches.
#[derive(Debug, Clone)]
pub struct EvalSet {
    /// Label in eval lines and metrics (`len 64`, `held-out`).
    pub label: String,
    /// Problem size of a task's set of one size (`None`: a file's set, or
    /// the `--eval-mix` set of many sizes).
    pub length: Option<usize>,
    /// The batches, generated once.
    pub batches: Vec<Batch>,
}

enum Source {
    Task {
        task: Task,
        sizes: Curriculum,
        skewed: f64,
        drop: f64,
    },
    File {
        data: FileData,
        window: usize,
    },
}

/// Training batches and eval sets for one run.
pub struct Dataset {
    source: Source,
    rng: ChaCha20Rng,
    batches: u64,
    clock: u64,
    smoothed_loss: Option<f64>,
    eval: Vec<EvalSet>,
}

/// Rows each task eval set holds (split into batches of the run's batch size).
pub const TASK_EVAL_ROWS: usize = 256;
/// Most held-out windows a file eval set holds.
pub const FILE_EVAL_ROWS: usize = 256;

// Distinct stream ids keep the train and eval streams apart for every seed.
const TRAIN_STREAM: u64 = 1;
const EVAL_STREAM: u64 = 2;

impl Dataset {
    /// Builds the data of a run. `batch` sizes the eval batches.
    pub fn new(spec: &DataSpec, seed: u64, batch: usize) -> Result<Self, TrainError> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        rng.set_stream(TRAIN_STREAM);
        let (source, eval) = match spec {
            DataSpec::Task {
                task,
                train_len,
                eval_lens,
                curriculum,
                curriculum_gate,
                curriculum_start,
                train_min_len,
                skewed_rows,
                skew_drop,
                eval_mix,
                eval_products,
            } => {
                let mut eval_rng = ChaCha20Rng::seed_from_u64(seed);
                eval_rng.set_stream(EVAL_STREAM);
                let mut eval: Vec<EvalSet> = eval_lens
                    .iter()
                    .map(|&n| task_eval_set(*task, n, batch, &mut eval_rng))
                    .collect();
                // Drawn after the sets of one size, which stay as without it.
                if let Some([lo, hi]) = *eval_mix {
                    eval.push(task_mix_set(*task, lo, hi, batch, &mut eval_rng));
                }
                if let Some(k) = *eval_products {
                    eval.push(task_products_set(*task, k, batch, &mut eval_rng));
                }
                let source = Source::Task {
                    task: *task,
                    sizes: Curriculum {
                        smallest: task.min_len(),
                        train_len: *train_len,
                        steps: *curriculum,
                        gate: *curriculum_gate,
                        start: *curriculum_start,
                        floor: *train_min_len,
                    },
                    skewed: *skewed_rows,
                    drop: *skew_drop,
                };
                (source, eval)
            }
            DataSpec::File {
                path,
                format,
                vocab_size,
                eval_fraction,
                seq_len,
            } => {
                let window = seq_len + 1;
                let data = FileData::open(path, *format, *vocab_size, *eval_fraction, window)?;
                let eval = vec![EvalSet {
                    label: "held-out".into(),
                    length: None,
                    batches: data.eval_batches(batch, window, FILE_EVAL_ROWS)?,
                }];
                (Source::File { data, window }, eval)
            }
        };
        Ok(Self {
            source,
            rng,
            batches: 0,
            clock: 0,
            smoothed_loss: None,
            eval,
        })
    }

    /// Vocabulary size of the data (the model's `vocab_size`).
    pub fn vocab_size(&self) -> usize {
        match &self.source {
            Source::Task { task, .. } => task.vocab_size(),
            Source::File { data, .. } => data.vocab_size(),
        }
    }

    /// Row width (`T + 1`) of every training batch: fixed, so a captured GPU
    /// step sees one shape for the whole run.
    pub fn train_width(&self) -> usize {
        match &self.source {
            Source::Task { task, sizes, .. } => task.width(sizes.train_len),
            Source::File { window, .. } => *window,
        }
    }

    /// Size and hash of a data file (`None` for a task).
    pub fn fingerprint(&self) -> Option<&Fingerprint> {
        match &self.source {
            Source::Task { .. } => None,
            Source::File { data, .. } => Some(data.fingerprint()),
        }
    }

    /// The task, when the data is synthetic.
    pub fn task(&self) -> Option<Task> {
        match &self.source {
            Source::Task { task, .. } => Some(*task),
            Source::File { .. } => None,
        }
    }

    /// A one-line description for the start of a run.
    pub fn describe(&self) -> String {
        match &self.source {
            Source::Task {
                task,
                sizes,
                skewed,
                drop,
            } => format!(
                "task {} (vocab {}), train sizes {}{}, eval sizes {}",
                task.name(),
                task.vocab_size(),
                sizes.describe(),
                if *skewed > 0.0 {
                    format!(
                        ", {skewed} of the rows skewed once the curriculum has ended{}",
                        if *drop > 0.0 {
                            format!(" (each symbol left out of one with probability {drop})")
                        } else {
                            String::new()
                        }
                    )
                } else {
                    String::new()
                },
                self.eval
                    .iter()
                    .map(|e| e.length.map_or_else(|| e.label.clone(), |n| n.to_string()))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Source::File { data, window } => {
                let (total, train) = data.sizes();
                format!(
                    "data {} ({total} tokens, vocab {}; {train} train, {} held out), windows of {window}",
                    data.path().display(),
                    data.vocab_size(),
                    total - train
                )
            }
        }
    }

    /// The next training batch of `rows` rows. Fails only when a data file
    /// can no longer be read.
    pub fn next_batch(&mut self, rows: usize) -> Result<Batch, TrainError> {
        self.batches += 1;
        match &self.source {
            Source::Task {
                task,
                sizes,
                skewed,
                drop,
            } => {
                if sizes.advances(self.smoothed_loss) {
                    self.clock += 1;
                }
                let width = task.width(sizes.train_len);
                let drawn = sizes.drawn(self.clock);
                let skew = *skewed > 0.0 && sizes.ended(self.clock);
                let examples: Vec<Example> = (0..rows)
                    .map(|_| {
                        let n = self.rng.random_range(drawn.clone());
                        // No draw without the option (older runs keep their
                        // stream), none before the curriculum's end.
                        if skew && self.rng.random::<f64>() < *skewed {
                            task.sample_skewed(n, *drop, &mut self.rng)
                        } else {
                            task.sample(n, false, &mut self.rng)
                        }
                    })
                    .collect();
                Ok(Batch::from_examples(&examples, width, task.pad()))
            }
            Source::File { data, window } => data.train_batch(rows, *window, &mut self.rng),
        }
    }

    /// The fixed eval sets.
    pub fn eval_sets(&self) -> &[EvalSet] {
        &self.eval
    }

    /// Whether a loss gate paces the curriculum (`--curriculum-gate`).
    pub fn is_gated(&self) -> bool {
        matches!(&self.source, Source::Task { sizes, .. } if sizes.is_gated())
    }

    /// Feeds a step's training loss to a gated curriculum (a no-op without
    /// one). Non-finite losses, from steps the optimizer skipped, are left
    /// out.
    pub fn observe_loss(&mut self, loss: f64) {
        if !self.is_gated() || !loss.is_finite() {
            return;
        }
        self.smoothed_loss = Some(match self.smoothed_loss {
            None => loss,
            Some(l) => l + GATE_SMOOTHING * (loss - l),
        });
    }

    /// The largest training size the latest batch could draw (`None` for
    /// a file): where a curriculum stands.
    pub fn largest_size(&self) -> Option<usize> {
        match &self.source {
            Source::Task { sizes, .. } => Some(sizes.largest(self.clock)),
            Source::File { .. } => None,
        }
    }

    /// Where the training stream stands.
    pub fn position(&self) -> DataPosition {
        DataPosition {
            batches: self.batches,
            word_pos: self.rng.get_word_pos(),
            clock: self.clock,
            smoothed_loss: self.smoothed_loss,
        }
    }

    /// Moves the training stream to a saved position.
    pub fn restore(&mut self, pos: DataPosition) {
        self.batches = pos.batches;
        self.rng.set_word_pos(pos.word_pos);
        self.clock = pos.clock;
        self.smoothed_loss = pos.smoothed_loss;
    }
}

/// The label of the `--eval-mix` set over sizes `lo..=hi`.
pub fn mix_label(lo: usize, hi: usize) -> String {
    format!("mix {lo}-{hi}")
}

/// [`TASK_EVAL_ROWS`] held-out rows whose sizes are uniform in `lo..=hi`,
/// padded to the width of `hi`; no single length (`length: None`).
fn task_mix_set(task: Task, lo: usize, hi: usize, batch: usize, rng: &mut ChaCha20Rng) -> EvalSet {
    let width = task.width(hi.clamp(task.min_len(), task.max_len()));
    eval_set(task, mix_label(lo, hi), None, width, batch, || {
        let n = rng.random_range(lo..=hi.max(lo));
        task.sample(n, true, rng)
    })
}

/// The label of the `--eval-products` set of `k` factors.
pub fn products_label(k: usize) -> String {
    format!("products {k}")
}

/// [`TASK_EVAL_ROWS`] held-out rows of one zero-free product of `k`
/// factors each ([`skew::Symbols::zero_free_products`]).
fn task_products_set(task: Task, k: usize, batch: usize, rng: &mut ChaCha20Rng) -> EvalSet {
    let symbols = skew::Symbols::zero_free_products(task.modulus().unwrap_or(2));
    eval_set(task, products_label(k), None, task.width(k), batch, || {
        task.sample_from(k, true, &symbols, rng)
    })
}

fn task_eval_set(task: Task, n: usize, batch: usize, rng: &mut ChaCha20Rng) -> EvalSet {
    let width = task.width(n.clamp(task.min_len(), task.max_len()));
    eval_set(task, format!("len {n}"), Some(n), width, batch, || {
        task.sample(n, true, rng)
    })
}

/// [`TASK_EVAL_ROWS`] rows from `draw`, in batches of `batch` rows padded
/// to `width`.
fn eval_set(
    task: Task,
    label: String,
    length: Option<usize>,
    width: usize,
    batch: usize,
    mut draw: impl FnMut() -> Example,
) -> EvalSet {
    let examples: Vec<Example> = (0..TASK_EVAL_ROWS).map(|_| draw()).collect();
    EvalSet {
        label,
        length,
        batches: examples
            .chunks(batch.max(1))
            .map(|c| Batch::from_examples(c, width, task.pad()))
            .collect(),
    }
}
