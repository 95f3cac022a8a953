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
// chunk) stays serial.
//
// Tensor-core discipline. Every product operand is staged once into shared
// memory as bf16 (rounded from the f32 value the math asks for: keys are
// scaled by scale_s before rounding, chunk-state rows by their decay
// weight), in row-major tiles padded by M3C_PAD elements (16 bytes) per
// row, so the eight 16-byte rows an ldmatrix phase reads fall on distinct
// banks. Fragments come from `ldmatrix` (`.trans` where the product wants
// the stored tile transposed) and feed `mma.sync.m16n8k16` bf16 with f32
// accumulation. The f32 parts of the math (decays, the diagonal D + gamma
// term, row dots that drive the decay gradients, every reduction and the
// state recurrence) read their operands in f32 from global memory, where
// the block's own staging left them in L2.
//
// Work is split into warp jobs: an output tile of 16 rows x up to 32
// columns (two m16n8 pairs). Partial sums that several jobs contribute to
// are kept per job in shared memory and added in a fixed order at the end,
// so results are bit-identical run to run.
//
// Shapes: C and P in {16, 32, 48, 64}, N a multiple of 16 (the wrapper
// checks, and falls back to the scalar scan otherwise).
#include "mamba3_common.cuh"

// Threads of the per-chunk kernels (8 warps); the Rust wrapper launches the
// same count (kernels/mamba3_chunk.rs, CHUNK_THREADS).
#define M3C_THREADS 256
#define M3C_WARPS (M3C_THREADS / 32)
// Threads of the state walk (one per state element).
#define M3C_PASS_THREADS 256
// Row padding of every bf16 shared tile, in elements.
#define M3C_PAD 8
// Output columns of one warp job.
#define M3C_JOB_COLS 32
// Largest chunk (C) and head width (P): C / 16 score tiles and P / 8
// accumulators per row block must stay in registers.
#define M3C_MAX_TILE 64
// Loads in flight per thread while staging.
#define M3C_STAGE_UNROLL 8

typedef unsigned short m3c_bf;

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

__device__ __forceinline__ void m3c_ldsm(unsigned* r, const m3c_bf* p) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

__device__ __forceinline__ void m3c_ldsm_t(unsigned* r, const m3c_bf* p) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

// The A fragment (rows m0..m0+16, k0..k0+16) of a matrix stored [m][k].
__device__ __forceinline__ void m3c_frag_a_mk(unsigned* a, const m3c_bf* t, unsigned ld, unsigned m0, unsigned k0) {
    const unsigned l = threadIdx.x % 32;
    m3c_ldsm(a, t + (m0 + (l & 7) + ((l >> 3) & 1) * 8) * ld + k0 + (l >> 4) * 8);
}

// The A fragment of a matrix whose transpose is stored ([k][m]).
__device__ __forceinline__ void m3c_frag_a_km(unsigned* a, const m3c_bf* t, unsigned ld, unsigned m0, unsigned k0) {
    const unsigned l = threadIdx.x % 32;
    m3c_ldsm_t(a, t + (k0 + (l & 7) + (l >> 4) * 8) * ld + m0 + ((l >> 3) & 1) * 8);
}

// B fragments of two n8 tiles (columns n0.. and n0+8..; k0..k0+16) of a
// matrix stored transposed, [n][k]: b[0..1] is tile n0, b[2..3] tile n0+8.
__device__ __forceinline__ void m3c_frag_b_nk(unsigned* b, const m3c_bf* t, unsigned ld, unsigned n0, unsigned k0) {
    const unsigned l = threadIdx.x % 32;
    m3c_ldsm(b, t + (n0 + (l & 7) + (l >> 4) * 8) * ld + k0 + ((l >> 3) & 1) * 8);
}

// The same from a matrix stored as is, [k][n].
__device__ __forceinline__ void m3c_frag_b_kn(unsigned* b, const m3c_bf* t, unsigned ld, unsigned n0, unsigned k0) {
    const unsigned l = threadIdx.x % 32;
    m3c_ldsm_t(b, t + (k0 + (l & 7) + ((l >> 3) & 1) * 8) * ld + n0 + (l >> 4) * 8);
}

// One warp job's accumulators: 16 rows x M3C_JOB_COLS columns, four m16n8
// tiles. Element r of acc[j] sits at row m0 + g + 8 (r / 2), column
// n0 + 8 j + 2 t + r % 2, with g = lane / 4 and t = lane % 4.
struct M3cAcc {
    float v[M3C_JOB_COLS / 8][4];
};

__device__ __forceinline__ void m3c_zero(M3cAcc& c) {
#pragma unroll
    for (int j = 0; j < M3C_JOB_COLS / 8; ++j) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            c.v[j][r] = 0.0f;
        }
    }
}

__device__ __forceinline__ unsigned m3c_row(unsigned m0, int r) {
    return m0 + (threadIdx.x % 32) / 4 + 8 * (r / 2);
}
__device__ __forceinline__ unsigned m3c_col(unsigned n0, int j, int r) {
    return n0 + 8 * j + 2 * ((threadIdx.x % 32) % 4) + r % 2;
}

// c += A(m0.., k) B(k, n0..) over k in [k0, k1) (steps of 16), for the
// `ncols` (16 or 32) columns from n0. A_KM: A is stored [k][m] (else
// [m][k]); B_NK: B is stored [n][k] (else [k][n]).
template <bool A_KM, bool B_NK>
__device__ __forceinline__ void m3c_gemm(M3cAcc& c, const m3c_bf* A, unsigned lda, const m3c_bf* B, unsigned ldb,
                                         unsigned m0, unsigned n0, unsigned k0, unsigned k1, unsigned ncols) {
    // Two k steps per iteration: enough independent fragment loads to
    // cover ldmatrix latency; more unrolling only grows the code (ten call
    // sites), and instruction-cache misses cost these kernels more.
#pragma unroll 2
    for (unsigned k = k0; k < k1; k += 16) {
        unsigned a[4];
        if (A_KM) {
            m3c_frag_a_km(a, A, lda, m0, k);
        } else {
            m3c_frag_a_mk(a, A, lda, m0, k);
        }
#pragma unroll
        for (int h = 0; h < M3C_JOB_COLS / 16; ++h) {
            if (16u * h < ncols) {
                unsigned b[4];
                if (B_NK) {
                    m3c_frag_b_nk(b, B, ldb, n0 + 16 * h, k);
                } else {
                    m3c_frag_b_kn(b, B, ldb, n0 + 16 * h, k);
                }
                m3c_mma(c.v[2 * h], a, b);
                m3c_mma(c.v[2 * h + 1], a, b + 2);
            }
        }
    }
}

// Scales row m of a job's tile by s[m] (a per-row f32 factor in shared
// memory).
__device__ __forceinline__ void m3c_scale_rows(M3cAcc& c, const float* s, unsigned m0) {
    const float lo = s[m3c_row(m0, 0)], hi = s[m3c_row(m0, 2)];
#pragma unroll
    for (int j = 0; j < M3C_JOB_COLS / 8; ++j) {
        c.v[j][0] *= lo;
        c.v[j][1] *= lo;
        c.v[j][2] *= hi;
        c.v[j][3] *= hi;
    }
}

