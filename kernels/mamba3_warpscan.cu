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
// A row may pack several sequences: resets[b * len + t] != 0 marks the first
// token of one, where a_t = 0 (the state and the trapezoid's previous-token
// term, folded into the previous token's key scale, are dropped), and the
// reverse sweep's suffix sum restarts with dadt_t = 0 (adt_t does not reach
// the loss there). The angles need nothing: only their differences within
// a sequence reach the scan. The kernels read resets only with has_resets
// set (else it may be any buffer: no sequence starts).
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
#define M3W_FULL 0xffffffffu

__device__ __forceinline__ float m3w_sum_n(float v) {
    v += __shfl_xor_sync(M3W_FULL, v, 1);
    v += __shfl_xor_sync(M3W_FULL, v, 2);
    v += __shfl_xor_sync(M3W_FULL, v, 4);
    return v;
}

__device__ __forceinline__ float m3w_sum_p(float v) {
    v += __shfl_xor_sync(M3W_FULL, v, 8);
    v += __shfl_xor_sync(M3W_FULL, v, 16);
    return v;
}

// NN consecutive q/k values from a 16-byte (f32) or 8-byte (bf16) aligned
// address: the wrapper checks the buffers, and rows are N = 8 NN long.
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
        v[j] = __uint_as_float(x.x << 16);
        v[j + 1] = __uint_as_float(x.x & 0xffff0000u);
        v[j + 2] = __uint_as_float(x.y << 16);
        v[j + 3] = __uint_as_float(x.y & 0xffff0000u);
    }
}

template <int NN>
__device__ __forceinline__ void m3w_store(float* __restrict__ p, const float (&v)[NN]) {
#pragma unroll
    for (int j = 0; j < NN; j += 4) {
        *reinterpret_cast<float4*>(p + j) = make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
    }
}

// Lane ng == i writes element i of its lane group's PP values (PP <= 8), so
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

// The per-token scalars of one group of 32 tokens, lane l holding token
// base + l's: raw loads for the next group are issued when a group starts,
// so their latency is spent on the 32 tokens before their use, and each
// token's decay, skip weight and key scale reach the warp as three
// shuffles instead of six loads and an expf on every lane.
struct M3wRaw {
    float adt, lam, dt, qkr, dtn, lamn, rst;
};

// Whether token t of row b starts a sequence (resets may be null).
__device__ __forceinline__ bool m3w_starts(const float* __restrict__ resets, unsigned b, unsigned t,
                                           const M3Dims& d) {
    return resets != nullptr && resets[(unsigned long long)b * d.len + t] != 0.0f;
}

struct M3wScal {
    float a, dg, sc;
};

__device__ __forceinline__ void m3w_raw_load(M3wRaw& r, const float* __restrict__ dt,
                                             const float* __restrict__ adt, const float* __restrict__ lam,
                                             const float* __restrict__ qk_raw, const float* __restrict__ resets,
                                             unsigned base, unsigned lane, unsigned b, unsigned h, const M3Dims& d) {
    const unsigned t = base + lane;
    r = M3wRaw{0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0.0f};
    if (t < d.len) {
        r.rst = m3w_starts(resets, b, t, d) ? 1.0f : 0.0f;
        const unsigned long long rh = ((unsigned long long)b * d.len + t) * d.nheads + h;
        r.adt = adt[rh];
        r.lam = lam[rh];
        r.dt = dt[rh];
        r.qkr = qk_raw[rh];
        if (t + 1 < d.len) {
            r.dtn = dt[rh + d.nheads];
            r.lamn = lam[rh + d.nheads];
        }
    }
}

// a = e^{adt} (0 where a sequence starts), dg = D + lam dt qk_raw, scale =
// lam dt + dt' (1 - lam') with the next token's dt' and lam' (none after the
// last: 0 x (1 - 1) adds 0; before a sequence start the next a = 0 drops it).
__device__ __forceinline__ M3wScal m3w_scal(const M3wRaw& r, float dskip_h) {
    const float s = r.lam * r.dt;
    return M3wScal{r.rst != 0.0f ? 0.0f : expf(r.adt), fmaf(s, r.qkr, dskip_h), s + r.dtn * (1.0f - r.lamn)};
}

