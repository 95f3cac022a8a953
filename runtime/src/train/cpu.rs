//! The CPU engine: the f32 CPU reference model (forward, analytic backward)
//! with AdamW on the host. It is the fallback when no GPU engine is
//! available, and the engine the resume and determinism tests run on.
//!
//! Rows of a batch are split into a fixed number of chunks ([`CHUNKS`]) that
//! run in parallel with rayon; their gradients are combined in chunk order,
//! so the result does not depend on the thread count (a resumed run is
//! bit-identical on any machine with the same float semantics).
//!
//! The CPU model's loss is the mean over *all* predictions. To train on the
//! masked mean (answer positions only), the logits of unscored predictions
//! are replaced, before the backward pass, by a row whose softmax is exactly
//! the one-hot target (`0` at the target, `-1e30` elsewhere), which makes
//! their `softmax - onehot` term exactly zero; each chunk's gradient is then
//! rescaled from `1 / predictions` to `1 / scored`. The scored loss itself is
//! computed here from the untouched logits.
//!
//! AdamW is applied here, not through [`crate::optim::AdamW`], because a
//! resumed run must restore the moments and that type keeps them private;
//! the update is the same torch-semantics arithmetic in the same order, and
//! a test checks the two agree bit for bit.

use rayon::prelude::*;

use super::data::Batch;
use super::engine::{
    EngineError, EngineInfo, EngineState, EvalOutput, Moments, OptimSettings, StepMetrics,
    TrainEngine,
};
use super::schedule::LrSchedule;
use crate::mamba3::Mamba3Config;
use crate::mamba3::cpu::{
    Float, ForwardOutput, Grads, ModelError, ScanMode, Tokens, Weights, backward, check_weights,
    forward,
};
use crate::optim::clip_grad_norm;

/// Row chunks per batch (fixed, so results do not depend on the thread count).
pub const CHUNKS: usize = 4;

/// Logit given to non-target classes of an unscored prediction.
const MASKED_LOGIT: f32 = -1e30;

/// f32 CPU reference model + host AdamW.
pub struct CpuEngine {
    cfg: Mamba3Config,
    weights: Weights<f32>,
    settings: OptimSettings,
    decay: Vec<bool>,
    moments: Vec<Moments>,
    adam_steps: u64,
    steps: u64,
    skipped: u64,
    schedule: LrSchedule,
    staged: Option<Batch>,
    last: Option<StepMetrics>,
}

impl CpuEngine {
    /// An engine over `weights` (checked against `cfg`) with zero moments.
    pub fn new(
        cfg: Mamba3Config,
        weights: Weights<f32>,
        settings: OptimSettings,
    ) -> Result<Self, EngineError> {
        check_weights(&cfg, &weights)?;
        let params = crate::step::params(&cfg);
        let decay = params.iter().map(|p| settings.decay.decays(p)).collect();
        let moments = params
            .iter()
            .map(|p| (vec![0.0; p.numel], vec![0.0; p.numel]))
            .collect();
        let schedule = LrSchedule {
            peak: settings.adam.lr,
            min_lr: settings.adam.lr,
            warmup: 0,
            total: 0,
        };
        Ok(Self {
            cfg,
            weights,
            settings,
            decay,
            moments,
            adam_steps: 0,
            steps: 0,
            skipped: 0,
            schedule,
            staged: None,
            last: None,
        })
    }

    /// The current weights.
    pub fn weights(&self) -> &Weights<f32> {
        &self.weights
    }

