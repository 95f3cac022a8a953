// The chunk-parallel Mamba-3 SISO scan with tensor-core products, used by
// the bf16 (mixed-precision) step. Same math as mamba3_scan.cu (read its
// header for the chunk recurrence); what changes is the schedule:
//
//   forward   m3c_chunk_state (mode 0)  every chunk's own state update
//             m3c_state_pass (dir 0)    the short serial walk over chunks
//             m3c_scan_out              every chunk's outputs
//   backward  m3c_chunk_state (mode 1)  every chunk's own dL/dS update
//             m3c_state_pass (dir 1)    the serial walk, last chunk first
//             m3c_scan_bwd              every chunk's input gradients
//
// so a (batch row, head) is spread over nchunks blocks instead of walking
// them in one, and only the P x N state recurrence (one FMA per element and
// chunk) stays serial. The products inside a chunk (scores, scores x values,
// state x queries, ...) run as bf16 mma.sync with f32 accumulation, as the
// official kernel's tl.dot does; operands are staged in shared memory as f32
// and rounded when a fragment is built, so the scalar parts (decays, the
// diagonal D + gamma term, every reduction, the state recurrence) stay f32.
//
// Shapes: C, N and P must be multiples of 16 (the wrapper falls back to the
// scalar scan otherwise). Shared tiles of width W are stored with row stride
// W + 8 floats, which keeps the row-major fragment reads of a quarter-warp
// on distinct banks. Every sum runs in a fixed order: results are
// bit-identical run to run.
#include "mamba3_common.cuh"

// Threads of the per-chunk kernels (16 warps); the Rust wrapper launches the
// same count (kernels/mamba3_chunk.rs, CHUNK_THREADS).
#define M3C_THREADS 512
#define M3C_WARPS (M3C_THREADS / 32)
// Threads of the state walk (one per state element).
#define M3C_PASS_THREADS 256
#define M3C_PAD 8

