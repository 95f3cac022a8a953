// What a training step adds around the model's forward and backward passes:
// the per-prediction loss weights (masked mean cross-entropy), the frozen
// gradient mask, the global gradient norm's fold with clipping, the
// non-finite skip and the learning-rate schedule evaluated on the device (the
// norm's partials and the guarded AdamW update are the multi-tensor kernels
// of optim.cu). Everything the host may change lives in device buffers, so a
// captured graph bakes in no value a run can alter.
//
// Device scalars (layouts mirrored in runtime/src/optim/step_control.rs):
//   params   (f64, host-written): [peak_lr, min_lr, max_norm (<= 0: no clip)]
//   counters (u64): [steps run (skips included), steps skipped, warmup, total]
//   gate     (f32, written here): [clip coefficient, skip flag (0 or 1),
//                                  loss-weight gradient scale]
//   report   (f64, written here): [loss, grad norm, lr, skipped now,
//                                  skipped total, steps, adam steps, coef]
// AdamW's own scalars are optim/gpu.rs's StepScalars (hyper, step, derived);
// tr_schedule writes `derived` with the layout of m3_advance_schedule, and
// optim.cu's mt_adamw reads it with `gate`.
//
// Reductions run in a fixed order in double (fixed units per tensor, a
// fixed shared-memory tree, partials folded in index order), with no atomics.
#include "common.cuh"

// One block: loss[0] = sum_i w[i] * row_loss[i] over rows with w[i] != 0, in
// double and a fixed order (unweighted rows are skipped, not multiplied by
// zero, so a non-finite loss there does not leak in), and
// gate[2] = rows * max_i w[i]: the factor that turns the gradient of the plain
// mean (what the model's backward pass computes) over the scored rows into
// the gradient of the weighted loss, when every nonzero weight is the same.
extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    tr_weighted_loss_f32(const float* __restrict__ row_loss, const float* __restrict__ w, float* __restrict__ loss,
                         float* __restrict__ gate, unsigned n) {
    __shared__ double s[SG_BLOCK];
    __shared__ float smax[SG_BLOCK];
    double acc = 0.0;
    float wmax = 0.0f;
    for (unsigned i = threadIdx.x; i < n; i += SG_BLOCK) {
        const float wi = w[i];
        if (wi != 0.0f) {
            acc += (double)wi * (double)row_loss[i];
            wmax = fmaxf(wmax, wi);
        }
    }
    const double total = sg_block_sum_f64(acc, s);
    smax[threadIdx.x] = wmax;
    __syncthreads();
    for (unsigned stride = SG_BLOCK / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            smax[threadIdx.x] = fmaxf(smax[threadIdx.x], smax[threadIdx.x + stride]);
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        loss[0] = (float)total;
        gate[2] = (float)((double)n * (double)smax[0]);
    }
}

// Rows of weight 0 get logits whose softmax is exactly the one-hot target (0
// at the target, -1e30 elsewhere) and lse 0, so the model's cross-entropy
// backward gives them exact zeros, as the CPU engine's masked rows.
extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    tr_mask_rows_f32(float* __restrict__ logits, float* __restrict__ lse, const int* __restrict__ tokens,
                     const float* __restrict__ w, unsigned vocab, unsigned len, unsigned rows) {
    const unsigned long long n = (unsigned long long)rows * vocab;
    SG_FOR_EACH(i, n) {
        const unsigned row = (unsigned)(i / vocab);
        if (w[row] != 0.0f) {
            continue;
        }
        const unsigned j = (unsigned)(i % vocab);
        const unsigned b = row / len, t = row % len;
        const int tgt = tokens[(unsigned long long)b * (len + 1) + t + 1];
        logits[i] = (tgt >= 0 && (unsigned)tgt == j) ? 0.0f : -1e30f;
        if (j == 0) {
            lse[row] = 0.0f;
        }
    }
}

// x[start .. end) = 0: gradients of frozen parameter slices.
extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    tr_zero_range_f32(float* __restrict__ x, unsigned start, unsigned n) {
    SG_FOR_EACH(i, n) { x[start + i] = 0.0f; }
}

// The warmup + cosine schedule of runtime/src/train/schedule.rs (LrSchedule::lr).
__device__ double tr_lr(double peak, double min_lr, unsigned long long warmup, unsigned long long total,
                        unsigned long long step) {
    if (step < warmup) {
        return peak * (double)(step + 1) / (double)warmup;
    }
    unsigned long long span = total > warmup ? total - warmup : 0;
    span = span > 0 ? span : 1;
    double progress = (double)(step - warmup) / (double)span;
    progress = progress < 1.0 ? progress : 1.0;
    const double cosine = 0.5 * (1.0 + cos(SG_PI * progress));
    return min_lr + (peak - min_lr) * cosine;
}

