//! The MLP training step on the GPU, built only from stepgraph's public
//! API: its buffers, its kernels (`mlp.cu`), its ops, and the step struct
//! `specs/mlp.ron` describes, captured by `#[derive(TrainingGraph)]`.

use std::sync::LazyLock;

use stepgraph::device::{DeviceBuffer, Gemm, Gpu, GpuError, REDUCE_PARTIALS};
use stepgraph::kernels::launch::BLOCK;
use stepgraph::kernels::user::{Grid, UserKernel, UserKernels};
use stepgraph::kernels::user_params::{In, Out, Scratch};
use stepgraph::optim::gpu::{AdamWState, StepScalars, Update, fused_update};
use stepgraph::optim::{AdamWConfig, DecayPolicy, OptimError};
use stepgraph::{DevicePtrs, TrainingGraph};

use crate::data::{Dims, HostParams};
use crate::reference::param_group;

/// Seed of the teacher and of the initial weights.
pub const SEED: u64 = 17;

/// The optimizer's settings: AdamW, decay on the two matrices only.
pub fn adamw_config() -> AdamWConfig {
    AdamWConfig {
        lr: 1e-2,
        weight_decay: 1e-4,
        ..AdamWConfig::default()
    }
}

// Each handle's type is its kernel's parameter list (see mlp.cu); the
// context checks it against the compiled kernel when it loads it.
/// `mlp_bias_act(float* y, const float* bias, unsigned rows, unsigned cols, unsigned relu)`.
pub type BiasAct = UserKernel<(Out<f32>, In<f32>, u32, u32, u32)>;
/// `mlp_softmax_xent(const float* z, const int* labels, float* dz, float* row_loss, unsigned rows, unsigned classes)`.
pub type SoftmaxXent = UserKernel<(In<f32>, In<i32>, Out<f32>, Scratch<f32>, u32, u32)>;
/// `mlp_mean(const float* x, float* out, unsigned n)`, `x` in a scratch area.
pub type Mean = UserKernel<(Scratch<f32>, Out<f32>, u32)>;
/// `mlp_colsum(const float* g, float* out, unsigned rows, unsigned cols)`.
pub type Colsum = UserKernel<(In<f32>, Out<f32>, u32, u32)>;
/// `mlp_relu_bwd(float* dh, const float* h, unsigned n)`.
pub type ReluBwd = UserKernel<(Out<f32>, In<f32>, u32)>;

/// The example's kernels, declared once: the ops launch them through these
/// handles, and [`open_gpu`] opens a context that has them loaded.
pub struct MlpKernels {
    /// The set the handles belong to.
    pub set: UserKernels,
    /// `y = act(y + bias)` per row, in place.
    pub bias_act: BiasAct,
    /// Per-row loss (into scratch) and the logits' gradient.
    pub softmax_xent: SoftmaxXent,
    /// The mean of the per-row losses.
    pub mean: Mean,
    /// Column sums: a bias's gradient.
    pub colsum: Colsum,
    /// ReLU backward, in place.
    pub relu_bwd: ReluBwd,
}

/// The handles, made on first use.
pub static KERNELS: LazyLock<MlpKernels> = LazyLock::new(|| {
    let mut set = UserKernels::new();
    let mut m = set.module("mlp.cu", include_str!("mlp.cu"));
    let bias_act = m.kernel("mlp_bias_act");
    let softmax_xent = m.kernel("mlp_softmax_xent");
    let mean = m.kernel("mlp_mean");
    let colsum = m.kernel("mlp_colsum");
    let relu_bwd = m.kernel("mlp_relu_bwd");
    MlpKernels {
        set,
        bias_act,
        softmax_xent,
        mean,
        colsum,
        relu_bwd,
    }
});

/// A context on GPU 0 with stepgraph's kernels and the example's.
pub fn open_gpu() -> Result<Gpu, GpuError> {
    Gpu::with_user_kernels(Default::default(), &KERNELS.set)
}

/// The four parameter tensors (also the shape of their gradients).
#[derive(Debug, DevicePtrs)]
pub struct MlpParams {
    /// `[input x hidden]`.
    pub w1: DeviceBuffer<f32>,
    /// `[hidden]`.
    pub b1: DeviceBuffer<f32>,
    /// `[hidden x classes]`.
    pub w2: DeviceBuffer<f32>,
    /// `[classes]`.
    pub b2: DeviceBuffer<f32>,
}

impl MlpParams {
    /// Uploads `p`.
    pub fn upload(gpu: &Gpu, p: &HostParams) -> Result<Self, GpuError> {
        Ok(Self {
            w1: gpu.to_device(&p.w1)?,
            b1: gpu.to_device(&p.b1)?,
            w2: gpu.to_device(&p.w2)?,
            b2: gpu.to_device(&p.b2)?,
        })
    }