// Two floats rounded to a bf16 pair, `lo` in the low half (the lower column
// or row index of a fragment register).
__device__ __forceinline__ unsigned m3c_pack(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// acc (16 x 8, f32) += a (16 x 16, bf16, row) * b (16 x 8, bf16, col).
__device__ __forceinline__ void m3c_mma(float* acc, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One warp's 16 x 16 output tile at (m0, n0), two m16n8 accumulators:
// acc[j][*] covers columns n0 + 8j + [0, 8). Element r of acc[j] sits at
// row m0 + g + 8 (r / 2), column n0 + 8j + 2 t + r % 2, with g = lane / 4
// and t = lane % 4 (the mma.sync accumulator layout).
struct M3cTile {
    float acc[2][4];
};

__device__ __forceinline__ void m3c_zero(M3cTile& c) {
    for (int j = 0; j < 2; ++j) {
        for (int r = 0; r < 4; ++r) {
            c.acc[j][r] = 0.0f;
        }
    }
}

// c += sum over k in [k0, k1) (steps of 16) of A(m0 + i, k) B(k, n0 + j);
// A and B are element accessors (row, column) -> float, so transposes,
// masks and per-row scales cost no extra copies.
template <class FA, class FB>
__device__ __forceinline__ void m3c_mma_tile(M3cTile& c, FA A, FB B, unsigned m0, unsigned n0, unsigned k0,
                                             unsigned k1) {
    const unsigned lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (unsigned k = k0; k < k1; k += 16) {
        const unsigned ka = k + 2 * t;
        unsigned a[4];
        a[0] = m3c_pack(A(m0 + g, ka), A(m0 + g, ka + 1));
        a[1] = m3c_pack(A(m0 + g + 8, ka), A(m0 + g + 8, ka + 1));
        a[2] = m3c_pack(A(m0 + g, ka + 8), A(m0 + g, ka + 9));
        a[3] = m3c_pack(A(m0 + g + 8, ka + 8), A(m0 + g + 8, ka + 9));
        for (unsigned j = 0; j < 2; ++j) {
            const unsigned n = n0 + 8 * j + g;
            unsigned b[2];
            b[0] = m3c_pack(B(ka, n), B(ka + 1, n));
            b[1] = m3c_pack(B(ka + 8, n), B(ka + 9, n));
            m3c_mma(c.acc[j], a, b);
        }
    }
}

// Row and column of accumulator element (j, r) of this lane's tile.
__device__ __forceinline__ unsigned m3c_row(unsigned m0, int r) {
    return m0 + (threadIdx.x % 32) / 4 + 8 * (r / 2);
}
__device__ __forceinline__ unsigned m3c_col(unsigned n0, int j, int r) {
    return n0 + 8 * j + 2 * ((threadIdx.x % 32) % 4) + r % 2;
}

// Row sums of a tile's 16 columns, for rows m0 + g and m0 + g + 8: `v[r]`
// is this lane's value at element (j, r) summed over j by the caller's
// loop; the quad's four lanes fold in a fixed butterfly order.
__device__ __forceinline__ float m3c_quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

// Sum over aligned groups of eight lanes (xor 4, 2, 1: a fixed order).
__device__ __forceinline__ float m3c_oct_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v;
}

// Stores per-(row, 16-column tile) partial sums of `f(row, col) * acc` into
// part[row * ntiles + n0 / 16]; the caller adds the tiles in order later.
template <class F>
__device__ __forceinline__ void m3c_row_partials(const M3cTile& c, F f, unsigned m0, unsigned n0, float* part,
                                                 unsigned ntiles) {
    float lo = 0.0f, hi = 0.0f;
    for (int j = 0; j < 2; ++j) {
        for (int r = 0; r < 4; ++r) {
            const float v = f(m3c_row(m0, r), m3c_col(n0, j, r)) * c.acc[j][r];
            if (r < 2) {
                lo += v;
            } else {
                hi += v;
            }
        }
    }
    lo = m3c_quad_sum(lo);
    hi = m3c_quad_sum(hi);
    if ((threadIdx.x % 32) % 4 == 0) {
        part[m3c_row(m0, 0) * ntiles + n0 / 16] = lo;
        part[m3c_row(m0, 2) * ntiles + n0 / 16] = hi;
    }
}

// Loads the chunk's adt, runs its serial inclusive cumsum into cs (the same
// order as mamba3_scan.cu and m3c_state_pass, so the chunk totals agree bit
// for bit), and zeroes cs past the chunk's end. Ends with a barrier.
__device__ __forceinline__ void m3c_chunk_cumsum(const float* __restrict__ adt, unsigned long long row0,
                                                 unsigned h, unsigned L, unsigned C, unsigned nheads,
                                                 float* cs) {
    for (unsigned t = threadIdx.x; t < C; t += blockDim.x) {
        cs[t] = t < L ? adt[(row0 + t) * nheads + h] : 0.0f;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float acc = 0.0f;
        for (unsigned t = 0; t < L; ++t) {
            acc += cs[t];
            cs[t] = acc;
        }
    }
    __syncthreads();
}

__device__ __forceinline__ float m3c_scale(const float* dt, const float* lam, unsigned long long rh, unsigned t,
                                           unsigned len, unsigned nheads) {
    float s = lam[rh] * dt[rh];
    if (t + 1 < len) {
        unsigned long long nx = rh + nheads;
        s += dt[nx] * (1.0f - lam[nx]);
    }
    return s;
}

// Loads in flight per thread while staging: a block holds one SM, so its
// own loads must cover the memory latency (one at a time, staging alone
// took most of a kernel's time).
#define M3C_STAGE_UNROLL 16

// Copies L rows of `width` floats (row r at src[(row0 + r) * stride + off])
// into a shared tile of row stride width + M3C_PAD, zero-filling rows L..C.
__device__ __forceinline__ void m3c_stage(const float* __restrict__ src, unsigned long long row0,
                                          unsigned long long stride, unsigned long long off, unsigned width,
                                          unsigned L, unsigned C, float* dst) {
    const unsigned ws = width + M3C_PAD, total = C * width;
    for (unsigned base = threadIdx.x; base < total; base += M3C_STAGE_UNROLL * blockDim.x) {
        float v[M3C_STAGE_UNROLL];
#pragma unroll
        for (int j = 0; j < M3C_STAGE_UNROLL; ++j) {
            const unsigned i = base + j * blockDim.x, r = i / width;
            v[j] = i < total && r < L ? src[(row0 + r) * stride + off + i % width] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < M3C_STAGE_UNROLL; ++j) {
            const unsigned i = base + j * blockDim.x;
            if (i < total) {
                dst[(i / width) * ws + i % width] = v[j];
            }
        }
    }
}

// Copies a P x N state slice (contiguous) into a shared tile of row stride
// N + M3C_PAD; the same batching as m3c_stage.
__device__ __forceinline__ void m3c_stage_state(const float* __restrict__ src, unsigned P, unsigned N,
                                                float* dst) {
    m3c_stage(src, 0, N, 0, N, P, P, dst);
}

// One chunk's own contribution to the state recurrence, written to
// out[((b H + h) nchunks + c), P, N]:
//   mode 0 (forward):  sum_s e^{cs_last - cs_s} scale_s v_s k_s^T
//   mode 1 (backward): sum_t e^{cs_t} dy_t q_t^T
// x is proj (its x columns) or dy; yv is k or q [rows, H, N].
extern "C" __global__ void __launch_bounds__(M3C_THREADS)
    m3c_chunk_state(const float* __restrict__ x, unsigned x_stride, unsigned x_off, const float* __restrict__ yv,
                    const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                    float* __restrict__ out, M3Dims d, unsigned mode) {
    extern __shared__ float sm[];
    const unsigned P = d.headdim, N = d.d_state, C = d.chunk;
    const unsigned PS = P + M3C_PAD, NS = N + M3C_PAD;
    float* X = sm;           // C x PS, weighted rows
    float* Y = X + C * PS;   // C x NS
    float* cs = Y + C * NS;  // C
    float* w = cs + C;       // C
    const unsigned c = blockIdx.x, bh = blockIdx.y, b = bh / d.nheads, h = bh % d.nheads;
    const unsigned c0 = c * C, L = min(C, d.len - c0);
    const unsigned long long row0 = (unsigned long long)b * d.len + c0;
    m3c_chunk_cumsum(adt, row0, h, L, C, d.nheads, cs);
    for (unsigned t = threadIdx.x; t < C; t += blockDim.x) {
        float wt = 0.0f;
        if (t < L) {
            if (mode == 0) {
                const unsigned long long rh = (row0 + t) * d.nheads + h;
                wt = expf(cs[L - 1] - cs[t]) * m3c_scale(dt, lam, rh, c0 + t, d.len, d.nheads);
            } else {
                wt = expf(cs[t]);
            }
        }
        w[t] = wt;
    }
    m3c_stage(x, row0, x_stride, (unsigned long long)x_off + h * P, P, L, C, X);
    m3c_stage(yv, row0, (unsigned long long)d.nheads * N, (unsigned long long)h * N, N, L, C, Y);
    __syncthreads();
    for (unsigned i = threadIdx.x; i < C * P; i += blockDim.x) {
        X[(i / P) * PS + i % P] *= w[i / P];
    }
    __syncthreads();
    auto A = [&](unsigned p, unsigned t) { return X[t * PS + p]; };
    auto B = [&](unsigned t, unsigned n) { return Y[t * NS + n]; };
    float* o = out + ((unsigned long long)bh * d.nchunks + c) * P * N;
    const unsigned warp = threadIdx.x / 32, tn = N / 16, jobs = (P / 16) * tn;
    for (unsigned job = warp; job < jobs; job += M3C_WARPS) {
        const unsigned m0 = (job / tn) * 16, n0 = (job % tn) * 16;
        M3cTile acc;
        m3c_zero(acc);
        m3c_mma_tile(acc, A, B, m0, n0, 0, C);
        for (int j = 0; j < 2; ++j) {
            for (int r = 0; r < 4; ++r) {
                o[m3c_row(m0, r) * N + m3c_col(n0, j, r)] = acc.acc[j][r];
            }
        }
    }
}

// The serial walk over chunks, one thread per state element. On entry
// buf[bh, c] holds chunk c's own contribution; on exit
//   dir 0: the state entering chunk c    (S_0 = 0, S_{c+1} = e^{cs_last} S_c + own_c)
//   dir 1: dL/d(state leaving chunk c)   (G_last = 0, G_{c-1} = e^{cs_last} G_c + own_c)
// Chunk totals of adt are summed in the same serial order as the chunk
// kernels, so the decays agree bit for bit. Dynamic shared memory: nchunks
// floats.
extern "C" __global__ void __launch_bounds__(M3C_PASS_THREADS)
    m3c_state_pass(const float* __restrict__ adt, float* __restrict__ buf, M3Dims d, unsigned dir) {
    extern __shared__ float decay[];
    const unsigned bh = blockIdx.y, b = bh / d.nheads, h = bh % d.nheads, C = d.chunk;
    for (unsigned c = threadIdx.x; c < d.nchunks; c += blockDim.x) {
        const unsigned c0 = c * C, L = min(C, d.len - c0);
        const float* a = adt + ((unsigned long long)b * d.len + c0) * d.nheads + h;
        float acc = 0.0f;
        for (unsigned t0 = 0; t0 < L; t0 += M3C_STAGE_UNROLL) {
            float v[M3C_STAGE_UNROLL];
#pragma unroll
            for (int j = 0; j < M3C_STAGE_UNROLL; ++j) {
                v[j] = t0 + j < L ? a[(unsigned long long)(t0 + j) * d.nheads] : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < M3C_STAGE_UNROLL; ++j) {
                if (t0 + j < L) {
                    acc += v[j];
                }
            }
        }
        decay[c] = expf(acc);
    }
    __syncthreads();
    const unsigned long long pn = (unsigned long long)d.headdim * d.d_state;
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pn) {
        return;
    }
    float* base = buf + (unsigned long long)bh * d.nchunks * pn + i;
    // Chunks in batches whose loads are all issued before the walk uses them.
    const unsigned nc = d.nchunks;
    float s = 0.0f;
    for (unsigned k0 = 0; k0 < nc; k0 += 8) {
        float own[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const unsigned k = k0 + j, c = dir == 0 ? k : nc - 1 - k;
            own[j] = k < nc ? base[c * pn] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const unsigned k = k0 + j, c = dir == 0 ? k : nc - 1 - k;
            if (k < nc) {
                base[c * pn] = s;
                s = fmaf(decay[c], s, own[j]);
            }
        }
    }
}

