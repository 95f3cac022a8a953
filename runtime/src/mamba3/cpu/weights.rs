//! Parameters (and, with the same layout, gradients) of the CPU model, their
//! official names and shapes, and the official initialisation.
//!
//! Every tensor is a flat row-major `Vec<T>` in the official PyTorch layout
//! (`nn.Linear.weight` is `[out, in]`), so the named list from
//! [`Weights::tensors`] can be written to a checkpoint or compared with a GPU
//! buffer without any transposition.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::float::Float;
use crate::mamba3::config::{ConfigError, Mamba3Config};

/// What a parameter is, which decides its default weight-decay treatment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// A 2-D projection or embedding matrix: decayed by default.
    Matrix,
    /// A norm weight, bias, `dt_bias` or `D`: not decayed by default.
    Vector,
}

/// Name, shape and kind of one parameter tensor, in the official
/// `MambaLMHeadModel.state_dict()` naming.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    /// Official name, e.g. `backbone.layers.0.mixer.in_proj.weight`.
    pub name: String,
    /// Official shape.
    pub shape: Vec<usize>,
    /// Matrix or vector-like.
    pub kind: ParamKind,
}

impl ParamSpec {
    fn new(name: String, shape: Vec<usize>, kind: ParamKind) -> Self {
        Self { name, shape, kind }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Parameters of one block: the pre-norm and the Mamba3 mixer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerWeights<T> {
    /// `layers.{i}.norm.weight` `[d_model]`.
    pub norm: Vec<T>,
    /// `mixer.in_proj.weight` `[d_in_proj, d_model]`.
    pub in_proj: Vec<T>,
    /// `mixer.dt_bias` `[nheads]`.
    pub dt_bias: Vec<T>,
    /// `mixer.B_bias` `[nheads, 1, d_state]` (official `(H, mimo_rank, N)`, rank 1).
    pub b_bias: Vec<T>,
    /// `mixer.C_bias` `[nheads, 1, d_state]`.
    pub c_bias: Vec<T>,
    /// `mixer.B_norm.weight` `[d_state]`, shared by all groups.
    pub b_norm: Vec<T>,
    /// `mixer.C_norm.weight` `[d_state]`.
    pub c_norm: Vec<T>,
    /// `mixer.D` `[nheads]`.
    pub d: Vec<T>,
    /// `mixer.norm.weight` `[d_inner]`; present only with `is_outproj_norm`.
    pub out_norm: Option<Vec<T>>,
    /// `mixer.out_proj.weight` `[d_model, d_inner]`.
    pub out_proj: Vec<T>,
}

/// All parameters of the language model. Gradients use the same type.
#[derive(Debug, Clone, PartialEq)]
pub struct Weights<T> {
    /// `backbone.embedding.weight` `[padded_vocab, d_model]`.
    pub embedding: Vec<T>,
    /// One entry per block.
    pub layers: Vec<LayerWeights<T>>,
    /// `backbone.norm_f.weight` `[d_model]`.
    pub norm_f: Vec<T>,
    /// `lm_head.weight` `[padded_vocab, d_model]`; `None` when tied to the embedding.
    pub lm_head: Option<Vec<T>>,
}

/// Gradients of the mean loss, one tensor per parameter, same names and shapes.
pub type Grads<T> = Weights<T>;

/// The official names, shapes and kinds of every parameter, in registration order.
pub fn param_specs(cfg: &Mamba3Config) -> Vec<ParamSpec> {
    let (d, v, h, n) = (
        cfg.d_model,
        cfg.padded_vocab_size(),
        cfg.nheads(),
        cfg.d_state,
    );
    let mut specs = vec![ParamSpec::new(
        "backbone.embedding.weight".into(),
        vec![v, d],
        ParamKind::Matrix,
    )];
    for i in 0..cfg.n_layer {
        let p = format!("backbone.layers.{i}");
        let m = format!("{p}.mixer");
        specs.push(ParamSpec::new(
            format!("{p}.norm.weight"),
            vec![d],
            ParamKind::Vector,
        ));
        specs.push(ParamSpec::new(
            format!("{m}.in_proj.weight"),
            vec![cfg.d_in_proj(), d],
            ParamKind::Matrix,
        ));
        specs.push(ParamSpec::new(
            format!("{m}.dt_bias"),
            vec![h],
            ParamKind::Vector,
        ));
        specs.push(ParamSpec::new(
            format!("{m}.B_bias"),
            vec![h, 1, n],
            ParamKind::Vector,
        ));
        specs.push(ParamSpec::new(
            format!("{m}.C_bias"),
            vec![h, 1, n],
            ParamKind::Vector,
        ));
        specs.push(ParamSpec::new(
            format!("{m}.B_norm.weight"),
            vec![n],
            ParamKind::Vector,
        ));
        specs.push(ParamSpec::new(
            format!("{m}.C_norm.weight"),
            vec![n],
            ParamKind::Vector,
        ));
        specs.push(ParamSpec::new(format!("{m}.D"), vec![h], ParamKind::Vector));
        if cfg.is_outproj_norm {
            specs.push(ParamSpec::new(
                format!("{m}.norm.weight"),
                vec![cfg.d_inner()],
                ParamKind::Vector,
            ));
        }
        specs.push(ParamSpec::new(
            format!("{m}.out_proj.weight"),
            vec![d, cfg.d_inner()],
            ParamKind::Matrix,
        ));
    }
    specs.push(ParamSpec::new(
        "backbone.norm_f.weight".into(),
        vec![d],
        ParamKind::Vector,
    ));
    if !cfg.tie_embeddings {
        specs.push(ParamSpec::new(
            "lm_head.weight".into(),
            vec![v, d],
            ParamKind::Matrix,
        ));
    }
    specs
}

impl<T: Float> Weights<T> {
    /// All-zero tensors of the right shapes (gradient accumulators).
    pub fn zeros(cfg: &Mamba3Config) -> Self {
        let specs = param_specs(cfg);
        let mut w = Self::empty(cfg);
        for (slot, spec) in w.tensors_mut().into_iter().zip(&specs) {
            *slot = vec![T::ZERO; spec.numel()];
        }
        w
    }

    fn empty(cfg: &Mamba3Config) -> Self {
        let layer = LayerWeights {
            norm: Vec::new(),
            in_proj: Vec::new(),
            dt_bias: Vec::new(),
            b_bias: Vec::new(),
            c_bias: Vec::new(),
            b_norm: Vec::new(),
            c_norm: Vec::new(),
            d: Vec::new(),
            out_norm: cfg.is_outproj_norm.then(Vec::new),
            out_proj: Vec::new(),
        };
        Self {
            embedding: Vec::new(),
            layers: vec![layer; cfg.n_layer],
            norm_f: Vec::new(),
            lm_head: (!cfg.tie_embeddings).then(Vec::new),
        }
    }

    /// Builds weights from tensors given in [`param_specs`] order (sizes are
    /// checked by the caller, e.g. the checkpoint loader).
    pub(crate) fn from_ordered(cfg: &Mamba3Config, tensors: Vec<Vec<T>>) -> Self {
        let mut w = Self::empty(cfg);
        for (slot, t) in w.tensors_mut().into_iter().zip(tensors) {
            *slot = t;
        }
        w
    }

    /// The official initialisation (`Mamba3.__init__` plus
    /// `mixer_seq_simple._init_weights`), drawn from a ChaCha20 stream seeded
    /// with `seed`, computed in f64 and rounded once to `T`:
    /// - embedding ~ N(0, 0.02^2);
    /// - `in_proj` (and an untied `lm_head`) ~ U(+-1/sqrt(fan_in)) (`nn.Linear` default);
    /// - `out_proj` ~ U(+-1/sqrt(d_inner)) / sqrt(n_layer) (GPT-2 rescale, one
    ///   residual per layer since there is no MLP);
    /// - `dt_bias` = inverse softplus of dt, dt log-uniform in `[dt_min, dt_max]`,
    ///   floored at `dt_init_floor`;
    /// - B/C biases, all norm weights and D: ones.
    pub fn init(cfg: &Mamba3Config, seed: u64) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let mut stream = Stream::new(seed);
        let (d, v, h, n, di) = (
            cfg.d_model,
            cfg.padded_vocab_size(),
            cfg.nheads(),
            cfg.d_state,
            cfg.d_inner(),
        );
        let embedding = stream.fill(v * d, NORMAL_WORDS, |rng| T::from_f64(0.02 * normal(rng)));
        let ones = |len: usize| vec![T::ONE; len];
        let mut layers = Vec::with_capacity(cfg.n_layer);
        let in_bound = 1.0 / f64::from_count(d).sqrt();
        let out_bound = 1.0 / f64::from_count(di).sqrt();
        let out_scale = 1.0 / f64::from_count(cfg.n_layer).sqrt();
        let (ln_min, ln_max) = (cfg.dt_min.ln(), cfg.dt_max.ln());
        for _ in 0..cfg.n_layer {
            let in_proj = stream.uniform(cfg.d_in_proj() * d, in_bound, 1.0);
            let dt_bias = stream.fill(h, UNIFORM_WORDS, |rng| {
                let u: f64 = rng.random();
                let dt = (u * (ln_max - ln_min) + ln_min)
                    .exp()
                    .max(cfg.dt_init_floor);
                // inverse softplus, written as the official code does
                T::from_f64(dt + (-(-dt).exp_m1()).ln())
            });
            let out_proj = stream.uniform(d * di, out_bound, out_scale);
            layers.push(LayerWeights {
                norm: ones(d),
                in_proj,
                dt_bias,
                b_bias: ones(h * n),
                c_bias: ones(h * n),
                b_norm: ones(n),
                c_norm: ones(n),
                d: ones(h),
                out_norm: cfg.is_outproj_norm.then(|| ones(di)),
                out_proj,
            });
        }
        let lm_head = (!cfg.tie_embeddings).then(|| stream.uniform(v * d, in_bound, 1.0));
        Ok(Self {
            embedding,
            layers,
            norm_f: ones(d),
            lm_head,
        })
    }

    /// Every tensor, in [`param_specs`] order.
    pub fn tensors(&self) -> Vec<&[T]> {
        let mut out: Vec<&[T]> = vec![&self.embedding];
        for l in &self.layers {
            out.extend([
                l.norm.as_slice(),
                &l.in_proj,
                &l.dt_bias,
                &l.b_bias,
                &l.c_bias,
                &l.b_norm,
                &l.c_norm,
                &l.d,
            ]);
            if let Some(on) = &l.out_norm {
                out.push(on);
            }
            out.push(&l.out_proj);
        }
        out.push(&self.norm_f);
        if let Some(h) = &self.lm_head {
            out.push(h);
        }
        out
    }

    /// Every tensor, mutably, in [`param_specs`] order.
    pub fn tensors_mut(&mut self) -> Vec<&mut Vec<T>> {
        let mut out: Vec<&mut Vec<T>> = vec![&mut self.embedding];
        for l in &mut self.layers {
            out.extend([
                &mut l.norm,
                &mut l.in_proj,
                &mut l.dt_bias,
                &mut l.b_bias,
                &mut l.c_bias,
                &mut l.b_norm,
                &mut l.c_norm,
                &mut l.d,
            ]);
            if let Some(on) = &mut l.out_norm {
                out.push(on);
            }
            out.push(&mut l.out_proj);
        }
        out.push(&mut self.norm_f);
        if let Some(h) = &mut self.lm_head {
            out.push(h);
        }
        out
    }

    /// `(name, shape, data)` for every tensor, in [`param_specs`] order: the
    /// list a GPU implementation compares against, tensor by tensor.
    pub fn named<'a>(&'a self, cfg: &Mamba3Config) -> Vec<(ParamSpec, &'a [T])> {
        param_specs(cfg).into_iter().zip(self.tensors()).collect()
    }

