// The chunked ("shifted scale") Mamba-3 SISO scan, forward and backward, one
// thread block per (batch row, head) walking every chunk of the window in
// order (forward) or in reverse (backward), as the official kernel does.
//
// Per chunk [c0, c0 + L), with cs_t the inclusive cumsum of adt inside the
// chunk, S_c the state entering it, k~_s = scale_s k_s and
// dg_t = D + gamma_t (q̂_t · k̂_t):
//   y_t     = e^{cs_t} S_c q_t + sum_{s<t} e^{cs_t - cs_s} (q_t · k~_s) v_s + dg_t v_t
//   S_{c+1} = e^{cs_last} S_c + sum_s e^{cs_last - cs_s} v_s k~_s^T
// The window starts from a zero state (a training step carries none). The
// forward pass stores every S_c; the backward pass reads them back and
// carries G = dL/dS_{c+1} from the last chunk to the first.
//
// Shared memory is dynamic (sized by the wrapper from P, N and C); rows of
// N-wide tiles are padded to N + 1 floats so column walks avoid bank conflicts.
// All sums run in a fixed order: results are bit-identical run to run.
#include <cuda_bf16.h>
#include "mamba3_common.cuh"

// Threads per scan block. One block per (batch row, head) fills one SM (the
// shared memory allows no second block), so the block brings its own
// latency hiding: 32 warps. The Rust wrapper launches the same count
// (kernels/mamba3.rs, SCAN_THREADS).
#define M3_SCAN_THREADS 1024

