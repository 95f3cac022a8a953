//! The language model around the mixers: token embedding, `n_layer` x
//! (RMSNorm -> Mamba3 -> residual add), final RMSNorm, LM head and the mean
//! next-token cross-entropy; forward and exact backward.
//!
//! The official `Block` computes `residual = hidden + residual; hidden =
//! mixer(norm(residual))`; written out that is `h_{l+1} = h_l + mixer(norm(h_l))`
//! with `h_0` the embedding, followed by `norm_f(h_L)`. The loss is the mean
//! over all `B * T` predictions of `-log softmax(logits)[target]`, with logits
//! over the padded vocabulary, as `F.cross_entropy` on the official logits.

use thiserror::Error;

use super::mixer::{MixerTape, ScanMode, mixer_forward};
use super::mixer_backward::mixer_backward;
use super::ops::{matmul_nn, matmul_nt, matmul_tn_acc, rmsnorm_rows, rmsnorm_rows_backward};
use super::state::{ModelState, StateShapeError};
use super::tokens::{TokenError, Tokens};
use super::weights::{Grads, Weights, param_specs};
use crate::float::Float;
use crate::mamba3::config::{ConfigError, Mamba3Config};

/// Why a forward pass could not run.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ModelError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The token batch is invalid.
    #[error(transparent)]
    Tokens(#[from] TokenError),
    /// The carried state does not fit.
    #[error(transparent)]
    State(#[from] StateShapeError),
    /// A weight tensor has the wrong number of elements for the config.
    #[error("weight `{name}`: expected shape {expected:?} ({numel} values), found {found} values")]
    WeightSize {
        /// Official tensor name.
        name: String,
        /// Shape the config implies.
        expected: Vec<usize>,
        /// Its element count.
        numel: usize,
        /// Element count present.
        found: usize,
    },
    /// A token id outside this model's vocabulary (only possible when the
    /// batch was validated against a larger vocabulary than the model's).
    #[error("token id {token} is outside this model's vocabulary [0, {vocab_size})")]
    TokenVocabulary {
        /// The id.
        token: usize,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
    /// A batch that packs several sequences in a row (resets) run with the
    /// chunked scan, which has no way to cut a row.
    #[error(
        "tokens: the batch marks {count} sequence start(s) inside its rows; only the recurrent scan (ScanMode::Recurrent) runs such a batch"
    )]
    ResetsNeedRecurrentScan {
        /// Flags set.
        count: usize,
    },
    /// [`backward`] was given a forward pass of a different model or batch.
    #[error(
        "forward output does not match this model: {what} has {found} values, expected {expected}"
    )]
    ForwardMismatch {
        /// The part that does not fit.
        what: &'static str,
        /// Size this model implies.
        expected: usize,
        /// Size found.
        found: usize,
    },
}

/// What one block's forward pass keeps.
#[derive(Debug, Clone)]
pub struct BlockTape<T> {
    /// Residual stream entering the block `[B*T, d_model]`.
    pub h_in: Vec<T>,
    /// Reciprocal RMS of the pre-norm `[B*T]`.
    pub rstd: Vec<T>,
    /// The mixer's own tape.
    pub mixer: MixerTape<T>,
}

/// Result of [`forward`]: the loss, the logits, the state after the window,
/// and everything the backward pass needs.
#[derive(Debug, Clone)]
pub struct ForwardOutput<T> {
    /// Mean next-token cross-entropy (accumulated in f64).
    pub loss: f64,
    /// Logits `[B, T, padded_vocab]`.
    pub logits: Vec<T>,
    /// The carried state after the last position (feed it to the next window).
    pub final_state: ModelState<T>,
    /// Per-block tapes, for the backward pass and for comparison.
    pub blocks: Vec<BlockTape<T>>,
    /// Residual stream after the last block `[B*T, d_model]`.
    pub h_final: Vec<T>,
    /// Reciprocal RMS of `norm_f` `[B*T]`.
    pub rstd_f: Vec<T>,
    /// `norm_f` output `[B*T, d_model]`.
    pub normed: Vec<T>,
    /// Input and target ids.
    pub tokens: Tokens,
}

/// Checks that every weight tensor has the size the config implies.
pub fn check_weights<T: Float>(cfg: &Mamba3Config, w: &Weights<T>) -> Result<(), ModelError> {
    cfg.validate()?;
    let specs = param_specs(cfg);
    let tensors = w.tensors();
    if w.layers.len() != cfg.n_layer || tensors.len() != specs.len() {
        let name = if w.layers.len() != cfg.n_layer {
            "backbone.layers"
        } else if cfg.tie_embeddings {
            "lm_head.weight (present although tie_embeddings is true)"
        } else {
            "lm_head.weight (absent although tie_embeddings is false)"
        };
        return Err(ModelError::WeightSize {
            name: name.into(),
            expected: vec![cfg.n_layer],
            numel: specs.len(),
            found: tensors.len(),
        });
    }
    for (i, l) in w.layers.iter().enumerate() {
        if l.out_norm.is_some() != cfg.is_outproj_norm {
            return Err(ModelError::WeightSize {
                name: format!("backbone.layers.{i}.mixer.norm.weight"),
                expected: if cfg.is_outproj_norm {
                    vec![cfg.d_inner()]
                } else {
                    Vec::new()
                },
                numel: if cfg.is_outproj_norm {
                    cfg.d_inner()
                } else {
                    0
                },
                found: l.out_norm.as_ref().map_or(0, Vec::len),
            });
        }
    }
    for (spec, t) in specs.iter().zip(tensors) {
        if t.len() != spec.numel() {
            return Err(ModelError::WeightSize {
                name: spec.name.clone(),
                expected: spec.shape.clone(),
                numel: spec.numel(),
                found: t.len(),
            });
        }
    }
    Ok(())
}