    /// The same values in another precision (rounded once).
    pub fn cast<U: Float>(&self) -> Weights<U> {
        let conv = |v: &Vec<T>| {
            v.iter()
                .map(|x| U::from_f64(x.to_f64()))
                .collect::<Vec<U>>()
        };
        Weights {
            embedding: conv(&self.embedding),
            layers: self
                .layers
                .iter()
                .map(|l| LayerWeights {
                    norm: conv(&l.norm),
                    in_proj: conv(&l.in_proj),
                    dt_bias: conv(&l.dt_bias),
                    b_bias: conv(&l.b_bias),
                    c_bias: conv(&l.c_bias),
                    b_norm: conv(&l.b_norm),
                    c_norm: conv(&l.c_norm),
                    d: conv(&l.d),
                    out_norm: l.out_norm.as_ref().map(conv),
                    out_proj: conv(&l.out_proj),
                })
                .collect(),
            norm_f: conv(&self.norm_f),
            lm_head: self.lm_head.as_ref().map(conv),
        }
    }

    /// The LM head matrix actually used: `lm_head` or, when tied, the embedding.
    pub fn head(&self) -> &[T] {
        self.lm_head.as_deref().unwrap_or(&self.embedding)
    }
}

/// ChaCha20 words (u32) one `f64` draw takes: `random::<f64>()` reads one `u64`.
const UNIFORM_WORDS: u64 = 2;
/// Words of one [`normal`] sample (two `f64` draws).
const NORMAL_WORDS: u64 = 4;
/// Values per parallel task of [`Stream::fill`].
const FILL_CHUNK: usize = 1 << 16;