// One block: folds the norm partials, decides clip and skip, evaluates the
// schedule at the step counter, advances the counters and writes AdamW's
// per-step scalars (bias corrections only when the update runs) and the report.
extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    tr_schedule(const double* __restrict__ partials, unsigned count, const double* __restrict__ params,
                unsigned long long* __restrict__ counters, const double* __restrict__ hyper, int* __restrict__ adam_step,
                float* __restrict__ derived, float* __restrict__ gate, const float* __restrict__ loss,
                double* __restrict__ report) {
    __shared__ double s[SG_BLOCK];
    double acc = 0.0;
    for (unsigned i = threadIdx.x; i < count; i += SG_BLOCK) {
        acc += partials[i];
    }
    const double sumsq = sg_block_sum_f64(acc, s);
    if (threadIdx.x != 0) {
        return;
    }
    // The partials are of the plain-mean gradient; gate[2] rescales it.
    const double norm = (double)gate[2] * sqrt(sumsq);
    const bool skip = !isfinite(norm);
    const double max_norm = params[2];
    double coef = 1.0;
    if (max_norm > 0.0 && !skip) {
        const double c = max_norm / (norm + 1e-6);
        coef = c < 1.0 ? c : 1.0;
    }
    const unsigned long long step = counters[0];
    const double lr = tr_lr(params[0], params[1], counters[2], counters[3], step);
    int t = adam_step[0];
    if (skip) {
        counters[1] += 1;
    } else {
        t += 1;
        adam_step[0] = t;
        const double b1 = hyper[1], b2 = hyper[2], eps = hyper[3], wd = hyper[4];
        const double bc1 = 1.0 - pow(b1, (double)t);
        const double bc2 = 1.0 - pow(b2, (double)t);
        derived[0] = (float)(lr / bc1);
        derived[1] = (float)sqrt(bc2);
        derived[2] = (float)(1.0 - lr * wd);
        derived[3] = (float)b1;
        derived[4] = (float)(1.0 - b1);
        derived[5] = (float)b2;
        derived[6] = (float)(1.0 - b2);
        derived[7] = (float)eps;
    }
    counters[0] = step + 1;
    gate[0] = (float)coef;
    gate[1] = skip ? 1.0f : 0.0f;
    report[0] = (double)loss[0];
    report[1] = norm;
    report[2] = lr;
    report[3] = skip ? 1.0 : 0.0;
    report[4] = (double)counters[1];
    report[5] = (double)(step + 1);
    report[6] = (double)t;
    report[7] = coef;
}

// One block per row: out[row] = the first index of the largest of
// logits[row, 0 .. real) (NaN never wins), as the CPU engine's eval.
extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    tr_argmax_f32(const float* __restrict__ logits, unsigned* __restrict__ out, unsigned stride, unsigned real,
                  unsigned rows) {
    __shared__ float sv[SG_BLOCK];
    __shared__ unsigned si[SG_BLOCK];
    for (unsigned row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* lr = logits + (unsigned long long)row * stride;
        float best = -__int_as_float(0x7f800000);
        unsigned bi = 0xffffffffu;
        for (unsigned j = threadIdx.x; j < real; j += SG_BLOCK) {
            const float x = lr[j];
            if (x > best || (bi == 0xffffffffu && x == best)) {
                best = x;
                bi = j;
            }
        }
        __syncthreads();
        sv[threadIdx.x] = best;
        si[threadIdx.x] = bi;
        __syncthreads();
        for (unsigned stride2 = SG_BLOCK / 2; stride2 > 0; stride2 >>= 1) {
            if (threadIdx.x < stride2) {
                const float ov = sv[threadIdx.x + stride2];
                const unsigned oi = si[threadIdx.x + stride2];
                const bool take = oi != 0xffffffffu &&
                                  (si[threadIdx.x] == 0xffffffffu || ov > sv[threadIdx.x] ||
                                   (ov == sv[threadIdx.x] && oi < si[threadIdx.x]));
                if (take) {
                    sv[threadIdx.x] = ov;
                    si[threadIdx.x] = oi;
                }
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            out[row] = si[0] == 0xffffffffu ? 0u : si[0];
        }
    }
}