// A job's view of an f32 matrix in global memory (x[row * ld + col], rows
// < L, zero elsewhere), laid out like its accumulators. Loaded before a
// job's products so the loads overlap them (a row dot or an epilogue
// term reads it after).
struct M3cSide {
    float v[M3C_JOB_COLS / 8][4];
};

__device__ __forceinline__ void m3c_side_load(M3cSide& o, const float* __restrict__ x, unsigned long long ld,
                                              unsigned m0, unsigned n0, unsigned ncols, unsigned L) {
#pragma unroll
    for (int j = 0; j < M3C_JOB_COLS / 8; ++j) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const unsigned row = m3c_row(m0, r);
            o.v[j][r] = 8u * j < ncols && row < L ? x[row * ld + m3c_col(n0, j, r)] : 0.0f;
        }
    }
}

// m3c_side_load from a bf16 matrix (pairs of columns as one u32).
__device__ __forceinline__ void m3c_side_load_bf16(M3cSide& o, const m3c_bf* __restrict__ x, unsigned long long ld,
                                                   unsigned m0, unsigned n0, unsigned ncols, unsigned L) {
#pragma unroll
    for (int j = 0; j < M3C_JOB_COLS / 8; ++j) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const unsigned row = m3c_row(m0, 2 * hr);
            unsigned w = 0u;
            if (8u * j < ncols && row < L) {
                w = *reinterpret_cast<const unsigned*>(x + row * ld + m3c_col(n0, j, 2 * hr));
            }
            o.v[j][2 * hr] = __uint_as_float(w << 16);
            o.v[j][2 * hr + 1] = __uint_as_float(w & 0xffff0000u);
        }
    }
}

// Row dots of a job's tile with a loaded side matrix, summed over the
// quad in a fixed order; lanes with t == 0 store rows m0 + g and
// m0 + g + 8 into part[row].
__device__ __forceinline__ void m3c_row_dots(const M3cAcc& c, const M3cSide& x, unsigned m0, float* part) {
    float lo = 0.0f, hi = 0.0f;
#pragma unroll
    for (int j = 0; j < M3C_JOB_COLS / 8; ++j) {
        lo = fmaf(c.v[j][1], x.v[j][1], fmaf(c.v[j][0], x.v[j][0], lo));
        hi = fmaf(c.v[j][3], x.v[j][3], fmaf(c.v[j][2], x.v[j][2], hi));
    }
    lo += __shfl_xor_sync(0xffffffffu, lo, 1);
    lo += __shfl_xor_sync(0xffffffffu, lo, 2);
    hi += __shfl_xor_sync(0xffffffffu, hi, 1);
    hi += __shfl_xor_sync(0xffffffffu, hi, 2);
    if ((threadIdx.x % 32) % 4 == 0) {
        part[m3c_row(m0, 0)] = lo;
        part[m3c_row(m0, 2)] = hi;
    }
}

// Inclusive cumsum of the chunk's adt (L positions) by one warp, in a
// fixed order (shuffle scans of 32, carried). Returns the chunk total and,
// when cs is not null, writes cs[0, C) (zeros past L) and the total into
// cs[C]. The kernels use cs[C] wherever the math says cs_last, and
// m3c_state_pass calls this too, so every decay over a whole chunk agrees
// bit for bit.
__device__ __forceinline__ float m3c_warp_cumsum(const float* __restrict__ adt, unsigned long long row0, unsigned h,
                                                 unsigned L, unsigned C, unsigned nheads, float* cs) {
    const unsigned lane = threadIdx.x % 32;
    // C <= M3C_MAX_TILE: at most two segments, both loaded before either
    // is scanned.
    float seg[M3C_MAX_TILE / 32];
#pragma unroll
    for (int k = 0; k < M3C_MAX_TILE / 32; ++k) {
        const unsigned t = 32 * k + lane;
        seg[k] = t < L ? adt[(row0 + t) * nheads + h] : 0.0f;
    }
    float carry = 0.0f;
#pragma unroll
    for (int k = 0; k < M3C_MAX_TILE / 32; ++k) {
        const unsigned t = 32 * k + lane;
        if (32u * k >= C) {
            break;
        }
        float v = seg[k];
        for (unsigned o = 1; o < 32; o <<= 1) {
            const float n = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) {
                v += n;
            }
        }
        v += carry;
        if (cs != nullptr && t < C) {
            cs[t] = t < L ? v : 0.0f;
        }
        carry = __shfl_sync(0xffffffffu, v, 31);
    }
    if (cs != nullptr && lane == 0) {
        cs[C] = carry;
    }
    return carry;
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

// Stages rows [0, C) x columns [0, width) of an f32 matrix (row r at
// src[(row0 + r) * stride + off]) into a bf16 tile of row stride
// width + M3C_PAD, each row multiplied by scale[r] (when not null) before
// rounding; rows past L are zero. 16-byte loads when the rows allow.
__device__ __noinline__ void m3c_stage(const float* __restrict__ src, unsigned long long row0,
                                          unsigned long long stride, unsigned long long off, unsigned width,
                                          unsigned L, unsigned C, const float* scale, m3c_bf* dst) {
    const unsigned ws = width + M3C_PAD;
    const float* base = src + row0 * stride + off;
    const bool vec = ((stride | off) & 3) == 0 && (reinterpret_cast<unsigned long long>(src) & 15) == 0;
    if (vec) {
        const unsigned q = width / 4, total = C * q;
        for (unsigned i0 = threadIdx.x; i0 < total; i0 += M3C_STAGE_UNROLL * blockDim.x) {
            float4 v[M3C_STAGE_UNROLL];
#pragma unroll
            for (int j = 0; j < M3C_STAGE_UNROLL; ++j) {
                const unsigned i = i0 + j * blockDim.x, r = i / q;
                v[j] = i < total && r < L ? *reinterpret_cast<const float4*>(base + r * stride + (i % q) * 4)
                                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int j = 0; j < M3C_STAGE_UNROLL; ++j) {
                const unsigned i = i0 + j * blockDim.x, r = i / q;
                if (i < total) {
                    const float s = scale != nullptr ? scale[r] : 1.0f;
                    uint2 p;
                    p.x = m3c_pack(s * v[j].x, s * v[j].y);
                    p.y = m3c_pack(s * v[j].z, s * v[j].w);
                    *reinterpret_cast<uint2*>(dst + r * ws + (i % q) * 4) = p;
                }
            }
        }
    } else {
        const unsigned q = width / 2, total = C * q;
        for (unsigned i0 = threadIdx.x; i0 < total; i0 += M3C_STAGE_UNROLL * blockDim.x) {
            float2 v[M3C_STAGE_UNROLL];
#pragma unroll
            for (int j = 0; j < M3C_STAGE_UNROLL; ++j) {
                const unsigned i = i0 + j * blockDim.x, r = i / q;
                const float* p = base + r * stride + (i % q) * 2;
                v[j] = i < total && r < L ? make_float2(p[0], p[1]) : make_float2(0.0f, 0.0f);
            }
#pragma unroll
            for (int j = 0; j < M3C_STAGE_UNROLL; ++j) {
                const unsigned i = i0 + j * blockDim.x, r = i / q;
                if (i < total) {
                    const float s = scale != nullptr ? scale[r] : 1.0f;
                    *reinterpret_cast<unsigned*>(dst + r * ws + (i % q) * 2) = m3c_pack(s * v[j].x, s * v[j].y);
                }
            }
        }
    }
}

