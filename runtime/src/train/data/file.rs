//! Real data from a file (`--data FILE`): UTF-8 text read as bytes (vocab
//! 256), or a flat little-endian `u16` / `u32` token file.
//!
//! The file is read whole with `std::fs::read` rather than memory-mapped:
//! every token has to be checked against the vocabulary once anyway (so every
//! page is touched), the files this CPU trainer meets are small, and a plain
//! read needs no `unsafe`. A file above [`MAX_FILE_BYTES`] is refused with a
//! clear error instead of exhausting memory; memory-mapping belongs here once
//! GPU runs train on corpora of that size.
//!
//! The last `eval_fraction` of the tokens is held out: training draws random
//! windows of `seq_len + 1` tokens from the rest, evaluation reads fixed,
//! non-overlapping windows of the held-out part.

use std::path::{Path, PathBuf};

use rand::Rng;
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use super::Batch;
use crate::train::TrainError;

/// Largest data file read into memory (4 GiB).
pub const MAX_FILE_BYTES: u64 = 4 << 30;

/// How a data file encodes tokens (`--data-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataFormat {
    /// One token per byte, vocabulary 256 (UTF-8 text at byte level).
    Bytes,
    /// Little-endian `u16` per token.
    U16,
    /// Little-endian `u32` per token.
    U32,
}

impl DataFormat {
    /// The `--data-format` name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Bytes => "bytes",
            Self::U16 => "u16",
            Self::U32 => "u32",
        }
    }

    fn width(self) -> usize {
        match self {
            Self::Bytes => 1,
            Self::U16 => 2,
            Self::U32 => 4,
        }
    }
}

/// A token file split into a training and a held-out part.
#[derive(Debug, Clone)]
pub struct FileData {
    path: PathBuf,
    tokens: Vec<u32>,
    vocab_size: usize,
    split: usize,
}

impl FileData {
    /// Reads and checks `path`. `vocab_size` is required for `u16`/`u32`
    /// files (bytes: 256); every id must be below it.
    pub fn open(
        path: &Path,
        format: DataFormat,
        vocab_size: Option<usize>,
        eval_fraction: f64,
        window: usize,
    ) -> Result<Self, TrainError> {
        let io = |source| TrainError::DataRead {
            path: path.to_path_buf(),
            source,
        };
        let len = std::fs::metadata(path).map_err(io)?.len();
        if len > MAX_FILE_BYTES {
            return Err(TrainError::DataInvalid {
                path: path.to_path_buf(),
                reason: format!("{len} bytes is above the {MAX_FILE_BYTES}-byte limit"),
            });
        }
        let bytes = std::fs::read(path).map_err(io)?;
        let width = format.width();
        if bytes.len() % width != 0 {
            return Err(TrainError::DataInvalid {
                path: path.to_path_buf(),
                reason: format!(
                    "{} bytes is not a whole number of {} tokens ({width} bytes each)",
                    bytes.len(),
                    format.name()
                ),
            });
        }
        let tokens: Vec<u32> = match format {
            DataFormat::Bytes => bytes.iter().map(|&b| u32::from(b)).collect(),
            DataFormat::U16 => bytes
                .chunks_exact(2)
                .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            DataFormat::U32 => bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        };
        let vocab_size = match (format, vocab_size) {
            (DataFormat::Bytes, None) => 256,
            (_, Some(v)) => v,
            (_, None) => {
                return Err(TrainError::InvalidOption {
                    flag: "--vocab-size",
                    reason: format!("required with --data-format {}", format.name()),
                });
            }
        };
        for (i, &t) in tokens.iter().enumerate() {
            if usize::try_from(t).map_or(true, |t| t >= vocab_size) {
                return Err(TrainError::TokenOutOfRange {
                    path: path.to_path_buf(),
                    index: i,
                    token: t,
                    vocab_size,
                });
            }
        }
        // eval_fraction is checked to lie in [0, 1), so `held` is in [0, len].
        let held = round_count(tokens.len() as f64 * eval_fraction).min(tokens.len());
        let split = tokens.len() - held;
        for (part, have) in [("training part", split), ("held-out part", held)] {
            if have < window {
                return Err(TrainError::DataInvalid {
                    path: path.to_path_buf(),
                    reason: format!(
                        "{} tokens: its {part} has {have} tokens, fewer than one window of \
                         seq_len + 1 = {window} (lower --seq-len or change --eval-fraction)",
                        tokens.len()
                    ),
                });
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            tokens,
            vocab_size,
            split,
        })
    }

    /// The file read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Vocabulary size the ids were checked against.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Total tokens and how many of them train.
    pub fn sizes(&self) -> (usize, usize) {
        (self.tokens.len(), self.split)
    }

    /// `rows` random training windows of `window` tokens.
    pub fn train_batch(&self, rows: usize, window: usize, rng: &mut ChaCha20Rng) -> Batch {
        let mut tokens = Vec::with_capacity(rows * window);
        let last_start = self.split - window;
        for _ in 0..rows {
            let s = rng.random_range(0..=last_start);
            tokens.extend_from_slice(&self.tokens[s..s + window]);
        }
        Batch {
            rows,
            width: window,
            tokens,
            mask: None,
        }
    }

    /// Non-overlapping held-out windows, at most `max_rows`, in batches of `rows`.
    pub fn eval_batches(&self, rows: usize, window: usize, max_rows: usize) -> Vec<Batch> {
        let held = &self.tokens[self.split..];
        let windows: Vec<&[u32]> = held.chunks_exact(window).take(max_rows).collect();
        windows
            .chunks(rows.max(1))
            .map(|group| Batch {
                rows: group.len(),
                width: window,
                tokens: group.concat(),
                mask: None,
            })
            .collect()
    }
}

/// Rounds a non-negative float to a count without an `as` cast: through its
/// decimal text, which is exact for every integer a count can hold.
fn round_count(x: f64) -> usize {
    if !(x.is_finite() && x >= 0.0) {
        return 0;
    }
    format!("{:.0}", x.round()).parse().unwrap_or(usize::MAX)
}
