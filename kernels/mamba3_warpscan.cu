// The Mamba-3 SISO scan for small heads: one warp per (batch row, head)
// walking the window token by token, its P x N state spread over the 32
// lanes' registers. It computes what mamba3_scan.cu computes (same inputs,
// same outputs) without the chunked form's shared-memory tiles and
// block-wide barriers, whose fixed cost per chunk dominates when a head's
// state is only P x N <= 1024 values (headdim 16, d_state 64: the
// state-tracking models).
//
// Per token t, with a_t = e^{adt_t}, k~_t = scale_t k_t and
// dg_t = D + gamma_t (q̂_t · k̂_t):
//   D_t = a_t S_{t-1}                    (S_{-1} = 0)
//   y_t = D_t q_t + dg_t v_t
//   S_t = D_t + v_t k~_t^T
// Backward, with G_t = dL/dS_t = a_{t+1} (G_{t+1} + dy_{t+1} q_{t+1}^T):
//   dq_t   = D_t^T dy_t                  (a forward sweep)
//   dv_t   = G_t k~_t + dg_t dy_t,  dk~_t = G_t^T v_t   (a reverse sweep)
//   dcs_t  = q_t · dq_t - v_t · (G_t k~_t),  dadt_r = sum_{t >= r} dcs_t
// (dcs_t is dL/dcs_t for the log-decay cumsum cs; a_t enters every later
// cumsum, hence the suffix sum). The forward sweep parks q_t · dq_t in dadt,
// which the reverse sweep (the same lane) reads back and overwrites.
//
// Lane l holds rows p in [pg PP, pg PP + PP) and columns n in
// [ng NN, ng NN + NN) of the state, pg = l / 8, ng = l % 8, so P = 4 PP and
// N = 8 NN: sums over n are butterflies over lanes xor 1, 2, 4, sums over p
// over lanes xor 8, 16. All sums run in a fixed order, so reruns give the
// same bits. The forward pass also writes the state entering every chunk of
// d.chunk tokens, the layout the chunked scan writes.
#include <cuda_bf16.h>
#include "mamba3_common.cuh"

// Warps (one (row, head) each) per block; kernels/mamba3.rs WARP_SCAN_WARPS.
#define M3W_WARPS 4

__device__ __forceinline__ float m3w_sum_n(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    return v;
}

__device__ __forceinline__ float m3w_sum_p(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 8);
    v += __shfl_xor_sync(0xffffffffu, v, 16);
    return v;
}

// NN consecutive q/k values from a 4-element-aligned address (the wrapper
// checks the buffers' alignment; rows are N = 8 NN long).
template <int NN>
__device__ __forceinline__ void m3w_load(const float* __restrict__ p, float (&v)[NN]) {
#pragma unroll
    for (int j = 0; j < NN; j += 4) {
        const float4 x = *reinterpret_cast<const float4*>(p + j);
        v[j] = x.x;
        v[j + 1] = x.y;
        v[j + 2] = x.z;
        v[j + 3] = x.w;
    }
}

template <int NN>
__device__ __forceinline__ void m3w_load(const __nv_bfloat16* __restrict__ p, float (&v)[NN]) {
#pragma unroll
    for (int j = 0; j < NN; j += 4) {
        const uint2 x = *reinterpret_cast<const uint2*>(p + j);
        const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&x.x);
        const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&x.y);
        v[j] = __low2float(lo);
        v[j + 1] = __high2float(lo);
        v[j + 2] = __low2float(hi);
        v[j + 3] = __high2float(hi);
    }
}

template <int NN>
__device__ __forceinline__ void m3w_store(float* __restrict__ p, const float (&v)[NN]) {
#pragma unroll
    for (int j = 0; j < NN; j += 4) {
        *reinterpret_cast<float4*>(p + j) = make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
    }
}

// One token's operands for this lane. Loaded one token ahead of their use,
// so the global loads overlap the previous token's arithmetic.
template <int PP, int NN>
struct M3wTok {
    float q[NN], k[NN];   // k unscaled: k~ = sc k
    float v[PP], dy[PP];
    float a, dg, sc;
};

// Where this lane's warp works: the (row, head) pair and the lane's tile.
struct M3wLane {
    unsigned bh, b, h, pg, ng, lane;
};

__device__ __forceinline__ M3wLane m3w_lane(const M3Dims& d) {
    M3wLane w;
    w.lane = threadIdx.x % 32;
    w.bh = blockIdx.x * M3W_WARPS + threadIdx.x / 32;
    w.b = w.bh / d.nheads;
    w.h = w.bh % d.nheads;
    w.pg = w.lane / 8;
    w.ng = w.lane % 8;
    return w;
}