/// Runs the model over one window. `state` is the state carried in from the
/// previous window (`None`: a fresh sequence). A batch with resets
/// ([`Tokens::with_resets`]) needs [`ScanMode::Recurrent`].
pub fn forward<T: Float>(
    cfg: &Mamba3Config,
    w: &Weights<T>,
    tokens: &Tokens,
    state: Option<&ModelState<T>>,
    mode: ScanMode,
) -> Result<ForwardOutput<T>, ModelError> {
    check_weights(cfg, w)?;
    let count = tokens
        .resets()
        .map_or(0, |r| r.iter().filter(|&&b| b).count());
    if count > 0 && mode != ScanMode::Recurrent {
        return Err(ModelError::ResetsNeedRecurrentScan { count });
    }
    let (batch, len) = (tokens.batch(), tokens.len());
    let zero_state;
    let state = match state {
        Some(s) => {
            s.check(cfg, batch)?;
            s
        }
        None => {
            zero_state = ModelState::zeros(cfg, batch);
            &zero_state
        }
    };
    let (dm, vocab) = (cfg.d_model, cfg.padded_vocab_size());
    let rows = batch * len;
    let eps = T::from_f64(cfg.norm_eps);

    let mut ids = tokens.inputs().iter().chain(tokens.targets());
    if let Some(&token) = ids.find(|&&id| id >= cfg.vocab_size) {
        return Err(ModelError::TokenVocabulary {
            token,
            vocab_size: cfg.vocab_size,
        });
    }
    let mut h = Vec::with_capacity(rows * dm);
    for &id in tokens.inputs() {
        h.extend_from_slice(&w.embedding[id * dm..(id + 1) * dm]);
    }
    let mut blocks = Vec::with_capacity(cfg.n_layer);
    let mut final_state = ModelState {
        batch,
        layers: Vec::with_capacity(cfg.n_layer),
    };
    for (lw, carry) in w.layers.iter().zip(&state.layers) {
        let (u, rstd) = rmsnorm_rows(&h, &lw.norm, dm, eps);
        let resets = tokens.resets().unwrap_or(&[]);
        let (out, mixer, next) = mixer_forward(cfg, lw, u, (batch, len), (carry, resets), mode);
        let mut h_next = h.clone();
        for (a, &b) in h_next.iter_mut().zip(&out) {
            *a += b;
        }
        blocks.push(BlockTape {
            h_in: std::mem::replace(&mut h, h_next),
            rstd,
            mixer,
        });
        final_state.layers.push(next);
    }
    let (normed, rstd_f) = rmsnorm_rows(&h, &w.norm_f, dm, eps);
    let logits = matmul_nt(&normed, w.head(), rows, dm, vocab);
    let loss = mean_cross_entropy(&logits, tokens.targets(), vocab);
    Ok(ForwardOutput {
        loss,
        logits,
        final_state,
        blocks,
        h_final: h,
        rstd_f,
        normed,
        tokens: tokens.clone(),
    })
}

/// Mean of `-log softmax(row)[target]` over rows, accumulated in f64.
fn mean_cross_entropy<T: Float>(logits: &[T], targets: &[usize], vocab: usize) -> f64 {
    let mut total = 0.0;
    for (row, &tgt) in logits.chunks(vocab).zip(targets) {
        let m = row
            .iter()
            .fold(f64::NEG_INFINITY, |a, &b| a.max(b.to_f64()));
        let lse = m + row
            .iter()
            .map(|&x| (x.to_f64() - m).exp())
            .sum::<f64>()
            .ln();
        total += lse - row[tgt].to_f64();
    }
    total / f64::from_count(targets.len().max(1))
}