// Stages rows [0, C) x columns [0, width) of a bf16 matrix (row r at
// src[(row0 + r) * stride + off], the rotated q/k the mixed step stores in
// bf16) into a tile of row stride width + M3C_PAD; rows past L are zero.
// Unscaled rows are copied bit for bit (16-byte accesses when aligned);
// with `scale`, each value is widened, multiplied in f32 and rounded again.
__device__ __noinline__ void m3c_stage_bf16(const m3c_bf* __restrict__ src, unsigned long long row0,
                                            unsigned long long stride, unsigned long long off, unsigned width,
                                            unsigned L, unsigned C, const float* scale, m3c_bf* dst) {
    const unsigned ws = width + M3C_PAD;
    const m3c_bf* base = src + row0 * stride + off;
    const bool vec = ((stride | off) & 7) == 0 && (reinterpret_cast<unsigned long long>(src) & 15) == 0;
    // Items of 8 elements (one uint4) when aligned, else 2 (one u32).
    const unsigned per = vec ? 8 : 2, q = width / per, total = C * q;
    for (unsigned i0 = threadIdx.x; i0 < total; i0 += M3C_STAGE_UNROLL * blockDim.x) {
        uint4 v[M3C_STAGE_UNROLL];
#pragma unroll
        for (int j = 0; j < M3C_STAGE_UNROLL; ++j) {
            const unsigned i = i0 + j * blockDim.x, r = i / q;
            const m3c_bf* p = base + r * stride + (i % q) * per;
            v[j] = make_uint4(0u, 0u, 0u, 0u);
            if (i < total && r < L) {
                if (vec) {
                    v[j] = *reinterpret_cast<const uint4*>(p);
                } else {
                    v[j].x = *reinterpret_cast<const unsigned*>(p);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < M3C_STAGE_UNROLL; ++j) {
            const unsigned i = i0 + j * blockDim.x, r = i / q;
            if (i >= total) {
                continue;
            }
            unsigned w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
            if (scale != nullptr) {
                const float s = scale[r];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    w[e] = m3c_pack(s * __uint_as_float(w[e] << 16), s * __uint_as_float(w[e] & 0xffff0000u));
                }
            }
            m3c_bf* d = dst + r * ws + (i % q) * per;
            if (vec) {
                *reinterpret_cast<uint4*>(d) = make_uint4(w[0], w[1], w[2], w[3]);
            } else {
                *reinterpret_cast<unsigned*>(d) = w[0];
            }
        }
    }
}

// Stores a job's tile as bf16 into a tile of row stride ld.
__device__ __forceinline__ void m3c_store_bf(const M3cAcc& c, m3c_bf* t, unsigned ld, unsigned m0, unsigned n0,
                                             unsigned ncols) {
#pragma unroll
    for (int j = 0; j < M3C_JOB_COLS / 8; ++j) {
        if (8u * j < ncols) {
            *reinterpret_cast<unsigned*>(t + m3c_row(m0, 0) * ld + m3c_col(n0, j, 0)) = m3c_pack(c.v[j][0], c.v[j][1]);
            *reinterpret_cast<unsigned*>(t + m3c_row(m0, 2) * ld + m3c_col(n0, j, 2)) = m3c_pack(c.v[j][2], c.v[j][3]);
        }
    }
}

// Stores a job's rows < L as f32 pairs at out[row * ld + col] (+ off).
__device__ __forceinline__ void m3c_store_f32(const M3cAcc& c, float* __restrict__ out, unsigned long long ld,
                                              unsigned m0, unsigned n0, unsigned ncols, unsigned L) {
#pragma unroll
    for (int j = 0; j < M3C_JOB_COLS / 8; ++j) {
        if (8u * j < ncols) {
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const unsigned row = m3c_row(m0, 2 * hr);
                if (row < L) {
                    *reinterpret_cast<float2*>(out + row * ld + m3c_col(n0, j, 2 * hr)) =
                        make_float2(c.v[j][2 * hr], c.v[j][2 * hr + 1]);
                }
            }
        }
    }
}

// Block coordinates of the per-chunk kernels: chunk c of (batch row b,
// head h), its first row and its length L (the last chunk may be short).
struct M3cBlock {
    unsigned c, bh, b, h, c0, L;
    unsigned long long row0;
};

__device__ __forceinline__ M3cBlock m3c_block(const M3Dims& d) {
    M3cBlock k;
    k.c = blockIdx.x;
    k.bh = blockIdx.y;
    k.b = k.bh / d.nheads;
    k.h = k.bh % d.nheads;
    k.c0 = k.c * d.chunk;
    k.L = min(d.chunk, d.len - k.c0);
    k.row0 = (unsigned long long)k.b * d.len + k.c0;
    return k;
}

// One chunk's own contribution to the state recurrence, written to
// out[((b H + h) nchunks + c), P, N]:
//   mode 0 (forward):  sum_s e^{cs_last - cs_s} scale_s v_s k_s^T
//   mode 1 (backward): sum_t e^{cs_t} dy_t q_t^T
// x is proj (its x columns) or dy; yv is k or q [rows, H, N].
extern "C" __global__ void __launch_bounds__(M3C_THREADS, 4)
    m3c_chunk_state(const float* __restrict__ x, unsigned x_stride, unsigned x_off, const m3c_bf* __restrict__ yv,
                    const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                    float* __restrict__ out, M3Dims d, unsigned mode) {
    extern __shared__ __align__(16) unsigned char m3c_sm[];
    const unsigned P = d.headdim, N = d.d_state, C = d.chunk;
    const unsigned PS = P + M3C_PAD, NS = N + M3C_PAD;
    m3c_bf* X = reinterpret_cast<m3c_bf*>(m3c_sm);      // C x PS, rows weighted by w
    m3c_bf* Y = X + C * PS;                              // C x NS
    float* cs = reinterpret_cast<float*>(Y + C * NS);    // C + 1
    float* w = cs + C + 1;                               // C
    const M3cBlock k = m3c_block(d);
    const unsigned warp = threadIdx.x / 32;
    if (warp == 0) {
        m3c_warp_cumsum(adt, k.row0, k.h, k.L, C, d.nheads, cs);
    }
    __syncthreads();
    for (unsigned t = threadIdx.x; t < C; t += blockDim.x) {
        float wt = 0.0f;
        if (t < k.L) {
            if (mode == 0) {
                const unsigned long long rh = (k.row0 + t) * d.nheads + k.h;
                wt = expf(cs[C] - cs[t]) * m3c_scale(dt, lam, rh, k.c0 + t, d.len, d.nheads);
            } else {
                wt = expf(cs[t]);
            }
        }
        w[t] = wt;
    }
    __syncthreads();
    m3c_stage(x, k.row0, x_stride, (unsigned long long)x_off + k.h * P, P, k.L, C, w, X);
    m3c_stage_bf16(yv, k.row0, (unsigned long long)d.nheads * N, (unsigned long long)k.h * N, N, k.L, C, nullptr, Y);
    __syncthreads();
    float* o = out + ((unsigned long long)k.bh * d.nchunks + k.c) * P * N;
    const unsigned tn = (N + M3C_JOB_COLS - 1) / M3C_JOB_COLS, jobs = (P / 16) * tn;
    for (unsigned job = warp; job < jobs; job += M3C_WARPS) {
        const unsigned m0 = (job / tn) * 16, n0 = (job % tn) * M3C_JOB_COLS;
        const unsigned ncols = min(M3C_JOB_COLS, N - n0);
        M3cAcc acc;
        m3c_zero(acc);
        // out[p][n] = sum_t X[t][p] Y[t][n]: A is X^T, B is Y as stored.
        m3c_gemm<true, false>(acc, X, PS, Y, NS, m0, n0, 0, C, ncols);
        m3c_store_f32(acc, o, N, m0, n0, ncols, P);
    }
}