    /// The tensors in optimizer order, with their names.
    pub fn named_mut(&mut self) -> [(&'static str, &mut DeviceBuffer<f32>); 4] {
        [
            ("w1", &mut self.w1),
            ("b1", &mut self.b1),
            ("w2", &mut self.w2),
            ("b2", &mut self.b2),
        ]
    }

    /// The tensors in optimizer order.
    pub fn tensors(&self) -> [&DeviceBuffer<f32>; 4] {
        [&self.w1, &self.b1, &self.w2, &self.b2]
    }
}

/// The step's working memory.
#[derive(Debug, DevicePtrs)]
pub struct Acts {
    /// `relu(x w1 + b1)`, `[batch x hidden]`.
    pub h: DeviceBuffer<f32>,
    /// `h w2 + b2`, `[batch x classes]`.
    pub logits: DeviceBuffer<f32>,
    /// The mean loss's gradient by the logits.
    pub dlogits: DeviceBuffer<f32>,
    /// Its gradient by `h` (then by `x w1 + b1`).
    pub dh: DeviceBuffer<f32>,
    /// The sizes (not device memory).
    #[ptrs(skip)]
    pub dims: Dims,
}

/// One training step's buffers; `specs/mlp.ron` says what each op does
/// with them, and the derive generates the capture, the replay guards and
/// their tests.
#[derive(Debug, TrainingGraph)]
#[graph(spec = "../../../specs/mlp.ron")]
pub struct MlpStep {
    /// Trainable parameters.
    pub params: MlpParams,
    /// AdamW moments.
    pub adam: AdamWState,
    /// lr, step count and bias corrections, on the device.
    pub sched: StepScalars,
    /// Gradients.
    pub grads: MlpParams,
    /// Activations.
    pub acts: Acts,
    /// `[batch x input]` features (written by the host before a step).
    pub x: DeviceBuffer<f32>,
    /// `[batch]` class ids (written by the host before a step).
    pub labels: DeviceBuffer<i32>,
    /// The step's mean loss.
    pub loss: DeviceBuffer<f32>,
}

impl MlpStep {
    /// Uploads `init` and allocates everything a step of `dims` needs.
    pub fn new(gpu: &Gpu, dims: Dims, init: &HostParams) -> Result<Self, GpuError> {
        let (b, d, h, c) = (dims.batch, dims.input, dims.hidden, dims.classes);
        let group = param_group(dims);
        Ok(Self {
            params: MlpParams::upload(gpu, init)?,
            adam: AdamWState::new(gpu, &group, &DecayPolicy::MatricesOnly)?,
            sched: StepScalars::new(gpu, &adamw_config())?,
            grads: MlpParams {
                w1: gpu.alloc_zeros(d * h)?,
                b1: gpu.alloc_zeros(h)?,
                w2: gpu.alloc_zeros(h * c)?,
                b2: gpu.alloc_zeros(c)?,
            },
            acts: Acts {
                h: gpu.alloc_zeros(b * h)?,
                logits: gpu.alloc_zeros(b * c)?,
                dlogits: gpu.alloc_zeros(b * c)?,
                dh: gpu.alloc_zeros(b * h)?,
                dims,
            },
            x: gpu.alloc_zeros(b * d)?,
            labels: gpu.alloc_zeros(b)?,
            loss: gpu.alloc_zeros(1)?,
        })
    }

    /// Copies the next batch in (never inside a capture: between replays).
    /// A label outside the classes would make the loss NaN; it is refused
    /// here, where it can be named.
    pub fn set_batch(&mut self, gpu: &Gpu, x: &[f32], labels: &[i32]) -> Result<(), GpuError> {
        let classes = self.acts.dims.classes;
        if let Some(&bad) = labels
            .iter()
            .find(|&&y| usize::try_from(y).map_or(true, |y| y >= classes))
        {
            return Err(GpuError::ShapeLimit {
                what: "class label",
                value: usize::try_from(bad).unwrap_or(usize::MAX),
                max: classes.saturating_sub(1),
            });
        }
        gpu.copy_from_host(x, &mut self.x)?;
        gpu.copy_from_host(labels, &mut self.labels)
    }

