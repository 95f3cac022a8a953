// Multi-tensor optimizer kernels: the global gradient norm's partials and the
// AdamW update of every parameter tensor, each in one launch per list of up
// to MT_*_MAX tensors instead of one launch per tensor.
//
// The tensor list travels by value as the kernel's only argument (a
// __grid_constant__ struct in parameter space, read in place, never copied
// to local memory): device addresses, lengths and the per-tensor first work
// unit. A captured graph therefore bakes in the addresses of the tensors,
// which are exactly the allocations the step's generated guards compare
// before every replay; there is no device-side table that could go stale.
// Both structs stay below the 4 KB kernel-parameter limit of every driver.
//
// Work units. Tensor t of a launch owns units [first[t], first[t + 1]); unit
// u covers elements [(u - first[t]) * CHUNK, ...) of it. Block b handles
// units b, b + gridDim.x, ...; within a unit, thread i handles the float4
// groups i, i + SG_BLOCK, ... (then the scalar tail), so which thread adds
// which element depends only on the tensor lengths, never on the grid.
//
// Layouts (mirrored by runtime/src/kernels/optim.rs, which asserts the same
// sizes and offsets against the MT_* numbers below; the static_asserts at
// the end check them here):
//
//   MtNormList (MT_NORM_SIZE bytes), read by mt_sumsq_partials:
//     grad[MT_NORM_MAX]    const float*  gradients
//     partials             double*       one sum of squares per unit
//     n[MT_NORM_MAX]       unsigned      lengths
//     first[MT_NORM_MAX+1] unsigned      first unit of each tensor; first[count] = units
//     count                unsigned      tensors in this list (>= 1)
//     partial_offset       unsigned      partials index of this list's unit 0
//
//   MtAdamList (MT_ADAM_SIZE bytes), read by mt_adamw:
//     param, grad, m, v [MT_ADAM_MAX]   float*   (grad: const)
//     copy[MT_ADAM_MAX]    __nv_bfloat16* or 0   bf16 compute copy of param
//     derived              const float*  AdamW's per-step scalars (8; mamba3_adamw.cu)
//     gate                 const float*  [clip coef, skip flag, grad scale] (train.cu) or 0
//     n[MT_ADAM_MAX]       unsigned      lengths
//     first[MT_ADAM_MAX+1] unsigned      first unit of each tensor
//     decay[MT_ADAM_MAX]   unsigned      1: decoupled weight decay
//     count                unsigned      tensors in this list (>= 1)
#include <cuda_bf16.h>
#include "common.cuh"

#define MT_NORM_MAX 192
#define MT_NORM_CHUNK 65536u
#define MT_NORM_SIZE 3096
#define MT_NORM_OFF_PARTIALS 1536
#define MT_NORM_OFF_N 1544
#define MT_NORM_OFF_FIRST 2312
#define MT_NORM_OFF_COUNT 3084
#define MT_NORM_OFF_PARTIAL_OFFSET 3088

#define MT_ADAM_MAX 64
#define MT_ADAM_CHUNK 16384u
#define MT_ADAM_SIZE 3352
#define MT_ADAM_OFF_GRAD 512
#define MT_ADAM_OFF_M 1024
#define MT_ADAM_OFF_V 1536
#define MT_ADAM_OFF_COPY 2048
#define MT_ADAM_OFF_DERIVED 2560
#define MT_ADAM_OFF_GATE 2568
#define MT_ADAM_OFF_N 2576
#define MT_ADAM_OFF_FIRST 2832
#define MT_ADAM_OFF_DECAY 3092
#define MT_ADAM_OFF_COUNT 3348

struct MtNormList {
    unsigned long long grad[MT_NORM_MAX];
    unsigned long long partials;
    unsigned n[MT_NORM_MAX];
    unsigned first[MT_NORM_MAX + 1];
    unsigned count;
    unsigned partial_offset;
    unsigned pad;
};

