// Shared helpers of the Mamba-3 kernels (mamba3_*.cu).
//
// Every reduction here runs in a fixed order (butterfly shuffles inside a
// warp, a fixed shared-memory tree across a block of SG_BLOCK threads), so the
// same inputs give the same bits on every run, eager or replayed. The scalar
// activations use the accurate libm functions (expf, log1pf, tanhf, sincosf),
// never the __ intrinsics: the f32 step is checked against an f64 oracle.
//
// Kernels are templates over the storage type of activations (`T`), with the
// arithmetic in float; each .cu file instantiates them for float under
// `extern "C"` names ending in _f32, and the bf16 step adds its own names.
#pragma once
#include <cuda_bf16.h>
#include "common.cuh"

// torch's softplus returns its input above this threshold.
#define M3_SOFTPLUS_THRESHOLD 20.0f


__device__ __forceinline__ float m3_sigmoid(float x) {
    if (x >= 0.0f) {
        return 1.0f / (1.0f + expf(-x));
    }
    float e = expf(x);
    return e / (1.0f + e);
}

__device__ __forceinline__ float m3_softplus(float x) {
    return x > M3_SOFTPLUS_THRESHOLD ? x : log1pf(expf(x));
}

__device__ __forceinline__ float m3_softplus_grad(float x) {
    return x > M3_SOFTPLUS_THRESHOLD ? 1.0f : m3_sigmoid(x);
}

// Official heavy_tail_activation: 1 + x above zero, 1 / (1 - x) below.
__device__ __forceinline__ float m3_heavy_tail(float x) {
    return x >= 0.0f ? 1.0f + x : 1.0f / (1.0f - x);
}

__device__ __forceinline__ float m3_heavy_tail_grad(float x) {
    if (x >= 0.0f) {
        return 1.0f;
    }
    float d = 1.0f - x;
    return 1.0f / (d * d);
}

__device__ __forceinline__ float m3_silu(float x) { return x * m3_sigmoid(x); }

__device__ __forceinline__ float m3_silu_grad(float x) {
    float s = m3_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

// silu(x) and its derivative from one sigmoid: the same bits as m3_silu and
// m3_silu_grad, for kernels that need both (the gate backward).
__device__ __forceinline__ void m3_silu_both(float x, float& silu, float& grad) {
    const float s = m3_sigmoid(x);
    silu = x * s;
    grad = s * (1.0f + x * (1.0f - s));
}

// Shapes of one mixer, passed by value to every per-token kernel. The in_proj
// output row is [z, x, B, C, dd_dt, dd_A, trap, angles] at the given offsets.
struct M3Dims {
    unsigned batch, len, rows;      // B, T, B*T
    unsigned nheads, headdim;       // H, P
    unsigned d_state, ngroups;      // N, G
    unsigned angles;                // S (rotated pairs)
    unsigned width;                 // E, in_proj output width
    unsigned d_inner;               // H*P
    unsigned off_z, off_x, off_b, off_c, off_dt, off_a, off_trap, off_ang;
    unsigned chunk, nchunks;        // C, ceil(T/C)
    float eps, a_floor;
    unsigned a_act;                 // f of A = -max(f(dd_A), A_floor): 0 heavy-tail, 1 softplus
};

// One element of the biased, normalised key or query (B^, C^):
// x * rstd * w + bias. Every kernel that builds keys or queries uses this
// and m3_rotate (m3_qk_fwd, and m3_rot_bwd, which rebuilds them instead of
// reading them), so they agree bit for bit.
__device__ __forceinline__ float m3_hat(float x, float rstd, float w, float bias) {
    return fmaf(x * rstd, w, bias);
}

// Loads / stores an interleaved pair (p[0], p[1]); p is 8-byte aligned
// (pairs start at even indices of buffers whose rows have an even length).
__device__ __forceinline__ float2 m3_load_pair(const float* p) {
    return *reinterpret_cast<const float2*>(p);
}
__device__ __forceinline__ void m3_store_pair(float* p, float a, float b) {
    *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
__device__ __forceinline__ void m3_store_pair(__nv_bfloat16* p, float a, float b) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}

// Four adjacent values from / to a 16-byte aligned address (an 8-byte one
// for the bf16 store).
__device__ __forceinline__ float4 m3_load4(const float* p) {
    return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ void m3_store4(float* p, float4 v) {
    *reinterpret_cast<float4*>(p) = v;
}
__device__ __forceinline__ void m3_store4(__nv_bfloat16* p, float4 v) {
    m3_store_pair(p, v.x, v.y);
    m3_store_pair(p + 2, v.z, v.w);
}

// Sum over the `g` lanes of an aligned group (g a power of two <= 32, every
// lane of the warp taking part), the same value on each.
__device__ __forceinline__ float m3_group_sum(float v, unsigned g) {
    for (unsigned off = g / 2; off > 0; off /= 2) {
        v += __shfl_xor_sync(0xffffffffu, v, off);
    }
    return v;
}

// Rotates the interleaved pair (a, b) by +phi, given sin and cos of phi.
__device__ __forceinline__ void m3_rotate(float& a, float& b, float sn, float cs) {
    const float x = fmaf(a, cs, -(b * sn));
    const float y = fmaf(a, sn, b * cs);
    a = x;
    b = y;
}

// Threads of the angle cumsum kernels (m3_angle_fwd_f32, m3_angle_bwd_f32):
// 32 time segments of 32 angle lanes. The Rust wrapper launches the same
// count (kernels/mamba3.rs, ANGLE_THREADS).
#define M3_ANGLE_THREADS 1024
#define M3_ANGLE_SEGS (M3_ANGLE_THREADS / 32)
// Tokens the serial angle kernels load ahead of their first store.
#define M3_ANGLE_RUN 16

// This thread's place in an angle kernel: its lane (angle within a tile of
// 32), its time segment [t0, t1), and the number of (b, h, angle tile)
// units the grid strides over.
struct M3AngleSched {
    unsigned lane, seg, stiles, t0, t1;
    unsigned long long units;
};

__device__ __forceinline__ M3AngleSched m3_angle_sched(const M3Dims& d) {
    M3AngleSched k;
    k.lane = threadIdx.x % 32;
    k.seg = threadIdx.x / 32;
    k.stiles = (d.angles + 31) / 32;
    k.units = (unsigned long long)d.batch * d.nheads * k.stiles;
    const unsigned per = (d.len + M3_ANGLE_SEGS - 1) / M3_ANGLE_SEGS;
    k.t0 = min(k.seg * per, d.len);
    k.t1 = min(k.t0 + per, d.len);
    return k;
}

// Unit u's angle for this lane (live when below S), head and first row.
struct M3AngleUnit {
    unsigned s, h;
    unsigned long long row0;
    bool live;
};

__device__ __forceinline__ M3AngleUnit m3_angle_unit(const M3Dims& d, const M3AngleSched& k,
                                                     unsigned long long u) {
    M3AngleUnit a;
    a.s = (unsigned)(u % k.stiles) * 32 + k.lane;
    const unsigned long long bh = u / k.stiles;
    a.h = (unsigned)(bh % d.nheads);
    a.row0 = (bh / d.nheads) * d.len;
    a.live = a.s < d.angles;
    return a;
}

// f(dd_A) and its derivative for the map d.a_act selects.
__device__ __forceinline__ float m3_a_rate(const M3Dims& d, float x) {
    return d.a_act ? m3_softplus(x) : m3_heavy_tail(x);
}
__device__ __forceinline__ float m3_a_rate_grad(const M3Dims& d, float x) {
    return d.a_act ? m3_softplus_grad(x) : m3_heavy_tail_grad(x);
}