/// Checks that `fwd` came from a forward pass of this model.
fn check_forward<T: Float>(cfg: &Mamba3Config, fwd: &ForwardOutput<T>) -> Result<(), ModelError> {
    let rows = fwd.tokens.count();
    let (dm, e) = (cfg.d_model, cfg.d_in_proj());
    let mut parts = vec![
        ("blocks", fwd.blocks.len(), cfg.n_layer),
        ("logits", fwd.logits.len(), rows * cfg.padded_vocab_size()),
        ("h_final", fwd.h_final.len(), rows * dm),
        ("normed", fwd.normed.len(), rows * dm),
        ("rstd_f", fwd.rstd_f.len(), rows),
    ];
    for b in &fwd.blocks {
        let m = &b.mixer;
        let heads = m.batch * cfg.nheads();
        let chunked_heads = if m.chunked.is_empty() {
            heads
        } else {
            m.chunked.len()
        };
        let ck = if m.chunked.is_empty() {
            heads * m.len.div_ceil(cfg.chunk_size.max(1)) * cfg.headdim * cfg.d_state
        } else {
            m.checkpoints.len()
        };
        parts.extend([
            ("block input", b.h_in.len(), rows * dm),
            ("block rstd", b.rstd.len(), rows),
            ("mixer rows", m.batch * m.len, rows),
            ("mixer projection", m.proj.len(), rows * e),
            ("mixer chunked heads", chunked_heads, heads),
            ("mixer checkpoints", m.checkpoints.len(), ck),
            (
                "mixer carried state",
                m.carry.ssm.len(),
                heads * cfg.headdim * cfg.d_state,
            ),
        ]);
    }
    for (what, found, expected) in parts {
        if found != expected {
            return Err(ModelError::ForwardMismatch {
                what,
                expected,
                found,
            });
        }
    }
    Ok(())
}

/// [`backward`] after checking that the weights fit `cfg` and that `fwd`
/// came from a forward pass of this model: a mismatch is an error, not a panic.
pub fn try_backward<T: Float>(
    cfg: &Mamba3Config,
    w: &Weights<T>,
    fwd: &ForwardOutput<T>,
) -> Result<Grads<T>, ModelError> {
    check_weights(cfg, w)?;
    check_forward(cfg, fwd)?;
    Ok(backward(cfg, w, fwd))
}

/// Gradient of the mean loss with respect to every parameter (the carried-in
/// state is treated as a constant). The softmax is recomputed from
/// `fwd.logits`, so a caller may edit the logits (e.g. to mask positions)
/// before calling.
///
/// # Panics
///
/// If `fwd` did not come from [`forward`] with the same `cfg` and `w` (sizes
/// disagree); [`try_backward`] checks this and returns an error instead.
pub fn backward<T: Float>(cfg: &Mamba3Config, w: &Weights<T>, fwd: &ForwardOutput<T>) -> Grads<T> {
    let mut g = Weights::zeros(cfg);
    let (dm, vocab) = (cfg.d_model, cfg.padded_vocab_size());
    let rows = fwd.tokens.count();
    let inv = T::ONE / T::from_count(rows.max(1));

    // d logits = (softmax - onehot) / (B T)
    let mut dlogits = vec![T::ZERO; fwd.logits.len()];
    for ((drow, row), &tgt) in dlogits
        .chunks_mut(vocab)
        .zip(fwd.logits.chunks(vocab))
        .zip(fwd.tokens.targets())
    {
        let m = row.iter().fold(row[0], |a, &b| a.max(b));
        let mut z = T::ZERO;
        for (d, &x) in drow.iter_mut().zip(row) {
            *d = (x - m).exp();
            z += *d;
        }
        for d in drow.iter_mut() {
            *d = *d / z * inv;
        }
        drow[tgt] -= inv;
    }
    let head_grad = g.lm_head.as_mut().unwrap_or(&mut g.embedding);
    matmul_tn_acc(head_grad, &dlogits, &fwd.normed, rows, vocab, dm);
    let dnormed = matmul_nn(&dlogits, w.head(), rows, vocab, dm);
    let mut dh = rmsnorm_rows_backward(
        &fwd.h_final,
        &w.norm_f,
        &fwd.rstd_f,
        &dnormed,
        dm,
        &mut g.norm_f,
    );

    for ((lw, gl), bt) in w
        .layers
        .iter()
        .zip(g.layers.iter_mut())
        .zip(&fwd.blocks)
        .rev()
    {
        // h_out = h_in + mixer(norm(h_in))
        let du = mixer_backward(cfg, lw, &bt.mixer, &dh, gl);
        let dh_norm = rmsnorm_rows_backward(&bt.h_in, &lw.norm, &bt.rstd, &du, dm, &mut gl.norm);
        for (a, &b) in dh.iter_mut().zip(&dh_norm) {
            *a += b;
        }
    }
    for (&id, drow) in fwd.tokens.inputs().iter().zip(dh.chunks(dm)) {
        for (gv, &d) in g.embedding[id * dm..(id + 1) * dm].iter_mut().zip(drow) {
            *gv += d;
        }
    }
    g
}

/// Forward then backward: `(loss, gradients)` of one window from a fresh state.
pub fn loss_and_grads<T: Float>(
    cfg: &Mamba3Config,
    w: &Weights<T>,
    tokens: &Tokens,
) -> Result<(f64, Grads<T>), ModelError> {
    let fwd = forward(cfg, w, tokens, None, ScanMode::default())?;
    Ok((fwd.loss, backward(cfg, w, &fwd)))
}
