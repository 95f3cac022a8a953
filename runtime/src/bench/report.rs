//! What the bench reports: serializable records (`--json`) and the
//! terminal table.

use std::fmt::Write as _;

use serde::Serialize;

use crate::device::Gpu;

use super::flops::StepFlops;
use super::layer::Family;
use super::timing::{Ceiling, Stats, tflops};
use super::{BenchConfig, BenchOptions};
use crate::Precision;

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// The GPU.
    pub device: DeviceSummary,
    /// Step precision.
    pub precision: Precision,
    /// How f32 GEMMs computed (`Ieee`, `Pedantic`, `Tf32`).
    pub f32_gemm_math: String,
    /// The measured bf16 GEMM ceiling MFU is taken against.
    pub ceiling: Ceiling,
    /// Timed steps per mode.
    pub steps: usize,
    /// Untimed warm-up steps before each series.
    pub warmup: usize,
    /// Vocabulary of the full LM step.
    pub vocab: usize,
    /// One entry per configuration, in order.
    pub configs: Vec<ConfigOutcome>,
}

/// The device, as the report names it.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceSummary {
    /// e.g. `NVIDIA H200`.
    pub name: String,
    /// e.g. `sm_90`.
    pub arch: String,
    /// Multiprocessors.
    pub sm_count: i32,
    /// Device memory.
    pub total_memory_bytes: usize,
    /// Driver CUDA version, `major.minor`.
    pub driver_cuda: String,
}

/// A configuration measured, or skipped with the reason.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ConfigOutcome {
    /// Measured.
    Measured(Box<ConfigReport>),
    /// Not run (does not fit, or over the time budget).
    Skipped(Skipped),
    /// Started and failed; the other configurations still ran.
    Failed(Failed),
}

/// A configuration whose run returned an error.
#[derive(Clone, Debug, Serialize)]
pub struct Failed {
    /// Configuration name.
    pub name: String,
    /// Its shape.
    pub shape: Shape,
    /// The error, as one line.
    pub error: String,
}

/// Why a configuration was not run.
#[derive(Clone, Debug, Serialize)]
pub struct Skipped {
    /// Configuration name.
    pub name: String,
    /// Its shape.
    pub shape: Shape,
    /// One sentence: what did not fit.
    pub reason: String,
}

/// The model and window of one configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Shape {
    /// Residual width.
    pub d_model: usize,
    /// Blocks.
    pub n_layer: usize,
    /// State size N.
    pub d_state: usize,
    /// Head dimension P.
    pub headdim: usize,
    /// Heads H.
    pub nheads: usize,
    /// `in_proj` output width.
    pub d_in_proj: usize,
    /// Scan chunk length.
    pub chunk: usize,
    /// Padded vocabulary of the full step.
    pub vocab: usize,
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
}

impl Shape {
    /// The shape of `cfg` with `vocab`.
    pub fn of(cfg: &BenchConfig, vocab: usize) -> Self {
        let m = cfg.model(vocab);
        Self {
            d_model: cfg.d_model,
            n_layer: cfg.n_layer,
            d_state: cfg.d_state,
            headdim: cfg.headdim,
            nheads: m.nheads(),
            d_in_proj: m.d_in_proj(),
            chunk: m.chunk_size,
            vocab: m.padded_vocab_size(),
            batch: cfg.batch,
            seq_len: cfg.seq_len,
        }
    }
}

/// Everything measured for one configuration.
#[derive(Clone, Debug, Serialize)]
pub struct ConfigReport {
    /// Configuration name.
    pub name: String,
    /// Its shape.
    pub shape: Shape,
    /// Trainable parameters.
    pub params: u64,
    /// Model FLOPs of one step, by family.
    pub flops: StepFlops,
    /// Full-step FLOPs per token.
    pub full_flops_per_token: f64,
    /// Backbone FLOPs per token.
    pub backbone_flops_per_token: f64,
    /// The full LM step.
    pub full: StepResult,
    /// The backbone-only step.
    pub backbone: StepResult,
    /// Eager time of the full step by family and by op.
    pub breakdown: Breakdown,
    /// Device memory.
    pub memory: Memory,
    /// The breakdown's timed pass (the step's own forward and backward
    /// bodies, each op between CUDA events) left the same loss and layer-0
    /// gradient, bit for bit, as the step's untimed ops: the timing probe
    /// changed no launch.
    pub replica_matches_step: bool,
}