// The serial walk over chunks, four state elements a thread (16-byte
// loads of the f32 contributions, 8-byte bf16 stores). own[bh, c] holds
// chunk c's own contribution (m3c_chunk_state, f32); the walk accumulates
// in f32 and writes out[bh, c] in bf16, the precision every consumer
// stages it in:
//   dir 0: the state entering chunk c    (S_0 = 0, S_{c+1} = e^{cs_last} S_c + own_c)
//   dir 1: dL/d(state leaving chunk c)   (G_last = 0, G_{c-1} = e^{cs_last} G_c + own_c)
// Chunk totals come from m3c_warp_cumsum, as in the chunk kernels; every
// block recomputes them for its (b, h), so fewer, wider threads also mean
// fewer copies of that prologue. Dynamic shared memory: nchunks floats.
extern "C" __global__ void __launch_bounds__(M3C_PASS_THREADS)
    m3c_state_pass(const float* __restrict__ adt, const float* __restrict__ own, m3c_bf* __restrict__ out, M3Dims d,
                   unsigned dir) {
    extern __shared__ float decay[];
    const unsigned bh = blockIdx.y, b = bh / d.nheads, h = bh % d.nheads, C = d.chunk;
    const unsigned warp = threadIdx.x / 32, nw = blockDim.x / 32;
    for (unsigned c = warp; c < d.nchunks; c += nw) {
        const unsigned c0 = c * C, L = min(C, d.len - c0);
        const float tot = m3c_warp_cumsum(adt, (unsigned long long)b * d.len + c0, h, L, C, d.nheads, nullptr);
        if (threadIdx.x % 32 == 0) {
            decay[c] = expf(tot);
        }
    }
    __syncthreads();
    const unsigned long long pn4 = (unsigned long long)d.headdim * d.d_state / 4;
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pn4) {
        return;
    }
    const unsigned long long first = (unsigned long long)bh * d.nchunks * pn4 + i;
    const float4* src = reinterpret_cast<const float4*>(own) + first;
    uint2* dst = reinterpret_cast<uint2*>(out) + first;
    // Chunks in batches whose loads are all issued before the walk uses them.
    const unsigned nc = d.nchunks;
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (unsigned k0 = 0; k0 < nc; k0 += 8) {
        float4 o[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const unsigned k = k0 + j, c = dir == 0 ? k : nc - 1 - k;
            o[j] = k < nc ? src[c * pn4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const unsigned k = k0 + j, c = dir == 0 ? k : nc - 1 - k;
            if (k < nc) {
                dst[c * pn4] = make_uint2(m3c_pack(s.x, s.y), m3c_pack(s.z, s.w));
                const float e = decay[c];
                s = make_float4(fmaf(e, s.x, o[j].x), fmaf(e, s.y, o[j].y), fmaf(e, s.z, o[j].z),
                                fmaf(e, s.w, o[j].w));
            }
        }
    }
}

