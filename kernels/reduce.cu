// Deterministic reductions: a fixed grid, a fixed per-thread order and a fixed
// shared-memory tree, and no float atomics, so the same input gives the same
// bits on every run, eager or replayed from a graph.
#include "common.cuh"

// Pass 1: block b writes the sum of squares of its grid-stride share of x to
// partials[b]. The grid size is chosen by the wrapper from n alone.
extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    sumsq_partials_f32(const float* __restrict__ x, unsigned n, float* __restrict__ partials) {
    __shared__ float s[SG_BLOCK];
    float acc = 0.0f;
    SG_FOR_EACH(i, n) { acc = fmaf(x[i], x[i], acc); }
    float total = sg_block_sum(acc, s);
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = total;
    }
}

// Pass 2: one block folds `count` partials into out[0].
extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    sum_partials_f32(const float* __restrict__ partials, unsigned count, float* __restrict__ out) {
    __shared__ float s[SG_BLOCK];
    float acc = 0.0f;
    for (unsigned i = threadIdx.x; i < count; i += SG_BLOCK) {
        acc += partials[i];
    }
    float total = sg_block_sum(acc, s);
    if (threadIdx.x == 0) {
        out[0] = total;
    }
}