// Every chunk's outputs, given the state entering it:
//   y_t = e^{cs_t} S_c q_t + sum_{s<t} e^{cs_t - cs_s} (q_t . k~_s) v_s + dg_t v_t
// with the diagonal dg_t v_t added in f32 after the products.
extern "C" __global__ void __launch_bounds__(M3C_THREADS)
    m3c_scan_out(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ proj,
                 const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                 const float* __restrict__ qk_raw, const float* __restrict__ dskip,
                 const float* __restrict__ states, float* __restrict__ y, M3Dims d) {
    extern __shared__ float sm[];
    const unsigned P = d.headdim, N = d.d_state, C = d.chunk;
    const unsigned PS = P + M3C_PAD, NS = N + M3C_PAD, CS = C + M3C_PAD;
    float* Q = sm;            // C x NS
    float* K = Q + C * NS;    // C x NS, raw keys
    float* V = K + C * NS;    // C x PS
    float* S = V + C * PS;    // P x NS, state entering the chunk
    float* W = S + P * NS;    // C x CS, decayed strictly-causal scores
    float* cs = W + C * CS;   // C
    float* sc = cs + C;       // C, scale
    float* dg = sc + C;       // C, D + gamma q̂.k̂
    float* ecs = dg + C;      // C, e^{cs_t}
    const unsigned c = blockIdx.x, bh = blockIdx.y, b = bh / d.nheads, h = bh % d.nheads;
    const unsigned c0 = c * C, L = min(C, d.len - c0);
    const unsigned long long row0 = (unsigned long long)b * d.len + c0;
    m3c_chunk_cumsum(adt, row0, h, L, C, d.nheads, cs);
    const float dh = dskip[h];
    for (unsigned t = threadIdx.x; t < C; t += blockDim.x) {
        float s = 0.0f, g = 0.0f, e = 0.0f;
        if (t < L) {
            const unsigned long long rh = (row0 + t) * d.nheads + h;
            s = m3c_scale(dt, lam, rh, c0 + t, d.len, d.nheads);
            g = dh + lam[rh] * dt[rh] * qk_raw[rh];
            e = expf(cs[t]);
        }
        sc[t] = s;
        dg[t] = g;
        ecs[t] = e;
    }
    const unsigned long long hn = (unsigned long long)d.nheads * N;
    m3c_stage(q, row0, hn, (unsigned long long)h * N, N, L, C, Q);
    m3c_stage(k, row0, hn, (unsigned long long)h * N, N, L, C, K);
    m3c_stage(proj, row0, d.width, (unsigned long long)d.off_x + h * P, P, L, C, V);
    m3c_stage_state(states + ((unsigned long long)bh * d.nchunks + c) * P * N, P, N, S);
    __syncthreads();
    const unsigned warp = threadIdx.x / 32, tc = C / 16;
    // Scores W_ts = e^{cs_t - cs_s} q_t . (scale_s k_s) for s < t; tiles
    // above the diagonal are zero and skipped by the next product.
    {
        auto A = [&](unsigned t, unsigned n) { return Q[t * NS + n]; };
        auto B = [&](unsigned n, unsigned s) { return sc[s] * K[s * NS + n]; };
        for (unsigned job = warp; job < tc * tc; job += M3C_WARPS) {
            const unsigned m0 = (job / tc) * 16, n0 = (job % tc) * 16;
            if (n0 > m0) {
                continue;
            }
            M3cTile acc;
            m3c_zero(acc);
            m3c_mma_tile(acc, A, B, m0, n0, 0, N);
            for (int j = 0; j < 2; ++j) {
                for (int r = 0; r < 4; ++r) {
                    const unsigned t = m3c_row(m0, r), s = m3c_col(n0, j, r);
                    W[t * CS + s] = s < t ? expf(cs[t] - cs[s]) * acc.acc[j][r] : 0.0f;
                }
            }
        }
    }
    __syncthreads();
    // y = W V + diag(e^{cs}) Q S^T (+ dg v in f32).
    {
        auto AW = [&](unsigned t, unsigned s) { return W[t * CS + s]; };
        auto BV = [&](unsigned s, unsigned p) { return V[s * PS + p]; };
        auto AQ = [&](unsigned t, unsigned n) { return ecs[t] * Q[t * NS + n]; };
        auto BS = [&](unsigned n, unsigned p) { return S[p * NS + n]; };
        const unsigned tp = P / 16;
        for (unsigned job = warp; job < tc * tp; job += M3C_WARPS) {
            const unsigned m0 = (job / tp) * 16, n0 = (job % tp) * 16;
            M3cTile acc;
            m3c_zero(acc);
            m3c_mma_tile(acc, AW, BV, m0, n0, 0, m0 + 16);
            m3c_mma_tile(acc, AQ, BS, m0, n0, 0, N);
            for (int j = 0; j < 2; ++j) {
                for (int r = 0; r < 4; ++r) {
                    const unsigned t = m3c_row(m0, r), p = m3c_col(n0, j, r);
                    if (t < L) {
                        y[(row0 + t) * d.d_inner + h * P + p] = fmaf(dg[t], V[t * PS + p], acc.acc[j][r]);
                    }
                }
            }
        }
    }
}