    /// One AdamW update with learning rate `lr` (torch semantics, as
    /// `optim::AdamW::step`).
    fn adamw(&mut self, grads: &Grads<f32>, lr: f64) {
        self.adam_steps += 1;
        let c = self.settings.adam;
        let t = i32::try_from(self.adam_steps).unwrap_or(i32::MAX);
        let bc1 = 1.0 - c.beta1.powi(t);
        let bc2_sqrt = (1.0 - c.beta2.powi(t)).sqrt();
        let step_size = f32::from_f64(lr / bc1);
        let (b1, b2) = (f32::from_f64(c.beta1), f32::from_f64(c.beta2));
        let (one_b1, one_b2) = (f32::from_f64(1.0 - c.beta1), f32::from_f64(1.0 - c.beta2));
        let (eps, bc2s) = (f32::from_f64(c.eps), f32::from_f64(bc2_sqrt));
        let shrink = f32::from_f64(1.0 - lr * c.weight_decay);
        let params = self.weights.tensors_mut();
        for (((p, g), (m, v)), &decay) in params
            .into_iter()
            .zip(grads.tensors())
            .zip(self.moments.iter_mut())
            .zip(&self.decay)
        {
            for (((pv, &gv), mv), vv) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                if decay {
                    *pv *= shrink;
                }
                *mv = b1 * *mv + one_b1 * gv;
                *vv = b2 * *vv + one_b2 * gv * gv;
                *pv -= step_size * *mv / (vv.sqrt() / bc2s + eps);
            }
        }
    }
}

/// `[start, end)` row ranges of the chunks of a batch of `rows` rows.
fn chunk_bounds(rows: usize) -> Vec<(usize, usize)> {
    let n = rows.clamp(1, CHUNKS);
    (0..n).map(|i| (i * rows / n, (i + 1) * rows / n)).collect()
}

fn to_tokens(cfg: &Mamba3Config, batch: &Batch) -> Result<Tokens, ModelError> {
    let ids: Vec<i64> = batch.tokens.iter().map(|&t| i64::from(t)).collect();
    let tokens = Tokens::from_rows(&ids, batch.rows, batch.width, cfg.vocab_size)?;
    Ok(match &batch.resets {
        Some(r) => tokens.with_resets(r.clone())?,
        None => tokens,
    })
}

/// The scan a batch runs with: a packed batch's resets need the recurrent
/// form; otherwise the chunked one, as before packing existed.
fn scan_mode(tokens: &Tokens) -> ScanMode {
    if tokens.resets().is_some() {
        ScanMode::Recurrent
    } else {
        ScanMode::default()
    }
}

/// `-log softmax(row)[target]`, in f64.
fn cross_entropy(row: &[f32], target: usize) -> f64 {
    let m = row
        .iter()
        .fold(f64::NEG_INFINITY, |a, &b| a.max(f64::from(b)));
    let lse = m + row
        .iter()
        .map(|&x| (f64::from(x) - m).exp())
        .sum::<f64>()
        .ln();
    lse - f64::from(row[target])
}

/// What one chunk contributes: its gradient (of the mean over all of its
/// predictions, unscored ones contributing exactly zero), its scored loss
/// sum, scored count and prediction count.
struct ChunkGrad {
    grads: Option<Grads<f32>>,
    loss_sum: f64,
    scored: usize,
    predictions: usize,
}

fn chunk_grad(
    cfg: &Mamba3Config,
    w: &Weights<f32>,
    batch: &Batch,
) -> Result<ChunkGrad, ModelError> {
    let tokens = to_tokens(cfg, batch)?;
    let mut fwd: ForwardOutput<f32> = forward(cfg, w, &tokens, None, scan_mode(&tokens))?;
    let vocab = cfg.padded_vocab_size();
    let (mut loss_sum, mut scored) = (0.0, 0);
    for (i, (row, &tgt)) in fwd
        .logits
        .chunks_mut(vocab)
        .zip(tokens.targets())
        .enumerate()
    {
        if batch.scored(i) {
            loss_sum += cross_entropy(row, tgt);
            scored += 1;
        } else {
            row.fill(MASKED_LOGIT);
            row[tgt] = 0.0;
        }
    }
    let grads = (scored > 0).then(|| backward(cfg, w, &fwd));
    Ok(ChunkGrad {
        grads,
        loss_sum,
        scored,
        predictions: tokens.count(),
    })
}

