//! Training data: synthetic tasks ([`tasks`], the arithmetic generators in
//! [`arith`]) and token files ([`file`](mod@file)),
//! behind one [`Dataset`] that hands out training batches and fixed eval sets.
//!
//! Everything is deterministic from the seed. Training batches come from one
//! ChaCha20 stream; its word position is the *data position* saved in
//! checkpoints ([`DataPosition`]), so a resumed run draws exactly the batches
//! the uninterrupted run would have drawn. Eval sets come from a separate
//! stream (seed-derived) and are generated once, so every evaluation scores
//! the same instances.

pub mod arith;
pub mod file;
pub mod tasks;

use std::path::PathBuf;

use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

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
        }
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
            } => format!(
                "`task {}, train_len {train_len}{}, eval {}{}{}{}`",
                task.name(),
                if *train_min_len > 0 {
                    format!(", train_min_len {train_min_len}")
                } else {
                    String::new()
                },
                eval_lens
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
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
    /// Problem size for tasks.
    pub length: Option<usize>,
    /// The batches, generated once.
    pub batches: Vec<Batch>,
}

enum Source {
    Task {
        task: Task,
        train_len: usize,
        curriculum: u64,
        curriculum_gate: f64,
        curriculum_start: usize,
        train_min_len: usize,
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
            } => {
                let mut eval_rng = ChaCha20Rng::seed_from_u64(seed);
                eval_rng.set_stream(EVAL_STREAM);
                let eval = eval_lens
                    .iter()
                    .map(|&n| task_eval_set(*task, n, batch, &mut eval_rng))
                    .collect();
                let source = Source::Task {
                    task: *task,
                    train_len: *train_len,
                    curriculum: *curriculum,
                    curriculum_gate: *curriculum_gate,
                    curriculum_start: *curriculum_start,
                    train_min_len: *train_min_len,
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
            Source::Task {
                task, train_len, ..
            } => task.width(*train_len),
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
                train_len,
                curriculum,
                curriculum_gate,
                curriculum_start,
                train_min_len,
            } => format!(
                "task {} (vocab {}), train sizes {}..={train_len}{}{}, eval sizes {}",
                task.name(),
                task.vocab_size(),
                if *curriculum > 0 {
                    task.min_len()
                } else {
                    (*train_min_len).max(task.min_len())
                },
                if *curriculum > 0 && *train_min_len > task.min_len() {
                    format!(" (from {train_min_len} once the curriculum has ended)")
                } else {
                    String::new()
                },
                if *curriculum > 0 && *curriculum_gate > 0.0 {
                    format!(
                        " (largest size growing from {} over {curriculum} batches whose smoothed loss is below {curriculum_gate})",
                        first_largest(*task, *curriculum_start, *train_len)
                    )
                } else if *curriculum > 0 {
                    format!(
                        " (largest size growing from {} over {curriculum} batches)",
                        first_largest(*task, *curriculum_start, *train_len)
                    )
                } else {
                    String::new()
                },
                self.eval
                    .iter()
                    .filter_map(|e| e.length.map(|n| n.to_string()))
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
                train_len,
                curriculum,
                curriculum_gate,
                curriculum_start,
                train_min_len,
            } => {
                let open = *curriculum_gate <= 0.0
                    || self.smoothed_loss.is_some_and(|l| l < *curriculum_gate);
                if open {
                    self.clock += 1;
                }
                let width = task.width(*train_len);
                let hi = curriculum_max(
                    first_largest(*task, *curriculum_start, *train_len),
                    *train_len,
                    *curriculum,
                    self.clock,
                );
                // The floor waits for the curriculum's end: short rows are
                // what a run first learns from (README, "Arithmetic at full
                // length").
                let lo = if hi >= *train_len {
                    (*train_min_len).max(task.min_len()).min(hi)
                } else {
                    task.min_len()
                };
                let examples: Vec<Example> = (0..rows)
                    .map(|_| {
                        let n = self.rng.random_range(lo..=hi);
                        task.sample(n, false, &mut self.rng)
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
        matches!(self.source, Source::Task { curriculum_gate, .. } if curriculum_gate > 0.0)
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
            Source::Task {
                task,
                train_len,
                curriculum,
                curriculum_start,
                ..
            } => Some(curriculum_max(
                first_largest(*task, *curriculum_start, *train_len),
                *train_len,
                *curriculum,
                self.clock,
            )),
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

/// The largest size a curriculum draws at its start: `--curriculum-start`
/// within the task's sizes and the training size (0: the task's smallest).
fn first_largest(task: Task, curriculum_start: usize, train_len: usize) -> usize {
    curriculum_start.max(task.min_len()).min(train_len)
}

/// The largest size drawn for training batch `batch` (1-based): it grows
/// linearly from `min` to `max` over the first `curriculum` batches.
fn curriculum_max(min: usize, max: usize, curriculum: u64, batch: u64) -> usize {
    if curriculum == 0 || batch >= curriculum || max <= min {
        return max;
    }
    let Ok(span) = u128::try_from(max - min) else {
        return max;
    };
    let (batch, curriculum) = (u128::from(batch), u128::from(curriculum));
    let grown = usize::try_from(span * batch / curriculum).unwrap_or(max - min);
    (min + grown).min(max)
}

fn task_eval_set(task: Task, n: usize, batch: usize, rng: &mut ChaCha20Rng) -> EvalSet {
    let width = task.width(n.clamp(task.min_len(), task.max_len()));
    let examples: Vec<Example> = (0..TASK_EVAL_ROWS)
        .map(|_| task.sample(n, true, rng))
        .collect();
    EvalSet {
        label: format!("len {n}"),
        length: Some(n),
        batches: examples
            .chunks(batch.max(1))
            .map(|c| Batch::from_examples(c, width, task.pad()))
            .collect(),
    }
}

#[cfg(test)]
mod curriculum_tests {
    use super::{DataSpec, Dataset, Task, curriculum_max};
    use rand::SeedableRng;

    /// `modarith-prec` up to 21 operands over a 20-batch curriculum.
    fn data(
        curriculum_gate: f64,
        curriculum_start: usize,
        train_min_len: usize,
        seed: u64,
        batch: usize,
    ) -> Dataset {
        let spec = DataSpec::Task {
            task: Task::ModarithPrec,
            train_len: 21,
            eval_lens: vec![21],
            curriculum: 20,
            curriculum_gate,
            curriculum_start,
            train_min_len,
        };
        Dataset::new(&spec, seed, batch).unwrap()
    }

    fn gated(gate: f64) -> Dataset {
        data(gate, 0, 0, 3, 4)
    }

    #[test]
    fn a_gated_curriculum_waits_for_the_loss() {
        let mut d = gated(0.5);
        let min = Task::ModarithPrec.min_len();
        for _ in 0..5 {
            d.next_batch(4).unwrap();
            d.observe_loss(1.6);
        }
        assert_eq!(d.largest_size(), Some(min), "held while the loss is high");
        // The average follows the loss down over tens of steps, not at once.
        d.observe_loss(0.0);
        d.next_batch(4).unwrap();
        assert_eq!(
            d.largest_size(),
            Some(min),
            "one good batch does not open it"
        );
        for _ in 0..100 {
            d.observe_loss(0.1);
        }
        for _ in 0..10 {
            d.next_batch(4).unwrap();
        }
        assert_eq!(d.largest_size(), Some(curriculum_max(min, 21, 20, 10)));
        // Shut again: the size stays where it is, it does not shrink.
        for _ in 0..200 {
            d.observe_loss(1.6);
        }
        let at = d.largest_size();
        d.next_batch(4).unwrap();
        assert_eq!(d.largest_size(), at);
        // Skipped steps' non-finite losses are left out.
        let before = d.position().smoothed_loss;
        d.observe_loss(f64::NAN);
        assert_eq!(d.position().smoothed_loss, before);
        // The position carries the gate's state.
        let pos = d.position();
        let mut e = gated(0.5);
        e.restore(pos);
        assert_eq!(e.position(), pos);
        assert_eq!(
            e.next_batch(4).unwrap().tokens,
            d.next_batch(4).unwrap().tokens
        );
    }

    #[test]
    fn without_a_gate_the_clock_is_the_batch_count() {
        let mut d = gated(0.0);
        for _ in 0..7 {
            d.next_batch(4).unwrap();
            d.observe_loss(9.0);
        }
        let pos = d.position();
        assert_eq!((pos.clock, pos.batches, pos.smoothed_loss), (7, 7, None));
    }

    /// Each row's problem size, read from where its answer is scored.
    fn row_sizes(d: &mut Dataset, rows: usize) -> Vec<usize> {
        let task = Task::ModarithPrec;
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(0);
        let at: std::collections::HashMap<usize, usize> = (task.min_len()..=21)
            .map(|n| (task.sample(n, false, &mut rng).answers[0], n))
            .collect();
        let batch = d.next_batch(rows).unwrap();
        let mask = batch.mask.as_ref().unwrap();
        mask.chunks(batch.seq_len())
            .map(|row| at[&row.iter().position(|&m| m).unwrap()])
            .collect()
    }

    fn floored(train_min_len: usize) -> Dataset {
        data(0.0, 0, train_min_len, 5, 64)
    }

    fn started(curriculum_start: usize) -> Dataset {
        data(0.0, curriculum_start, 0, 7, 64)
    }

    #[test]
    fn a_curriculum_start_is_the_first_largest_size() {
        let min = Task::ModarithPrec.min_len();
        let mut d = started(10);
        assert!(
            d.describe().contains(&format!(
                "train sizes {min}..=21 (largest size growing from 10 over 20 batches)"
            )),
            "{}",
            d.describe()
        );
        let mut first = std::collections::BTreeSet::new();
        for b in 1..=40 {
            let hi = curriculum_max(10, 21, 20, b);
            let sizes = row_sizes(&mut d, 64);
            assert_eq!(d.largest_size(), Some(hi), "batch {b}");
            for &n in &sizes {
                assert!(
                    (min..=hi).contains(&n),
                    "batch {b}: size {n} outside {min}..={hi}"
                );
            }
            if b == 1 {
                first.extend(sizes);
            }
        }
        assert_eq!(d.largest_size(), Some(21), "it ends at the training size");
        assert_eq!(
            first,
            (min..=10).collect(),
            "the first batch draws every size from the task's smallest to the start"
        );
        // A start at the task's smallest (or 0) is the plain curriculum, bit
        // for bit; a start above the training size is the training size.
        let (mut a, mut b, mut c) = (started(0), started(min), started(10));
        let (x, y, z) = (
            a.next_batch(16).unwrap(),
            b.next_batch(16).unwrap(),
            c.next_batch(16).unwrap(),
        );
        assert_eq!(x.tokens, y.tokens);
        assert_ne!(x.tokens, z.tokens);
        let mut over = started(99);
        over.next_batch(4).unwrap();
        assert_eq!(over.largest_size(), Some(21));
    }

    #[test]
    fn a_training_floor_draws_rows_between_it_and_the_curriculum_size() {
        let min = Task::ModarithPrec.min_len();
        let mut d = floored(15);
        assert!(
            d.describe().contains(&format!(
                "train sizes {min}..=21 (from 15 once the curriculum has ended)"
            )),
            "{}",
            d.describe()
        );
        let mut seen = std::collections::BTreeSet::new();
        for b in 1..=60 {
            let hi = curriculum_max(min, 21, 20, b);
            let lo = if hi == 21 { 15 } else { min };
            for n in row_sizes(&mut d, 64) {
                assert!(
                    (lo..=hi).contains(&n),
                    "batch {b}: size {n} outside {lo}..={hi}"
                );
                if b > 20 {
                    seen.insert(n);
                }
            }
        }
        assert_eq!(
            seen,
            (15..=21).collect(),
            "every size of the range is drawn"
        );
        // Until the curriculum's end the floor changes nothing.
        let (mut a, mut b) = (floored(0), floored(15));
        for _ in 0..19 {
            assert_eq!(
                a.next_batch(8).unwrap().tokens,
                b.next_batch(8).unwrap().tokens
            );
        }
        let (x, y) = (a.next_batch(64).unwrap(), b.next_batch(64).unwrap());
        assert_ne!(x.tokens, y.tokens, "from the curriculum's end on it does");
        // The task's own minimum as the floor is the stream without one.
        let (mut a, mut b) = (floored(0), floored(min));
        for _ in 0..30 {
            assert_eq!(
                a.next_batch(8).unwrap().tokens,
                b.next_batch(8).unwrap().tokens
            );
        }
    }

    #[test]
    fn the_largest_size_grows_linearly_then_stays() {
        assert_eq!(curriculum_max(1, 160, 0, 1), 160, "off");
        assert_eq!(curriculum_max(1, 160, 100, 1), 2);
        assert_eq!(curriculum_max(1, 160, 100, 50), 80);
        assert_eq!(curriculum_max(1, 160, 100, 99), 158);
        assert_eq!(curriculum_max(1, 160, 100, 100), 160);
        assert_eq!(curriculum_max(1, 160, 100, 10_000), 160);
        assert_eq!(curriculum_max(5, 5, 100, 1), 5);
        let sizes: Vec<usize> = (1..=100).map(|b| curriculum_max(1, 160, 100, b)).collect();
        assert!(sizes.windows(2).all(|w| w[0] <= w[1]));
    }
}