// The state recurrence in one kernel: each block owns 16 rows of P of one
// (batch row, head) and walks its chunks in order, the 16 x N slice of the
// state in f32 accumulators (a warp per 32 columns of N), so nothing but
// the bf16 result goes through memory:
//   dir 0: out[c] = S_c, the state entering chunk c; then
//          S_{c+1} = e^{cs_last} S_c + sum_s e^{cs_last - cs_s} scale_s v_s k_s^T
//   dir 1: out[c] = G_c, dL/d(state leaving chunk c), last chunk first; then
//          G_{c-1} = e^{cs_last} G_c + sum_t e^{cs_t} dy_t q_t^T
// (the same sums m3c_chunk_state + m3c_state_pass form; the products add
// onto the decayed accumulator instead of a fresh one). The next chunk's x
// and y rows are loaded into registers while the current chunk's products
// run; the chunk weights are built M3C_SW_WIN chunks at a time (each warp
// a quarter of them) with m3c_warp_cumsum, so decays agree bit for bit with
// the chunk kernels and their loads sit outside the walk. At most 80
// registers a thread (six blocks an SM): at M's shape every block of a
// launch is resident at once, so the serial walks all run in one wave
// (see m3c_states_wide for larger launches). Needs N <= M3C_SW_WARPS * M3C_JOB_COLS (the wrapper
// checks and falls back to the two-kernel form otherwise).
#define M3C_SW_WARPS 4
#define M3C_SW_THREADS (32 * M3C_SW_WARPS)
// Chunks whose weights one window builds.
#define M3C_SW_WIN 16
// Per-thread prefetch: C x N bf16 of y in 16-byte items, C x 16 f32 of x in
// pairs, with C <= 64 and N <= 128.
#define M3C_SW_YPRE (M3C_MAX_TILE * (M3C_SW_WARPS * M3C_JOB_COLS) / 8 / M3C_SW_THREADS)
#define M3C_SW_XPRE (M3C_MAX_TILE * 8 / M3C_SW_THREADS)
__device__ __forceinline__ void m3c_states_body(const float* __restrict__ x, unsigned x_stride, unsigned x_off,
                                                const m3c_bf* __restrict__ yv, const float* __restrict__ dt,
                                                const float* __restrict__ adt, const float* __restrict__ lam,
                                                m3c_bf* __restrict__ out, const M3Dims& d, unsigned dir) {
    extern __shared__ __align__(16) unsigned char m3c_sm[];
    const unsigned P = d.headdim, N = d.d_state, C = d.chunk, nc = d.nchunks;
    const unsigned XS = 16 + M3C_PAD, NS = N + M3C_PAD;
    m3c_bf* X = reinterpret_cast<m3c_bf*>(m3c_sm);  // C x XS: weighted x rows, 16 columns of P
    m3c_bf* Y = X + C * XS;                          // C x NS
    float* win = reinterpret_cast<float*>(Y + C * NS);  // M3C_SW_WIN x (C + 1): weights, then e^{cs_last}
    const unsigned bh = blockIdx.y, b = bh / d.nheads, h = bh % d.nheads, p0 = blockIdx.x * 16;
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned n0 = warp * M3C_JOB_COLS, ncols = n0 < N ? min(M3C_JOB_COLS, N - n0) : 0;
    const unsigned long long hn = (unsigned long long)d.nheads * N;
    // Fixed per-thread places, so the walk does no index division: y rows
    // in passes of `ypass` rows, this thread at row yr0 + j ypass, 8
    // columns from yc (threads past ypass * N / 8 idle); x rows in passes
    // of 16, row xr0 + 16 j, columns 2 xc, 2 xc + 1.
    const unsigned n8 = N / 8, ypass = M3C_SW_THREADS / n8;
    const unsigned yr0 = threadIdx.x / n8, yc = (threadIdx.x % n8) * 8;
    const bool ylive = yr0 < ypass;
    const unsigned xr0 = threadIdx.x / 8, xc = (threadIdx.x % 8) * 2;
    const m3c_bf* ycol = yv + (unsigned long long)h * N + yc;
    const float* xcol = x + x_off + (unsigned long long)h * P + p0 + xc;
    const unsigned long long ystep = (unsigned long long)ypass * hn, xstep = 16ull * x_stride;
    uint4 ypre[M3C_SW_YPRE];
    float2 xpre[M3C_SW_XPRE];
    // Loads chunk c's y rows (C x N) and x rows (C x 16 from column p0 of
    // head h) into the prefetch registers; rows past the chunk are zero.
    auto fetch = [&](unsigned c) {
        const unsigned c0 = c * C, L = min(C, d.len - c0);
        const unsigned long long row0 = (unsigned long long)b * d.len + c0;
        const m3c_bf* py = ycol + (row0 + yr0) * hn;
#pragma unroll
        for (int j = 0; j < M3C_SW_YPRE; ++j) {
            ypre[j] = make_uint4(0u, 0u, 0u, 0u);
            if (ylive && yr0 + j * ypass < L) {
                ypre[j] = *reinterpret_cast<const uint4*>(py);
            }
            py += ystep;
        }
        const float* px = xcol + (row0 + xr0) * x_stride;
#pragma unroll
        for (int j = 0; j < M3C_SW_XPRE; ++j) {
            xpre[j] = make_float2(0.0f, 0.0f);
            if (xr0 + 16 * j < L) {
                xpre[j] = make_float2(px[0], px[1]);
            }
            px += xstep;
        }
    };
    M3cAcc acc;
    m3c_zero(acc);
    fetch(dir == 0 ? 0 : nc - 1);
    for (unsigned k = 0; k < nc; ++k) {
        const unsigned c = dir == 0 ? k : nc - 1 - k, kk = k % M3C_SW_WIN;
        if (kk == 0) {
            // Weights of the next M3C_SW_WIN chunks, a warp per chunk.
            for (unsigned jw = warp; jw < M3C_SW_WIN && k + jw < nc; jw += M3C_SW_WARPS) {
                const unsigned cw = dir == 0 ? k + jw : nc - 1 - (k + jw);
                const unsigned c0 = cw * C, L = min(C, d.len - c0);
                const unsigned long long row0 = (unsigned long long)b * d.len + c0;
                float* cs = win + jw * (C + 1);
                m3c_warp_cumsum(adt, row0, h, L, C, d.nheads, cs);
                __syncwarp();
                const float last = cs[C];
                for (unsigned t = lane; t < C; t += 32) {
                    float wt = 0.0f;
                    if (t < L) {
                        if (dir == 0) {
                            const unsigned long long rh = (row0 + t) * d.nheads + h;
                            wt = expf(last - cs[t]) * m3c_scale(dt, lam, rh, c0 + t, d.len, d.nheads);
                        } else {
                            wt = expf(cs[t]);
                        }
                    }
                    cs[t] = wt;
                }
                __syncwarp();
                if (lane == 0) {
                    cs[C] = expf(last);
                }
                __syncwarp();
            }
            __syncthreads();
        }
        const float* w = win + kk * (C + 1);
#pragma unroll
        for (int j = 0; j < M3C_SW_YPRE; ++j) {
            const unsigned r = yr0 + j * ypass;
            if (ylive && r < C) {
                *reinterpret_cast<uint4*>(Y + r * NS + yc) = ypre[j];
            }
        }
#pragma unroll
        for (int j = 0; j < M3C_SW_XPRE; ++j) {
            const unsigned r = xr0 + 16 * j;
            if (r < C) {
                const float s = w[r];
                *reinterpret_cast<unsigned*>(X + r * XS + xc) = m3c_pack(s * xpre[j].x, s * xpre[j].y);
            }
        }
        // The registers are free again: the next chunk's loads go out
        // before the barrier.
        if (k + 1 < nc) {
            fetch(dir == 0 ? k + 1 : nc - 2 - k);
        }
        __syncthreads();
        if (ncols > 0) {
            m3c_bf* o = out + (((unsigned long long)bh * nc + c) * P + p0) * N;
#pragma unroll
            for (int j = 0; j < M3C_JOB_COLS / 8; ++j) {
                if (8u * j < ncols) {
                    *reinterpret_cast<unsigned*>(o + m3c_row(0, 0) * N + m3c_col(n0, j, 0)) =
                        m3c_pack(acc.v[j][0], acc.v[j][1]);
                    *reinterpret_cast<unsigned*>(o + m3c_row(0, 2) * N + m3c_col(n0, j, 2)) =
                        m3c_pack(acc.v[j][2], acc.v[j][3]);
                }
            }
            const float e = w[C];
#pragma unroll
            for (int j = 0; j < M3C_JOB_COLS / 8; ++j) {
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    acc.v[j][r] *= e;
                }
            }
            // acc[p][n] += sum_t X[t][p] Y[t][n]: A is X^T, B is Y as stored.
            m3c_gemm<true, false>(acc, X, XS, Y, NS, 0, n0, 0, C, ncols);
        }
        __syncthreads();
    }
}

// Two builds of the walk: at most 80 registers (six blocks an SM, a few
// bytes spilled) for launches that then fit one wave, so every serial walk
// runs at once; without the cap (fewer instructions) for launches that need
// two waves either way. The wrapper picks by grid size.
extern "C" __global__ void __launch_bounds__(M3C_SW_THREADS, 6)
    m3c_states(const float* __restrict__ x, unsigned x_stride, unsigned x_off, const m3c_bf* __restrict__ yv,
               const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
               m3c_bf* __restrict__ out, M3Dims d, unsigned dir) {
    m3c_states_body(x, x_stride, x_off, yv, dt, adt, lam, out, d, dir);
}