impl TrainEngine for CpuEngine {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            name: "cpu".into(),
            precision: "f32",
            device: format!("CPU, {} threads", rayon::current_num_threads()),
        }
    }

    fn model_config(&self) -> &Mamba3Config {
        &self.cfg
    }

    fn set_schedule(&mut self, schedule: LrSchedule) {
        self.schedule = schedule;
    }

    fn load_batch(&mut self, batch: &Batch) -> Result<(), EngineError> {
        if batch.rows == 0 || batch.width < 2 || batch.tokens.len() != batch.rows * batch.width {
            return Err(EngineError::BatchShape {
                ids: batch.tokens.len(),
                rows: batch.rows,
                width: batch.width,
            });
        }
        self.staged = Some(batch.clone());
        Ok(())
    }

    fn step(&mut self) -> Result<(), EngineError> {
        let batch = self
            .staged
            .take()
            .ok_or(EngineError::Order("step() without load_batch()"))?;
        let lr = self.schedule.lr(self.steps);
        let (cfg, w) = (&self.cfg, &self.weights);
        let parts: Vec<ChunkGrad> = chunk_bounds(batch.rows)
            .par_iter()
            .map(|&(s, e)| chunk_grad(cfg, w, &batch.slice_rows(s, e)))
            .collect::<Result<_, _>>()?;
        let total: usize = parts.iter().map(|p| p.scored).sum();
        if total == 0 {
            return Err(EngineError::NothingScored);
        }
        let mut grads = Weights::<f32>::zeros(&self.cfg);
        let mut loss_sum = 0.0;
        for p in &parts {
            loss_sum += p.loss_sum;
            let Some(g) = &p.grads else { continue };
            // Chunk gradients are means over their predictions; weight them
            // so the sum is the mean over all scored predictions.
            let scale = f32::from_f64(p.predictions as f64 / total as f64);
            for (acc, part) in grads.tensors_mut().into_iter().zip(g.tensors()) {
                for (a, &b) in acc.iter_mut().zip(part) {
                    *a += b * scale;
                }
            }
        }
        let mut tensors = grads.tensors_mut();
        for f in &self.settings.frozen {
            if let Some(g) = tensors
                .get_mut(f.tensor)
                .and_then(|t| t.get_mut(f.start..f.end))
            {
                g.fill(0.0);
            }
        }
        let grad_norm = match self.settings.clip {
            Some(max_norm) => clip_grad_norm(&mut tensors, max_norm),
            None => tensors
                .iter()
                .flat_map(|t| t.iter())
                .map(|&v| f64::from(v) * f64::from(v))
                .sum::<f64>()
                .sqrt(),
        };
        let skipped = !grad_norm.is_finite();
        if skipped {
            self.skipped += 1;
        } else {
            self.adamw(&grads, lr);
        }
        self.steps += 1;
        self.last = Some(StepMetrics {
            step: self.steps,
            loss: loss_sum / total as f64,
            grad_norm,
            lr,
            skipped,
            skipped_total: self.skipped,
        });
        Ok(())
    }

    fn metrics(&mut self) -> Result<StepMetrics, EngineError> {
        self.last
            .ok_or(EngineError::Order("metrics() before step()"))
    }

    fn eval(&mut self, batch: &Batch) -> Result<EvalOutput, EngineError> {
        let (cfg, w) = (&self.cfg, &self.weights);
        let (vocab, real) = (cfg.padded_vocab_size(), cfg.vocab_size);
        let parts: Vec<EvalOutput> = chunk_bounds(batch.rows)
            .par_iter()
            .map(|&(s, e)| -> Result<EvalOutput, ModelError> {
                let tokens = to_tokens(cfg, &batch.slice_rows(s, e))?;
                let fwd = forward(cfg, w, &tokens, None, scan_mode(&tokens))?;
                let mut out = EvalOutput {
                    token_loss: Vec::with_capacity(tokens.count()),
                    argmax: Vec::with_capacity(tokens.count()),
                };
                for (row, &tgt) in fwd.logits.chunks(vocab).zip(tokens.targets()) {
                    out.token_loss.push(f32::from_f64(cross_entropy(row, tgt)));
                    // Padded vocabulary rows are never targets: argmax over real ids.
                    let best = row[..real].iter().enumerate().fold(
                        (0, f32::NEG_INFINITY),
                        |b, (i, &x)| if x > b.1 { (i, x) } else { b },
                    );
                    out.argmax.push(u32::try_from(best.0).unwrap_or(u32::MAX));
                }
                Ok(out)
            })
            .collect::<Result<_, _>>()?;
        let mut out = EvalOutput {
            token_loss: Vec::new(),
            argmax: Vec::new(),
        };
        for p in parts {
            out.token_loss.extend(p.token_loss);
            out.argmax.extend(p.argmax);
        }
        Ok(out)
    }

    fn export_state(&mut self) -> Result<EngineState, EngineError> {
        Ok(EngineState {
            weights: self.weights.clone(),
            moments: self.moments.clone(),
            adam_steps: self.adam_steps,
            steps: self.steps,
            skipped: self.skipped,
        })
    }

    fn import_state(&mut self, state: EngineState) -> Result<(), EngineError> {
        state.check(&self.cfg)?;
        self.weights = state.weights;
        self.moments = state.moments;
        self.adam_steps = state.adam_steps;
        self.steps = state.steps;
        self.skipped = state.skipped;
        self.last = None;
        Ok(())
    }

    fn weights(&mut self) -> Result<Weights<f32>, EngineError> {
        Ok(self.weights.clone())
    }

    fn set_weights(&mut self, weights: &Weights<f32>) -> Result<(), EngineError> {
        check_weights(&self.cfg, weights)?;
        self.weights.clone_from(weights);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::{AdamW, AdamWConfig, DecayPolicy};
    use crate::train::data::{DataSpec, Dataset, Task};

    fn tiny() -> Mamba3Config {
        Mamba3Config {
            vocab_size: Task::Parity.vocab_size(),
            n_layer: 1,
            ..Mamba3Config::tiny()
        }
    }

    fn settings(clip: Option<f64>) -> OptimSettings {
        OptimSettings {
            adam: AdamWConfig {
                lr: 1e-2,
                weight_decay: 0.1,
                ..AdamWConfig::default()
            },
            decay: DecayPolicy::MatricesOnly,
            clip,
            frozen: Vec::new(),
        }
    }

    fn bits(w: &Weights<f32>) -> Vec<u32> {
        w.tensors()
            .iter()
            .flat_map(|t| t.iter().map(|v| v.to_bits()))
            .collect()
    }

    #[test]
    fn host_adamw_equals_optim_adamw_bit_for_bit() {
        let cfg = tiny();
        let w = Weights::<f32>::init(&cfg, 3).unwrap();
        let mut engine = CpuEngine::new(cfg.clone(), w.clone(), settings(None)).unwrap();
        let mut reference = AdamW::<f32>::new(
            settings(None).adam,
            &crate::step::params(&cfg),
            &DecayPolicy::MatricesOnly,
        );
        let mut ref_w = w;
        for (k, lr) in [1e-2, 5e-3, 2e-3].into_iter().enumerate() {
            // Deterministic, non-trivial gradients of every tensor.
            let mut g = Weights::<f32>::zeros(&cfg);
            for (i, t) in g.tensors_mut().into_iter().enumerate() {
                for (j, v) in t.iter_mut().enumerate() {
                    *v = ((i * 31 + j * 7 + k) % 13) as f32 * 0.01 - 0.06;
                }
            }
            engine.adamw(&g, lr);
            reference.config.lr = lr;
            reference
                .step(&mut ref_w.tensors_mut(), &g.tensors())
                .unwrap();
        }
        assert_eq!(bits(engine.weights()), bits(&ref_w));
        for (i, (m, v)) in engine.moments.iter().enumerate() {
            let (rm, rv) = reference.moments(i).unwrap();
            assert!(m.iter().zip(rm).all(|(a, b)| a.to_bits() == b.to_bits()));
            assert!(v.iter().zip(rv).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    fn parity_batch(rows: usize) -> Batch {
        let spec = DataSpec::task(Task::Parity, 6, vec![]);
        Dataset::new(&spec, 0, rows)
            .unwrap()
            .next_batch(rows)
            .unwrap()
    }

    #[test]
    fn non_finite_gradients_skip_the_update_and_are_counted() {
        let cfg = tiny();
        let mut w = Weights::<f32>::init(&cfg, 1).unwrap();
        w.norm_f[0] = f32::NAN;
        let mut engine = CpuEngine::new(cfg, w, settings(Some(1.0))).unwrap();
        let before = engine.export_state().unwrap();
        let batch = parity_batch(4);
        for k in 1..=2 {
            engine.load_batch(&batch).unwrap();
            engine.step().unwrap();
            let m = engine.metrics().unwrap();
            assert!(m.skipped && !m.grad_norm.is_finite());
            assert_eq!((m.step, m.skipped_total), (k, k));
        }
        let after = engine.export_state().unwrap();
        assert_eq!(
            bits(&after.weights),
            bits(&before.weights),
            "no update applied"
        );
        assert_eq!(after.adam_steps, 0);
        assert_eq!((after.steps, after.skipped), (2, 2));
        assert_eq!(after.moments, before.moments);
    }

    #[test]
    fn masked_loss_counts_only_answer_positions() {
        let cfg = tiny();
        let w = Weights::<f32>::init(&cfg, 2).unwrap();
        let mut engine = CpuEngine::new(cfg, w, settings(None)).unwrap();
        let batch = parity_batch(6);
        let eval = engine.eval(&batch).unwrap();
        let (mut sum, mut n) = (0.0, 0);
        for (i, &l) in eval.token_loss.iter().enumerate() {
            if batch.scored(i) {
                sum += f64::from(l);
                n += 1;
            }
        }
        assert_eq!(n, 6, "one answer per parity row");
        engine.load_batch(&batch).unwrap();
        engine.step().unwrap();
        let m = engine.metrics().unwrap();
        assert!(
            (m.loss - sum / 6.0).abs() < 1e-5,
            "{} vs {}",
            m.loss,
            sum / 6.0
        );
    }

    #[test]
    fn frozen_rows_never_move() {
        let cfg = tiny();
        let frozen = crate::train::engine::rotation_rows(&cfg);
        assert_eq!(frozen.len(), cfg.n_layer);
        let mut w = Weights::<f32>::init(&cfg, 4).unwrap();
        let (f, before_rest) = (&frozen[0], w.layers[0].in_proj.clone());
        w.layers[0].in_proj[f.start..f.end].fill(0.0);
        let s = OptimSettings {
            frozen: frozen.clone(),
            ..settings(Some(1.0))
        };
        let mut engine = CpuEngine::new(cfg, w, s).unwrap();
        for _ in 0..3 {
            engine.load_batch(&parity_batch(4)).unwrap();
            engine.step().unwrap();
        }
        let after = &engine.weights().layers[0].in_proj;
        assert!(
            after[f.start..f.end].iter().all(|&v| v == 0.0),
            "angle rows stay zero"
        );
        assert_ne!(
            &after[..f.start],
            &before_rest[..f.start],
            "the rest trains"
        );
    }

    #[test]
    fn chunking_covers_every_row_once() {
        for rows in [1, 2, 3, 4, 5, 17] {
            let b = chunk_bounds(rows);
            assert_eq!(b[0].0, 0);
            assert_eq!(b.last().unwrap().1, rows);
            assert!(b.windows(2).all(|w| w[0].1 == w[1].0 && w[0].0 < w[0].1));
        }
    }
}
