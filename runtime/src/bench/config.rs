//! The benchmark configurations: the named presets of issue 8 (S, M, L) and
//! the `d_model/n_layer/d_state/headdim/batch/seq_len[/chunk]` form for any
//! other size, each turned into a [`Mamba3Config`] plus a window shape. The
//! optional seventh number is the scan's chunk length: the same math at any
//! chunk, a different schedule, so it is a speed setting worth timing.

use crate::mamba3::Mamba3Config;

use super::BenchError;

/// Vocabulary of the full LM step unless `--vocab` says otherwise: byte-level,
/// as the trainer's tasks use; the backbone step does not depend on it.
pub const DEFAULT_VOCAB: usize = 256;

/// One benchmark shape: the six numbers of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BenchConfig {
    /// Preset name (`S`, `M`, `L`) or the spec as written.
    pub name: String,
    /// Residual width.
    pub d_model: usize,
    /// Blocks.
    pub n_layer: usize,
    /// State size N.
    pub d_state: usize,
    /// Head dimension P.
    pub headdim: usize,
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Chunk length of the chunked scan (the official default, 64, unless
    /// the spec's seventh number says otherwise).
    pub chunk_size: usize,
}

/// The presets, in the order: `(name, d_model, n_layer, d_state,
/// headdim, batch, seq_len)`.
pub const PRESETS: [(&str, [usize; 6]); 3] = [
    ("S", [256, 4, 64, 64, 16, 256]),
    ("M", [768, 12, 128, 64, 8, 1024]),
    ("L", [2048, 48, 128, 64, 4, 4096]),
];

impl BenchConfig {
    fn from_numbers(name: String, n: [usize; 6]) -> Self {
        let [d_model, n_layer, d_state, headdim, batch, seq_len] = n;
        Self {
            name,
            d_model,
            n_layer,
            d_state,
            headdim,
            batch,
            seq_len,
            chunk_size: crate::mamba3::DEFAULT_CHUNK_SIZE,
        }
    }

    /// A preset by name (case-insensitive), or six numbers separated by `/`
    /// with an optional seventh, the chunk length.
    pub fn parse(text: &str) -> Result<Self, BenchError> {
        let t = text.trim();
        if let Some((name, n)) = PRESETS.iter().find(|(p, _)| p.eq_ignore_ascii_case(t)) {
            return Ok(Self::from_numbers((*name).to_owned(), *n));
        }
        let bad = |reason: &str| BenchError::Config {
            text: t.to_owned(),
            reason: reason.to_owned(),
        };
        let parts: Vec<&str> = t.split('/').collect();
        if !(6..=7).contains(&parts.len()) {
            return Err(bad(
                "expected S, M, L or d_model/n_layer/d_state/headdim/batch/seq_len[/chunk]",
            ));
        }
        let mut n = [0usize; 7];
        for (slot, p) in n.iter_mut().zip(&parts) {
            *slot = p
                .trim()
                .parse()
                .map_err(|_| bad("every field must be a positive integer"))?;
            if *slot == 0 {
                return Err(bad("every field must be a positive integer"));
            }
        }
        let [d_model, n_layer, d_state, headdim, batch, seq_len, chunk] = n;
        let mut cfg = Self::from_numbers(
            t.to_owned(),
            [d_model, n_layer, d_state, headdim, batch, seq_len],
        );
        if parts.len() == 7 {
            cfg.chunk_size = chunk;
        }
        cfg.model(DEFAULT_VOCAB)
            .validate()
            .map_err(|e| BenchError::Config {
                text: t.to_owned(),
                reason: e.to_string(),
            })?;
        Ok(cfg)
    }

    /// A comma-separated list (`S,M,L`), each entry as [`Self::parse`].
    pub fn parse_list(text: &str) -> Result<Vec<Self>, BenchError> {
        text.split(',')
            .filter(|s| !s.trim().is_empty())
            .map(Self::parse)
            .collect()
    }

    /// The model: the official Mamba-3 defaults (expand 2, one B/C group,
    /// half rope, tied embedding) with this shape, chunk and `vocab`.
    pub fn model(&self, vocab: usize) -> Mamba3Config {
        Mamba3Config {
            d_model: self.d_model,
            n_layer: self.n_layer,
            vocab_size: vocab,
            d_state: self.d_state,
            headdim: self.headdim,
            chunk_size: self.chunk_size,
            ..Mamba3Config::default()
        }
    }

    /// Tokens per step (`batch * seq_len`).
    pub fn tokens(&self) -> usize {
        self.batch.saturating_mul(self.seq_len)
    }
}