__device__ __forceinline__ M3wScal m3w_bcast(const M3wScal& g, unsigned t) {
    const int src = (int)(t % 32);
    return M3wScal{__shfl_sync(M3W_FULL, g.a, src), __shfl_sync(M3W_FULL, g.dg, src),
                   __shfl_sync(M3W_FULL, g.sc, src)};
}

// One token's vector operands for this lane, fetched one token ahead.
template <int PP, int NN>
struct M3wTok {
    float q[NN], k[NN];   // k unscaled: k~ = scale k
    float v[PP];
};

// Where this lane reads and writes token t: pointers into row (b, t),
// advanced a token at a time rather than recomputed from the row index.
template <typename TQK>
struct M3wPtrs {
    const TQK* q;
    const TQK* k;
    const float* v;    // proj's x columns
    float* y;
};

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

template <typename TQK>
__device__ __forceinline__ void m3w_advance(M3wPtrs<TQK>& p, const M3Dims& d) {
    const unsigned long long hn = (unsigned long long)d.nheads * d.d_state;
    p.q += hn;
    p.k += hn;
    p.v += d.width;
    p.y += d.d_inner;
}

template <typename TQK, int PP, int NN>
__device__ __forceinline__ void m3w_fetch(M3wTok<PP, NN>& o, const M3wPtrs<TQK>& p) {
    m3w_load<NN>(p.q, o.q);
    m3w_load<NN>(p.k, o.k);
#pragma unroll
    for (int i = 0; i < PP; ++i) {
        o.v[i] = p.v[i];
    }
}

template <int PP, int NN>
__device__ __forceinline__ void m3w_zero(float (&s)[PP][NN]) {
#pragma unroll
    for (int i = 0; i < PP; ++i) {
#pragma unroll
        for (int j = 0; j < NN; ++j) {
            s[i][j] = 0.0f;
        }
    }
}

// One forward token: store the state entering a chunk, y_t = a D q + dg v
// (D = S_{t-1}), then S <- a S + v (sc k)^T.
template <int PP, int NN>
__device__ __forceinline__ void m3w_fwd_token(float (&s)[PP][NN], const M3wTok<PP, NN>& o, const M3wScal& c,
                                              float* y, float*& st, unsigned& into_chunk, const M3wLane& w,
                                              const M3Dims& d) {
    if (into_chunk == 0) {
#pragma unroll
        for (int i = 0; i < PP; ++i) {
            m3w_store<NN>(st + (unsigned long long)i * d.d_state, s[i]);
        }
        st += (unsigned long long)d.headdim * d.d_state;
    }
    if (++into_chunk == d.chunk) {
        into_chunk = 0;
    }
    float out[PP];
#pragma unroll
    for (int i = 0; i < PP; ++i) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < NN; ++j) {
            acc = fmaf(s[i][j], o.q[j], acc);
        }
        out[i] = fmaf(c.a, m3w_sum_n(acc), c.dg * o.v[i]);
    }
    m3w_store_p<PP>(y, out, w.ng);
    float ks[NN];
#pragma unroll
    for (int j = 0; j < NN; ++j) {
        ks[j] = c.sc * o.k[j];
    }
#pragma unroll
    for (int i = 0; i < PP; ++i) {
#pragma unroll
        for (int j = 0; j < NN; ++j) {
            s[i][j] = fmaf(c.a, s[i][j], o.v[i] * ks[j]);
        }
    }
}