struct MtAdamList {
    unsigned long long param[MT_ADAM_MAX];
    unsigned long long grad[MT_ADAM_MAX];
    unsigned long long m[MT_ADAM_MAX];
    unsigned long long v[MT_ADAM_MAX];
    unsigned long long copy[MT_ADAM_MAX];
    unsigned long long derived;
    unsigned long long gate;
    unsigned n[MT_ADAM_MAX];
    unsigned first[MT_ADAM_MAX + 1];
    unsigned decay[MT_ADAM_MAX];
    unsigned count;
};

// NVRTC has no offsetof. Each struct's size equals the sum of its members'
// sizes, so it has no padding and every member sits at the sum of the sizes
// of the members before it: those sums are what the MT_*_OFF_* numbers say.
#define MT_SZ(S, f) sizeof(((S*)nullptr)->f)
static_assert(sizeof(MtNormList) == MT_NORM_SIZE, "MtNormList size");
static_assert(MT_SZ(MtNormList, grad) + MT_SZ(MtNormList, partials) + MT_SZ(MtNormList, n) +
                      MT_SZ(MtNormList, first) + MT_SZ(MtNormList, count) + MT_SZ(MtNormList, partial_offset) +
                      MT_SZ(MtNormList, pad) ==
                  MT_NORM_SIZE,
              "MtNormList has padding");
static_assert(MT_SZ(MtNormList, grad) == MT_NORM_OFF_PARTIALS, "MtNormList.partials");
static_assert(MT_NORM_OFF_PARTIALS + MT_SZ(MtNormList, partials) == MT_NORM_OFF_N, "MtNormList.n");
static_assert(MT_NORM_OFF_N + MT_SZ(MtNormList, n) == MT_NORM_OFF_FIRST, "MtNormList.first");
static_assert(MT_NORM_OFF_FIRST + MT_SZ(MtNormList, first) == MT_NORM_OFF_COUNT, "MtNormList.count");
static_assert(MT_NORM_OFF_COUNT + MT_SZ(MtNormList, count) == MT_NORM_OFF_PARTIAL_OFFSET,
              "MtNormList.partial_offset");
static_assert(sizeof(MtAdamList) == MT_ADAM_SIZE, "MtAdamList size");
static_assert(MT_SZ(MtAdamList, param) + MT_SZ(MtAdamList, grad) + MT_SZ(MtAdamList, m) + MT_SZ(MtAdamList, v) +
                      MT_SZ(MtAdamList, copy) + MT_SZ(MtAdamList, derived) + MT_SZ(MtAdamList, gate) +
                      MT_SZ(MtAdamList, n) + MT_SZ(MtAdamList, first) + MT_SZ(MtAdamList, decay) +
                      MT_SZ(MtAdamList, count) ==
                  MT_ADAM_SIZE,
              "MtAdamList has padding");
static_assert(MT_SZ(MtAdamList, param) == MT_ADAM_OFF_GRAD, "MtAdamList.grad");
static_assert(MT_ADAM_OFF_GRAD + MT_SZ(MtAdamList, grad) == MT_ADAM_OFF_M, "MtAdamList.m");
static_assert(MT_ADAM_OFF_M + MT_SZ(MtAdamList, m) == MT_ADAM_OFF_V, "MtAdamList.v");
static_assert(MT_ADAM_OFF_V + MT_SZ(MtAdamList, v) == MT_ADAM_OFF_COPY, "MtAdamList.copy");
static_assert(MT_ADAM_OFF_COPY + MT_SZ(MtAdamList, copy) == MT_ADAM_OFF_DERIVED, "MtAdamList.derived");
static_assert(MT_ADAM_OFF_DERIVED + MT_SZ(MtAdamList, derived) == MT_ADAM_OFF_GATE, "MtAdamList.gate");
static_assert(MT_ADAM_OFF_GATE + MT_SZ(MtAdamList, gate) == MT_ADAM_OFF_N, "MtAdamList.n");
static_assert(MT_ADAM_OFF_N + MT_SZ(MtAdamList, n) == MT_ADAM_OFF_FIRST, "MtAdamList.first");
static_assert(MT_ADAM_OFF_FIRST + MT_SZ(MtAdamList, first) == MT_ADAM_OFF_DECAY, "MtAdamList.decay");
static_assert(MT_ADAM_OFF_DECAY + MT_SZ(MtAdamList, decay) == MT_ADAM_OFF_COUNT, "MtAdamList.count");
#undef MT_SZ

