//! A validated batch of next-token-prediction data: `[B, T+1]` token ids
//! split into inputs `[:, :-1]` and targets `[:, 1:]`, every id checked
//! against the vocabulary.

use thiserror::Error;

/// Token data that cannot be used.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TokenError {
    /// The batch has no rows.
    #[error("tokens: batch size B is 0 (expected shape [B, T+1] with B >= 1)")]
    EmptyBatch,
    /// Rows hold fewer than two tokens, so there is nothing to predict.
    #[error(
        "tokens: sequence length T is 0 (rows have {cols} token(s); expected [B, T+1] with T >= 1)"
    )]
    EmptySequence {
        /// Tokens per row.
        cols: usize,
    },
    /// The token tensor is not 2-D.
    #[error("tokens: expected a 2-D tensor [B, T+1], got shape {shape:?}")]
    Rank {
        /// The shape found.
        shape: Vec<usize>,
    },
    /// The data length does not match `rows * cols`.
    #[error("tokens: {found} values do not fill shape [{rows}, {cols}]")]
    Length {
        /// Rows B.
        rows: usize,
        /// Columns T+1.
        cols: usize,
        /// Values found.
        found: usize,
    },
    /// Reset flags that do not cover the batch's inputs one to one.
    #[error("tokens: {found} reset flags for a batch of {expected} input positions [B, T]")]
    Resets {
        /// `B * T`.
        expected: usize,
        /// Flags given.
        found: usize,
    },
    /// An id outside `[0, vocab_size)`.
    #[error(
        "tokens: id {token} at batch row {row}, position {position} is outside the vocabulary [0, {vocab_size})"
    )]
    OutOfRange {
        /// Batch row.
        row: usize,
        /// Position within the row (0-based, in the `[B, T+1]` tensor).
        position: usize,
        /// The offending id.
        token: i64,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
}

/// Inputs and targets of one batch, `B` rows of `T` predictions each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokens {
    batch: usize,
    len: usize,
    inputs: Vec<usize>,
    targets: Vec<usize>,
    resets: Option<Vec<bool>>,
}

impl Tokens {
    /// Builds a batch from a row-major `[rows, cols]` tensor of ids
    /// (`cols = T + 1`), rejecting ids outside `[0, vocab_size)`.
    pub fn from_rows(
        data: &[i64],
        rows: usize,
        cols: usize,
        vocab_size: usize,
    ) -> Result<Self, TokenError> {
        if rows == 0 {
            return Err(TokenError::EmptyBatch);
        }
        if cols < 2 {
            return Err(TokenError::EmptySequence { cols });
        }
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(TokenError::Length {
                rows,
                cols,
                found: data.len(),
            });
        }
        let mut ids = Vec::with_capacity(data.len());
        for (idx, &token) in data.iter().enumerate() {
            let id = usize::try_from(token).ok().filter(|&id| id < vocab_size);
            let Some(id) = id else {
                return Err(TokenError::OutOfRange {
                    row: idx / cols,
                    position: idx % cols,
                    token,
                    vocab_size,
                });
            };
            ids.push(id);
        }
        let len = cols - 1;
        let mut inputs = Vec::with_capacity(rows * len);
        let mut targets = Vec::with_capacity(rows * len);
        for row in ids.chunks(cols) {
            inputs.extend_from_slice(&row[..len]);
            targets.extend_from_slice(&row[1..]);
        }
        Ok(Self {
            batch: rows,
            len,
            inputs,
            targets,
            resets: None,
        })
    }

    /// Marks the input positions (`[B, T]`, row-major) where a new sequence
    /// starts inside a row: several instances packed in one row, each seeing
    /// none of the ones before it (the model's state is dropped there, see
    /// [`crate::mamba3::cpu::HeadInputs::resets`]).
    pub fn with_resets(mut self, resets: Vec<bool>) -> Result<Self, TokenError> {
        if resets.len() != self.inputs.len() {
            return Err(TokenError::Resets {
                expected: self.inputs.len(),
                found: resets.len(),
            });
        }
        self.resets = Some(resets);
        Ok(self)
    }

    /// The sequence starts set by [`Self::with_resets`], if any.
    pub fn resets(&self) -> Option<&[bool]> {
        self.resets.as_deref()
    }

    /// Same as [`Self::from_rows`] with a shape slice, checking it is 2-D.
    pub fn from_shaped(
        data: &[i64],
        shape: &[usize],
        vocab_size: usize,
    ) -> Result<Self, TokenError> {
        match *shape {
            [rows, cols] => Self::from_rows(data, rows, cols, vocab_size),
            _ => Err(TokenError::Rank {
                shape: shape.to_vec(),
            }),
        }
    }

    /// Batch rows B.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Predictions per row T.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true for a constructed batch (T >= 1); present for API symmetry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Input ids `[B, T]`.
    pub fn inputs(&self) -> &[usize] {
        &self.inputs
    }

    /// Target ids `[B, T]`.
    pub fn targets(&self) -> &[usize] {
        &self.targets
    }

    /// Number of predictions `B * T` (the loss is their mean).
    pub fn count(&self) -> usize {
        self.inputs.len()
    }
}
