// Mamba-3 SISO language model, forward kernels (everything but the scan and
// the GEMMs, which cuBLAS runs): embedding gather, RMSNorm, the per-token
// split of the in_proj output (dt, A dt, trap, angles, B/C RMSNorm), the
// angle cumsum, biases + rotation, the z gate (optionally with the grouped
// output norm) and the cross-entropy.
//
// Layouts (row = b * T + t): per-token tensors are [rows, ...]; per-head
// scalars are [rows, H]; queries/keys are [rows, H, N]; angles [rows, H, S].
#include <cuda_bf16.h>
#include "mamba3_common.cuh"

// h[row, :] = emb[tokens[b, t], :]. An id outside [0, vocab) yields a NaN row
// (and so a NaN loss) instead of an out-of-bounds read: a captured kernel
// cannot return an error.
template <typename T>
__device__ void embed_fwd(const int* __restrict__ tokens, const T* __restrict__ emb, T* __restrict__ h,
                          unsigned len, unsigned width, unsigned vocab, unsigned rows) {
    unsigned long long n = (unsigned long long)rows * width;
    SG_FOR_EACH(i, n) {
        unsigned row = (unsigned)(i / width);
        unsigned j = (unsigned)(i % width);
        unsigned b = row / len, t = row % len;
        int id = tokens[(unsigned long long)b * (len + 1) + t];
        h[i] = (id >= 0 && (unsigned)id < vocab) ? emb[(unsigned long long)id * width + j] : (T)__int_as_float(0x7fc00000);
    }
}

extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_embed_fwd_f32(const int* __restrict__ tokens, const float* __restrict__ emb, float* __restrict__ h,
                     unsigned len, unsigned width, unsigned vocab, unsigned rows) {
    embed_fwd<float>(tokens, emb, h, len, width, vocab, rows);
}

// One block per row: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
// The statistics are f32 whatever the storage; TY is the storage of y, which
// feeds a GEMM (bf16 in the mixed step) while the residual x stays f32.
template <typename T, typename TY>
__device__ void rmsnorm_fwd(const T* __restrict__ x, const float* __restrict__ w, TY* __restrict__ y,
                            float* __restrict__ rstd, unsigned width, float eps, unsigned rows) {
    __shared__ float s[SG_BLOCK];
    for (unsigned row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* xr = x + (unsigned long long)row * width;
        float acc = 0.0f;
        for (unsigned j = threadIdx.x; j < width; j += SG_BLOCK) {
            float v = (float)xr[j];
            acc = fmaf(v, v, acc);
        }
        float ss = sg_block_sum(acc, s);
        float r = 1.0f / sqrtf(ss / (float)width + eps);
        TY* yr = y + (unsigned long long)row * width;
        for (unsigned j = threadIdx.x; j < width; j += SG_BLOCK) {
            yr[j] = (TY)((float)xr[j] * r * w[j]);
        }
        if (threadIdx.x == 0) {
            rstd[row] = r;
        }
    }
}

extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_rmsnorm_fwd_f32(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                       float* __restrict__ rstd, unsigned width, float eps, unsigned rows) {
    rmsnorm_fwd<float, float>(x, w, y, rstd, width, eps, rows);
}

// The mixed step's norms: f32 residual in, bf16 GEMM operand out.
extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_rmsnorm_fwd_bf16(const float* __restrict__ x, const float* __restrict__ w, __nv_bfloat16* __restrict__ y,
                        float* __restrict__ rstd, unsigned width, float eps, unsigned rows) {
    rmsnorm_fwd<float, __nv_bfloat16>(x, w, y, rstd, width, eps, rows);
}

