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
    v = m3_warp_sum(v);
    __syncthreads();
    if (lane == 0) {
        s[warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        float w = lane < M3_SCAN_THREADS / 32 ? s[lane] : 0.0f;
        w = m3_warp_sum(w);
        if (lane == 0) {
            s[0] = w;
        }
    }
    __syncthreads();
    float r = s[0];
    __syncthreads();
    return r;
}

// Rows per register tile of m3_product.
#define M3_TI 8

// out(i, j) = sum_{k0(i0) <= k < k1(i0)} a(i, k) * b(j, k) for i < I, j < J,
// handed to sink(i, j, out). Each thread owns tiles of M3_TI consecutive rows
// and one column; consecutive lanes take consecutive columns, so a(i, k) is a
// broadcast and b(j, k) a conflict-free (padded or contiguous) load: 9 loads
// feed 8 FMAs instead of 2 loads per FMA. Tiles with live(i0, j) false are
// skipped (triangular products). Every output sums k in increasing order.
template <typename FA, typename FB, typename FK0, typename FK1, typename FL, typename FS>
__device__ __forceinline__ void m3_product(unsigned I, unsigned J, FA a, FB b, FK0 k0, FK1 k1, FL live, FS sink) {
    const unsigned ti = (I + M3_TI - 1) / M3_TI;
    for (unsigned tile = threadIdx.x; tile < ti * J; tile += M3_SCAN_THREADS) {
        const unsigned i0 = (tile / J) * M3_TI, j = tile % J;
        if (!live(i0, j)) {
            continue;
        }
        float acc[M3_TI];
#pragma unroll
        for (int r = 0; r < M3_TI; ++r) {
            acc[r] = 0.0f;
        }
        const unsigned ke = k1(i0);
        for (unsigned k = k0(i0); k < ke; ++k) {
            const float bv = b(j, k);
#pragma unroll
            for (unsigned r = 0; r < M3_TI; ++r) {
                acc[r] = fmaf(i0 + r < I ? a(i0 + r, k) : 0.0f, bv, acc[r]);
            }
        }
#pragma unroll
        for (unsigned r = 0; r < M3_TI; ++r) {
            if (i0 + r < I) {
                sink(i0 + r, j, acc[r]);
            }
        }
    }
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

template <typename T>
__device__ void scan_fwd(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ proj,
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
    float* ecs = dl + C;       // C, e^{cs_t}
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
            ecs[t] = expf(cs[t]);
        }
        float* st = states + ((unsigned long long)bh * d.nchunks + c) * P * N;
        for (unsigned i = tid; i < P * N; i += M3_SCAN_THREADS) {
            st[i] = S[(i / N) * NS + i % N];
        }
        for (unsigned i = tid; i < L * L; i += M3_SCAN_THREADS) {
            unsigned t = i / L, s2 = i % L;
            if (s2 >= t) {
                W[t * C + s2] = s2 == t ? dg[t] : 0.0f;
            }
        }
        __syncthreads();
        auto zero = [](unsigned) { return 0u; };
        auto always = [](unsigned, unsigned) { return true; };
        // Strictly-lower scores W[t][s] = e^{cs_t - cs_s} (q_t . k~_s).
        m3_product(
            L, L, [&](unsigned t, unsigned n) { return Q[t * NS + n]; },
            [&](unsigned s2, unsigned n) { return K[s2 * NS + n]; }, zero, [&](unsigned) { return N; },
            [&](unsigned i0, unsigned s2) { return s2 < i0 + M3_TI - 1; },
            [&](unsigned t, unsigned s2, float acc) {
                if (s2 < t) {
                    W[t * C + s2] = expf(cs[t] - cs[s2]) * acc;
                }
            });
        __syncthreads();
        // y_t = e^{cs_t} S_c q_t + sum_{s <= t} W[t][s] v_s, as one product
        // over k = [0, N) (state) then [N, N + L) (chunk).
        m3_product(
            L, P,
            [&](unsigned t, unsigned kk) { return kk < N ? ecs[t] * Q[t * NS + kk] : W[t * C + (kk - N)]; },
            [&](unsigned p, unsigned kk) { return kk < N ? S[p * NS + kk] : V[(kk - N) * P + p]; }, zero,
            [&](unsigned i0) { return N + min(L, i0 + M3_TI); }, always,
            [&](unsigned t, unsigned p, float acc) { y[(row0 + t) * d.d_inner + h * P + p] = (T)acc; });
        __syncthreads();
        // S <- e^{cs_last} S + sum_s e^{cs_last - cs_s} v_s k~_s^T.
        const float total = expf(cs[L - 1]);
        m3_product(
            P, N, [&](unsigned p, unsigned s2) { return dl[s2] * V[s2 * P + p]; },
            [&](unsigned n, unsigned s2) { return K[s2 * NS + n]; }, zero, [&](unsigned) { return L; }, always,
            [&](unsigned p, unsigned n, float acc) { S[p * NS + n] = fmaf(total, S[p * NS + n], acc); });
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(M3_SCAN_THREADS)
    m3_scan_fwd_f32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ proj,
                    const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                    const float* __restrict__ qk_raw, const float* __restrict__ dskip, float* __restrict__ y,
                    float* __restrict__ states, M3Dims d) {
    scan_fwd<float>(q, k, proj, dt, adt, lam, qk_raw, dskip, y, states, d);
}