extern "C" __global__ void __launch_bounds__(M3C_SW_THREADS)
    m3c_states_wide(const float* __restrict__ x, unsigned x_stride, unsigned x_off, const m3c_bf* __restrict__ yv,
                    const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                    m3c_bf* __restrict__ out, M3Dims d, unsigned dir) {
    m3c_states_body(x, x_stride, x_off, yv, dt, adt, lam, out, d, dir);
}

// Every chunk's outputs, given the state entering it:
//   y_t = e^{cs_t} S_c q_t + sum_{s<t} e^{cs_t - cs_s} (q_t . k~_s) v_s + dg_t v_t
// with the diagonal dg_t v_t added in f32 after the products.
extern "C" __global__ void __launch_bounds__(M3C_THREADS, 3)
    m3c_scan_out(const m3c_bf* __restrict__ q, const m3c_bf* __restrict__ kin, const float* __restrict__ proj,
                 const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                 const float* __restrict__ qk_raw, const float* __restrict__ dskip,
                 const m3c_bf* __restrict__ states, float* __restrict__ y, M3Dims d) {
    extern __shared__ __align__(16) unsigned char m3c_sm[];
    const unsigned P = d.headdim, N = d.d_state, C = d.chunk;
    const unsigned PS = P + M3C_PAD, NS = N + M3C_PAD, CS = C + M3C_PAD;
    m3c_bf* Q = reinterpret_cast<m3c_bf*>(m3c_sm);  // C x NS
    m3c_bf* K = Q + C * NS;                          // C x NS, k~ = scale_s k_s
    m3c_bf* V = K + C * NS;                          // C x PS
    m3c_bf* S = V + C * PS;                          // P x NS, state entering the chunk
    m3c_bf* W = S + P * NS;                          // C x CS, decayed strictly-causal scores
    float* cs = reinterpret_cast<float*>(W + C * CS);  // C + 1
    float* sc = cs + C + 1;                            // C, scale
    float* dg = sc + C;                                // C, D + gamma q^.k^
    float* ecs = dg + C;                               // C, e^{cs_t}
    const M3cBlock k = m3c_block(d);
    const unsigned warp = threadIdx.x / 32, tc = C / 16, L = k.L, h = k.h;
    const unsigned long long row0 = k.row0;
    if (warp == 0) {
        m3c_warp_cumsum(adt, row0, h, L, C, d.nheads, cs);
    }
    __syncthreads();
    const float dh = dskip[h];
    for (unsigned t = threadIdx.x; t < C; t += blockDim.x) {
        float s = 0.0f, g = 0.0f, e = 0.0f;
        if (t < L) {
            const unsigned long long rh = (row0 + t) * d.nheads + h;
            s = m3c_scale(dt, lam, rh, k.c0 + t, d.len, d.nheads);
            g = dh + lam[rh] * dt[rh] * qk_raw[rh];
            e = expf(cs[t]);
        }
        sc[t] = s;
        dg[t] = g;
        ecs[t] = e;
    }
    __syncthreads();
    const unsigned long long hn = (unsigned long long)d.nheads * N;
    m3c_stage_bf16(q, row0, hn, (unsigned long long)h * N, N, L, C, nullptr, Q);
    m3c_stage_bf16(kin, row0, hn, (unsigned long long)h * N, N, L, C, sc, K);
    m3c_stage(proj, row0, d.width, (unsigned long long)d.off_x + h * P, P, L, C, nullptr, V);
    m3c_stage_bf16(states + ((unsigned long long)k.bh * d.nchunks + k.c) * P * N, 0, N, 0, N, P, P, nullptr, S);
    __syncthreads();
    // Scores W_ts = e^{cs_t - cs_s} q_t . k~_s for s < t < L, else 0; tiles
    // above the diagonal are never read.
    for (unsigned job = warp; job < tc * tc; job += M3C_WARPS) {
        const unsigned m0 = (job / tc) * 16, n0 = (job % tc) * 16;
        if (n0 > m0) {
            continue;
        }
        M3cAcc acc;
        m3c_zero(acc);
        m3c_gemm<false, true>(acc, Q, NS, K, NS, m0, n0, 0, N, 16);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const unsigned t = m3c_row(m0, r), s = m3c_col(n0, j, r);
                acc.v[j][r] = s < t && t < L ? expf(cs[t] - cs[s]) * acc.v[j][r] : 0.0f;
            }
        }
        m3c_store_bf(acc, W, CS, m0, n0, 16);
    }
    __syncthreads();
    // y = diag(e^{cs}) Q S^T + W V (+ dg v in f32).
    const unsigned tp = (P + M3C_JOB_COLS - 1) / M3C_JOB_COLS;
    const float* vf = proj + row0 * d.width + d.off_x + h * P;
    float* yo = y + row0 * d.d_inner + h * P;
    for (unsigned job = warp; job < tc * tp; job += M3C_WARPS) {
        const unsigned m0 = (job / tp) * 16, n0 = (job % tp) * M3C_JOB_COLS;
        const unsigned ncols = min(M3C_JOB_COLS, P - n0);
        M3cSide v;
        m3c_side_load(v, vf, d.width, m0, n0, ncols, L);
        M3cAcc acc;
        m3c_zero(acc);
        m3c_gemm<false, true>(acc, Q, NS, S, NS, m0, n0, 0, N, ncols);
        m3c_scale_rows(acc, ecs, m0);
        m3c_gemm<false, false>(acc, W, CS, V, PS, m0, n0, 0, m0 + 16, ncols);
#pragma unroll
        for (int j = 0; j < M3C_JOB_COLS / 8; ++j) {
            if (8u * j < ncols) {
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const unsigned t = m3c_row(m0, r), p = m3c_col(n0, j, r);
                    if (t < L) {
                        yo[t * (unsigned long long)d.d_inner + p] = fmaf(dg[t], v.v[j][r], acc.v[j][r]);
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
extern "C" __global__ void __launch_bounds__(M3C_THREADS, 2)
    m3c_scan_bwd(const m3c_bf* __restrict__ q, const m3c_bf* __restrict__ kin, const float* __restrict__ proj,
                 const float* __restrict__ dt, const float* __restrict__ adt, const float* __restrict__ lam,
                 const float* __restrict__ qk_raw, const float* __restrict__ dskip,
                 const m3c_bf* __restrict__ states, const m3c_bf* __restrict__ gstates, const float* __restrict__ dy,
                 float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dproj,
                 float* __restrict__ dadt, float* __restrict__ dscale, float* __restrict__ dqkdot,
                 float* __restrict__ dskip_part, M3Dims d) {
    extern __shared__ __align__(16) unsigned char m3c_sm[];
    const unsigned P = d.headdim, N = d.d_state, C = d.chunk;
    const unsigned PS = P + M3C_PAD, NS = N + M3C_PAD, CS = C + M3C_PAD;
    const unsigned tc = C / 16, TN = (N + M3C_JOB_COLS - 1) / M3C_JOB_COLS, TP = (P + M3C_JOB_COLS - 1) / M3C_JOB_COLS;
    m3c_bf* Q = reinterpret_cast<m3c_bf*>(m3c_sm);  // C x NS
    m3c_bf* K = Q + C * NS;                          // C x NS, k~ = scale_s k_s
    m3c_bf* V = K + C * NS;                          // C x PS
    m3c_bf* DY = V + C * PS;                         // C x PS
    m3c_bf* X = DY + C * PS;                         // P x NS: S_c, then G
    // C x CS each, [t][s]: QK = E_ts (q_t . k~_s) and DV = E_ts (dy_t . v_s)
    // for s < t < L (E_ts = e^{cs_t - cs_s}), else 0.
    m3c_bf* QK = X + P * NS;
    m3c_bf* DV = QK + C * CS;
    float* cs = reinterpret_cast<float*>(DV + C * CS);  // C + 1
    float* ecs = cs + C + 1;                              // C, e^{cs_t}
    float* dl = ecs + C;                                  // C, e^{cs_last - cs_t}
    float* dg = dl + C;                                   // C, D + gamma qk_raw
    float* sc = dg + C;                                   // C, scale
    float* dyv = sc + C;                                  // C, dy_t . v_t
    // Partial sums, one row of C per contributing job, added in order last:
    float* prow = dyv + C;      // tc x C: pair weights w_ts summed over score tile st's columns
    float* pcol = prow + tc * C;  // tc x C: w_ts summed over row block rb's rows
    float* pa = pcol + tc * C;  // TN x C: q . (inter-chunk dq) per column block
    float* pc = pa + TN * C;    // TN x C: dk~ . k per column block
    float* pb = pc + TN * C;    // TP x C: v . (dl G k~) per column block
    float* red = pb + TP * C;   // M3C_WARPS
    const M3cBlock k = m3c_block(d);
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, L = k.L, h = k.h;
    const unsigned long long row0 = k.row0, hn = (unsigned long long)d.nheads * N;
    if (warp == 0) {
        m3c_warp_cumsum(adt, row0, h, L, C, d.nheads, cs);
    }
    __syncthreads();
    const float dh = dskip[h];
    for (unsigned t = threadIdx.x; t < C; t += blockDim.x) {
        float s = 0.0f, g = 0.0f, e = 0.0f, l = 0.0f;
        if (t < L) {
            const unsigned long long rh = (row0 + t) * d.nheads + h;
            s = m3c_scale(dt, lam, rh, k.c0 + t, d.len, d.nheads);
            g = dh + lam[rh] * dt[rh] * qk_raw[rh];
            e = expf(cs[t]);
            l = expf(cs[C] - cs[t]);
        }
        sc[t] = s;
        dg[t] = g;
        ecs[t] = e;
        dl[t] = l;
    }
    __syncthreads();
    const float* vf = proj + row0 * d.width + d.off_x + h * P;  // v rows, f32
    const float* dyf = dy + row0 * d.d_inner + h * P;           // dy rows, f32
    const unsigned long long st_off = ((unsigned long long)k.bh * d.nchunks + k.c) * P * N;
    m3c_stage_bf16(q, row0, hn, (unsigned long long)h * N, N, L, C, nullptr, Q);
    m3c_stage_bf16(kin, row0, hn, (unsigned long long)h * N, N, L, C, sc, K);
    m3c_stage(proj, row0, d.width, (unsigned long long)d.off_x + h * P, P, L, C, nullptr, V);
    m3c_stage(dy, row0, d.d_inner, (unsigned long long)h * P, P, L, C, nullptr, DY);
    m3c_stage_bf16(states + st_off, 0, N, 0, N, P, P, nullptr, X);
    // dy_t . v_t in f32, a warp per row.
    for (unsigned t = warp; t < C; t += M3C_WARPS) {
        float acc = 0.0f;
        if (t < L) {
            for (unsigned p = lane; p < P; p += 32) {
                acc = fmaf(dyf[t * (unsigned long long)d.d_inner + p], vf[t * (unsigned long long)d.width + p], acc);
            }
        }
        acc = sg_warp_sum(acc);
        if (lane == 0) {
            dyv[t] = acc;
        }
    }
    __syncthreads();

    // Score tiles (rows t, columns s <= t): QK and DV, and the pair weights
    // w_ts = QK_ts (dy_t . v_s), which drive cs_t up and cs_s down.
    for (unsigned job = warp; job < tc * tc; job += M3C_WARPS) {
        const unsigned rb = job / tc, st = job % tc, m0 = rb * 16, n0 = st * 16;
        if (st > rb) {
            continue;
        }
        M3cAcc qk, dv;
        m3c_zero(qk);
        m3c_zero(dv);
        m3c_gemm<false, true>(qk, Q, NS, K, NS, m0, n0, 0, N, 16);
        m3c_gemm<false, true>(dv, DY, PS, V, PS, m0, n0, 0, P, 16);
        float rlo = 0.0f, rhi = 0.0f, col[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const unsigned t = m3c_row(m0, r), s = m3c_col(n0, j, r);
                float a = 0.0f, e_dv = 0.0f, w = 0.0f;
                if (s < t && t < L) {
                    const float e = expf(cs[t] - cs[s]);
                    a = e * qk.v[j][r];
                    e_dv = e * dv.v[j][r];
                    w = a * dv.v[j][r];
                }
                qk.v[j][r] = a;
                dv.v[j][r] = e_dv;
                if (r < 2) {
                    rlo += w;
                } else {
                    rhi += w;
                }
                col[j][r % 2] += w;
            }
        }
        m3c_store_bf(qk, QK, CS, m0, n0, 16);
        m3c_store_bf(dv, DV, CS, m0, n0, 16);
        rlo += __shfl_xor_sync(0xffffffffu, rlo, 1);
        rlo += __shfl_xor_sync(0xffffffffu, rlo, 2);
        rhi += __shfl_xor_sync(0xffffffffu, rhi, 1);
        rhi += __shfl_xor_sync(0xffffffffu, rhi, 2);
        if (lane % 4 == 0) {
            prow[st * C + m3c_row(m0, 0)] = rlo;
            prow[st * C + m3c_row(m0, 2)] = rhi;
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float v = col[j][e];
                v += __shfl_xor_sync(0xffffffffu, v, 4);
                v += __shfl_xor_sync(0xffffffffu, v, 8);
                v += __shfl_xor_sync(0xffffffffu, v, 16);
                if (lane < 4) {
                    pcol[rb * C + m3c_col(n0, j, e)] = v;
                }
            }
        }
    }
    __syncthreads();
    // dq = e^{cs_t} (S_c^T dy_t) + sum_{s<t} DV_ts k~_s; the first term's
    // row dot with q_t is the inter-chunk part of dL/dcs_t.
    for (unsigned job = warp; job < tc * TN; job += M3C_WARPS) {
        const unsigned rb = job / TN, nb = job % TN, m0 = rb * 16, n0 = nb * M3C_JOB_COLS;
        const unsigned ncols = min(M3C_JOB_COLS, N - n0);
        M3cSide qv;
        m3c_side_load_bf16(qv, q + row0 * hn + h * N, hn, m0, n0, ncols, L);
        M3cAcc acc;
        m3c_zero(acc);
        m3c_gemm<false, false>(acc, DY, PS, X, NS, m0, n0, 0, P, ncols);
        m3c_scale_rows(acc, ecs, m0);
        m3c_row_dots(acc, qv, m0, pa + nb * C);
        m3c_gemm<false, false>(acc, DV, CS, K, NS, m0, n0, 0, m0 + 16, ncols);
        m3c_store_f32(acc, dq + row0 * hn + h * N, hn, m0, n0, ncols, L);
    }
    __syncthreads();
    // G replaces S_c in X (bit for bit); the sum of G . S_c (both as the
    // walk stored them, in bf16, summed in f32) drives e^{cs_last} in front
    // of S_c.
    float part = 0.0f;
    {
        const uint4* gs = reinterpret_cast<const uint4*>(gstates + st_off);
        const uint4* ss = reinterpret_cast<const uint4*>(states + st_off);
        const unsigned n8 = P * N / 8, q8 = N / 8;
        for (unsigned i0 = threadIdx.x; i0 < n8; i0 += 2 * blockDim.x) {
            uint4 g[2], s[2];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const unsigned i = i0 + j * blockDim.x;
                g[j] = i < n8 ? gs[i] : make_uint4(0u, 0u, 0u, 0u);
                s[j] = i < n8 ? ss[i] : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const unsigned i = i0 + j * blockDim.x;
                if (i < n8) {
                    const unsigned gw[4] = {g[j].x, g[j].y, g[j].z, g[j].w};
                    const unsigned sw[4] = {s[j].x, s[j].y, s[j].z, s[j].w};
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        part = fmaf(__uint_as_float(gw[e] << 16), __uint_as_float(sw[e] << 16), part);
                        part = fmaf(__uint_as_float(gw[e] & 0xffff0000u), __uint_as_float(sw[e] & 0xffff0000u), part);
                    }
                    *reinterpret_cast<uint4*>(X + (i / q8) * NS + (i % q8) * 8) = g[j];
                }
            }
        }
    }
    part = sg_warp_sum(part);
    if (lane == 0) {
        red[warp] = part;
    }
    __syncthreads();
    // dk~_s = sum_{t>s} DV_ts q_t + e^{cs_last - cs_s} G^T v_s, and
    // dv_s = sum_{t>s} QK_ts dy_t + dg_s dy_s + e^{cs_last - cs_s} G k~_s.
    const unsigned jobs_k = tc * TN, jobs = jobs_k + tc * TP;
    for (unsigned job = warp; job < jobs; job += M3C_WARPS) {
        M3cAcc acc;
        m3c_zero(acc);
        M3cSide side;
        if (job < jobs_k) {
            const unsigned rb = job / TN, nb = job % TN, m0 = rb * 16, n0 = nb * M3C_JOB_COLS;
            const unsigned ncols = min(M3C_JOB_COLS, N - n0);
            m3c_side_load_bf16(side, kin + row0 * hn + h * N, hn, m0, n0, ncols, L);
            m3c_gemm<false, false>(acc, V, PS, X, NS, m0, n0, 0, P, ncols);
            m3c_scale_rows(acc, dl, m0);
            m3c_gemm<true, false>(acc, DV, CS, Q, NS, m0, n0, m0, C, ncols);
            m3c_row_dots(acc, side, m0, pc + nb * C);
            m3c_scale_rows(acc, sc, m0);
            m3c_store_f32(acc, dk + row0 * hn + h * N, hn, m0, n0, ncols, L);
        } else {
            const unsigned jv = job - jobs_k, rb = jv / TP, pbk = jv % TP, m0 = rb * 16, n0 = pbk * M3C_JOB_COLS;
            const unsigned ncols = min(M3C_JOB_COLS, P - n0);
            m3c_side_load(side, vf, d.width, m0, n0, ncols, L);
            M3cSide dys;
            m3c_side_load(dys, dyf, d.d_inner, m0, n0, ncols, L);
            m3c_gemm<false, true>(acc, K, NS, X, NS, m0, n0, 0, N, ncols);
            m3c_scale_rows(acc, dl, m0);
            m3c_row_dots(acc, side, m0, pb + pbk * C);
            m3c_gemm<true, false>(acc, QK, CS, DY, PS, m0, n0, m0, C, ncols);
            float* out = dproj + row0 * d.width + d.off_x + h * P;
#pragma unroll
            for (int j = 0; j < M3C_JOB_COLS / 8; ++j) {
                if (8u * j < ncols) {
#pragma unroll
                    for (int r = 0; r < 4; ++r) {
                        const unsigned s = m3c_row(m0, r), p = m3c_col(n0, j, r);
                        if (s < L) {
                            out[s * (unsigned long long)d.width + p] = fmaf(dg[s], dys.v[j][r], acc.v[j][r]);
                        }
                    }
                }
            }
        }
    }
    __syncthreads();
    // Per-position scalars: dL/dcs_t into prow[t], v . G k~ into pb[t].
    for (unsigned t = threadIdx.x; t < L; t += blockDim.x) {
        const unsigned long long rh = (row0 + t) * d.nheads + h;
        const unsigned tb = t / 16;
        float pair = 0.0f, inter = 0.0f, ds = 0.0f, vg = 0.0f;
        for (unsigned st = 0; st <= tb; ++st) {
            pair += prow[st * C + t];
        }
        for (unsigned rb = tb; rb < tc; ++rb) {
            pair -= pcol[rb * C + t];
        }
        for (unsigned j = 0; j < TN; ++j) {
            inter += pa[j * C + t];
            ds += pc[j * C + t];
        }
        for (unsigned j = 0; j < TP; ++j) {
            vg += pb[j * C + t];
        }
        prow[t] = pair + inter - vg;
        pb[t] = vg;
        dqkdot[rh] = dyv[t];
        dscale[rh] = ds;
    }
    __syncthreads();
    if (warp == 0) {
        const float gsum = sg_warp_sum(lane < M3C_WARPS ? red[lane] : 0.0f);
        float sum_vg = 0.0f, dd = 0.0f;
        for (unsigned t = lane; t < L; t += 32) {
            sum_vg += pb[t];
            dd += dyv[t];
        }
        sum_vg = sg_warp_sum(sum_vg);
        dd = sg_warp_sum(dd);
        // The last position also drives e^{cs_last} in front of S_c and of
        // every e^{cs_last - cs_s}.
        if (lane == 0) {
            prow[L - 1] += expf(cs[C]) * gsum + sum_vg;
        }
        __syncwarp();
        // dL/dadt_t = sum_{u >= t} dL/dcs_u: suffix sums 32 positions at a
        // time from the chunk's end, carrying the total.
        float carry = 0.0f;
        for (unsigned end = L; end > 0; end = end > 32 ? end - 32 : 0) {
            const unsigned first = end > 32 ? end - 32 : 0, t = first + lane;
            float v = t < end ? prow[t] : 0.0f;
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
            dskip_part[((unsigned long long)k.b * d.nchunks + k.c) * d.nheads + h] = dd;
        }
    }
}
