//! Real data from a file (`--data FILE`): UTF-8 text read as bytes (vocab
//! 256), or a flat little-endian `u16` / `u32` token file.
//!
//! The file is never held in memory. Opening it streams it once, in
//! fixed-size chunks, to check every id against the vocabulary. Each batch
//! then reads its windows with positional reads (`pread`). Like a memory
//! map, this keeps memory use independent of the corpus size and leaves
//! caching to the OS page cache. Unlike one, it needs no `unsafe`, and a
//! file truncated under a running job is an I/O error instead of a SIGBUS.
//! Compared with reading the whole file and widening every id to `u32`, it
//! saves four bytes of memory per token (sixteen for byte-level text).
//!
//! The last `eval_fraction` of the tokens is held out: training draws random
//! windows of `seq_len + 1` tokens from the rest, evaluation reads fixed,
//! non-overlapping windows of the held-out part.

use std::fs::File;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use rand::Rng;
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use super::Batch;
use crate::train::TrainError;

/// Bytes read at a time while checking the ids (a multiple of every width).
const SCAN_CHUNK: usize = 1 << 20;

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

    fn width_u8(self) -> u8 {
        match self {
            Self::Bytes => 1,
            Self::U16 => 2,
            Self::U32 => 4,
        }
    }

    fn width(self) -> usize {
        usize::from(self.width_u8())
    }

    /// Decodes whole tokens from `bytes` (a multiple of the width).
    fn decode(self, bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
        bytes.chunks_exact(self.width()).map(move |c| match self {
            Self::Bytes => u32::from(c[0]),
            Self::U16 => u32::from(u16::from_le_bytes([c[0], c[1]])),
            Self::U32 => u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
        })
    }
}

/// What identifies a data file's contents: its size and a hash of its bytes
/// (xxh3-64, computed during the pass that checks the ids). Saved with
/// checkpoints, so a resume refuses a file that changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// File size.
    pub bytes: u64,
    /// xxh3-64 of the bytes, 16 hex digits.
    pub xxh3: String,
}

/// A token file split into a training and a held-out part.
#[derive(Debug)]
pub struct FileData {
    path: PathBuf,
    file: File,
    format: DataFormat,
    ntokens: usize,
    vocab_size: usize,
    split: usize,
    fingerprint: Fingerprint,
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
        let mut file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let width = format.width();
        let w64 = u64::from(format.width_u8());
        let ntokens = usize::try_from(len / w64)
            .ok()
            .filter(|_| len % w64 == 0)
            .ok_or_else(|| TrainError::DataInvalid {
                path: path.to_path_buf(),
                reason: format!(
                    "{len} bytes is not a whole number of {} tokens ({width} bytes each)",
                    format.name()
                ),
            })?;
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
        // One pass in fixed chunks: every id is checked, none is kept.
        let mut chunk = vec![0u8; SCAN_CHUNK];
        let mut index = 0usize;
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        while index < ntokens {
            let take = (ntokens - index).min(SCAN_CHUNK / width) * width;
            file.read_exact(&mut chunk[..take]).map_err(io)?;
            hasher.update(&chunk[..take]);
            for (i, t) in format.decode(&chunk[..take]).enumerate() {
                if usize::try_from(t).map_or(true, |t| t >= vocab_size) {
                    return Err(TrainError::TokenOutOfRange {
                        path: path.to_path_buf(),
                        index: index + i,
                        token: t,
                        vocab_size,
                    });
                }
            }
            index += take / width;
        }
        // eval_fraction is checked to lie in [0, 1), so `held` is in [0, len].
        let held = round_count(ntokens as f64 * eval_fraction).min(ntokens);
        let split = ntokens - held;
        for (part, have) in [("training part", split), ("held-out part", held)] {
            if have < window {
                return Err(TrainError::DataInvalid {
                    path: path.to_path_buf(),
                    reason: format!(
                        "{ntokens} tokens: its {part} has {have} tokens, fewer than one window of \
                         seq_len + 1 = {window} (lower --seq-len or change --eval-fraction)"
                    ),
                });
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            format,
            ntokens,
            vocab_size,
            split,
            fingerprint: Fingerprint {
                bytes: len,
                xxh3: format!("{:016x}", hasher.digest()),
            },
        })
    }

    /// Size and hash of the file as it was checked.
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
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
        (self.ntokens, self.split)
    }

    /// Appends tokens `[start, start + count)` of the file to `out`.
    fn read_tokens(
        &self,
        start: usize,
        count: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), TrainError> {
        let width = self.format.width();
        let mut bytes = vec![0u8; count * width];
        let offset = u64::try_from(start * width).unwrap_or(u64::MAX);
        read_at(&self.file, &mut bytes, offset).map_err(|source| TrainError::DataRead {
            path: self.path.clone(),
            source,
        })?;
        out.extend(self.format.decode(&bytes));
        Ok(())
    }

    /// `rows` random training windows of `window` tokens. Fails only if
    /// the file cannot be read any more (changed or removed under the run).
    pub fn train_batch(
        &self,
        rows: usize,
        window: usize,
        rng: &mut ChaCha20Rng,
    ) -> Result<Batch, TrainError> {
        let mut tokens = Vec::with_capacity(rows * window);
        let last_start = self.split - window;
        for _ in 0..rows {
            let s = rng.random_range(0..=last_start);
            self.read_tokens(s, window, &mut tokens)?;
        }
        Ok(Batch {
            rows,
            width: window,
            tokens,
            mask: None,
            resets: None,
        })
    }

    /// Non-overlapping held-out windows, at most `max_rows`, in batches of `rows`.
    pub fn eval_batches(
        &self,
        rows: usize,
        window: usize,
        max_rows: usize,
    ) -> Result<Vec<Batch>, TrainError> {
        let count = ((self.ntokens - self.split) / window).min(max_rows);
        let starts: Vec<usize> = (0..count).map(|k| self.split + k * window).collect();
        starts
            .chunks(rows.max(1))
            .map(|group| {
                let mut tokens = Vec::with_capacity(group.len() * window);
                for &s in group {
                    self.read_tokens(s, window, &mut tokens)?;
                }
                Ok(Batch {
                    rows: group.len(),
                    width: window,
                    tokens,
                    mask: None,
                    resets: None,
                })
            })
            .collect()
    }
}

/// Fills `buf` from `file` at byte `offset` without moving a shared cursor.
#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

/// Fills `buf` from `file` at byte `offset` (`seek_read` may return short).
#[cfg(windows)]
fn read_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    while !buf.is_empty() {
        match std::os::windows::fs::FileExt::seek_read(file, buf, offset)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                offset += u64::try_from(n).unwrap_or(u64::MAX);
            }
        }
    }
    Ok(())
}

/// Rounds a non-negative float to a count without an `as` cast: through its
/// decimal text, which is exact for every integer a count can hold.
fn round_count(x: f64) -> usize {
    if !(x.is_finite() && x >= 0.0) {
        return 0;
    }
    format!("{:.0}", x.round()).parse().unwrap_or(usize::MAX)
}