// One block per row of the in_proj output: reciprocal RMS of every B and C
// group (one warp per group), theta = pi tanh(angles), and per head
// dt = softplus(dd_dt + dt_bias), adt = -max(f(dd_A), A_floor) dt (f: m3_a_rate),
// lam = sigmoid(trap).
template <typename T>
__device__ void prep(const T* __restrict__ proj, const float* __restrict__ dt_bias, float* __restrict__ rstd_b,
                     float* __restrict__ rstd_c, float* __restrict__ theta, float* __restrict__ dt,
                     float* __restrict__ adt, float* __restrict__ lam, M3Dims d) {
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = SG_BLOCK / 32;
    for (unsigned row = blockIdx.x; row < d.rows; row += gridDim.x) {
        const T* pr = proj + (unsigned long long)row * d.width;
        for (unsigned g = warp; g < d.ngroups; g += nwarps) {
            float sb = 0.0f, sc = 0.0f;
            for (unsigned n = lane; n < d.d_state; n += 32) {
                float bv = (float)pr[d.off_b + g * d.d_state + n];
                float cv = (float)pr[d.off_c + g * d.d_state + n];
                sb = fmaf(bv, bv, sb);
                sc = fmaf(cv, cv, sc);
            }
            sb = sg_warp_sum(sb);
            sc = sg_warp_sum(sc);
            if (lane == 0) {
                rstd_b[(unsigned long long)row * d.ngroups + g] = 1.0f / sqrtf(sb / (float)d.d_state + d.eps);
                rstd_c[(unsigned long long)row * d.ngroups + g] = 1.0f / sqrtf(sc / (float)d.d_state + d.eps);
            }
        }
        for (unsigned s = threadIdx.x; s < d.angles; s += SG_BLOCK) {
            theta[(unsigned long long)row * d.angles + s] = SG_PI_F * tanhf((float)pr[d.off_ang + s]);
        }
        for (unsigned h = threadIdx.x; h < d.nheads; h += SG_BLOCK) {
            unsigned long long rh = (unsigned long long)row * d.nheads + h;
            float dtv = m3_softplus((float)pr[d.off_dt + h] + dt_bias[h]);
            float a = -fmaxf(m3_a_rate(d, (float)pr[d.off_a + h]), d.a_floor);
            dt[rh] = dtv;
            adt[rh] = a * dtv;
            lam[rh] = m3_sigmoid((float)pr[d.off_trap + h]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_prep_f32(const float* __restrict__ proj, const float* __restrict__ dt_bias, float* __restrict__ rstd_b,
                float* __restrict__ rstd_c, float* __restrict__ theta, float* __restrict__ dt,
                float* __restrict__ adt, float* __restrict__ lam, M3Dims d) {
    prep<float>(proj, dt_bias, rstd_b, rstd_c, theta, dt, adt, lam, d);
}

// phi_t = (sum_{r <= t} dt_r theta_r) mod 2 pi. A block takes one (b, h) and
// up to 32 angles: lane = angle (coalesced reads of theta and writes of phi,
// whose angle index is innermost), warp = one of M3_ANGLE_SEGS consecutive
// time segments. Each warp sums its segment, the segment totals are combined
// in a fixed order through shared memory, and each warp walks its segment
// again from its carry, so the serial chain is T / 32 steps instead of T.
// Sums run in double: an f32 running sum drifts by ~T ulps of 2 pi, which
// the rotation turns into error in every score. Reducing the sum mod 2 pi
// on output equals the recurrence's per-step wrap.
extern "C" __global__ void __launch_bounds__(M3_ANGLE_THREADS)
    m3_angle_fwd_f32(const float* __restrict__ dt, const float* __restrict__ theta, float* __restrict__ phi,
                     M3Dims d) {
    const double two_pi = 6.283185307179586476925;
    __shared__ double tot[M3_ANGLE_SEGS][32];
    const M3AngleSched k = m3_angle_sched(d);
    const unsigned lane = k.lane, seg = k.seg, t0 = k.t0, t1 = k.t1;
    for (unsigned long long u = blockIdx.x; u < k.units; u += gridDim.x) {
        const M3AngleUnit a = m3_angle_unit(d, k, u);
        const unsigned s = a.s, h = a.h;
        const unsigned long long row0 = a.row0;
        const bool live = a.live;
        double acc = 0.0;
        if (live) {
#pragma unroll 8
            for (unsigned t = t0; t < t1; ++t) {
                const unsigned long long row = row0 + t;
                acc += (double)dt[row * d.nheads + h] * (double)theta[row * d.angles + s];
            }
        }
        tot[seg][lane] = acc;
        __syncthreads();
        double carry = 0.0;
        for (unsigned w = 0; w < seg; ++w) {
            carry += tot[w][lane];
        }
        carry -= two_pi * floor(carry / two_pi);
        if (live) {
            for (unsigned t = t0; t < t1; ++t) {
                const unsigned long long row = row0 + t;
                carry += (double)dt[row * d.nheads + h] * (double)theta[row * d.angles + s];
                phi[(row * d.nheads + h) * d.angles + s] = (float)(carry - two_pi * floor(carry / two_pi));
            }
        }
        // The next unit rewrites tot.
        __syncthreads();
    }
}

// The same cumsum with one thread per (b, h, angle) walking the whole
// window: for short windows and many (b, h, angle) (the state-tracking
// models: T 161, 65536 threads at batch 256), where the segmented form's
// 1024-thread blocks, half their lanes idle at S 16, spend more time on the
// barrier and the carry than on the sums (kernels/mamba3.rs, AngleForm).
// Consecutive threads take consecutive angles, then heads, so a warp's
// stores of phi are contiguous; dt is a broadcast, theta is shared by the
// heads through L1. The same double sum and wrap as the segmented form;
// only the order of the double additions differs.
extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_angle_fwd_serial_f32(const float* __restrict__ dt, const float* __restrict__ theta,
                            float* __restrict__ phi, M3Dims d) {
    const double two_pi = 6.283185307179586476925;
    const unsigned long long hs = (unsigned long long)d.nheads * d.angles;
    const unsigned long long n = (unsigned long long)d.batch * hs;
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const unsigned s = (unsigned)(i % d.angles);
        const unsigned long long bh = i / d.angles;
        const unsigned h = (unsigned)(bh % d.nheads);
        const unsigned long long row0 = (bh / d.nheads) * d.len;
        const float* dp = dt + row0 * d.nheads + h;
        const float* tp = theta + row0 * d.angles + s;
        float* pp = phi + row0 * hs + (unsigned long long)h * d.angles + s;
        // The loads of M3_ANGLE_RUN tokens are issued before any of their
        // stores: the compiler cannot tell the stores from the later loads
        // apart (the strides are run-time values), so a plain loop waits
        // out one load latency a token.
        double acc = 0.0;
        for (unsigned t0 = 0; t0 < d.len; t0 += M3_ANGLE_RUN) {
            float a[M3_ANGLE_RUN], th[M3_ANGLE_RUN];
#pragma unroll
            for (unsigned k = 0; k < M3_ANGLE_RUN; ++k) {
                const unsigned long long t = t0 + k;
                a[k] = t < d.len ? dp[t * d.nheads] : 0.0f;
                th[k] = t < d.len ? tp[t * d.angles] : 0.0f;
            }
#pragma unroll
            for (unsigned k = 0; k < M3_ANGLE_RUN; ++k) {
                const unsigned long long t = t0 + k;
                if (t < d.len) {
                    acc += (double)a[k] * (double)th[k];
                    pp[t * hs] = (float)(acc - two_pi * floor(acc / two_pi));
                }
            }
        }
    }
}

// Standard RoPE, the rotation ablation with input-independent angles:
// phi[row, h, s] = ((t + 1) omega_s) mod 2 pi, omega_s = base^(-s / S),
// t = row % T. It is m3_angle_fwd_f32's cumsum with every dt_t theta_t
// replaced by the constant omega_s, so the same for every head and input;
// in double, like that cumsum, so the wrap keeps the angle's low bits.
extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_angle_fixed_f32(float* __restrict__ phi, double base, M3Dims d) {
    const double two_pi = 6.283185307179586476925;
    const unsigned long long hs = (unsigned long long)d.nheads * d.angles;
    const unsigned long long n = (unsigned long long)d.rows * hs;
    SG_FOR_EACH(i, n) {
        const unsigned s = (unsigned)(i % d.angles);
        const unsigned long long row = i / hs;
        const double steps = (double)(row % d.len + 1);
        const double v = steps * pow(base, -(double)s / (double)d.angles);
        phi[i] = (float)(v - two_pi * floor(v / two_pi));
    }
}

// One warp per (row, head), one lane per interleaved pair: the biased,
// normalised key/query of the head's group, their unrotated dot product, and
// the rotation of the first S pairs by +phi, stored as Q (f32, or bf16 in
// the mixed step: the scan rounds them to bf16 for its products anyway).
template <typename T, typename Q>
__device__ void qk_fwd(const T* __restrict__ proj, const float* __restrict__ rstd_b, const float* __restrict__ rstd_c,
                       const float* __restrict__ b_norm, const float* __restrict__ c_norm,
                       const float* __restrict__ b_bias, const float* __restrict__ c_bias,
                       const float* __restrict__ phi, Q* __restrict__ q, Q* __restrict__ k,
                       float* __restrict__ qk_raw, M3Dims d) {
    const unsigned lane = threadIdx.x % 32;
    const unsigned long long warps = (unsigned long long)gridDim.x * (SG_BLOCK / 32);
    const unsigned long long total = (unsigned long long)d.rows * d.nheads;
    const unsigned hpg = d.nheads / d.ngroups;
    for (unsigned long long w = (unsigned long long)blockIdx.x * (SG_BLOCK / 32) + threadIdx.x / 32; w < total;
         w += warps) {
        unsigned long long row = w / d.nheads;
        unsigned h = (unsigned)(w % d.nheads);
        unsigned g = h / hpg;
        const T* pr = proj + row * d.width;
        float rb = rstd_b[row * d.ngroups + g], rc = rstd_c[row * d.ngroups + g];
        float dot = 0.0f;
        for (unsigned i = lane; 2 * i < d.d_state; i += 32) {
            unsigned j0 = 2 * i, j1 = 2 * i + 1;
            float kb0 = m3_hat((float)pr[d.off_b + g * d.d_state + j0], rb, b_norm[j0], b_bias[h * d.d_state + j0]);
            float kb1 = m3_hat((float)pr[d.off_b + g * d.d_state + j1], rb, b_norm[j1], b_bias[h * d.d_state + j1]);
            float qb0 = m3_hat((float)pr[d.off_c + g * d.d_state + j0], rc, c_norm[j0], c_bias[h * d.d_state + j0]);
            float qb1 = m3_hat((float)pr[d.off_c + g * d.d_state + j1], rc, c_norm[j1], c_bias[h * d.d_state + j1]);
            dot = fmaf(qb0, kb0, dot);
            dot = fmaf(qb1, kb1, dot);
            if (i < d.angles) {
                float sn, cs;
                sincosf(phi[w * d.angles + i], &sn, &cs);
                m3_rotate(kb0, kb1, sn, cs);
                m3_rotate(qb0, qb1, sn, cs);
            }
            m3_store_pair(k + w * d.d_state + j0, kb0, kb1);
            m3_store_pair(q + w * d.d_state + j0, qb0, qb1);
        }
        dot = sg_warp_sum(dot);
        if (lane == 0) {
            qk_raw[w] = dot;
        }
    }
}

extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_qk_fwd_f32(const float* __restrict__ proj, const float* __restrict__ rstd_b, const float* __restrict__ rstd_c,
                  const float* __restrict__ b_norm, const float* __restrict__ c_norm,
                  const float* __restrict__ b_bias, const float* __restrict__ c_bias,
                  const float* __restrict__ phi, float* __restrict__ q, float* __restrict__ k,
                  float* __restrict__ qk_raw, M3Dims d) {
    qk_fwd<float, float>(proj, rstd_b, rstd_c, b_norm, c_norm, b_bias, c_bias, phi, q, k, qk_raw, d);
}

extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_qk_fwd_bf16qk(const float* __restrict__ proj, const float* __restrict__ rstd_b, const float* __restrict__ rstd_c,
                     const float* __restrict__ b_norm, const float* __restrict__ c_norm,
                     const float* __restrict__ b_bias, const float* __restrict__ c_bias,
                     const float* __restrict__ phi, __nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ k,
                     float* __restrict__ qk_raw, M3Dims d) {
    qk_fwd<float, __nv_bfloat16>(proj, rstd_b, rstd_c, b_norm, c_norm, b_bias, c_bias, phi, q, k, qk_raw, d);
}


// The vectorised form of qk_fwd for N / 8 a power of two up to 32 (the
// wrapper falls back to the warp form otherwise): N / 8 lanes per
// (row, head), eight elements (four pairs) a lane, so a warp serves 32 / (N / 8)
// (row, head) items at once (heads fastest: the items of a warp share the
// row's B/C in L1) and the dot reduces in a few shuffles, with no shared
// memory and no barrier. Same values as the warp form (m3_hat's rounding:
// x * rstd first) except the dot's summation order.
template <typename Q>
__device__ __forceinline__ void m3_store8(Q* p, const float* v);
template <>
__device__ __forceinline__ void m3_store8<float>(float* p, const float* v) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
template <>
__device__ __forceinline__ void m3_store8<__nv_bfloat16>(__nv_bfloat16* p, const float* v) {
    uint4 u;
    __nv_bfloat162 h0 = __floats2bfloat162_rn(v[0], v[1]), h1 = __floats2bfloat162_rn(v[2], v[3]);
    __nv_bfloat162 h2 = __floats2bfloat162_rn(v[4], v[5]), h3 = __floats2bfloat162_rn(v[6], v[7]);
    u.x = *reinterpret_cast<unsigned*>(&h0);
    u.y = *reinterpret_cast<unsigned*>(&h1);
    u.z = *reinterpret_cast<unsigned*>(&h2);
    u.w = *reinterpret_cast<unsigned*>(&h3);
    *reinterpret_cast<uint4*>(p) = u;
}

template <typename Q>
__device__ void qk_fwd_vec(const float* __restrict__ proj, const float* __restrict__ rstd_b,
                           const float* __restrict__ rstd_c, const float* __restrict__ b_norm,
                           const float* __restrict__ c_norm, const float* __restrict__ b_bias,
                           const float* __restrict__ c_bias, const float* __restrict__ phi, Q* __restrict__ q,
                           Q* __restrict__ k, float* __restrict__ qk_raw, M3Dims d) {
    const unsigned tpr = d.d_state / 8, sub = threadIdx.x % tpr, j0 = 8 * sub;
    const unsigned long long total = (unsigned long long)d.rows * d.nheads;
    const unsigned long long per_warp = 32 / tpr;
    const unsigned long long warps = (unsigned long long)gridDim.x * (SG_BLOCK / 32);
    const unsigned hpg = d.nheads / d.ngroups;
    // The loop bound is the warp's: every lane shuffles on every pass.
    for (unsigned long long w = (unsigned long long)blockIdx.x * (SG_BLOCK / 32) + threadIdx.x / 32;
         w * per_warp < total; w += warps) {
        const unsigned long long item = w * per_warp + (threadIdx.x % 32) / tpr;
        float dot = 0.0f;
        if (item < total) {
            const unsigned long long row = item / d.nheads;
            const unsigned h = (unsigned)(item % d.nheads), g = h / hpg;
            const float* pr = proj + row * d.width;
            // The angles load first, with the other inputs: sincosf's slow
            // path is a branch, and a load placed after one waits on its own.
            // 16-byte loads where the layout allows them (every item's angles,
            // every row's B/C columns start at a multiple of 4 floats): the
            // kernel is bound by L1 requests (ncu at M: L1 72%, DRAM 25%), a
            // quarter of them with scalar loads.
            float ph[4], xbv[8], xcv[8];
            if (d.angles % 4 == 0) {
                const float4 t = j0 / 2 < d.angles
                                     ? *reinterpret_cast<const float4*>(phi + item * d.angles + j0 / 2)
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                ph[0] = t.x;
                ph[1] = t.y;
                ph[2] = t.z;
                ph[3] = t.w;
            } else {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const unsigned pair = j0 / 2 + i;
                    ph[i] = pair < d.angles ? phi[item * d.angles + pair] : 0.0f;
                }
            }
            const float* xb = pr + d.off_b + g * d.d_state + j0;
            const float* xc = pr + d.off_c + g * d.d_state + j0;
            if (d.width % 4 == 0 && d.off_b % 4 == 0 && d.off_c % 4 == 0) {
#pragma unroll
                for (int e = 0; e < 8; e += 4) {
                    const float4 b4 = *reinterpret_cast<const float4*>(xb + e);
                    const float4 c4 = *reinterpret_cast<const float4*>(xc + e);
                    xbv[e] = b4.x;
                    xbv[e + 1] = b4.y;
                    xbv[e + 2] = b4.z;
                    xbv[e + 3] = b4.w;
                    xcv[e] = c4.x;
                    xcv[e + 1] = c4.y;
                    xcv[e + 2] = c4.z;
                    xcv[e + 3] = c4.w;
                }
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    xbv[e] = xb[e];
                    xcv[e] = xc[e];
                }
            }
            const float rb = rstd_b[row * d.ngroups + g], rc = rstd_c[row * d.ngroups + g];
            float kv[8], qv[8];
#pragma unroll
            for (int e = 0; e < 8; e += 4) {
                const float4 bn = *reinterpret_cast<const float4*>(b_norm + j0 + e);
                const float4 cn = *reinterpret_cast<const float4*>(c_norm + j0 + e);
                const float4 bb = *reinterpret_cast<const float4*>(b_bias + h * d.d_state + j0 + e);
                const float4 cb = *reinterpret_cast<const float4*>(c_bias + h * d.d_state + j0 + e);
                kv[e] = m3_hat(xbv[e], rb, bn.x, bb.x);
                kv[e + 1] = m3_hat(xbv[e + 1], rb, bn.y, bb.y);
                kv[e + 2] = m3_hat(xbv[e + 2], rb, bn.z, bb.z);
                kv[e + 3] = m3_hat(xbv[e + 3], rb, bn.w, bb.w);
                qv[e] = m3_hat(xcv[e], rc, cn.x, cb.x);
                qv[e + 1] = m3_hat(xcv[e + 1], rc, cn.y, cb.y);
                qv[e + 2] = m3_hat(xcv[e + 2], rc, cn.z, cb.z);
                qv[e + 3] = m3_hat(xcv[e + 3], rc, cn.w, cb.w);
            }
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                dot = fmaf(qv[e], kv[e], dot);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const unsigned pair = j0 / 2 + i;
                if (pair < d.angles) {
                    float sn, cs;
                    sincosf(ph[i], &sn, &cs);
                    m3_rotate(kv[2 * i], kv[2 * i + 1], sn, cs);
                    m3_rotate(qv[2 * i], qv[2 * i + 1], sn, cs);
                }
            }
            m3_store8<Q>(k + item * d.d_state + j0, kv);
            m3_store8<Q>(q + item * d.d_state + j0, qv);
        }
        for (unsigned o = tpr / 2; o > 0; o >>= 1) {
            dot += __shfl_xor_sync(0xffffffffu, dot, o);
        }
        if (item < total && sub == 0) {
            qk_raw[item] = dot;
        }
    }
}

extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_qk_fwd_vec_f32(const float* __restrict__ proj, const float* __restrict__ rstd_b,
                      const float* __restrict__ rstd_c, const float* __restrict__ b_norm,
                      const float* __restrict__ c_norm, const float* __restrict__ b_bias,
                      const float* __restrict__ c_bias, const float* __restrict__ phi, float* __restrict__ q,
                      float* __restrict__ k, float* __restrict__ qk_raw, M3Dims d) {
    qk_fwd_vec<float>(proj, rstd_b, rstd_c, b_norm, c_norm, b_bias, c_bias, phi, q, k, qk_raw, d);
}

extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_qk_fwd_vec_bf16qk(const float* __restrict__ proj, const float* __restrict__ rstd_b,
                         const float* __restrict__ rstd_c, const float* __restrict__ b_norm,
                         const float* __restrict__ c_norm, const float* __restrict__ b_bias,
                         const float* __restrict__ c_bias, const float* __restrict__ phi,
                         __nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ k,
                         float* __restrict__ qk_raw, M3Dims d) {
    qk_fwd_vec<__nv_bfloat16>(proj, rstd_b, rstd_c, b_norm, c_norm, b_bias, c_bias, phi, q, k, qk_raw, d);
}

// One warp per (row, head): o = y' * silu(z), y' = y, or with the output norm
// y' = RMSNorm_P(y) w (its reciprocal RMS kept in gate_rstd). `has_norm` = 0
// ignores `norm_w` and `gate_rstd`. TO is the storage of o, the out_proj
// GEMM operand.
template <typename T, typename TO>
__device__ void gate_fwd(const T* __restrict__ y, const T* __restrict__ proj, const float* __restrict__ norm_w,
                         TO* __restrict__ o, float* __restrict__ gate_rstd, unsigned has_norm, M3Dims d) {
    const unsigned lane = threadIdx.x % 32;
    const unsigned long long warps = (unsigned long long)gridDim.x * (SG_BLOCK / 32);
    const unsigned long long total = (unsigned long long)d.rows * d.nheads;
    for (unsigned long long w = (unsigned long long)blockIdx.x * (SG_BLOCK / 32) + threadIdx.x / 32; w < total;
         w += warps) {
        unsigned long long row = w / d.nheads;
        unsigned h = (unsigned)(w % d.nheads);
        const T* yr = y + row * d.d_inner + (unsigned long long)h * d.headdim;
        const T* zr = proj + row * d.width + d.off_z + (unsigned long long)h * d.headdim;
        TO* orow = o + row * d.d_inner + (unsigned long long)h * d.headdim;
        float r = 1.0f;
        if (has_norm) {
            float acc = 0.0f;
            for (unsigned j = lane; j < d.headdim; j += 32) {
                float v = (float)yr[j];
                acc = fmaf(v, v, acc);
            }
            acc = sg_warp_sum(acc);
            r = 1.0f / sqrtf(acc / (float)d.headdim + d.eps);
            if (lane == 0) {
                gate_rstd[w] = r;
            }
        }
        for (unsigned j = lane; j < d.headdim; j += 32) {
            float yv = (float)yr[j];
            float yn = has_norm ? yv * r * norm_w[h * d.headdim + j] : yv;
            orow[j] = (TO)(yn * m3_silu((float)zr[j]));
        }
    }
}

