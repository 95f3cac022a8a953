// The MLP example's own kernels (runtime/examples/mlp/): not part of
// stepgraph, compiled at run time through its NVRTC path and kernel cache by
// Gpu::with_user_kernels, like the crate's kernels/*.cu. common.cuh is one of
// stepgraph's headers, served to every user module (SG_FOR_EACH, SG_BLOCK,
// block sums).
//
// Every reduction runs in a fixed order, with no atomics, so a step gives
// the same bits eagerly and replayed from its graph.
#include "common.cuh"

// y[r, c] = act(y[r, c] + bias[c]) in place, for a row-major rows x cols
// matrix: the bias of a linear layer fused with its activation (ReLU when
// relu != 0, the identity otherwise).
extern "C" __global__ void mlp_bias_act(float* __restrict__ y, const float* __restrict__ bias,
                                        unsigned rows, unsigned cols, unsigned relu) {
    SG_FOR_EACH(i, (unsigned long long)rows * cols) {
        const float v = y[i] + bias[i % cols];
        y[i] = (relu != 0u && v < 0.0f) ? 0.0f : v;
    }
}

// Softmax cross-entropy, fused with its gradient, one thread per row:
// row_loss[r] = logsumexp(z[r]) - z[r, label[r]] and
// dz[r] = (softmax(z[r]) - onehot(label[r])) / rows, the gradient of the
// mean loss. A label outside [0, classes) gives a NaN loss instead of a read
// out of bounds.
extern "C" __global__ void mlp_softmax_xent(const float* __restrict__ z,
                                            const int* __restrict__ labels,
                                            float* __restrict__ dz, float* __restrict__ row_loss,
                                            unsigned rows, unsigned classes) {
    SG_FOR_EACH(r, rows) {
        const float* zr = z + r * classes;
        float* dr = dz + r * classes;
        float m = zr[0];
        for (unsigned c = 1; c < classes; ++c) m = fmaxf(m, zr[c]);
        float s = 0.0f;
        for (unsigned c = 0; c < classes; ++c) s += expf(zr[c] - m);
        const int y = labels[r];
        const bool ok = y >= 0 && (unsigned)y < classes;
        row_loss[r] = ok ? m + logf(s) - zr[y] : __int_as_float(0x7fc00000);
        for (unsigned c = 0; c < classes; ++c) {
            const float p = expf(zr[c] - m) / s;
            dr[c] = (p - ((int)c == y ? 1.0f : 0.0f)) / (float)rows;
        }
    }
}

// out[0] = mean of x[0..n). One block of exactly SG_BLOCK threads: strided
// partial sums, then common.cuh's fixed block tree.
extern "C" __global__ void mlp_mean(const float* __restrict__ x, float* __restrict__ out,
                                    unsigned n) {
    __shared__ float s[SG_BLOCK];
    float acc = 0.0f;
    for (unsigned i = threadIdx.x; i < n; i += blockDim.x) acc += x[i];
    const float total = sg_block_sum(acc, s);
    if (threadIdx.x == 0) out[0] = n > 0u ? total / (float)n : 0.0f;
}

// out[c] = sum over r of g[r, c], rows in order, one thread per column: the
// gradient of a bias.
extern "C" __global__ void mlp_colsum(const float* __restrict__ g, float* __restrict__ out,
                                      unsigned rows, unsigned cols) {
    SG_FOR_EACH(c, cols) {
        float acc = 0.0f;
        for (unsigned r = 0; r < rows; ++r) acc += g[(unsigned long long)r * cols + c];
        out[c] = acc;
    }
}

// ReLU backward in place: dh[i] = 0 where the ReLU's output h[i] is not
// positive.
extern "C" __global__ void mlp_relu_bwd(float* __restrict__ dh, const float* __restrict__ h,
                                        unsigned n) {
    SG_FOR_EACH(i, n) {
        if (!(h[i] > 0.0f)) dh[i] = 0.0f;
    }
}
