// Elementwise f32 kernels. Each takes its element count last, as an unsigned
// int; the Rust wrapper checks that the count fits (u32::try_from).
#include "common.cuh"

extern "C" __global__ void fill_f32(float* __restrict__ y, float value, unsigned n) {
    SG_FOR_EACH(i, n) { y[i] = value; }
}

// y = a * x + y, written as one fused multiply-add so that the host check
// (f32::mul_add) can demand bit equality whatever NVRTC's contraction policy.
extern "C" __global__ void axpy_f32(const float* __restrict__ x, float* __restrict__ y, float a,
                                    unsigned n) {
    SG_FOR_EACH(i, n) { y[i] = fmaf(a, x[i], y[i]); }
}

extern "C" __global__ void mul_f32(const float* __restrict__ a, const float* __restrict__ b,
                                   float* __restrict__ out, unsigned n) {
    SG_FOR_EACH(i, n) { out[i] = a[i] * b[i]; }
}

// SiLU, x * sigmoid(x). expf (not __expf): accuracy over speed in the test step.
extern "C" __global__ void silu_f32(const float* __restrict__ x, float* __restrict__ y, unsigned n) {
    SG_FOR_EACH(i, n) {
        float v = x[i];
        y[i] = v / (1.0f + expf(-v));
    }
}

// The smallest useful kernel: the 1000-launch chain benchmark times launch
// overhead, not arithmetic.
extern "C" __global__ void add_one_f32(float* __restrict__ x, unsigned n) {
    SG_FOR_EACH(i, n) { x[i] += 1.0f; }
}