// The forward walk: operands fetched one token ahead into the other of two
// buffers (no copy between them), the group scalars refreshed every 32
// tokens.
template <typename TQK, int PP, int NN>
__device__ void m3w_fwd(const TQK* __restrict__ q, const TQK* __restrict__ k, const float* __restrict__ proj,
                        const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                        const float* __restrict__ qk_raw, const float* __restrict__ resets,
                        const float* __restrict__ dskip, float* __restrict__ y, float* __restrict__ states,
                        const M3Dims& d) {
    const M3wLane w = m3w_lane(d);
    if (w.bh >= d.batch * d.nheads || d.len == 0) {
        return;
    }
    const unsigned n = d.len;
    const float dskip_h = dskip[w.h];
    float s[PP][NN];
    m3w_zero(s);
    float* st = states + ((unsigned long long)w.bh * d.nchunks * d.headdim + w.pg * PP) * d.d_state + w.ng * NN;
    unsigned into_chunk = 0;
    const unsigned long long r0 = (unsigned long long)w.b * n;
    const unsigned long long qk0 = (r0 * d.nheads + w.h) * d.d_state + w.ng * NN;
    const unsigned long long col = (unsigned long long)w.h * d.headdim + w.pg * PP;
    M3wPtrs<TQK> at{q + qk0, k + qk0, proj + r0 * d.width + d.off_x + col, y + r0 * d.d_inner + col};
    M3wPtrs<TQK> ahead = at;
    M3wRaw raw;
    m3w_raw_load(raw, dt, adt, lam, qk_raw, resets, 0, w.lane, w.b, w.h, d);
    M3wScal group = m3w_scal(raw, dskip_h);
    if (32 < n) {
        m3w_raw_load(raw, dt, adt, lam, qk_raw, resets, 32, w.lane, w.b, w.h, d);
    }
    M3wTok<PP, NN> x0, x1;
    m3w_fetch<TQK, PP, NN>(x0, ahead);
    for (unsigned t = 0; t < n; t += 2) {
        // Token t is in x0; token t + 1 goes to x1, token t + 2 to x0.
        if (t + 1 < n) {
            m3w_advance(ahead, d);
            m3w_fetch<TQK, PP, NN>(x1, ahead);
        }
        if (t % 32 == 0 && t > 0) {
            group = m3w_scal(raw, dskip_h);
            if (t + 32 < n) {
                m3w_raw_load(raw, dt, adt, lam, qk_raw, resets, t + 32, w.lane, w.b, w.h, d);
            }
        }
        m3w_fwd_token(s, x0, m3w_bcast(group, t), at.y, st, into_chunk, w, d);
        m3w_advance(at, d);
        if (t + 1 >= n) {
            break;
        }
        if (t + 2 < n) {
            m3w_advance(ahead, d);
            m3w_fetch<TQK, PP, NN>(x0, ahead);
        }
        m3w_fwd_token(s, x1, m3w_bcast(group, t + 1), at.y, st, into_chunk, w, d);
        m3w_advance(at, d);
    }
}

// The backward pass walks token by token too, but each token's scalars are
// loaded and computed on every lane, one token ahead with its vectors
// (m3w_fetch_s), and its addresses recomputed from the row index: written
// like the forward walk (group scalars, moving pointers, two buffers), its
// two walks measured slower on the H200, the bf16 one by a fifth
// (BENCHMARKS.md, "a warp per head").
template <int PP, int NN>
struct M3wTokS {
    float q[NN], k[NN];   // k unscaled: k~ = sc k
    float v[PP], dy[PP];
    float a, dg, sc;
    bool starts;   // the token starts a sequence (a = 0)
};