/// One seeded ChaCha20 stream, consumed in order by the initialisation.
///
/// Every value takes a fixed number of words, so the value at index `i` of a
/// tensor starts at a known word position: [`Stream::fill`] seeks there and
/// fills chunks of a tensor in parallel with exactly the values a single
/// sequential pass over the stream would give (the 1.4B-parameter L model
/// initialises in about a second on 16 cores instead of 17 s on one).
struct Stream {
    seed: u64,
    /// Next unused word (u32) of the stream.
    word: u128,
}

impl Stream {
    fn new(seed: u64) -> Self {
        Self { seed, word: 0 }
    }

    /// `len` values of `sample`, which must draw exactly `words` words each.
    fn fill<T: Float>(
        &mut self,
        len: usize,
        words: u64,
        sample: impl Fn(&mut ChaCha20Rng) -> T + Sync,
    ) -> Vec<T> {
        use rayon::prelude::*;
        let start = self.word;
        let mut out = vec![T::ZERO; len];
        out.par_chunks_mut(FILL_CHUNK)
            .enumerate()
            .for_each(|(chunk, values)| {
                let mut rng = ChaCha20Rng::seed_from_u64(self.seed);
                let first = wide(chunk * FILL_CHUNK);
                rng.set_word_pos(start + first * u128::from(words));
                for v in values {
                    *v = sample(&mut rng);
                }
            });
        self.word = start + wide(len) * u128::from(words);
        out
    }