// The same gate with `g` = headdim / 4 lanes a (row, head), four adjacent
// values a lane, when g is a power of two up to 32 and every row's y, z and
// o start 16-byte aligned (kernels/mamba3.rs, gate_lanes decides): at
// headdim 16 a warp serves eight heads with 16-byte loads where the warp
// form serves one with half its lanes. The norm's sum is a butterfly over
// the group. The loop bound is the warp's first unit, so every lane reaches
// the shuffles.
template <typename TO>
__device__ void gate_fwd_grp(const float* __restrict__ y, const float* __restrict__ proj,
                             const float* __restrict__ norm_w, TO* __restrict__ o, float* __restrict__ gate_rstd,
                             unsigned has_norm, unsigned g, M3Dims d) {
    const unsigned lane = threadIdx.x % 32, per_warp = 32 / g, j = (lane % g) * 4;
    const unsigned long long total = (unsigned long long)d.rows * d.nheads;
    const unsigned long long stride = (unsigned long long)gridDim.x * (SG_BLOCK / 32) * per_warp;
    for (unsigned long long w0 = ((unsigned long long)blockIdx.x * (SG_BLOCK / 32) + threadIdx.x / 32) * per_warp;
         w0 < total; w0 += stride) {
        const unsigned long long w = w0 + lane / g;
        const bool live = w < total;
        const unsigned long long row = live ? w / d.nheads : 0;
        const unsigned h = live ? (unsigned)(w % d.nheads) : 0;
        const unsigned long long yb = row * d.d_inner + (unsigned long long)h * d.headdim + j;
        float4 yv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), zv = yv;
        if (live) {
            yv = m3_load4(y + yb);
            zv = m3_load4(proj + row * d.width + d.off_z + (unsigned long long)h * d.headdim + j);
        }
        if (has_norm) {
            float acc = fmaf(yv.x, yv.x, fmaf(yv.y, yv.y, fmaf(yv.z, yv.z, yv.w * yv.w)));
            acc = m3_group_sum(acc, g);
            const float r = 1.0f / sqrtf(acc / (float)d.headdim + d.eps);
            if (live && j == 0) {
                gate_rstd[w] = r;
            }
            const float* wn = norm_w + (unsigned long long)h * d.headdim + j;
            yv = make_float4(yv.x * r * wn[0], yv.y * r * wn[1], yv.z * r * wn[2], yv.w * r * wn[3]);
        }
        if (live) {
            m3_store4(o + yb, make_float4(yv.x * m3_silu(zv.x), yv.y * m3_silu(zv.y), yv.z * m3_silu(zv.z),
                                          yv.w * m3_silu(zv.w)));
        }
    }
}