// Sum over the scan block: shuffle tree per warp, then warp 0 folds the 32
// warp sums in order. Every thread must call it and gets the result; `s`
// holds M3_SCAN_THREADS / 32 floats.
__device__ __forceinline__ float m3_scan_block_sum(float v, float* s) {
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = sg_warp_sum(v);
    __syncthreads();
    if (lane == 0) {
        s[warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        float w = lane < M3_SCAN_THREADS / 32 ? s[lane] : 0.0f;
        w = sg_warp_sum(w);
        if (lane == 0) {
            s[0] = w;
        }
    }
    __syncthreads();
    float r = s[0];
    __syncthreads();
    return r;
}

__device__ __forceinline__ float m3_scale(const float* dt, const float* lam, unsigned long long rh, unsigned t,
                                          unsigned len, unsigned nheads) {
    float s = lam[rh] * dt[rh];
    if (t + 1 < len) {
        unsigned long long nx = rh + nheads;
        s += dt[nx] * (1.0f - lam[nx]);
    }
    return s;
}

template <typename T, typename TQK>
__device__ void scan_fwd(const TQK* __restrict__ q, const TQK* __restrict__ k, const T* __restrict__ proj,
                         const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                         const float* __restrict__ qk_raw, const float* __restrict__ dskip, T* __restrict__ y,
                         float* __restrict__ states, M3Dims d) {
    extern __shared__ float sm[];
    const unsigned P = d.headdim, N = d.d_state, C = d.chunk, NS = N + 1;
    float* S = sm;             // P x NS
    float* Q = S + P * NS;     // C x NS
    float* K = Q + C * NS;     // C x NS, scaled keys
    float* V = K + C * NS;     // C x P
    float* W = V + C * P;      // C x C, scores incl. diagonal
    float* cs = W + C * C;     // C
    float* dg = cs + C;        // C
    float* dl = dg + C;        // C, e^{cs_last - cs_s}
    const unsigned tid = threadIdx.x;
    const unsigned bh = blockIdx.x, b = bh / d.nheads, h = bh % d.nheads;
    const float dh = dskip[h];
    for (unsigned i = tid; i < P * NS; i += M3_SCAN_THREADS) {
        S[i] = 0.0f;
    }
    for (unsigned c = 0; c < d.nchunks; ++c) {
        const unsigned c0 = c * C, L = min(C, d.len - c0);
        const unsigned long long row0 = (unsigned long long)b * d.len + c0;
        for (unsigned i = tid; i < L * N; i += M3_SCAN_THREADS) {
            unsigned t = i / N, n = i % N;
            unsigned long long rh = (row0 + t) * d.nheads + h;
            Q[t * NS + n] = (float)q[rh * N + n];
            K[t * NS + n] = m3_scale(dt, lam, rh, c0 + t, d.len, d.nheads) * (float)k[rh * N + n];
        }
        for (unsigned i = tid; i < L * P; i += M3_SCAN_THREADS) {
            unsigned t = i / P, p = i % P;
            V[i] = (float)proj[(row0 + t) * d.width + d.off_x + h * P + p];
        }
        for (unsigned t = tid; t < L; t += M3_SCAN_THREADS) {
            unsigned long long rh = (row0 + t) * d.nheads + h;
            dg[t] = dh + lam[rh] * dt[rh] * qk_raw[rh];
            cs[t] = adt[rh];
        }
        __syncthreads();
        // The chunk's cumsum is short and serial; staging adt first keeps
        // global latency out of it.
        if (tid == 0) {
            float acc = 0.0f;
            for (unsigned t = 0; t < L; ++t) {
                acc += cs[t];
                cs[t] = acc;
            }
        }
        __syncthreads();
        for (unsigned t = tid; t < L; t += M3_SCAN_THREADS) {
            dl[t] = expf(cs[L - 1] - cs[t]);
        }
        float* st = states + ((unsigned long long)bh * d.nchunks + c) * P * N;
        for (unsigned i = tid; i < P * N; i += M3_SCAN_THREADS) {
            st[i] = S[(i / N) * NS + i % N];
        }
        __syncthreads();
        for (unsigned i = tid; i < L * L; i += M3_SCAN_THREADS) {
            unsigned t = i / L, s = i % L;
            float w = 0.0f;
            if (s < t) {
                float acc = 0.0f;
                for (unsigned n = 0; n < N; ++n) {
                    acc = fmaf(Q[t * NS + n], K[s * NS + n], acc);
                }
                w = expf(cs[t] - cs[s]) * acc;
            } else if (s == t) {
                w = dg[t];
            }
            W[t * C + s] = w;
        }
        __syncthreads();
        for (unsigned i = tid; i < L * P; i += M3_SCAN_THREADS) {
            unsigned t = i / P, p = i % P;
            float inter = 0.0f;
            for (unsigned n = 0; n < N; ++n) {
                inter = fmaf(S[p * NS + n], Q[t * NS + n], inter);
            }
            float acc = expf(cs[t]) * inter;
            for (unsigned s = 0; s <= t; ++s) {
                acc = fmaf(W[t * C + s], V[s * P + p], acc);
            }
            y[(row0 + t) * d.d_inner + h * P + p] = (T)acc;
        }
        __syncthreads();
        const float total = expf(cs[L - 1]);
        for (unsigned i = tid; i < P * N; i += M3_SCAN_THREADS) {
            unsigned p = i / N, n = i % N;
            float acc = total * S[p * NS + n];
            for (unsigned s = 0; s < L; ++s) {
                acc = fmaf(dl[s] * V[s * P + p], K[s * NS + n], acc);
            }
            S[p * NS + n] = acc;
        }
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(M3_SCAN_THREADS)
    m3_scan_fwd_f32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ proj,
                    const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                    const float* __restrict__ qk_raw, const float* __restrict__ dskip, float* __restrict__ y,
                    float* __restrict__ states, M3Dims d) {
    scan_fwd<float, float>(q, k, proj, dt, adt, lam, qk_raw, dskip, y, states, d);
}

// The mixed step's scalar scan (shapes the chunk scan does not take): its
// rotated q/k are stored in bf16, everything else is f32.
extern "C" __global__ void __launch_bounds__(M3_SCAN_THREADS)
    m3_scan_fwd_bf16qk(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                       const float* __restrict__ proj, const float* __restrict__ dt, const float* __restrict__ adt,
                       const float* __restrict__ lam, const float* __restrict__ qk_raw,
                       const float* __restrict__ dskip, float* __restrict__ y, float* __restrict__ states, M3Dims d) {
    scan_fwd<float, __nv_bfloat16>(q, k, proj, dt, adt, lam, qk_raw, dskip, y, states, d);
}

// Backward of the chunked scan. Outputs, per (row, head): dq and dk (with
// respect to the rotated, unscaled q and k) [rows, H, N]; dv into the x
// columns of dproj; dadt, dscale (dL/d scale_t) and dqkdot (dL/d dg_t, which
// is also the D gradient's summand) [rows, H]; and dskip_part[b * H + h] =
// dL/dD summed over the row's window.
template <typename T, typename TQK>
__device__ void scan_bwd(const TQK* __restrict__ q, const TQK* __restrict__ k, const T* __restrict__ proj,
                         const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                         const float* __restrict__ qk_raw, const float* __restrict__ dskip,
                         const float* __restrict__ states, const T* __restrict__ dy, float* __restrict__ dq,
                         float* __restrict__ dk, T* __restrict__ dproj, float* __restrict__ dadt,
                         float* __restrict__ dscale, float* __restrict__ dqkdot, float* __restrict__ dskip_part,
                         M3Dims d) {
    extern __shared__ float sm[];
    const unsigned P = d.headdim, N = d.d_state, C = d.chunk, NS = N + 1, CS = C + 1;
    float* G = sm;             // P x NS, dL/dS_{c+1}
    float* Q = G + P * NS;     // C x NS
    float* K = Q + C * NS;     // C x NS, scaled keys
    float* DK = K + C * NS;    // C x NS, scratch: e^{cs_t} S_c^T dy_t, then dk~
    float* V = DK + C * NS;    // C x P
    float* DY = V + C * P;     // C x P
    float* GK = DY + C * P;    // C x P, e^{cs_last - cs_s} G k~_s
    // C x CS each. Lower triangle (s < t): QK = E_ts (q_t . k~_s) and
    // DV = E_ts (dy_t . v_s), with E_ts = e^{cs_t - cs_s}. QK's upper
    // triangle holds the pair weight w_ts = E_ts (q_t . k~_s)(dy_t . v_s) at
    // [s][t], which drives cs_t up and cs_s down.
    float* QK = GK + C * P;
    float* DV = QK + C * CS;
    float* cs = DV + C * CS;   // C
    float* dl = cs + C;        // C, e^{cs_last - cs_s}
    float* ecs = dl + C;       // C, e^{cs_t}
    float* dg = ecs + C;       // C, D + gamma qk_raw
    float* sc = dg + C;        // C, scale
    float* dcs = sc + C;       // C
    float* vgk = dcs + C;      // C, v_t . GK_t
    float* dyv = vgk + C;      // C, dy_t . v_t
    float* red = dyv + C;      // M3_SCAN_THREADS / 32
    const unsigned tid = threadIdx.x;
    const unsigned bh = blockIdx.x, b = bh / d.nheads, h = bh % d.nheads;
    const float dh = dskip[h];
    float dd_acc = 0.0f;
    for (unsigned i = tid; i < P * NS; i += M3_SCAN_THREADS) {
        G[i] = 0.0f;
    }
    for (unsigned cc = d.nchunks; cc-- > 0;) {
        const unsigned c0 = cc * C, L = min(C, d.len - c0);
        const unsigned long long row0 = (unsigned long long)b * d.len + c0;
        const float* st = states + ((unsigned long long)bh * d.nchunks + cc) * P * N;
        for (unsigned t = tid; t < L; t += M3_SCAN_THREADS) {
            unsigned long long rh = (row0 + t) * d.nheads + h;
            sc[t] = m3_scale(dt, lam, rh, c0 + t, d.len, d.nheads);
            dg[t] = dh + lam[rh] * dt[rh] * qk_raw[rh];
            cs[t] = adt[rh];
        }
        __syncthreads();
        if (tid == 0) {
            float acc = 0.0f;
            for (unsigned t = 0; t < L; ++t) {
                acc += cs[t];
                cs[t] = acc;
            }
        }
        __syncthreads();
        for (unsigned t = tid; t < L; t += M3_SCAN_THREADS) {
            dl[t] = expf(cs[L - 1] - cs[t]);
            ecs[t] = expf(cs[t]);
        }
        __syncthreads();
        for (unsigned i = tid; i < L * N; i += M3_SCAN_THREADS) {
            unsigned t = i / N, n = i % N;
            unsigned long long rh = (row0 + t) * d.nheads + h;
            Q[t * NS + n] = (float)q[rh * N + n];
            K[t * NS + n] = sc[t] * (float)k[rh * N + n];
        }
        for (unsigned i = tid; i < L * P; i += M3_SCAN_THREADS) {
            unsigned t = i / P, p = i % P;
            V[i] = (float)proj[(row0 + t) * d.width + d.off_x + h * P + p];
            DY[i] = (float)dy[(row0 + t) * d.d_inner + h * P + p];
        }
        __syncthreads();
        for (unsigned i = tid; i < L * L; i += M3_SCAN_THREADS) {
            unsigned t = i / L, s = i % L;
            if (s < t) {
                float a = 0.0f, bb = 0.0f;
                for (unsigned n = 0; n < N; ++n) {
                    a = fmaf(Q[t * NS + n], K[s * NS + n], a);
                }
                for (unsigned p = 0; p < P; ++p) {
                    bb = fmaf(DY[t * P + p], V[s * P + p], bb);
                }
                const float e = expf(cs[t] - cs[s]);
                QK[t * CS + s] = e * a;
                DV[t * CS + s] = e * bb;
                QK[s * CS + t] = e * a * bb;
            } else {
                DV[t * CS + s] = 0.0f;
                if (s == t) {
                    QK[t * CS + t] = 0.0f;
                }
            }
        }
        for (unsigned i = tid; i < L * N; i += M3_SCAN_THREADS) {
            unsigned t = i / N, n = i % N;
            float acc = 0.0f;
            for (unsigned p = 0; p < P; ++p) {
                acc = fmaf(DY[t * P + p], st[p * N + n], acc);
            }
            DK[t * NS + n] = ecs[t] * acc;
        }
        __syncthreads();
        // dq, and the inter-chunk part of dcs.
        for (unsigned i = tid; i < L * N; i += M3_SCAN_THREADS) {
            unsigned t = i / N, n = i % N;
            float acc = DK[t * NS + n];
            for (unsigned s = 0; s < t; ++s) {
                acc = fmaf(DV[t * CS + s], K[s * NS + n], acc);
            }
            dq[((row0 + t) * d.nheads + h) * N + n] = acc;
        }
        for (unsigned t = tid; t < L; t += M3_SCAN_THREADS) {
            float acc = 0.0f;
            for (unsigned n = 0; n < N; ++n) {
                acc = fmaf(Q[t * NS + n], DK[t * NS + n], acc);
            }
            dcs[t] = acc;
        }
        __syncthreads();
        // dk~ = intra-chunk part + e^{cs_last - cs_s} G^T v_s.
        for (unsigned i = tid; i < L * N; i += M3_SCAN_THREADS) {
            unsigned s = i / N, n = i % N;
            float acc = 0.0f;
            for (unsigned t = s + 1; t < L; ++t) {
                acc = fmaf(DV[t * CS + s], Q[t * NS + n], acc);
            }
            float gv = 0.0f;
            for (unsigned p = 0; p < P; ++p) {
                gv = fmaf(G[p * NS + n], V[s * P + p], gv);
            }
            DK[s * NS + n] = fmaf(dl[s], gv, acc);
        }
        // dv = intra-chunk part + dg_s dy_s + e^{cs_last - cs_s} G k~_s.
        for (unsigned i = tid; i < L * P; i += M3_SCAN_THREADS) {
            unsigned s = i / P, p = i % P;
            float acc = 0.0f;
            for (unsigned t = s + 1; t < L; ++t) {
                acc = fmaf(QK[t * CS + s], DY[t * P + p], acc);
            }
            float gk = 0.0f;
            for (unsigned n = 0; n < N; ++n) {
                gk = fmaf(G[p * NS + n], K[s * NS + n], gk);
            }
            gk *= dl[s];
            GK[s * P + p] = gk;
            acc = fmaf(dg[s], DY[s * P + p], acc) + gk;
            dproj[(row0 + s) * d.width + d.off_x + h * P + p] = (T)acc;
        }
        __syncthreads();
        for (unsigned i = tid; i < L * N; i += M3_SCAN_THREADS) {
            unsigned s = i / N, n = i % N;
            dk[((row0 + s) * d.nheads + h) * N + n] = sc[s] * DK[s * NS + n];
        }
        float part = 0.0f;
        for (unsigned i = tid; i < P * N; i += M3_SCAN_THREADS) {
            part = fmaf(G[(i / N) * NS + i % N], st[i], part);
        }
        const float total = expf(cs[L - 1]);
        const float gs = total * m3_scan_block_sum(part, red);
        for (unsigned t = tid; t < L; t += M3_SCAN_THREADS) {
            unsigned long long rh = (row0 + t) * d.nheads + h;
            float pairs = 0.0f;
            for (unsigned s = 0; s < t; ++s) {
                pairs += QK[s * CS + t];
            }
            for (unsigned u = t + 1; u < L; ++u) {
                pairs -= QK[t * CS + u];
            }
            float vg = 0.0f, yv = 0.0f;
            for (unsigned p = 0; p < P; ++p) {
                vg = fmaf(V[t * P + p], GK[t * P + p], vg);
                yv = fmaf(DY[t * P + p], V[t * P + p], yv);
            }
            float ds = 0.0f;
            for (unsigned n = 0; n < N; ++n) {
                ds = fmaf(DK[t * NS + n], (float)k[rh * N + n], ds);
            }
            dcs[t] += pairs - vg;
            dqkdot[rh] = yv;
            dscale[rh] = ds;
            vgk[t] = vg;
            dyv[t] = yv;
        }
        __syncthreads();
        if (tid == 0) {
            // The last position also drives e^{cs_last} in front of S_c and
            // of every e^{cs_last - cs_s}.
            float sum_vgk = 0.0f;
            for (unsigned t = 0; t < L; ++t) {
                sum_vgk += vgk[t];
                dd_acc += dyv[t];
            }
            dcs[L - 1] += gs + sum_vgk;
            float acc = 0.0f;
            for (unsigned t = L; t-- > 0;) {
                acc += dcs[t];
                dadt[(row0 + t) * d.nheads + h] = acc;
            }
        }
        // G <- dL/dS_c = e^{cs_last} G + sum_t e^{cs_t} dy_t q_t^T.
        for (unsigned i = tid; i < P * N; i += M3_SCAN_THREADS) {
            unsigned p = i / N, n = i % N;
            float acc = total * G[p * NS + n];
            for (unsigned t = 0; t < L; ++t) {
                acc = fmaf(ecs[t] * DY[t * P + p], Q[t * NS + n], acc);
            }
            G[p * NS + n] = acc;
        }
        __syncthreads();
    }
    if (tid == 0) {
        dskip_part[bh] = dd_acc;
    }
}

extern "C" __global__ void __launch_bounds__(M3_SCAN_THREADS)
    m3_scan_bwd_f32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ proj,
                    const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                    const float* __restrict__ qk_raw, const float* __restrict__ dskip,
                    const float* __restrict__ states, const float* __restrict__ dy, float* __restrict__ dq,
                    float* __restrict__ dk, float* __restrict__ dproj, float* __restrict__ dadt,
                    float* __restrict__ dscale, float* __restrict__ dqkdot, float* __restrict__ dskip_part,
                    M3Dims d) {
    scan_bwd<float, float>(q, k, proj, dt, adt, lam, qk_raw, dskip, states, dy, dq, dk, dproj, dadt, dscale, dqkdot,
                           dskip_part, d);
}

extern "C" __global__ void __launch_bounds__(M3_SCAN_THREADS)
    m3_scan_bwd_bf16qk(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                       const float* __restrict__ proj, const float* __restrict__ dt, const float* __restrict__ adt,
                       const float* __restrict__ lam, const float* __restrict__ qk_raw,
                       const float* __restrict__ dskip, const float* __restrict__ states,
                       const float* __restrict__ dy, float* __restrict__ dq, float* __restrict__ dk,
                       float* __restrict__ dproj, float* __restrict__ dadt, float* __restrict__ dscale,
                       float* __restrict__ dqkdot, float* __restrict__ dskip_part, M3Dims d) {
    scan_bwd<float, __nv_bfloat16>(q, k, proj, dt, adt, lam, qk_raw, dskip, states, dy, dq, dk, dproj, dadt, dscale,
                                   dqkdot, dskip_part, d);
}