    /// `len` values uniform in `[-bound, bound) * scale`.
    fn uniform<T: Float>(&mut self, len: usize, bound: f64, scale: f64) -> Vec<T> {
        self.fill(len, UNIFORM_WORDS, |rng| {
            let u: f64 = rng.random();
            T::from_f64((2.0 * u - 1.0) * bound * scale)
        })
    }
}

/// A count as a stream position (`usize` is at most 64 bits, so exact).
fn wide(n: usize) -> u128 {
    u128::try_from(n).unwrap_or(u128::MAX)
}

/// Standard normal sample (Box-Muller; `rand` 0.9 ships no normal distribution).
fn normal(rng: &mut ChaCha20Rng) -> f64 {
    // 1 - u keeps the logarithm's argument in (0, 1].
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_shapes_are_the_official_state_dict() {
        let cfg = Mamba3Config {
            n_layer: 1,
            is_outproj_norm: true,
            tie_embeddings: false,
            ..Mamba3Config::tiny()
        };
        let got: Vec<(String, Vec<usize>)> = param_specs(&cfg)
            .into_iter()
            .map(|s| (s.name, s.shape))
            .collect();
        let m = "backbone.layers.0.mixer";
        let want: Vec<(String, Vec<usize>)> = vec![
            ("backbone.embedding.weight".into(), vec![16, 8]),
            ("backbone.layers.0.norm.weight".into(), vec![8]),
            (
                format!("{m}.in_proj.weight"),
                vec![2 * 16 + 2 * 8 + 3 * 4 + 2, 8],
            ),
            (format!("{m}.dt_bias"), vec![4]),
            (format!("{m}.B_bias"), vec![4, 1, 8]),
            (format!("{m}.C_bias"), vec![4, 1, 8]),
            (format!("{m}.B_norm.weight"), vec![8]),
            (format!("{m}.C_norm.weight"), vec![8]),
            (format!("{m}.D"), vec![4]),
            (format!("{m}.norm.weight"), vec![16]),
            (format!("{m}.out_proj.weight"), vec![8, 16]),
            ("backbone.norm_f.weight".into(), vec![8]),
            ("lm_head.weight".into(), vec![16, 8]),
        ];
        assert_eq!(got, want);
    }

    /// The initialisation as one sequential pass over the stream: what
    /// [`Weights::init`] must reproduce value for value.
    fn sequential_init(cfg: &Mamba3Config, seed: u64) -> Vec<Vec<f32>> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let uniform = |rng: &mut ChaCha20Rng, len: usize, bound: f64, scale: f64| -> Vec<f32> {
            (0..len)
                .map(|_| {
                    let u: f64 = rng.random();
                    f32::from_f64((2.0 * u - 1.0) * bound * scale)
                })
                .collect()
        };
        let (d, v, h, di) = (
            cfg.d_model,
            cfg.padded_vocab_size(),
            cfg.nheads(),
            cfg.d_inner(),
        );
        let mut out = vec![
            (0..v * d)
                .map(|_| f32::from_f64(0.02 * normal(&mut rng)))
                .collect::<Vec<f32>>(),
        ];
        let in_bound = 1.0 / f64::from_count(d).sqrt();
        let out_bound = 1.0 / f64::from_count(di).sqrt();
        let out_scale = 1.0 / f64::from_count(cfg.n_layer).sqrt();
        let (ln_min, ln_max) = (cfg.dt_min.ln(), cfg.dt_max.ln());
        for _ in 0..cfg.n_layer {
            out.push(uniform(&mut rng, cfg.d_in_proj() * d, in_bound, 1.0));
            out.push(
                (0..h)
                    .map(|_| {
                        let u: f64 = rng.random();
                        let dt = (u * (ln_max - ln_min) + ln_min)
                            .exp()
                            .max(cfg.dt_init_floor);
                        f32::from_f64(dt + (-(-dt).exp_m1()).ln())
                    })
                    .collect(),
            );
            out.push(uniform(&mut rng, d * di, out_bound, out_scale));
        }
        if !cfg.tie_embeddings {
            out.push(uniform(&mut rng, v * d, in_bound, 1.0));
        }
        out
    }

    #[test]
    fn parallel_init_equals_one_sequential_stream() {
        // d_model 160: in_proj and out_proj span several fill chunks, and
        // the embedding (vocab 1000) does too.
        let wide = Mamba3Config {
            d_model: 160,
            n_layer: 2,
            d_state: 16,
            headdim: 16,
            vocab_size: 1000,
            tie_embeddings: false,
            ..Mamba3Config::tiny()
        };
        for (cfg, seed) in [(Mamba3Config::tiny(), 3), (wide, 7)] {
            let w = Weights::<f32>::init(&cfg, seed).unwrap();
            let mut got = vec![w.embedding.clone()];
            for l in &w.layers {
                got.extend([l.in_proj.clone(), l.dt_bias.clone(), l.out_proj.clone()]);
            }
            got.extend(w.lm_head.clone());
            let want = sequential_init(&cfg, seed);
            assert_eq!(got.len(), want.len());
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g.iter()
                        .map(|x| x.to_bits())
                        .eq(e.iter().map(|x| x.to_bits())),
                    "tensor {i} of seed {seed} differs from the sequential stream"
                );
            }
            assert!(
                got[1].len() > FILL_CHUNK || cfg.d_model < 100,
                "in_proj spans chunks"
            );
        }
    }

    #[test]
    fn init_is_seeded_and_official() {
        let cfg = Mamba3Config::tiny();
        let a = Weights::<f64>::init(&cfg, 9).unwrap();
        assert_eq!(a, Weights::<f64>::init(&cfg, 9).unwrap());
        assert_ne!(a, Weights::<f64>::init(&cfg, 10).unwrap());
        let l = &a.layers[0];
        assert!(
            l.b_bias
                .iter()
                .chain(&l.c_bias)
                .chain(&l.d)
                .chain(&l.norm)
                .all(|&v| v == 1.0)
        );
        let bound = 1.0 / 8f64.sqrt();
        assert!(l.in_proj.iter().all(|v| v.abs() <= bound));
        let out_bound = 1.0 / 16f64.sqrt() / 2f64.sqrt();
        assert!(l.out_proj.iter().all(|v| v.abs() <= out_bound));
        // dt = softplus(dt_bias) lies in [dt_min, dt_max].
        for &b in &l.dt_bias {
            let dt = b.exp().ln_1p();
            assert!((1e-3 - 1e-12..=0.1 + 1e-12).contains(&dt), "{dt}");
        }
        let std = (a.embedding.iter().map(|v| v * v).sum::<f64>() / 128.0).sqrt();
        assert!((0.01..0.03).contains(&std), "{std}");
    }
}