/// Eager and graph timings of one step and what follows from them.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct StepResult {
    /// Eager step times.
    pub eager: Stats,
    /// Graph replay times.
    pub graph: Stats,
    /// Eager median over graph median.
    pub graph_speedup: f64,
    /// Tokens per second, eager median.
    pub tokens_per_s_eager: f64,
    /// Tokens per second, graph median.
    pub tokens_per_s_graph: f64,
    /// Model TFLOP/s at the graph median.
    pub tflops_graph: f64,
    /// `tflops_graph` over the bf16 ceiling.
    pub mfu_graph: f64,
}

impl StepResult {
    /// Derived figures from the two timings, `flops` per step and `tokens` per step.
    pub fn new(eager: Stats, graph: Stats, flops: u64, tokens: u64, ceiling: &Ceiling) -> Self {
        #[expect(
            clippy::cast_precision_loss,
            reason = "statistics: rounding u64 -> f64 is fine"
        )]
        let (f, t) = (flops as f64, tokens as f64);
        let per_s = |ms: f64| if ms > 0.0 { t / (ms * 1e-3) } else { 0.0 };
        let tf = tflops(f, graph.median_ms);
        Self {
            eager,
            graph,
            graph_speedup: if graph.median_ms > 0.0 {
                eager.median_ms / graph.median_ms
            } else {
                0.0
            },
            tokens_per_s_eager: per_s(eager.median_ms),
            tokens_per_s_graph: per_s(graph.median_ms),
            tflops_graph: tf,
            mfu_graph: if ceiling.tflops > 0.0 {
                tf / ceiling.tflops
            } else {
                0.0
            },
        }
    }
}

/// Eager time by family and by op, medians over `reps` timed passes.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Breakdown {
    /// Timed passes.
    pub reps: usize,
    /// Per family, in [`Family::ALL`] order.
    pub families: Vec<FamilyTime>,
    /// Per op name, slowest first.
    pub ops: Vec<OpTime>,
    /// Sum of the families (each op between its own events, so launch
    /// latency is counted per op, as eager execution pays it when the GPU
    /// waits on the host).
    pub sum_ms: f64,
}

/// One family's share.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct FamilyTime {
    /// The family.
    pub family: Family,
    /// Median per-step time.
    pub ms: f64,
    /// Share of `sum_ms`.
    pub share: f64,
}

/// One op name's time, summed over its calls in a step.
#[derive(Clone, Debug, Serialize)]
pub struct OpTime {
    /// What ran.
    pub name: String,
    /// Its family.
    pub family: Family,
    /// Calls per step.
    pub calls: usize,
    /// Median per-step time.
    pub ms: f64,
}

/// Device memory of one configuration, from `cuMemGetInfo`: device-wide
/// readings, so another process allocating on the same GPU meanwhile
/// disturbs them.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Memory {
    /// Bytes the full step's buffers took (used after building minus before).
    pub full_step_bytes: u64,
    /// Bytes the backbone step's buffers took.
    pub backbone_step_bytes: u64,
    /// The bench's own estimate of the full step's buffers (its fit check).
    pub estimate_bytes: u64,
    /// Most bytes in use on the device at any reading during this config.
    pub peak_used_bytes: u64,
}

fn gib(b: u64) -> f64 {
    #[expect(
        clippy::cast_precision_loss,
        reason = "byte counts shown in GiB; rounding is fine"
    )]
    let b = b as f64;
    b / f64::from(1u32 << 30)
}