template <typename TQK, int PP, int NN>
__device__ __forceinline__ void m3w_fetch(M3wTok<PP, NN>& o, const TQK* __restrict__ q, const TQK* __restrict__ k,
                                          const float* __restrict__ proj, const float* __restrict__ dt,
                                          const float* __restrict__ adt, const float* __restrict__ lam,
                                          const float* __restrict__ qk_raw, const float* __restrict__ dy,
                                          float dskip_h, const M3wLane& w, unsigned t, const M3Dims& d) {
    const unsigned long long r = (unsigned long long)w.b * d.len + t;
    const unsigned long long rh = r * d.nheads + w.h;
    const unsigned long long qk = rh * d.d_state + w.ng * NN;
    m3w_load<NN>(q + qk, o.q);
    m3w_load<NN>(k + qk, o.k);
    float s = lam[rh] * dt[rh];
    o.dg = fmaf(s, qk_raw[rh], dskip_h);
    if (t + 1 < d.len) {
        const unsigned long long nx = rh + d.nheads;
        s += dt[nx] * (1.0f - lam[nx]);
    }
    o.sc = s;
    o.a = expf(adt[rh]);
    const float* vp = proj + r * d.width + d.off_x + w.h * d.headdim + w.pg * PP;
#pragma unroll
    for (int i = 0; i < PP; ++i) {
        o.v[i] = vp[i];
    }
    if (dy != nullptr) {
        const float* g = dy + r * d.d_inner + w.h * d.headdim + w.pg * PP;
#pragma unroll
        for (int i = 0; i < PP; ++i) {
            o.dy[i] = g[i];
        }
    }
}

// Lane ng == i writes element i of this lane group's PP values (PP <= 8), so
// a token's P outputs leave from P different lanes.
template <int PP>
__device__ __forceinline__ void m3w_store_p(float* __restrict__ p, const float (&v)[PP], unsigned ng) {
#pragma unroll
    for (int i = 0; i < PP; ++i) {
        if (ng == (unsigned)i) {
            p[i] = v[i];
        }
    }
}

template <typename TQK, int PP, int NN>
__device__ void m3w_fwd(const TQK* __restrict__ q, const TQK* __restrict__ k, const float* __restrict__ proj,
                        const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                        const float* __restrict__ qk_raw, const float* __restrict__ dskip, float* __restrict__ y,
                        float* __restrict__ states, const M3Dims& d) {
    const M3wLane w = m3w_lane(d);
    if (w.bh >= d.batch * d.nheads || d.len == 0) {
        return;
    }
    const float dskip_h = dskip[w.h];
    float s[PP][NN];
#pragma unroll
    for (int i = 0; i < PP; ++i) {
#pragma unroll
        for (int j = 0; j < NN; ++j) {
            s[i][j] = 0.0f;
        }
    }
    M3wTok<PP, NN> cur, nxt;
    m3w_fetch<TQK, PP, NN>(cur, q, k, proj, dt, adt, lam, qk_raw, nullptr, dskip_h, w, 0, d);
    for (unsigned t = 0; t < d.len; ++t) {
        if (t + 1 < d.len) {
            m3w_fetch<TQK, PP, NN>(nxt, q, k, proj, dt, adt, lam, qk_raw, nullptr, dskip_h, w, t + 1, d);
        }
        if (t % d.chunk == 0) {
            float* st = states + (((unsigned long long)w.bh * d.nchunks + t / d.chunk) * d.headdim + w.pg * PP) *
                                     d.d_state + w.ng * NN;
#pragma unroll
            for (int i = 0; i < PP; ++i) {
                m3w_store<NN>(st + (unsigned long long)i * d.d_state, s[i]);
            }
        }
        float out[PP];
#pragma unroll
        for (int i = 0; i < PP; ++i) {
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < NN; ++j) {
                acc = fmaf(s[i][j], cur.q[j], acc);
            }
            out[i] = m3w_sum_n(acc);
        }
#pragma unroll
        for (int i = 0; i < PP; ++i) {
            out[i] = fmaf(cur.a, out[i], cur.dg * cur.v[i]);
        }
        const unsigned long long r = (unsigned long long)w.b * d.len + t;
        m3w_store_p<PP>(y + r * d.d_inner + w.h * d.headdim + w.pg * PP, out, w.ng);
#pragma unroll
        for (int i = 0; i < PP; ++i) {
#pragma unroll
            for (int j = 0; j < NN; ++j) {
                s[i][j] = fmaf(cur.a, s[i][j], cur.v[i] * (cur.sc * cur.k[j]));
            }
        }
        if (t + 1 < d.len) {
            cur = nxt;
        }
    }
}