    /// The loss of the last step (synchronizes).
    pub fn loss(&self, gpu: &Gpu) -> Result<f32, GpuError> {
        Ok(gpu
            .to_host(&self.loss)?
            .first()
            .copied()
            .unwrap_or(f32::NAN))
    }
}

/// `value` as a kernel's `unsigned`.
fn u32_of(what: &'static str, value: usize) -> Result<u32, GpuError> {
    stepgraph::device::to_u32(what, value)
}

/// Forward and loss: `h = relu(x w1 + b1)`, `logits = h w2 + b2`, the
/// per-row losses (into the `reduce_partials` scratch area) and their mean,
/// and the logits' gradient.
pub fn forward(
    gpu: &Gpu,
    p: &MlpParams,
    x: &DeviceBuffer<f32>,
    labels: &DeviceBuffer<i32>,
    a: &mut Acts,
    loss: &mut DeviceBuffer<f32>,
) -> Result<(), GpuError> {
    let k = &*KERNELS;
    let Dims {
        batch,
        input,
        hidden,
        classes,
    } = a.dims;
    let (rows, hid, cls) = (
        u32_of("batch", batch)?,
        u32_of("hidden", hidden)?,
        u32_of("classes", classes)?,
    );
    gpu.gemm_f32(&Gemm::new(batch, hidden, input), x, &p.w1, &mut a.h)?;
    let relu = 1;
    k.bias_act.launch(
        gpu,
        Grid::cover(batch * hidden, BLOCK)?,
        (&mut a.h, &p.b1, rows, hid, relu),
    )?;
    gpu.gemm_f32(
        &Gemm::new(batch, classes, hidden),
        &a.h,
        &p.w2,
        &mut a.logits,
    )?;
    k.bias_act.launch(
        gpu,
        Grid::cover(batch * classes, BLOCK)?,
        (&mut a.logits, &p.b2, rows, cls, 0),
    )?;
    let mut row_loss = gpu.scratch_view::<f32>(REDUCE_PARTIALS, batch)?;
    k.softmax_xent.launch(
        gpu,
        Grid::cover(batch, BLOCK)?,
        (&a.logits, labels, &mut a.dlogits, row_loss.arg(), rows, cls),
    )?;
    // mlp_mean's block tree needs exactly SG_BLOCK (= BLOCK) threads.
    k.mean
        .launch(gpu, Grid::new(1, BLOCK), (row_loss.arg(), loss, rows))
}

/// Backward: every parameter's gradient into `g`.
pub fn backward(
    gpu: &Gpu,
    p: &MlpParams,
    x: &DeviceBuffer<f32>,
    a: &mut Acts,
    g: &mut MlpParams,
) -> Result<(), GpuError> {
    let k = &*KERNELS;
    let Dims {
        batch,
        input,
        hidden,
        classes,
    } = a.dims;
    let (rows, hid, cls) = (
        u32_of("batch", batch)?,
        u32_of("hidden", hidden)?,
        u32_of("classes", classes)?,
    );
    // dw2 = h^T dlogits, db2 = colsum(dlogits).
    let dw2 = Gemm::new(hidden, classes, batch).trans_a();
    gpu.gemm_f32(&dw2, &a.h, &a.dlogits, &mut g.w2)?;
    k.colsum.launch(
        gpu,
        Grid::cover(classes, BLOCK)?,
        (&a.dlogits, &mut g.b2, rows, cls),
    )?;
    // dh = (dlogits w2^T) * (h > 0), db1 = colsum(dh), dw1 = x^T dh.
    let dh = Gemm::new(batch, hidden, classes).trans_b();
    gpu.gemm_f32(&dh, &a.dlogits, &p.w2, &mut a.dh)?;
    let n = u32_of("batch * hidden", batch * hidden)?;
    k.relu_bwd.launch(
        gpu,
        Grid::cover(batch * hidden, BLOCK)?,
        (&mut a.dh, &a.h, n),
    )?;
    k.colsum.launch(
        gpu,
        Grid::cover(hidden, BLOCK)?,
        (&a.dh, &mut g.b1, rows, hid),
    )?;
    gpu.gemm_f32(
        &Gemm::new(input, hidden, batch).trans_a(),
        x,
        &a.dh,
        &mut g.w1,
    )
}

/// AdamW on every parameter, with the device-side scalars `sched` (the
/// `advance_schedule` op before it counted the step).
pub fn adamw(
    gpu: &Gpu,
    grads: &MlpParams,
    sched: &StepScalars,
    params: &mut MlpParams,
    adam: &mut AdamWState,
) -> Result<(), OptimError> {
    let updates = params
        .named_mut()
        .into_iter()
        .zip(grads.tensors())
        .map(|((_, param), grad)| Update {
            param,
            grad,
            copy: None,
        })
        .collect();
    fused_update(gpu, updates, &sched.derived, None, adam)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte size of each parameter of kernel `name`, read from its C
    /// signature in `src` (pointers 8 bytes, `unsigned`, `int`, `float` 4).
    fn c_param_bytes(src: &str, name: &str) -> Vec<usize> {
        let open = format!("void {name}(");
        let start = src.find(&open).map(|i| i + open.len());
        let start = start.unwrap_or_else(|| panic!("{name} not in mlp.cu"));
        let end = start + src[start..].find(')').expect("a closing parenthesis");
        src[start..end]
            .split(',')
            .map(|p| match p {
                p if p.contains('*') => 8,
                p if p.contains("double") || p.contains("long long") => 8,
                _ => 4,
            })
            .collect()
    }

    /// Without a GPU: each handle's parameter list has the length and sizes
    /// of its kernel's C signature (the context checks the compiled kernel
    /// itself when it opens).
    #[test]
    fn each_handle_matches_its_kernels_signature() {
        let src = include_str!("mlp.cu");
        let k = &*KERNELS;
        for (name, bytes) in [
            (k.bias_act.name(), k.bias_act.param_bytes()),
            (k.softmax_xent.name(), k.softmax_xent.param_bytes()),
            (k.mean.name(), k.mean.param_bytes()),
            (k.colsum.name(), k.colsum.param_bytes()),
            (k.relu_bwd.name(), k.relu_bwd.param_bytes()),
        ] {
            assert_eq!(bytes, c_param_bytes(src, name), "{name}");
        }
        assert_eq!(k.set.kernel_count(), 5);
    }
}