fn count(x: f64) -> String {
    if x >= 1e9 {
        format!("{:.2} G", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.2} M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1} k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

impl BenchReport {
    /// Assembles the report.
    pub fn new(
        gpu: &Gpu,
        opts: &BenchOptions,
        ceiling: Ceiling,
        configs: Vec<ConfigOutcome>,
    ) -> Self {
        let i = gpu.info();
        Self {
            device: DeviceSummary {
                name: i.name.clone(),
                arch: i.arch.clone(),
                sm_count: i.sm_count,
                total_memory_bytes: i.total_memory,
                driver_cuda: format!("{}.{}", i.driver_version.0, i.driver_version.1),
            },
            precision: opts.precision,
            f32_gemm_math: format!("{:?}", gpu.f32_gemm_math()),
            ceiling,
            steps: opts.steps,
            warmup: opts.warmup,
            vocab: opts.vocab,
            configs,
        }
    }

    /// The configurations that failed, in order.
    pub fn failures(&self) -> Vec<&Failed> {
        self.configs
            .iter()
            .filter_map(|c| match c {
                ConfigOutcome::Failed(f) => Some(f),
                _ => None,
            })
            .collect()
    }

    /// The terminal table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let prec = self.precision.name();
        let _ = writeln!(
            s,
            "stepgraph bench: {} ({}, {} SMs, CUDA {}), {prec} step (f32 GEMM math {}), median of {} steps after {} warm-up",
            self.device.name,
            self.device.arch,
            self.device.sm_count,
            self.device.driver_cuda,
            self.f32_gemm_math,
            self.steps,
            self.warmup
        );
        let _ = writeln!(
            s,
            "bf16 GEMM ceiling ({n}x{n}x{n}, cuBLAS, random data): {:.1} TFLOP/s ({:.3} ms); MFU below is against it",
            self.ceiling.tflops,
            self.ceiling.median_ms,
            n = self.ceiling.n
        );
        let _ = writeln!(
            s,
            "\n{:<7} {:<9} {:>10} {:>10} {:>7} {:>12} {:>10} {:>9} {:>7} {:>8}",
            "config",
            "step",
            "eager ms",
            "graph ms",
            "graph x",
            "tok/s graph",
            "FLOP/tok",
            "TFLOP/s",
            "MFU",
            "mem GiB"
        );
        for c in &self.configs {
            match c {
                ConfigOutcome::Skipped(k) => {
                    let _ = writeln!(s, "{:<7} skipped: {}", k.name, k.reason);
                }
                ConfigOutcome::Failed(k) => {
                    let _ = writeln!(s, "{:<7} failed: {}", k.name, k.error);
                }
                ConfigOutcome::Measured(r) => {
                    let rows = [
                        (
                            "full LM",
                            &r.full,
                            r.full_flops_per_token,
                            r.memory.full_step_bytes,
                        ),
                        (
                            "backbone",
                            &r.backbone,
                            r.backbone_flops_per_token,
                            r.memory.backbone_step_bytes,
                        ),
                    ];
                    for (label, t, fpt, mem) in rows {
                        let _ = writeln!(
                            s,
                            "{:<7} {:<9} {:>10.3} {:>10.3} {:>7.2} {:>12} {:>10} {:>9.2} {:>6.2}% {:>8.2}",
                            r.name,
                            label,
                            t.eager.median_ms,
                            t.graph.median_ms,
                            t.graph_speedup,
                            count(t.tokens_per_s_graph),
                            count(fpt),
                            t.tflops_graph,
                            100.0 * t.mfu_graph,
                            gib(mem)
                        );
                    }
                }
            }
        }
        self.breakdown_table(&mut s);
        s
    }

    fn breakdown_table(&self, s: &mut String) {
        let measured: Vec<&ConfigReport> = self
            .configs
            .iter()
            .filter_map(|c| match c {
                ConfigOutcome::Measured(r) => Some(&**r),
                ConfigOutcome::Skipped(_) | ConfigOutcome::Failed(_) => None,
            })
            .collect();
        if measured.is_empty() {
            return;
        }
        let _ = write!(
            s,
            "\nfull-step eager time by family (ms; each op between CUDA events)\n{:<7}",
            "config"
        );
        for f in Family::ALL {
            let _ = write!(s, " {:>10}", f.label());
        }
        let _ = writeln!(s, " {:>10} {:>10}", "sum", "eager");
        for r in &measured {
            let _ = write!(s, "{:<7}", r.name);
            for f in &r.breakdown.families {
                let _ = write!(s, " {:>10.3}", f.ms);
            }
            let _ = writeln!(
                s,
                " {:>10.3} {:>10.3}",
                r.breakdown.sum_ms, r.full.eager.median_ms
            );
        }
        for r in &measured {
            let _ = writeln!(s, "\n{} slowest ops (ms per step, calls):", r.name);
            for o in r.breakdown.ops.iter().take(8) {
                let _ = writeln!(s, "  {:<30} {:>9.3} {:>5}", o.name, o.ms, o.calls);
            }
            if !r.replica_matches_step {
                let _ = writeln!(
                    s,
                    "  warning: the timed breakdown pass did not reproduce the step's loss and gradient bit for bit; the breakdown may not time the step's launches"
                );
            }
        }
    }
}