template <typename TQK, int PP, int NN>
__device__ __forceinline__ void m3w_fetch_s(M3wTokS<PP, NN>& o, const TQK* __restrict__ q, const TQK* __restrict__ k,
                                          const float* __restrict__ proj, const float* __restrict__ dt,
                                          const float* __restrict__ adt, const float* __restrict__ lam,
                                          const float* __restrict__ qk_raw, const float* __restrict__ resets,
                                          const float* __restrict__ dy, float dskip_h, const M3wLane& w, unsigned t,
                                          const M3Dims& d) {
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
    o.starts = m3w_starts(resets, w.b, t, d);
    o.a = o.starts ? 0.0f : expf(adt[rh]);
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

template <typename TQK, int PP, int NN>
__device__ void m3w_bwd(const TQK* __restrict__ q, const TQK* __restrict__ k, const float* __restrict__ proj,
                        const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                        const float* __restrict__ qk_raw, const float* __restrict__ resets,
                        const float* __restrict__ dskip, const float* __restrict__ dy, float* __restrict__ dq,
                        float* __restrict__ dk, float* __restrict__ dproj, float* __restrict__ dadt,
                        float* __restrict__ dscale, float* __restrict__ dqkdot, float* __restrict__ dskip_part,
                        const M3Dims& d) {
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
    M3wTokS<PP, NN> cur, nxt;
    // Forward sweep: dq_t = a_t S_{t-1}^T dy_t, and q_t . dq_t parked in dadt.
    m3w_fetch_s<TQK, PP, NN>(cur, q, k, proj, dt, adt, lam, qk_raw, resets, dy, dskip_h, w, 0, d);
    for (unsigned t = 0; t < d.len; ++t) {
        if (t + 1 < d.len) {
            m3w_fetch_s<TQK, PP, NN>(nxt, q, k, proj, dt, adt, lam, qk_raw, resets, dy, dskip_h, w, t + 1, d);
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
    m3w_fetch_s<TQK, PP, NN>(cur, q, k, proj, dt, adt, lam, qk_raw, resets, dy, dskip_h, w, last, d);
    for (unsigned t = last + 1; t-- > 0;) {
        if (t > 0) {
            m3w_fetch_s<TQK, PP, NN>(nxt, q, k, proj, dt, adt, lam, qk_raw, resets, dy, dskip_h, w, t - 1, d);
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
            // A sequence's start ends the suffix of the one before it.
            dcs_acc = cur.starts ? 0.0f : dcs_acc + (dadt[rh] - vgk);
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
                     const float* __restrict__ qk_raw, const float* __restrict__ resets, unsigned has_resets,
                     const float* __restrict__ dskip, float* __restrict__ y, float* __restrict__ states, M3Dims d) {
    const float* starts = has_resets != 0 ? resets : nullptr;
    M3W_DISPATCH(m3w_fwd, float, q, k, proj, dt, adt, lam, qk_raw, starts, dskip, y, states, d);
}

extern "C" __global__ void __launch_bounds__(M3W_WARPS * 32)
    m3_wscan_fwd_bf16qk(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                        const float* __restrict__ proj, const float* __restrict__ dt, const float* __restrict__ adt,
                        const float* __restrict__ lam, const float* __restrict__ qk_raw,
                        const float* __restrict__ resets, unsigned has_resets, const float* __restrict__ dskip,
                        float* __restrict__ y, float* __restrict__ states, M3Dims d) {
    const float* starts = has_resets != 0 ? resets : nullptr;
    M3W_DISPATCH(m3w_fwd, __nv_bfloat16, q, k, proj, dt, adt, lam, qk_raw, starts, dskip, y, states, d);
}

// The parameters of m3_scan_bwd_* with `resets` and `has_resets` after
// qk_raw (without has_resets the flags are not read); `states` is not
// read (the forward sweep rebuilds every state from the start of the window).
extern "C" __global__ void __launch_bounds__(M3W_WARPS * 32)
    m3_wscan_bwd_f32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ proj,
                     const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                     const float* __restrict__ qk_raw, const float* __restrict__ resets, unsigned has_resets,
                     const float* __restrict__ dskip, const float* __restrict__ states, const float* __restrict__ dy,
                     float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dproj,
                     float* __restrict__ dadt, float* __restrict__ dscale, float* __restrict__ dqkdot,
                     float* __restrict__ dskip_part, M3Dims d) {
    const float* starts = has_resets != 0 ? resets : nullptr;
    M3W_DISPATCH(m3w_bwd, float, q, k, proj, dt, adt, lam, qk_raw, starts, dskip, dy, dq, dk, dproj, dadt, dscale,
                 dqkdot, dskip_part, d);
}

extern "C" __global__ void __launch_bounds__(M3W_WARPS * 32)
    m3_wscan_bwd_bf16qk(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                        const float* __restrict__ proj, const float* __restrict__ dt, const float* __restrict__ adt,
                        const float* __restrict__ lam, const float* __restrict__ qk_raw,
                        const float* __restrict__ resets, unsigned has_resets, const float* __restrict__ dskip,
                        const float* __restrict__ states, const float* __restrict__ dy, float* __restrict__ dq,
                        float* __restrict__ dk, float* __restrict__ dproj, float* __restrict__ dadt,
                        float* __restrict__ dscale, float* __restrict__ dqkdot, float* __restrict__ dskip_part,
                        M3Dims d) {
    const float* starts = has_resets != 0 ? resets : nullptr;
    M3W_DISPATCH(m3w_bwd, __nv_bfloat16, q, k, proj, dt, adt, lam, qk_raw, starts, dskip, dy, dq, dk, dproj, dadt,
                 dscale, dqkdot, dskip_part, d);
}