// The tensor owning `unit`: the largest t < count with first[t] <= unit
// (first is non-decreasing; a tensor with no units shares its first with the
// next one, so the search lands on the tensor whose range holds the unit).
__device__ __forceinline__ unsigned mt_tensor_of(const unsigned* first, unsigned count, unsigned unit) {
    unsigned lo = 0, hi = count - 1;
    while (lo < hi) {
        const unsigned mid = (lo + hi + 1) / 2;
        if (first[mid] <= unit) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

__device__ __forceinline__ bool mt_aligned16(unsigned long long addr) { return (addr & 15ull) == 0; }

__device__ __forceinline__ double mt_sumsq4(float4 x, double acc) {
    acc = fma((double)x.x, (double)x.x, acc);
    acc = fma((double)x.y, (double)x.y, acc);
    acc = fma((double)x.z, (double)x.z, acc);
    return fma((double)x.w, (double)x.w, acc);
}

// Unit by unit: partials[partial_offset + unit] = sum of the squares (in
// double) of the unit's gradient elements, in a fixed order.
extern "C" __global__ void __launch_bounds__(SG_BLOCK) mt_sumsq_partials(const __grid_constant__ MtNormList L) {
    __shared__ double s[SG_BLOCK];
    double* partials = (double*)L.partials;
    const unsigned units = L.first[L.count];
    for (unsigned unit = blockIdx.x; unit < units; unit += gridDim.x) {
        const unsigned t = mt_tensor_of(L.first, L.count, unit);
        const float* g = (const float*)L.grad[t];
        const unsigned long long begin = (unsigned long long)(unit - L.first[t]) * MT_NORM_CHUNK;
        const unsigned long long end = min(begin + MT_NORM_CHUNK, (unsigned long long)L.n[t]);
        // begin is a multiple of 4, so with an aligned base every float4 is.
        const unsigned long long vend = mt_aligned16(L.grad[t]) ? begin + ((end - begin) & ~3ull) : begin;
        double acc = 0.0;
        unsigned long long i = begin + 4ull * threadIdx.x;
        // Four float4 loads in flight per step, added in element order.
        for (; i + 12ull * SG_BLOCK < vend; i += 16ull * SG_BLOCK) {
            float4 x[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                x[k] = *(const float4*)(g + i + 4ull * SG_BLOCK * k);
            }
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                acc = mt_sumsq4(x[k], acc);
            }
        }
        for (; i < vend; i += 4ull * SG_BLOCK) {
            acc = mt_sumsq4(*(const float4*)(g + i), acc);
        }
        for (unsigned long long i = vend + threadIdx.x; i < end; i += SG_BLOCK) {
            const double x = (double)g[i];
            acc = fma(x, x, acc);
        }
        const double total = sg_block_sum_f64(acc, s);
        if (threadIdx.x == 0) {
            partials[L.partial_offset + unit] = total;
        }
    }
}

// AdamW's per-step scalars and the gate, read once per block.
struct MtAdamScalars {
    float step_size, bc2s, shrink, b1, ob1, b2, ob2, eps;
    float coef, gscale;
};

// One element, with the arithmetic of the CPU reference (optim/adamw.rs) in
// f32: the gradient is rescaled to the weighted loss, multiplied by the clip
// coefficient only when that is below 1, the parameter decays (decoupled)
// before the moment updates, then steps.
__device__ __forceinline__ void mt_adam_one(float& p, float g, float& m, float& v, const MtAdamScalars& k,
                                            bool decay) {
    float gv = g * k.gscale;
    if (k.coef < 1.0f) {
        gv *= k.coef;
    }
    float pv = p;
    if (decay) {
        pv *= k.shrink;
    }
    const float mv = k.b1 * m + k.ob1 * gv;
    const float vv = k.b2 * v + k.ob2 * gv * gv;
    m = mv;
    v = vv;
    p = pv - k.step_size * mv / (sqrtf(vv) / k.bc2s + k.eps);
}

// Every tensor of the list, unit by unit: AdamW on the (rescaled, clipped)
// gradient, and the updated parameter rounded (nearest even, as f32_to_bf16)
// into its bf16 compute copy where it has one. With a gate whose skip flag
// is set, nothing is written at all. Without a gate (gate == 0), the
// gradient is used as is (scale 1, no clipping).
extern "C" __global__ void __launch_bounds__(SG_BLOCK) mt_adamw(const __grid_constant__ MtAdamList L) {
    MtAdamScalars k;
    k.coef = 1.0f;
    k.gscale = 1.0f;
    if (L.gate != 0ull) {
        const float* gate = (const float*)L.gate;
        if (gate[1] != 0.0f) {
            return;
        }
        k.coef = gate[0];
        k.gscale = gate[2];
    }
    const float* d = (const float*)L.derived;
    k.step_size = d[0];
    k.bc2s = d[1];
    k.shrink = d[2];
    k.b1 = d[3];
    k.ob1 = d[4];
    k.b2 = d[5];
    k.ob2 = d[6];
    k.eps = d[7];
    const unsigned units = L.first[L.count];
    for (unsigned unit = blockIdx.x; unit < units; unit += gridDim.x) {
        const unsigned t = mt_tensor_of(L.first, L.count, unit);
        float* p = (float*)L.param[t];
        const float* g = (const float*)L.grad[t];
        float* m = (float*)L.m[t];
        float* v = (float*)L.v[t];
        __nv_bfloat16* c = (__nv_bfloat16*)L.copy[t];
        const bool decay = L.decay[t] != 0u;
        const unsigned long long begin = (unsigned long long)(unit - L.first[t]) * MT_ADAM_CHUNK;
        const unsigned long long end = min(begin + MT_ADAM_CHUNK, (unsigned long long)L.n[t]);
        const bool vec = mt_aligned16(L.param[t]) && mt_aligned16(L.grad[t]) && mt_aligned16(L.m[t]) &&
                         mt_aligned16(L.v[t]) && (L.copy[t] & 7ull) == 0;
        const unsigned long long vend = vec ? begin + ((end - begin) & ~3ull) : begin;
        for (unsigned long long i = begin + 4ull * threadIdx.x; i < vend; i += 4ull * SG_BLOCK) {
            float4 pv = *(const float4*)(p + i);
            const float4 gv = *(const float4*)(g + i);
            float4 mv = *(const float4*)(m + i);
            float4 vv = *(const float4*)(v + i);
            mt_adam_one(pv.x, gv.x, mv.x, vv.x, k, decay);
            mt_adam_one(pv.y, gv.y, mv.y, vv.y, k, decay);
            mt_adam_one(pv.z, gv.z, mv.z, vv.z, k, decay);
            mt_adam_one(pv.w, gv.w, mv.w, vv.w, k, decay);
            *(float4*)(p + i) = pv;
            *(float4*)(m + i) = mv;
            *(float4*)(v + i) = vv;
            if (c != nullptr) {
                __nv_bfloat162* c2 = (__nv_bfloat162*)(c + i);
                c2[0] = __halves2bfloat162(__float2bfloat16_rn(pv.x), __float2bfloat16_rn(pv.y));
                c2[1] = __halves2bfloat162(__float2bfloat16_rn(pv.z), __float2bfloat16_rn(pv.w));
            }
        }
        for (unsigned long long i = vend + threadIdx.x; i < end; i += SG_BLOCK) {
            float pv = p[i], mv = m[i], vv = v[i];
            mt_adam_one(pv, g[i], mv, vv, k, decay);
            p[i] = pv;
            m[i] = mv;
            v[i] = vv;
            if (c != nullptr) {
                c[i] = __float2bfloat16_rn(pv);
            }
        }
    }
}