// `lanes` = 0: the warp form; else the group form with that many lanes a
// head (kernels/mamba3.rs, gate_lanes).
extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_gate_fwd_f32(const float* __restrict__ y, const float* __restrict__ proj, const float* __restrict__ norm_w,
                    float* __restrict__ o, float* __restrict__ gate_rstd, unsigned has_norm, unsigned lanes,
                    M3Dims d) {
    if (lanes == 0) {
        gate_fwd<float, float>(y, proj, norm_w, o, gate_rstd, has_norm, d);
    } else {
        gate_fwd_grp<float>(y, proj, norm_w, o, gate_rstd, has_norm, lanes, d);
    }
}

// The mixed step's gate: f32 scan output and z in, bf16 GEMM operand out.
extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_gate_fwd_bf16(const float* __restrict__ y, const float* __restrict__ proj, const float* __restrict__ norm_w,
                     __nv_bfloat16* __restrict__ o, float* __restrict__ gate_rstd, unsigned has_norm,
                     unsigned lanes, M3Dims d) {
    if (lanes == 0) {
        gate_fwd<float, __nv_bfloat16>(y, proj, norm_w, o, gate_rstd, has_norm, d);
    } else {
        gate_fwd_grp<__nv_bfloat16>(y, proj, norm_w, o, gate_rstd, has_norm, lanes, d);
    }
}