// Every chunk's input gradients, given the state entering it (`states`) and
// G = dL/d(state leaving it) (`gstates`, from m3c_state_pass dir 1). Writes
// the same outputs as m3_scan_bwd_f32 except the D gradient, whose partial
// sums land per chunk: dskip_part[(b nchunks + c) H + h].
extern "C" __global__ void __launch_bounds__(M3C_THREADS)
    m3c_scan_bwd(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ proj,
                 const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                 const float* __restrict__ qk_raw, const float* __restrict__ dskip,
                 const float* __restrict__ states, const float* __restrict__ gstates, const float* __restrict__ dy,
                 float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dproj,
                 float* __restrict__ dadt, float* __restrict__ dscale, float* __restrict__ dqkdot,
                 float* __restrict__ dskip_part, M3Dims d) {
    extern __shared__ float sm[];
    const unsigned P = d.headdim, N = d.d_state, C = d.chunk;
    const unsigned PS = P + M3C_PAD, NS = N + M3C_PAD, CS = C + M3C_PAD, TN = N / 16, TP = P / 16;
    float* Q = sm;             // C x NS
    float* K = Q + C * NS;     // C x NS, raw keys (scaled when read)
    float* V = K + C * NS;     // C x PS
    float* DY = V + C * PS;    // C x PS
    float* X = DY + C * PS;    // P x NS: S_c, then G
    // C x CS each. Strictly lower triangle (s < t): QK = E_ts (q_t . k~_s)
    // and DV = E_ts (dy_t . v_s), E_ts = e^{cs_t - cs_s}. QK's upper
    // triangle holds the pair weight QK_ts (dy_t . v_s) at [s][t], which
    // drives cs_t up and cs_s down. Other entries are never read.
    float* QK = X + P * NS;
    float* DV = QK + C * CS;
    float* cs = DV + C * CS;   // C
    float* ecs = cs + C;       // C, e^{cs_t}
    float* dl = ecs + C;       // C, e^{cs_last - cs_t}
    float* dg = dl + C;        // C, D + gamma qk_raw
    float* sc = dg + C;        // C, scale
    float* pr = sc + C;        // C, pair terms of dcs
    float* dyv = pr + C;       // C, dy_t . v_t
    float* pa = dyv + C;       // C x TN, q . (inter-chunk dq) partials
    float* pb = pa + C * TN;   // C x TP, v . GK partials
    float* pc = pb + C * TP;   // C x TN, dk~ . k partials
    float* red = pc + C * TN;  // M3C_WARPS
    const unsigned c = blockIdx.x, bh = blockIdx.y, b = bh / d.nheads, h = bh % d.nheads;
    const unsigned c0 = c * C, L = min(C, d.len - c0);
    const unsigned long long row0 = (unsigned long long)b * d.len + c0;
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, tc = C / 16;
    m3c_chunk_cumsum(adt, row0, h, L, C, d.nheads, cs);
    const float dh = dskip[h];
    for (unsigned t = threadIdx.x; t < C; t += blockDim.x) {
        float s = 0.0f, g = 0.0f, e = 0.0f, l = 0.0f;
        if (t < L) {
            const unsigned long long rh = (row0 + t) * d.nheads + h;
            s = m3c_scale(dt, lam, rh, c0 + t, d.len, d.nheads);
            g = dh + lam[rh] * dt[rh] * qk_raw[rh];
            e = expf(cs[t]);
            l = expf(cs[L - 1] - cs[t]);
        }
        sc[t] = s;
        dg[t] = g;
        ecs[t] = e;
        dl[t] = l;
    }
    const unsigned long long hn = (unsigned long long)d.nheads * N;
    m3c_stage(q, row0, hn, (unsigned long long)h * N, N, L, C, Q);
    m3c_stage(k, row0, hn, (unsigned long long)h * N, N, L, C, K);
    m3c_stage(proj, row0, d.width, (unsigned long long)d.off_x + h * P, P, L, C, V);
    m3c_stage(dy, row0, d.d_inner, (unsigned long long)h * P, P, L, C, DY);
    const unsigned long long st_off = ((unsigned long long)bh * d.nchunks + c) * P * N;
    m3c_stage_state(states + st_off, P, N, X);
    __syncthreads();

    auto Kt = [&](unsigned s, unsigned n) { return sc[s] * K[s * NS + n]; };
    // Scores and value products of the lower tiles, in one pass so each
    // lane holds both factors of the pair weight.
    {
        auto AQ = [&](unsigned t, unsigned n) { return Q[t * NS + n]; };
        auto BK = [&](unsigned n, unsigned s) { return Kt(s, n); };
        auto AY = [&](unsigned t, unsigned p) { return DY[t * PS + p]; };
        auto BV = [&](unsigned p, unsigned s) { return V[s * PS + p]; };
        for (unsigned job = warp; job < tc * tc; job += M3C_WARPS) {
            const unsigned m0 = (job / tc) * 16, n0 = (job % tc) * 16;
            if (n0 > m0) {
                continue;
            }
            M3cTile qk, dv;
            m3c_zero(qk);
            m3c_zero(dv);
            m3c_mma_tile(qk, AQ, BK, m0, n0, 0, N);
            m3c_mma_tile(dv, AY, BV, m0, n0, 0, P);
            for (int j = 0; j < 2; ++j) {
                for (int r = 0; r < 4; ++r) {
                    const unsigned t = m3c_row(m0, r), s = m3c_col(n0, j, r);
                    if (s < t) {
                        const float e = expf(cs[t] - cs[s]);
                        const float a = e * qk.acc[j][r];
                        QK[t * CS + s] = a;
                        DV[t * CS + s] = e * dv.acc[j][r];
                        QK[s * CS + t] = a * dv.acc[j][r];
                    }
                }
            }
        }
    }
    // dy_t . v_t: eight lanes per row, folded in a fixed butterfly.
    for (unsigned base = 0; base < C; base += blockDim.x / 8) {
        const unsigned t = base + threadIdx.x / 8, j = threadIdx.x % 8;
        float acc = 0.0f;
        if (t < C) {
            for (unsigned p = j; p < P; p += 8) {
                acc = fmaf(DY[t * PS + p], V[t * PS + p], acc);
            }
        }
        acc = m3c_oct_sum(acc);
        if (t < C && j == 0) {
            dyv[t] = acc;
        }
    }
    __syncthreads();
    // dq = e^{cs_t} (S_c^T dy_t) + sum_{s<t} DV_ts k~_s; the first term's
    // row dot with q_t is the inter-chunk part of dL/dcs_t.
    {
        auto AY = [&](unsigned t, unsigned p) { return DY[t * PS + p]; };
        auto BS = [&](unsigned p, unsigned n) { return X[p * NS + n]; };
        auto ADV = [&](unsigned t, unsigned s) { return s < t ? DV[t * CS + s] : 0.0f; };
        auto BK = [&](unsigned s, unsigned n) { return Kt(s, n); };
        auto FQ = [&](unsigned t, unsigned n) { return Q[t * NS + n]; };
        for (unsigned job = warp; job < tc * TN; job += M3C_WARPS) {
            const unsigned m0 = (job / TN) * 16, n0 = (job % TN) * 16;
            M3cTile acc;
            m3c_zero(acc);
            m3c_mma_tile(acc, AY, BS, m0, n0, 0, P);
            for (int j = 0; j < 2; ++j) {
                for (int r = 0; r < 4; ++r) {
                    acc.acc[j][r] *= ecs[m3c_row(m0, r)];
                }
            }
            m3c_row_partials(acc, FQ, m0, n0, pa, TN);
            m3c_mma_tile(acc, ADV, BK, m0, n0, 0, m0 + 16);
            for (int j = 0; j < 2; ++j) {
                for (int r = 0; r < 4; ++r) {
                    const unsigned t = m3c_row(m0, r), n = m3c_col(n0, j, r);
                    if (t < L) {
                        dq[((row0 + t) * d.nheads + h) * N + n] = acc.acc[j][r];
                    }
                }
            }
        }
    }
    // Pair terms: sum_{s<t} w_ts - sum_{u>t} w_ut, eight lanes per row.
    for (unsigned base = 0; base < C; base += blockDim.x / 8) {
        const unsigned t = base + threadIdx.x / 8, j = threadIdx.x % 8;
        float acc = 0.0f;
        if (t < L) {
            for (unsigned s = j; s < t; s += 8) {
                acc += QK[s * CS + t];
            }
            for (unsigned u = t + 1 + j; u < L; u += 8) {
                acc -= QK[t * CS + u];
            }
        }
        acc = m3c_oct_sum(acc);
        if (t < C && j == 0) {
            pr[t] = acc;
        }
    }
    // sum over the state of G . S_c (drives e^{cs_last} in front of S_c),
    // then G replaces S_c in X.
    float part = 0.0f;
    {
        const float* gs = gstates + st_off;
        const unsigned pn = P * N;
        __syncthreads();
        for (unsigned base = threadIdx.x; base < pn; base += M3C_STAGE_UNROLL * blockDim.x) {
            float v[M3C_STAGE_UNROLL];
#pragma unroll
            for (int j = 0; j < M3C_STAGE_UNROLL; ++j) {
                const unsigned i = base + j * blockDim.x;
                v[j] = i < pn ? gs[i] : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < M3C_STAGE_UNROLL; ++j) {
                const unsigned i = base + j * blockDim.x;
                if (i < pn) {
                    const unsigned at = (i / N) * NS + i % N;
                    part = fmaf(v[j], X[at], part);
                    X[at] = v[j];
                }
            }
        }
    }
    part = m3_warp_sum(part);
    if (lane == 0) {
        red[warp] = part;
    }
    __syncthreads();
    // dk~ = sum_{t>s} DV_ts q_t + e^{cs_last - cs_s} G^T v_s, and
    // dv = sum_{t>s} QK_ts dy_t + dg_s dy_s + e^{cs_last - cs_s} G k~_s.
    {
        auto AV = [&](unsigned s, unsigned p) { return V[s * PS + p]; };
        auto BG = [&](unsigned p, unsigned n) { return X[p * NS + n]; };
        auto ADVt = [&](unsigned s, unsigned t) { return s < t ? DV[t * CS + s] : 0.0f; };
        auto BQ = [&](unsigned t, unsigned n) { return Q[t * NS + n]; };
        auto FK = [&](unsigned s, unsigned n) { return K[s * NS + n]; };
        auto AK = [&](unsigned s, unsigned n) { return Kt(s, n); };
        auto BGt = [&](unsigned n, unsigned p) { return X[p * NS + n]; };
        auto AQKt = [&](unsigned s, unsigned t) { return s < t ? QK[t * CS + s] : 0.0f; };
        auto BY = [&](unsigned t, unsigned p) { return DY[t * PS + p]; };
        auto FV = [&](unsigned s, unsigned p) { return V[s * PS + p]; };
        const unsigned jobs_k = tc * TN, jobs = jobs_k + tc * TP;
        for (unsigned job = warp; job < jobs; job += M3C_WARPS) {
            M3cTile acc;
            m3c_zero(acc);
            if (job < jobs_k) {
                const unsigned m0 = (job / TN) * 16, n0 = (job % TN) * 16;
                m3c_mma_tile(acc, AV, BG, m0, n0, 0, P);
                for (int j = 0; j < 2; ++j) {
                    for (int r = 0; r < 4; ++r) {
                        acc.acc[j][r] *= dl[m3c_row(m0, r)];
                    }
                }
                m3c_mma_tile(acc, ADVt, BQ, m0, n0, m0, C);
                m3c_row_partials(acc, FK, m0, n0, pc, TN);
                for (int j = 0; j < 2; ++j) {
                    for (int r = 0; r < 4; ++r) {
                        const unsigned s = m3c_row(m0, r), n = m3c_col(n0, j, r);
                        if (s < L) {
                            dk[((row0 + s) * d.nheads + h) * N + n] = sc[s] * acc.acc[j][r];
                        }
                    }
                }
            } else {
                const unsigned jv = job - jobs_k, m0 = (jv / TP) * 16, n0 = (jv % TP) * 16;
                m3c_mma_tile(acc, AK, BGt, m0, n0, 0, N);
                for (int j = 0; j < 2; ++j) {
                    for (int r = 0; r < 4; ++r) {
                        acc.acc[j][r] *= dl[m3c_row(m0, r)];
                    }
                }
                m3c_row_partials(acc, FV, m0, n0, pb, TP);
                m3c_mma_tile(acc, AQKt, BY, m0, n0, m0, C);
                for (int j = 0; j < 2; ++j) {
                    for (int r = 0; r < 4; ++r) {
                        const unsigned s = m3c_row(m0, r), p = m3c_col(n0, j, r);
                        if (s < L) {
                            dproj[(row0 + s) * d.width + d.off_x + h * P + p] =
                                fmaf(dg[s], DY[s * PS + p], acc.acc[j][r]);
                        }
                    }
                }
            }
        }
    }
    __syncthreads();
    // Per-position scalars, then the reverse cumsum of dL/dcs into dL/dadt.
    for (unsigned t = threadIdx.x; t < L; t += blockDim.x) {
        const unsigned long long rh = (row0 + t) * d.nheads + h;
        float inter = 0.0f, vg = 0.0f, ds = 0.0f;
        for (unsigned j = 0; j < TN; ++j) {
            inter += pa[t * TN + j];
            ds += pc[t * TN + j];
        }
        for (unsigned j = 0; j < TP; ++j) {
            vg += pb[t * TP + j];
        }
        pr[t] += inter - vg;
        // Kept for the chunk total below.
        pb[t * TP] = vg;
        dqkdot[rh] = dyv[t];
        dscale[rh] = ds;
    }
    __syncthreads();
    if (warp == 0) {
        float gsum = m3_warp_sum(lane < M3C_WARPS ? red[lane] : 0.0f);
        float sum_vg = 0.0f, dd = 0.0f;
        for (unsigned t = lane; t < L; t += 32) {
            sum_vg += pb[t * TP];
            dd += dyv[t];
        }
        sum_vg = m3_warp_sum(sum_vg);
        dd = m3_warp_sum(dd);
        // The last position also drives e^{cs_last} in front of S_c and of
        // every e^{cs_last - cs_s}.
        if (lane == 0) {
            pr[L - 1] += expf(cs[L - 1]) * gsum + sum_vg;
        }
        __syncwarp();
        // dL/dadt_t = sum_{u >= t} dL/dcs_u: suffix sums 32 positions at a
        // time from the chunk's end, carrying the total.
        float carry = 0.0f;
        for (unsigned end = L; end > 0; end = end > 32 ? end - 32 : 0) {
            const unsigned first = end > 32 ? end - 32 : 0, t = first + lane;
            float v = t < end ? pr[t] : 0.0f;
            for (unsigned o = 1; o < 32; o <<= 1) {
                const float n = __shfl_down_sync(0xffffffffu, v, o);
                if (lane + o < 32) {
                    v += n;
                }
            }
            v += carry;
            if (t < end) {
                dadt[(row0 + t) * d.nheads + h] = v;
            }
            carry = __shfl_sync(0xffffffffu, v, 0);
        }
        if (lane == 0) {
            dskip_part[((unsigned long long)b * d.nchunks + c) * d.nheads + h] = dd;
        }
    }
}