template <typename TQK, int PP, int NN>
__device__ void m3w_bwd(const TQK* __restrict__ q, const TQK* __restrict__ k, const float* __restrict__ proj,
                        const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                        const float* __restrict__ qk_raw, const float* __restrict__ dskip,
                        const float* __restrict__ dy, float* __restrict__ dq, float* __restrict__ dk,
                        float* __restrict__ dproj, float* __restrict__ dadt, float* __restrict__ dscale,
                        float* __restrict__ dqkdot, float* __restrict__ dskip_part, const M3Dims& d) {
    const M3wLane w = m3w_lane(d);
    if (w.bh >= d.batch * d.nheads || d.len == 0) {
        return;
    }
    const float dskip_h = dskip[w.h];
    float s[PP][NN];
#pragma unroll
    for (int i = 0; i < PP; ++i) {
#pragma unroll
        for (int j = 0; j < NN; ++j) {
            s[i][j] = 0.0f;
        }
    }
    M3wTok<PP, NN> cur, nxt;
    // Forward sweep: dq_t = a_t S_{t-1}^T dy_t, and q_t . dq_t parked in dadt.
    m3w_fetch<TQK, PP, NN>(cur, q, k, proj, dt, adt, lam, qk_raw, dy, dskip_h, w, 0, d);
    for (unsigned t = 0; t < d.len; ++t) {
        if (t + 1 < d.len) {
            m3w_fetch<TQK, PP, NN>(nxt, q, k, proj, dt, adt, lam, qk_raw, dy, dskip_h, w, t + 1, d);
        }
        const unsigned long long rh = ((unsigned long long)w.b * d.len + t) * d.nheads + w.h;
        float g[NN];
        float qdq = 0.0f;
#pragma unroll
        for (int j = 0; j < NN; ++j) {
            float acc = 0.0f;
#pragma unroll
            for (int i = 0; i < PP; ++i) {
                acc = fmaf(s[i][j], cur.dy[i], acc);
            }
            g[j] = cur.a * m3w_sum_p(acc);
            qdq = fmaf(cur.q[j], g[j], qdq);
        }
        if (w.pg == 0) {
            m3w_store<NN>(dq + rh * d.d_state + w.ng * NN, g);
        }
        qdq = m3w_sum_n(qdq);
        if (w.lane == 0) {
            dadt[rh] = qdq;
        }
#pragma unroll
        for (int i = 0; i < PP; ++i) {
#pragma unroll
            for (int j = 0; j < NN; ++j) {
                s[i][j] = fmaf(cur.a, s[i][j], cur.v[i] * (cur.sc * cur.k[j]));
            }
        }
        if (t + 1 < d.len) {
            cur = nxt;
        }
    }
    // Reverse sweep: s now holds G_t, from G_{T-1} = 0.
#pragma unroll
    for (int i = 0; i < PP; ++i) {
#pragma unroll
        for (int j = 0; j < NN; ++j) {
            s[i][j] = 0.0f;
        }
    }
    float dcs_acc = 0.0f, dd_acc = 0.0f;
    const unsigned last = d.len - 1;
    m3w_fetch<TQK, PP, NN>(cur, q, k, proj, dt, adt, lam, qk_raw, dy, dskip_h, w, last, d);
    for (unsigned t = last + 1; t-- > 0;) {
        if (t > 0) {
            m3w_fetch<TQK, PP, NN>(nxt, q, k, proj, dt, adt, lam, qk_raw, dy, dskip_h, w, t - 1, d);
        }
        const unsigned long long r = (unsigned long long)w.b * d.len + t;
        const unsigned long long rh = r * d.nheads + w.h;
        float ks[NN];
#pragma unroll
        for (int j = 0; j < NN; ++j) {
            ks[j] = cur.sc * cur.k[j];
        }
        // G k~ (over n) and dy . v, v . G k~ (over p).
        float gk[PP], dv[PP];
        float vgk = 0.0f, yv = 0.0f;
#pragma unroll
        for (int i = 0; i < PP; ++i) {
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < NN; ++j) {
                acc = fmaf(s[i][j], ks[j], acc);
            }
            gk[i] = m3w_sum_n(acc);
            dv[i] = fmaf(cur.dg, cur.dy[i], gk[i]);
            vgk = fmaf(cur.v[i], gk[i], vgk);
            yv = fmaf(cur.dy[i], cur.v[i], yv);
        }
        m3w_store_p<PP>(dproj + r * d.width + d.off_x + w.h * d.headdim + w.pg * PP, dv, w.ng);
        vgk = m3w_sum_p(vgk);
        yv = m3w_sum_p(yv);
        // dk~ = G^T v (over p); dscale = k . dk~ (over n).
        float dkt[NN];
        float ds = 0.0f;
#pragma unroll
        for (int j = 0; j < NN; ++j) {
            float acc = 0.0f;
#pragma unroll
            for (int i = 0; i < PP; ++i) {
                acc = fmaf(s[i][j], cur.v[i], acc);
            }
            dkt[j] = m3w_sum_p(acc);
            ds = fmaf(cur.k[j], dkt[j], ds);
            dkt[j] *= cur.sc;
        }
        ds = m3w_sum_n(ds);
        if (w.pg == 0) {
            m3w_store<NN>(dk + rh * d.d_state + w.ng * NN, dkt);
        }
        if (w.lane == 0) {
            dcs_acc += dadt[rh] - vgk;
            dadt[rh] = dcs_acc;
            dscale[rh] = ds;
            dqkdot[rh] = yv;
            dd_acc += yv;
        }
        // G_{t-1} = a_t (G_t + dy_t q_t^T).
#pragma unroll
        for (int i = 0; i < PP; ++i) {
#pragma unroll
            for (int j = 0; j < NN; ++j) {
                s[i][j] = cur.a * fmaf(cur.dy[i], cur.q[j], s[i][j]);
            }
        }
        if (t > 0) {
            cur = nxt;
        }
    }
    if (w.lane == 0) {
        dskip_part[w.bh] = dd_acc;
    }
}