// Backward of the chunked scan. Outputs, per (row, head): dq and dk (with
// respect to the rotated, unscaled q and k) [rows, H, N]; dv into the x
// columns of dproj; dadt, dscale (dL/d scale_t) and dqkdot (dL/d dg_t, which
// is also the D gradient's summand) [rows, H]; and dskip_part[b * H + h] =
// dL/dD summed over the row's window.
template <typename T>
__device__ void scan_bwd(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ proj,
                         const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                         const float* __restrict__ qk_raw, const float* __restrict__ dskip,
                         const float* __restrict__ states, const T* __restrict__ dy, float* __restrict__ dq,
                         float* __restrict__ dk, T* __restrict__ dproj, float* __restrict__ dadt,
                         float* __restrict__ dscale, float* __restrict__ dqkdot, float* __restrict__ dskip_part,
                         M3Dims d) {
    extern __shared__ float sm[];
    const unsigned P = d.headdim, N = d.d_state, C = d.chunk, NS = N + 1, CS = C + 1, PS = P + 1;
    float* G = sm;             // P x NS, dL/dS_{c+1}
    float* Q = G + P * NS;     // C x NS
    float* K = Q + C * NS;     // C x NS, scaled keys
    float* DK = K + C * NS;    // C x NS, scratch: e^{cs_t} S_c^T dy_t, then dk~
    // C x PS each (rows padded: the pair products walk them by row).
    float* V = DK + C * NS;
    float* DY = V + C * PS;
    float* GK = DY + C * PS;   // e^{cs_last - cs_s} G k~_s
    // C x CS each. Lower triangle (s < t): QK = E_ts (q_t . k~_s) and
    // DV = E_ts (dy_t . v_s), with E_ts = e^{cs_t - cs_s}. QK's upper
    // triangle holds the pair weight w_ts = E_ts (q_t . k~_s)(dy_t . v_s) at
    // [s][t], which drives cs_t up and cs_s down.
    float* QK = GK + C * PS;
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
            V[t * PS + p] = (float)proj[(row0 + t) * d.width + d.off_x + h * P + p];
            DY[t * PS + p] = (float)dy[(row0 + t) * d.d_inner + h * P + p];
        }
        __syncthreads();
        for (unsigned i = tid; i < L * L; i += M3_SCAN_THREADS) {
            unsigned t = i / L, s = i % L;
            if (s >= t) {
                DV[t * CS + s] = 0.0f;
                if (s == t) {
                    QK[t * CS + t] = 0.0f;
                }
            }
        }
        auto zero = [](unsigned) { return 0u; };
        auto always = [](unsigned, unsigned) { return true; };
        auto lower = [&](unsigned i0, unsigned s) { return s < i0 + M3_TI - 1; };
        // Lower triangles, raw: QK[t][s] = q_t . k~_s, DV[t][s] = dy_t . v_s.
        m3_product(
            L, L, [&](unsigned t, unsigned n) { return Q[t * NS + n]; },
            [&](unsigned s, unsigned n) { return K[s * NS + n]; }, zero, [&](unsigned) { return N; }, lower,
            [&](unsigned t, unsigned s, float acc) {
                if (s < t) {
                    QK[t * CS + s] = acc;
                }
            });
        m3_product(
            L, L, [&](unsigned t, unsigned p) { return DY[t * PS + p]; },
            [&](unsigned s, unsigned p) { return V[s * PS + p]; }, zero, [&](unsigned) { return P; }, lower,
            [&](unsigned t, unsigned s, float acc) {
                if (s < t) {
                    DV[t * CS + s] = acc;
                }
            });
        // DK <- e^{cs_t} S_c^T dy_t (S_c read from global memory, coalesced in n).
        m3_product(
            L, N, [&](unsigned t, unsigned p) { return DY[t * PS + p]; },
            [&](unsigned n, unsigned p) { return st[p * N + n]; }, zero, [&](unsigned) { return P; }, always,
            [&](unsigned t, unsigned n, float acc) { DK[t * NS + n] = ecs[t] * acc; });
        __syncthreads();
        // Decay both lower triangles by E_ts and put the pair weight
        // w_ts = E_ts (q_t . k~_s)(dy_t . v_s) into QK's upper triangle; each
        // (t, s) cell pair belongs to one thread.
        for (unsigned i = tid; i < L * L; i += M3_SCAN_THREADS) {
            unsigned t = i / L, s = i % L;
            if (s < t) {
                const float e = expf(cs[t] - cs[s]), qk = QK[t * CS + s], dv = DV[t * CS + s];
                QK[t * CS + s] = e * qk;
                DV[t * CS + s] = e * dv;
                QK[s * CS + t] = e * qk * dv;
            }
        }
        __syncthreads();
        // dq = e^{cs_t} S_c^T dy_t + sum_{s<t} DV[t][s] k~_s.
        m3_product(
            L, N, [&](unsigned t, unsigned s) { return DV[t * CS + s]; },
            [&](unsigned n, unsigned s) { return K[s * NS + n]; }, zero,
            [&](unsigned i0) { return min(L, i0 + M3_TI); }, always,
            [&](unsigned t, unsigned n, float acc) {
                dq[((row0 + t) * d.nheads + h) * N + n] = DK[t * NS + n] + acc;
            });
        for (unsigned t = tid; t < L; t += M3_SCAN_THREADS) {
            float acc = 0.0f;
            for (unsigned n = 0; n < N; ++n) {
                acc = fmaf(Q[t * NS + n], DK[t * NS + n], acc);
            }
            dcs[t] = acc;
        }
        __syncthreads();
        // dk~_s = sum_{t>s} DV[t][s] q_t + e^{cs_last - cs_s} G^T v_s, as one
        // product over k = [0, L) then [L, L + P).
        m3_product(
            L, N,
            [&](unsigned s, unsigned kk) { return kk < L ? DV[kk * CS + s] : dl[s] * V[s * PS + (kk - L)]; },
            [&](unsigned n, unsigned kk) { return kk < L ? Q[kk * NS + n] : G[(kk - L) * NS + n]; },
            [&](unsigned i0) { return i0 + 1; }, [&](unsigned) { return L + P; }, always,
            [&](unsigned s, unsigned n, float acc) { DK[s * NS + n] = acc; });
        // GK[s][p] = e^{cs_last - cs_s} G k~_s.
        m3_product(
            L, P, [&](unsigned s, unsigned n) { return K[s * NS + n]; },
            [&](unsigned p, unsigned n) { return G[p * NS + n]; }, zero, [&](unsigned) { return N; }, always,
            [&](unsigned s, unsigned p, float acc) { GK[s * PS + p] = dl[s] * acc; });
        __syncthreads();
        // dv = sum_{t>s} QK[t][s] dy_t + dg_s dy_s + GK[s].
        m3_product(
            L, P, [&](unsigned s, unsigned t) { return t > s ? QK[t * CS + s] : 0.0f; },
            [&](unsigned p, unsigned t) { return DY[t * PS + p]; }, [&](unsigned i0) { return i0 + 1; },
            [&](unsigned) { return L; }, always,
            [&](unsigned s, unsigned p, float acc) {
                dproj[(row0 + s) * d.width + d.off_x + h * P + p] =
                    (T)(fmaf(dg[s], DY[s * PS + p], acc) + GK[s * PS + p]);
            });
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
                vg = fmaf(V[t * PS + p], GK[t * PS + p], vg);
                yv = fmaf(DY[t * PS + p], V[t * PS + p], yv);
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
        m3_product(
            P, N, [&](unsigned p, unsigned t) { return ecs[t] * DY[t * PS + p]; },
            [&](unsigned n, unsigned t) { return Q[t * NS + n]; }, zero, [&](unsigned) { return L; }, always,
            [&](unsigned p, unsigned n, float acc) { G[p * NS + n] = fmaf(total, G[p * NS + n], acc); });
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
    scan_bwd<float>(q, k, proj, dt, adt, lam, qk_raw, dskip, states, dy, dq, dk, dproj, dadt, dscale, dqkdot,
                    dskip_part, d);
}