// One block per row: lse = log sum exp(logits), row_loss = lse - logit[target]
// with target = tokens[b, t + 1]; an out-of-range target gives NaN.
extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_ce_fwd_f32(const float* __restrict__ logits, const int* __restrict__ tokens, float* __restrict__ lse,
                  float* __restrict__ row_loss, unsigned vocab, unsigned len, unsigned rows) {
    __shared__ float s[SG_BLOCK];
    for (unsigned row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* lr = logits + (unsigned long long)row * vocab;
        float m = -__int_as_float(0x7f800000);
        for (unsigned j = threadIdx.x; j < vocab; j += SG_BLOCK) {
            m = fmaxf(m, lr[j]);
        }
        m = sg_block_max(m, s);
        float acc = 0.0f;
        for (unsigned j = threadIdx.x; j < vocab; j += SG_BLOCK) {
            acc += expf(lr[j] - m);
        }
        float z = sg_block_sum(acc, s);
        if (threadIdx.x == 0) {
            float l = m + logf(z);
            unsigned b = row / len, t = row % len;
            int tgt = tokens[(unsigned long long)b * (len + 1) + t + 1];
            lse[row] = l;
            row_loss[row] = (tgt >= 0 && (unsigned)tgt < vocab) ? l - lr[tgt] : __int_as_float(0x7fc00000);
        }
    }
}

// One block: out[0] = sum(x[0..n)) / n in a fixed order.
extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_mean_f32(const float* __restrict__ x, unsigned n, float* __restrict__ out) {
    __shared__ float s[SG_BLOCK];
    float acc = 0.0f;
    for (unsigned i = threadIdx.x; i < n; i += SG_BLOCK) {
        acc += x[i];
    }
    float total = sg_block_sum(acc, s);
    if (threadIdx.x == 0) {
        out[0] = total / (float)(n > 0 ? n : 1);
    }
}