// The shapes this scan takes (kernels/mamba3.rs, warp_scan_supported): P in
// {8, 16, 32} and N in {32, 64} with P x N <= 1024, at most 32 state values
// a lane.
#define M3W_DISPATCH(FN, TQK, ...)                                    \
    do {                                                              \
        const unsigned P_ = d.headdim, N_ = d.d_state;                \
        if (P_ == 16 && N_ == 64) {                                   \
            FN<TQK, 4, 8>(__VA_ARGS__);                               \
        } else if (P_ == 16 && N_ == 32) {                            \
            FN<TQK, 4, 4>(__VA_ARGS__);                               \
        } else if (P_ == 8 && N_ == 64) {                             \
            FN<TQK, 2, 8>(__VA_ARGS__);                               \
        } else if (P_ == 8 && N_ == 32) {                             \
            FN<TQK, 2, 4>(__VA_ARGS__);                               \
        } else if (P_ == 32 && N_ == 32) {                            \
            FN<TQK, 8, 4>(__VA_ARGS__);                               \
        }                                                             \
    } while (0)

extern "C" __global__ void __launch_bounds__(M3W_WARPS * 32)
    m3_wscan_fwd_f32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ proj,
                     const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                     const float* __restrict__ qk_raw, const float* __restrict__ dskip, float* __restrict__ y,
                     float* __restrict__ states, M3Dims d) {
    M3W_DISPATCH(m3w_fwd, float, q, k, proj, dt, adt, lam, qk_raw, dskip, y, states, d);
}

extern "C" __global__ void __launch_bounds__(M3W_WARPS * 32)
    m3_wscan_fwd_bf16qk(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                        const float* __restrict__ proj, const float* __restrict__ dt, const float* __restrict__ adt,
                        const float* __restrict__ lam, const float* __restrict__ qk_raw,
                        const float* __restrict__ dskip, float* __restrict__ y, float* __restrict__ states,
                        M3Dims d) {
    M3W_DISPATCH(m3w_fwd, __nv_bfloat16, q, k, proj, dt, adt, lam, qk_raw, dskip, y, states, d);
}

// Same parameters as m3_scan_bwd_*; `states` is not read (the forward sweep
// rebuilds every state from the start of the window).
extern "C" __global__ void __launch_bounds__(M3W_WARPS * 32)
    m3_wscan_bwd_f32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ proj,
                     const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                     const float* __restrict__ qk_raw, const float* __restrict__ dskip,
                     const float* __restrict__ states, const float* __restrict__ dy, float* __restrict__ dq,
                     float* __restrict__ dk, float* __restrict__ dproj, float* __restrict__ dadt,
                     float* __restrict__ dscale, float* __restrict__ dqkdot, float* __restrict__ dskip_part,
                     M3Dims d) {
    M3W_DISPATCH(m3w_bwd, float, q, k, proj, dt, adt, lam, qk_raw, dskip, dy, dq, dk, dproj, dadt, dscale, dqkdot,
                 dskip_part, d);
}

extern "C" __global__ void __launch_bounds__(M3W_WARPS * 32)
    m3_wscan_bwd_bf16qk(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                        const float* __restrict__ proj, const float* __restrict__ dt, const float* __restrict__ adt,
                        const float* __restrict__ lam, const float* __restrict__ qk_raw,
                        const float* __restrict__ dskip, const float* __restrict__ states,
                        const float* __restrict__ dy, float* __restrict__ dq, float* __restrict__ dk,
                        float* __restrict__ dproj, float* __restrict__ dadt, float* __restrict__ dscale,
                        float* __restrict__ dqkdot, float* __restrict__ dskip_part, M3Dims d) {
    M3W_DISPATCH(m3w_bwd, __nv_bfloat16, q, k, proj, dt, adt, lam, qk_raw, dskip, dy, dq, dk, dproj, dadt, dscale,
                 dqkdot, dskip_part, d);
}
