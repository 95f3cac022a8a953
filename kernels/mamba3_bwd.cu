// Mamba-3 SISO language model, backward kernels (besides the scan and the
// GEMMs): cross-entropy, RMSNorm, the z gate, the rotation, the angle
// cumsum, the scalar activations, the B/C RMSNorm, the deterministic column
// sums that turn per-row contributions into parameter gradients, and the
// embedding scatter.
//
// No float atomics anywhere: every parameter gradient that sums over rows is
// written per row first and then reduced by m3_colsum_* in a fixed order.
#include "mamba3_common.cuh"

// dlogits = (softmax(logits) - onehot(target)) * inv_rows.
extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_ce_bwd_f32(const float* __restrict__ logits, const float* __restrict__ lse, const int* __restrict__ tokens,
                  float* __restrict__ dlogits, unsigned vocab, unsigned len, unsigned rows, float inv_rows) {
    unsigned long long n = (unsigned long long)rows * vocab;
    SG_FOR_EACH(i, n) {
        unsigned row = (unsigned)(i / vocab);
        unsigned j = (unsigned)(i % vocab);
        unsigned b = row / len, t = row % len;
        int tgt = tokens[(unsigned long long)b * (len + 1) + t + 1];
        float p = expf(logits[i] - lse[row]) * inv_rows;
        dlogits[i] = (tgt >= 0 && (unsigned)tgt == j) ? p - inv_rows : p;
    }
}

// One block per row of y = x * r * w: dx = r w dy - (r^3 / n) (sum dy w x) x,
// written to dx (accumulate = 0) or added to it (accumulate = 1); the row's
// weight-gradient share dy * x * r goes to contrib[row, :].
template <typename T>
__device__ void rmsnorm_bwd(const T* __restrict__ x, const float* __restrict__ w, const float* __restrict__ rstd,
                            const T* __restrict__ dy, T* __restrict__ dx, float* __restrict__ contrib,
                            unsigned width, unsigned accumulate, unsigned rows) {
    __shared__ float s[SG_BLOCK];
    for (unsigned row = blockIdx.x; row < rows; row += gridDim.x) {
        const unsigned long long base = (unsigned long long)row * width;
        const float r = rstd[row];
        float acc = 0.0f;
        for (unsigned j = threadIdx.x; j < width; j += SG_BLOCK) {
            float g = (float)dy[base + j], xv = (float)x[base + j];
            acc = fmaf(g * w[j], xv, acc);
            contrib[base + j] = g * xv * r;
        }
        const float c = r * r * r * sg_block_sum(acc, s) / (float)width;
        for (unsigned j = threadIdx.x; j < width; j += SG_BLOCK) {
            float v = r * w[j] * (float)dy[base + j] - c * (float)x[base + j];
            dx[base + j] = (T)(accumulate ? (float)dx[base + j] + v : v);
        }
    }
}

extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_rmsnorm_bwd_f32(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ rstd,
                       const float* __restrict__ dy, float* __restrict__ dx, float* __restrict__ contrib,
                       unsigned width, unsigned accumulate, unsigned rows) {
    rmsnorm_bwd<float>(x, w, rstd, dy, dx, contrib, width, accumulate, rows);
}

// One warp per (row, head) of o = y' silu(z): dz into dproj's z columns, dy
// into dy[rows, d_inner]; with the output norm, the norm weight's per-row
// share into contrib[rows, d_inner].
template <typename T>
__device__ void gate_bwd(const T* __restrict__ y, const T* __restrict__ proj, const float* __restrict__ norm_w,
                         const float* __restrict__ gate_rstd, const T* __restrict__ d_o, T* __restrict__ dproj,
                         T* __restrict__ dy, float* __restrict__ contrib, unsigned has_norm, M3Dims d) {
    const unsigned lane = threadIdx.x % 32;
    const unsigned long long warps = (unsigned long long)gridDim.x * (SG_BLOCK / 32);
    const unsigned long long total = (unsigned long long)d.rows * d.nheads;
    for (unsigned long long w = (unsigned long long)blockIdx.x * (SG_BLOCK / 32) + threadIdx.x / 32; w < total;
         w += warps) {
        unsigned long long row = w / d.nheads;
        unsigned h = (unsigned)(w % d.nheads);
        unsigned long long yb = row * d.d_inner + (unsigned long long)h * d.headdim;
        unsigned long long zb = row * d.width + d.off_z + (unsigned long long)h * d.headdim;
        if (has_norm) {
            const float r = gate_rstd[w];
            const float* wn = norm_w + (unsigned long long)h * d.headdim;
            float acc = 0.0f;
            for (unsigned j = lane; j < d.headdim; j += 32) {
                float yv = (float)y[yb + j], z = (float)proj[zb + j], go = (float)d_o[yb + j];
                float sz, gz;
                m3_silu_both(z, sz, gz);
                float dyn = go * sz;
                dproj[zb + j] = (T)(go * yv * r * wn[j] * gz);
                contrib[yb + j] = dyn * yv * r;
                acc = fmaf(dyn * wn[j], yv, acc);
            }
            const float c = r * r * r * sg_warp_sum(acc) / (float)d.headdim;
            for (unsigned j = lane; j < d.headdim; j += 32) {
                float yv = (float)y[yb + j], z = (float)proj[zb + j], go = (float)d_o[yb + j];
                dy[yb + j] = (T)(r * wn[j] * go * m3_silu(z) - c * yv);
            }
        } else {
            for (unsigned j = lane; j < d.headdim; j += 32) {
                float yv = (float)y[yb + j], z = (float)proj[zb + j], go = (float)d_o[yb + j];
                float sz, gz;
                m3_silu_both(z, sz, gz);
                dproj[zb + j] = (T)(go * yv * gz);
                dy[yb + j] = (T)(go * sz);
            }
        }
    }
}

// The group form of gate_bwd (see gate_fwd_grp in mamba3_fwd.cu): g =
// headdim / 4 lanes a (row, head), four adjacent values a lane, kept in
// registers between the norm's butterfly and the second half.
__device__ void gate_bwd_grp(const float* __restrict__ y, const float* __restrict__ proj,
                             const float* __restrict__ norm_w, const float* __restrict__ gate_rstd,
                             const float* __restrict__ d_o, float* __restrict__ dproj, float* __restrict__ dy,
                             float* __restrict__ contrib, unsigned has_norm, unsigned g, M3Dims d) {
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
        const unsigned long long zb = row * d.width + d.off_z + (unsigned long long)h * d.headdim + j;
        float yv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, z[4] = {0.0f, 0.0f, 0.0f, 0.0f}, go[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (live) {
            const float4 a = m3_load4(y + yb), b = m3_load4(proj + zb), c = m3_load4(d_o + yb);
            yv[0] = a.x, yv[1] = a.y, yv[2] = a.z, yv[3] = a.w;
            z[0] = b.x, z[1] = b.y, z[2] = b.z, z[3] = b.w;
            go[0] = c.x, go[1] = c.y, go[2] = c.z, go[3] = c.w;
        }
        float sz[4], gz[4], dz[4], dyo[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            m3_silu_both(z[e], sz[e], gz[e]);
        }
        if (has_norm) {
            const float r = live ? gate_rstd[w] : 0.0f;
            const float* wn = norm_w + (unsigned long long)h * d.headdim + j;
            float acc = 0.0f, ct[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float dyn = go[e] * sz[e];
                dz[e] = go[e] * yv[e] * r * wn[e] * gz[e];
                ct[e] = dyn * yv[e] * r;
                acc = fmaf(dyn * wn[e], yv[e], acc);
            }
            const float c = r * r * r * m3_group_sum(acc, g) / (float)d.headdim;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                dyo[e] = r * wn[e] * go[e] * sz[e] - c * yv[e];
            }
            if (live) {
                m3_store4(contrib + yb, make_float4(ct[0], ct[1], ct[2], ct[3]));
            }
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                dz[e] = go[e] * yv[e] * gz[e];
                dyo[e] = go[e] * sz[e];
            }
        }
        if (live) {
            m3_store4(dproj + zb, make_float4(dz[0], dz[1], dz[2], dz[3]));
            m3_store4(dy + yb, make_float4(dyo[0], dyo[1], dyo[2], dyo[3]));
        }
    }
}

// `lanes` = 0: the warp form; else the group form with that many lanes a
// head (kernels/mamba3.rs, gate_lanes).
extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_gate_bwd_f32(const float* __restrict__ y, const float* __restrict__ proj, const float* __restrict__ norm_w,
                    const float* __restrict__ gate_rstd, const float* __restrict__ d_o, float* __restrict__ dproj,
                    float* __restrict__ dy, float* __restrict__ contrib, unsigned has_norm, unsigned lanes,
                    M3Dims d) {
    if (lanes == 0) {
        gate_bwd<float>(y, proj, norm_w, gate_rstd, d_o, dproj, dy, contrib, has_norm, d);
    } else {
        gate_bwd_grp(y, proj, norm_w, gate_rstd, d_o, dproj, dy, contrib, has_norm, lanes, d);
    }
}

// One warp per (row, group): the rotation and B/C-norm backward of every
// head of the group in one pass. In: dq/dk with respect to the rotated
// q/k (from the scan). Out:
//   dq/dk (in place): the gradients with respect to the unrotated biased
//     query/key C^/B^ of each head, including the diagonal term's gamma
//     (q^ . k^) share (their column sums are the bias gradients);
//   dphi [rows, H, S];
//   dproj's B and C columns: the RMSNorm backward of the per-group sums
//     over heads of those gradients, and contrib_b/contrib_c [rows, G, N]
//     (their column sums are the norm weight gradients).
// The rotated q/k that dphi needs are rebuilt from proj (m3_hat,
// m3_rotate: the values m3_qk_fwd writes). A lane owns the pairs
// lane, lane + 32, ... (N / 2 <= 128, so at most four) and keeps their
// sums over heads in registers, in head order.
#define M3_RB_MAX_PAIRS 4
template <typename T>
__device__ void rot_bcnorm_bwd(const T* __restrict__ proj, const float* __restrict__ rstd_b,
                               const float* __restrict__ rstd_c, const float* __restrict__ b_norm,
                               const float* __restrict__ c_norm, const float* __restrict__ b_bias,
                               const float* __restrict__ c_bias, const float* __restrict__ phi,
                               const float* __restrict__ dt, const float* __restrict__ lam,
                               const float* __restrict__ dqkdot, float* __restrict__ dq, float* __restrict__ dk,
                               float* __restrict__ dphi, T* __restrict__ dproj, float* __restrict__ contrib_b,
                               float* __restrict__ contrib_c, M3Dims d) {
    const unsigned lane = threadIdx.x % 32;
    const unsigned long long warps = (unsigned long long)gridDim.x * (SG_BLOCK / 32);
    const unsigned long long total = (unsigned long long)d.rows * d.ngroups;
    const unsigned hpg = d.nheads / d.ngroups, half = d.d_state / 2;
    for (unsigned long long w = (unsigned long long)blockIdx.x * (SG_BLOCK / 32) + threadIdx.x / 32; w < total;
         w += warps) {
        const unsigned long long row = w / d.ngroups;
        const unsigned g = (unsigned)(w % d.ngroups);
        const T* pr = proj + row * d.width;
        const float rb = rstd_b[w], rc = rstd_c[w];
        float xb[M3_RB_MAX_PAIRS][2], xc[M3_RB_MAX_PAIRS][2];
        float sb[M3_RB_MAX_PAIRS][2], sc[M3_RB_MAX_PAIRS][2];
#pragma unroll
        for (int k = 0; k < M3_RB_MAX_PAIRS; ++k) {
            const unsigned i = lane + 32 * k;
            const bool live = i < half;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const unsigned j = 2 * i + e;
                xb[k][e] = live ? (float)pr[d.off_b + g * d.d_state + j] : 0.0f;
                xc[k][e] = live ? (float)pr[d.off_c + g * d.d_state + j] : 0.0f;
                sb[k][e] = 0.0f;
                sc[k][e] = 0.0f;
            }
        }
        // Not unrolled: two heads an iteration took 113 registers instead of
        // 80 and ran slower (fewer warps per SM).
#pragma unroll 1
        for (unsigned h = g * hpg; h < (g + 1) * hpg; ++h) {
            const unsigned long long rh = row * d.nheads + h;
            const float dqk = dqkdot[rh] * lam[rh] * dt[rh];
#pragma unroll
            for (int k = 0; k < M3_RB_MAX_PAIRS; ++k) {
                const unsigned i = lane + 32 * k;
                if (i >= half) {
                    continue;
                }
                const unsigned j0 = 2 * i, j1 = j0 + 1;
                const unsigned long long e0 = rh * d.d_state + j0;
                const float2 gk = m3_load_pair(dk + e0), gq = m3_load_pair(dq + e0);
                float gk0 = gk.x, gk1 = gk.y, gq0 = gq.x, gq1 = gq.y;
                const float kb0 = m3_hat(xb[k][0], rb, b_norm[j0], b_bias[h * d.d_state + j0]);
                const float kb1 = m3_hat(xb[k][1], rb, b_norm[j1], b_bias[h * d.d_state + j1]);
                const float qb0 = m3_hat(xc[k][0], rc, c_norm[j0], c_bias[h * d.d_state + j0]);
                const float qb1 = m3_hat(xc[k][1], rc, c_norm[j1], c_bias[h * d.d_state + j1]);
                if (i < d.angles) {
                    float sn, cs;
                    sincosf(phi[rh * d.angles + i], &sn, &cs);
                    float k0 = kb0, k1 = kb1, q0 = qb0, q1 = qb1;
                    m3_rotate(k0, k1, sn, cs);
                    m3_rotate(q0, q1, sn, cs);
                    dphi[rh * d.angles + i] = -gk0 * k1 + gk1 * k0 - gq0 * q1 + gq1 * q0;
                    float a0 = cs * gk0 + sn * gk1, a1 = -sn * gk0 + cs * gk1;
                    float b0 = cs * gq0 + sn * gq1, b1 = -sn * gq0 + cs * gq1;
                    gk0 = a0; gk1 = a1; gq0 = b0; gq1 = b1;
                }
                gk0 = fmaf(dqk, qb0, gk0);
                gk1 = fmaf(dqk, qb1, gk1);
                gq0 = fmaf(dqk, kb0, gq0);
                gq1 = fmaf(dqk, kb1, gq1);
                m3_store_pair(dk + e0, gk0, gk1);
                m3_store_pair(dq + e0, gq0, gq1);
                sb[k][0] += gk0;
                sb[k][1] += gk1;
                sc[k][0] += gq0;
                sc[k][1] += gq1;
            }
        }
        // RMSNorm backward of B^ = B rb w (C likewise), the group sums as
        // upstream gradient.
        float accb = 0.0f, accc = 0.0f;
#pragma unroll
        for (int k = 0; k < M3_RB_MAX_PAIRS; ++k) {
            const unsigned i = lane + 32 * k;
            if (i < half) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const unsigned j = 2 * i + e;
                    contrib_b[w * d.d_state + j] = sb[k][e] * xb[k][e] * rb;
                    contrib_c[w * d.d_state + j] = sc[k][e] * xc[k][e] * rc;
                    accb = fmaf(sb[k][e] * b_norm[j], xb[k][e], accb);
                    accc = fmaf(sc[k][e] * c_norm[j], xc[k][e], accc);
                }
            }
        }
        const float cb = rb * rb * rb * sg_warp_sum(accb) / (float)d.d_state;
        const float cc = rc * rc * rc * sg_warp_sum(accc) / (float)d.d_state;
#pragma unroll
        for (int k = 0; k < M3_RB_MAX_PAIRS; ++k) {
            const unsigned i = lane + 32 * k;
            if (i < half) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const unsigned j = 2 * i + e;
                    dproj[row * d.width + d.off_b + g * d.d_state + j] = (T)(rb * b_norm[j] * sb[k][e] - cb * xb[k][e]);
                    dproj[row * d.width + d.off_c + g * d.d_state + j] = (T)(rc * c_norm[j] * sc[k][e] - cc * xc[k][e]);
                }
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_rot_bcnorm_bwd_f32(const float* __restrict__ proj, const float* __restrict__ rstd_b,
                          const float* __restrict__ rstd_c, const float* __restrict__ b_norm,
                          const float* __restrict__ c_norm, const float* __restrict__ b_bias,
                          const float* __restrict__ c_bias, const float* __restrict__ phi,
                          const float* __restrict__ dt, const float* __restrict__ lam,
                          const float* __restrict__ dqkdot, float* __restrict__ dq, float* __restrict__ dk,
                          float* __restrict__ dphi, float* __restrict__ dproj, float* __restrict__ contrib_b,
                          float* __restrict__ contrib_c, M3Dims d) {
    rot_bcnorm_bwd<float>(proj, rstd_b, rstd_c, b_norm, c_norm, b_bias, c_bias, phi, dt, lam, dqkdot, dq, dk, dphi,
                          dproj, contrib_b, contrib_c, d);
}


// The tiled form of m3_rot_bcnorm_bwd_f32 that also sums the bias
// gradients, for N / 2 in {32, 64, 128, 256} (the wrapper falls back to the
// warp form plus column sums otherwise). A block owns a tile of
// M3_RBT_ROWS rows and one group; a thread owns one interleaved pair p
// (N / 2 threads a "slot") and the heads slot, slot + slots, ... of the
// group, over all the tile's rows, whose normalised B/C (x * rstd) sit in
// its registers. So a head's sum over the tile's rows of dk/dq (the bias
// gradient's share of the tile) is one thread's, written over the tile's
// first row of dk/dq for that head once the thread has read them all (no
// other thread reads those elements), with no barrier in the head loop; the
// per-row sums over heads (the norm's upstream gradient) build up in
// thread-private shared memory and are added over the slots, in slot
// order, after one barrier. The bias gradients are then column sums over
// those rows (stride: a tile). Same math as the warp form except the
// order of the sums over heads and of the norm's row dot. Each head pass
// loads the tile's gradients and angles before any sincosf (whose slow
// path is a branch the loads would otherwise wait behind one row at a
// time); dqkdot * lam * dt sits in shared memory, staged once per block.
#define M3_RBT_ROWS 8
#define M3_RBT_MAX_HPG 128
extern "C" __global__ void __launch_bounds__(SG_BLOCK, 2)
    m3_rot_bcnorm_bwd_tiled_f32(const float* __restrict__ proj, const float* __restrict__ rstd_b,
                                const float* __restrict__ rstd_c, const float* __restrict__ b_norm,
                                const float* __restrict__ c_norm, const float* __restrict__ b_bias,
                                const float* __restrict__ c_bias, const float* __restrict__ phi,
                                const float* __restrict__ dt, const float* __restrict__ lam,
                                const float* __restrict__ dqkdot, float* __restrict__ dq, float* __restrict__ dk,
                                float* __restrict__ dphi, float* __restrict__ dproj, float* __restrict__ contrib_b,
                                float* __restrict__ contrib_c, M3Dims d) {
    // [row][thread]: this thread's (dk pair, dq pair) sums over its heads.
    __shared__ float4 acc[M3_RBT_ROWS][SG_BLOCK];
    // [warp][k]: a row's norm dots (b, c), one partial per warp.
    __shared__ float2 rowdot[SG_BLOCK / 32][M3_RBT_ROWS];
    // [row][head of the group]: dqkdot * lam * dt.
    __shared__ float sdqk[M3_RBT_ROWS][M3_RBT_MAX_HPG];
    const unsigned np = d.d_state / 2, slots = SG_BLOCK / np;
    const unsigned p = threadIdx.x % np, slot = threadIdx.x / np;
    const unsigned g = blockIdx.y, hpg = d.nheads / d.ngroups, j0 = 2 * p;
    const unsigned long long r0 = (unsigned long long)blockIdx.x * M3_RBT_ROWS;
    const unsigned live_rows = (unsigned)min((unsigned long long)M3_RBT_ROWS, d.rows - r0);
    const float bn0 = b_norm[j0], bn1 = b_norm[j0 + 1], cn0 = c_norm[j0], cn1 = c_norm[j0 + 1];
    const bool rotated = p < d.angles;
    float xb[M3_RBT_ROWS][2], xc[M3_RBT_ROWS][2];
#pragma unroll
    for (int i = 0; i < M3_RBT_ROWS; ++i) {
        const unsigned long long row = r0 + i;
        const bool live = i < live_rows;
        const float* pr = proj + row * d.width;
        const float rb = live ? rstd_b[row * d.ngroups + g] : 0.0f;
        const float rc = live ? rstd_c[row * d.ngroups + g] : 0.0f;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            xb[i][e] = live ? pr[d.off_b + g * d.d_state + j0 + e] * rb : 0.0f;
            xc[i][e] = live ? pr[d.off_c + g * d.d_state + j0 + e] * rc : 0.0f;
        }
        acc[i][threadIdx.x] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    // dqkdot * lam * dt of every (row, head) of the tile, once per block
    // (a group of up to M3_RBT_MAX_HPG heads; larger ones read it inline).
    const bool staged = hpg <= M3_RBT_MAX_HPG;
    if (staged) {
        for (unsigned t = threadIdx.x; t < M3_RBT_ROWS * hpg; t += SG_BLOCK) {
            const unsigned i = t / hpg, hl = t % hpg;
            const unsigned long long rh = (r0 + i) * d.nheads + g * hpg + hl;
            sdqk[i][hl] = i < live_rows ? dqkdot[rh] * lam[rh] * dt[rh] : 0.0f;
        }
    }
    __syncthreads();
#pragma unroll 1
    for (unsigned h = g * hpg + slot; h < (g + 1) * hpg; h += slots) {
        const unsigned hl = h - g * hpg;
        const float2 bb = m3_load_pair(b_bias + h * d.d_state + j0);
        const float2 cb = m3_load_pair(c_bias + h * d.d_state + j0);
        // Every row's inputs first, in one straight run: sincosf's slow
        // path is a branch, and loads placed after one wait row by row
        // (ncu: 66% of the stalls on global loads at 35% of DRAM bandwidth).
        float2 gkr[M3_RBT_ROWS], gqr[M3_RBT_ROWS];
        float phr[M3_RBT_ROWS];
#pragma unroll
        for (int i = 0; i < M3_RBT_ROWS; ++i) {
            const bool live = i < live_rows;
            const unsigned long long rh = (r0 + i) * d.nheads + h;
            const unsigned long long e0 = rh * d.d_state + j0;
            gkr[i] = live ? m3_load_pair(dk + e0) : make_float2(0.0f, 0.0f);
            gqr[i] = live ? m3_load_pair(dq + e0) : make_float2(0.0f, 0.0f);
            phr[i] = live && rotated ? phi[rh * d.angles + p] : 0.0f;
        }
        float4 tile = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int i = 0; i < M3_RBT_ROWS; ++i) {
            if (i >= live_rows) {
                continue;
            }
            const unsigned long long rh = (r0 + i) * d.nheads + h;
            const float dqk = staged ? sdqk[i][hl] : dqkdot[rh] * lam[rh] * dt[rh];
            float gk0 = gkr[i].x, gk1 = gkr[i].y, gq0 = gqr[i].x, gq1 = gqr[i].y;
            const float kb0 = fmaf(xb[i][0], bn0, bb.x), kb1 = fmaf(xb[i][1], bn1, bb.y);
            const float qb0 = fmaf(xc[i][0], cn0, cb.x), qb1 = fmaf(xc[i][1], cn1, cb.y);
            if (rotated) {
                float sn, cs;
                sincosf(phr[i], &sn, &cs);
                float k0 = kb0, k1 = kb1, q0 = qb0, q1 = qb1;
                m3_rotate(k0, k1, sn, cs);
                m3_rotate(q0, q1, sn, cs);
                dphi[rh * d.angles + p] = -gk0 * k1 + gk1 * k0 - gq0 * q1 + gq1 * q0;
                const float a0 = cs * gk0 + sn * gk1, a1 = -sn * gk0 + cs * gk1;
                const float b0 = cs * gq0 + sn * gq1, b1 = -sn * gq0 + cs * gq1;
                gk0 = a0; gk1 = a1; gq0 = b0; gq1 = b1;
            }
            gk0 = fmaf(dqk, qb0, gk0);
            gk1 = fmaf(dqk, qb1, gk1);
            gq0 = fmaf(dqk, kb0, gq0);
            gq1 = fmaf(dqk, kb1, gq1);
            float4 a = acc[i][threadIdx.x];
            a.x += gk0;
            a.y += gk1;
            a.z += gq0;
            a.w += gq1;
            acc[i][threadIdx.x] = a;
            tile.x += gk0;
            tile.y += gk1;
            tile.z += gq0;
            tile.w += gq1;
        }
        const unsigned long long e0 = (r0 * d.nheads + h) * d.d_state + j0;
        m3_store_pair(dk + e0, tile.x, tile.y);
        m3_store_pair(dq + e0, tile.z, tile.w);
    }
    __syncthreads();
    // RMSNorm backward of B^ = B rb w (C likewise), the group sums as the
    // upstream gradient: slot s takes rows s, s + slots, ...; a row's dot
    // runs over the slot's np / 32 warps.
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned per = (M3_RBT_ROWS + slots - 1) / slots;
    // Row i's (sums over heads, raw B/C inputs) of this thread's pair.
    auto row_sums = [&](unsigned i, float4& t, float2& xbr, float2& xcr) {
        t = acc[i][p];
        for (unsigned o = 1; o < slots; ++o) {
            const float4 u = acc[i][o * np + p];
            t.x += u.x;
            t.y += u.y;
            t.z += u.z;
            t.w += u.w;
        }
        const float* pr = proj + (r0 + i) * d.width;
        xbr = make_float2(pr[d.off_b + g * d.d_state + j0], pr[d.off_b + g * d.d_state + j0 + 1]);
        xcr = make_float2(pr[d.off_c + g * d.d_state + j0], pr[d.off_c + g * d.d_state + j0 + 1]);
    };
#pragma unroll 1
    for (unsigned kk = 0; kk < per; ++kk) {
        const unsigned i = slot + kk * slots;
        float ab = 0.0f, ac = 0.0f;
        if (i < live_rows) {
            float4 t;
            float2 xbr, xcr;
            row_sums(i, t, xbr, xcr);
            ab = fmaf(t.y * bn1, xbr.y, t.x * bn0 * xbr.x);
            ac = fmaf(t.w * cn1, xcr.y, t.z * cn0 * xcr.x);
        }
        ab = sg_warp_sum(ab);
        ac = sg_warp_sum(ac);
        if (lane == 0) {
            rowdot[warp][kk] = make_float2(ab, ac);
        }
    }
    __syncthreads();
    const unsigned wps = np / 32, w0 = slot * wps;
#pragma unroll 1
    for (unsigned kk = 0; kk < per; ++kk) {
        const unsigned i = slot + kk * slots;
        if (i >= live_rows) {
            continue;
        }
        const unsigned long long row = r0 + i;
        float4 t;
        float2 xbr, xcr;
        row_sums(i, t, xbr, xcr);
        const float rb = rstd_b[row * d.ngroups + g], rc = rstd_c[row * d.ngroups + g];
        float2 dot = rowdot[w0][kk];
        for (unsigned w = 1; w < wps; ++w) {
            dot.x += rowdot[w0 + w][kk].x;
            dot.y += rowdot[w0 + w][kk].y;
        }
        const float cbn = rb * rb * rb * dot.x / (float)d.d_state;
        const float ccn = rc * rc * rc * dot.y / (float)d.d_state;
        const unsigned long long gw = (row * d.ngroups + g) * d.d_state + j0;
        m3_store_pair(contrib_b + gw, t.x * xbr.x * rb, t.y * xbr.y * rb);
        m3_store_pair(contrib_c + gw, t.z * xcr.x * rc, t.w * xcr.y * rc);
        float* dr = dproj + row * d.width;
        dr[d.off_b + g * d.d_state + j0] = rb * bn0 * t.x - cbn * xbr.x;
        dr[d.off_b + g * d.d_state + j0 + 1] = rb * bn1 * t.y - cbn * xbr.y;
        dr[d.off_c + g * d.d_state + j0] = rc * cn0 * t.z - ccn * xcr.x;
        dr[d.off_c + g * d.d_state + j0 + 1] = rc * cn1 * t.w - ccn * xcr.y;
    }
}

// The reverse cumsum over t of dphi, in place (phi_t sums dt_r theta_r over
// r <= t, so d(dt_t theta_t) = sum_{u >= t} dphi_u), in double. Same
// schedule as m3_angle_fwd_f32: lane = angle, warp = time segment, segment
// totals combined last segment first in a fixed order, then each warp walks
// its segment backwards from its carry. A thread reads each of its elements
// before it overwrites it, and no other thread touches them.
extern "C" __global__ void __launch_bounds__(M3_ANGLE_THREADS) m3_angle_bwd_f32(float* __restrict__ dphi, M3Dims d) {
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
                acc += (double)dphi[((row0 + t) * d.nheads + h) * d.angles + s];
            }
        }
        tot[seg][lane] = acc;
        __syncthreads();
        double carry = 0.0;
        for (unsigned w = M3_ANGLE_SEGS; w-- > seg + 1;) {
            carry += tot[w][lane];
        }
        if (live) {
            for (unsigned t = t1; t-- > t0;) {
                const unsigned long long e = ((row0 + t) * d.nheads + h) * d.angles + s;
                carry += (double)dphi[e];
                dphi[e] = (float)carry;
            }
        }
        // The next unit rewrites tot.
        __syncthreads();
    }
}

// The serial form of the reverse cumsum (see m3_angle_fwd_serial_f32): one
// thread per (b, h, angle) walking the window from its end, in double.
extern "C" __global__ void __launch_bounds__(SG_BLOCK) m3_angle_bwd_serial_f32(float* __restrict__ dphi, M3Dims d) {
    const unsigned long long hs = (unsigned long long)d.nheads * d.angles;
    const unsigned long long n = (unsigned long long)d.batch * hs;
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        // i = (b, h, s) with s fastest, so column i of row b starts at b T H S + (i mod H S).
        const unsigned long long b = i / hs;
        float* p = dphi + b * d.len * hs + (i - b * hs);
        // A run of M3_ANGLE_RUN tokens is read before any of it is written
        // (as in the forward form), so the loads overlap.
        double acc = 0.0;
        for (unsigned t1 = d.len; t1 > 0;) {
            const unsigned n = t1 < M3_ANGLE_RUN ? t1 : M3_ANGLE_RUN;
            float v[M3_ANGLE_RUN];
#pragma unroll
            for (unsigned k = 0; k < M3_ANGLE_RUN; ++k) {
                v[k] = k < n ? p[(unsigned long long)(t1 - 1 - k) * hs] : 0.0f;
            }
#pragma unroll
            for (unsigned k = 0; k < M3_ANGLE_RUN; ++k) {
                if (k < n) {
                    acc += (double)v[k];
                    p[(unsigned long long)(t1 - 1 - k) * hs] = (float)acc;
                }
            }
            t1 -= n;
        }
    }
}

// One thread per (row, head): the scalar chain back to the in_proj columns
// dd_dt, dd_A and trap. gamma_t = lam_t dt_t enters scale_t and the diagonal;
// scale_{t-1} holds dt_t (1 - lam_t); adt_t = A_t dt_t; the angle path adds
// sum_s R_t[s] theta_t[s] to d dt_t.
template <typename T>
__device__ void scalar_bwd(const T* __restrict__ proj, const float* __restrict__ dt_bias,
                           const float* __restrict__ dt, const float* __restrict__ lam,
                           const float* __restrict__ theta, const float* __restrict__ rphi,
                           const float* __restrict__ dadt, const float* __restrict__ dscale,
                           const float* __restrict__ dqkdot, const float* __restrict__ qk_raw, T* __restrict__ dproj,
                           M3Dims d) {
    unsigned long long n = (unsigned long long)d.rows * d.nheads;
    SG_FOR_EACH(i, n) {
        unsigned long long row = i / d.nheads;
        unsigned h = (unsigned)(i % d.nheads);
        unsigned t = (unsigned)(row % d.len);
        const T* pr = proj + row * d.width;
        T* dr = dproj + row * d.width;
        float l = lam[i], dtv = dt[i];
        float dgamma = fmaf(dqkdot[i], qk_raw[i], dscale[i]);
        float ddt = dgamma * l, dlam = dgamma * dtv;
        if (t > 0) {
            float sp = dscale[i - d.nheads];
            ddt = fmaf(sp, 1.0f - l, ddt);
            dlam -= sp * dtv;
        }
        float x = (float)pr[d.off_a + h];
        float ht = m3_a_rate(d, x);
        float a = -fmaxf(ht, d.a_floor);
        float g = dadt[i];
        ddt = fmaf(g, a, ddt);
        dr[d.off_a + h] = (T)(ht >= d.a_floor ? -(g * dtv) * m3_a_rate_grad(d, x) : 0.0f);
        for (unsigned s = 0; s < d.angles; ++s) {
            ddt = fmaf(rphi[i * d.angles + s], theta[row * d.angles + s], ddt);
        }
        dr[d.off_dt + h] = (T)(ddt * m3_softplus_grad((float)pr[d.off_dt + h] + dt_bias[h]));
        dr[d.off_trap + h] = (T)(dlam * l * (1.0f - l));
    }
}

extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_scalar_bwd_f32(const float* __restrict__ proj, const float* __restrict__ dt_bias, const float* __restrict__ dt,
                      const float* __restrict__ lam, const float* __restrict__ theta, const float* __restrict__ rphi,
                      const float* __restrict__ dadt, const float* __restrict__ dscale,
                      const float* __restrict__ dqkdot, const float* __restrict__ qk_raw, float* __restrict__ dproj,
                      M3Dims d) {
    scalar_bwd<float>(proj, dt_bias, dt, lam, theta, rphi, dadt, dscale, dqkdot, qk_raw, dproj, d);
}

// One thread per (row, angle): dtheta = sum_h R[row, h, s] dt[row, h] (heads
// in order), then through theta = pi tanh(raw) into dproj's angle columns.
template <typename T>
__device__ void dtheta_bwd(const T* __restrict__ proj, const float* __restrict__ rphi, const float* __restrict__ dt,
                           T* __restrict__ dproj, M3Dims d) {
    unsigned long long n = (unsigned long long)d.rows * d.angles;
    SG_FOR_EACH(i, n) {
        unsigned long long row = i / d.angles;
        unsigned s = (unsigned)(i % d.angles);
        float acc = 0.0f;
        for (unsigned h = 0; h < d.nheads; ++h) {
            acc = fmaf(rphi[(row * d.nheads + h) * d.angles + s], dt[row * d.nheads + h], acc);
        }
        float th = tanhf((float)proj[row * d.width + d.off_ang + s]);
        dproj[row * d.width + d.off_ang + s] = (T)(acc * SG_PI_F * (1.0f - th * th));
    }
}

extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_dtheta_bwd_f32(const float* __restrict__ proj, const float* __restrict__ rphi, const float* __restrict__ dt,
                      float* __restrict__ dproj, M3Dims d) {
    dtheta_bwd<float>(proj, rphi, dt, dproj, d);
}

// Column sums of x[rows, ld] over columns [off, off + cols): out[c] =
// sum_r x[r * ld + off + c], in two launches and a fixed order.
//
// Pass 1 (m3_colsum_partials_f32, _f32x4): block (split, cb) sums rows
// [split * rows_per_split, ...) of columns [cb * 32 * VEC, ...) into
// partials[split, :]. Lane l of each warp owns VEC adjacent columns (the x4
// form reads them as one 16-byte load, so a warp reads 512 contiguous bytes
// per row); warp w adds rows w, w + 8, ... of the split in order, and the 8
// warp sums are added in warp order. Pass 2 (m3_colsum_finish_f32): warp w
// adds splits w, w + 8, ... of its lane's column, and the 8 warp sums are
// added in warp order. Which thread adds what depends only on the shape, so
// the sums are bit-identical run to run and eager vs replayed.
//
// M3Colsum (M3_COLSUM_SIZE bytes, by value; mirrored in
// runtime/src/kernels/mamba3_bwd.rs, whose test checks the size and the
// M3_COLSUM_OFF_* offsets):
//   rows, cols, ld, off   the input, as above
//   rows_per_split        rows per pass-1 split
//   splits                pass-1 splits (rows of partials)
#define M3_COLSUM_WARPS (SG_BLOCK / 32)
#define M3_COLSUM_SIZE 24
#define M3_COLSUM_OFF_COLS 4
#define M3_COLSUM_OFF_LD 8
#define M3_COLSUM_OFF_OFF 12
#define M3_COLSUM_OFF_ROWS_PER_SPLIT 16
#define M3_COLSUM_OFF_SPLITS 20

struct M3Colsum {
    unsigned rows, cols, ld, off;
    unsigned rows_per_split, splits;
};
static_assert(sizeof(M3Colsum) == M3_COLSUM_SIZE, "M3Colsum: six unsigned, no padding");

// VEC adjacent floats from p (16-byte aligned when VEC is 4).
template <int VEC>
__device__ __forceinline__ void colsum_load(const float* p, float* v) {
    if constexpr (VEC == 4) {
        const float4 q = *(const float4*)p;
        v[0] = q.x;
        v[1] = q.y;
        v[2] = q.z;
        v[3] = q.w;
    } else {
        v[0] = *p;
    }
}

template <int VEC>
__device__ __forceinline__ void colsum_partials(const float* __restrict__ x, float* __restrict__ partials,
                                                const M3Colsum& d) {
    __shared__ float s[M3_COLSUM_WARPS][32 * VEC];
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned c0 = blockIdx.y * 32 * VEC;
    const unsigned c = c0 + lane * VEC;
    const unsigned r0 = blockIdx.x * d.rows_per_split;
    const unsigned r1 = min(d.rows, r0 + d.rows_per_split);
    float acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
        acc[j] = 0.0f;
    }
    // The x4 form runs only when cols, ld and off are multiples of 4, so a
    // lane's four columns are all in range when its first is.
    if (c < d.cols) {
        const float* col = x + d.off + c;
        const unsigned long long ld = d.ld;
        unsigned r = r0 + warp;
        // Four rows per step with the loads issued before the adds, so four
        // are in flight; the adds stay in ascending row order.
        for (; r + 3 * M3_COLSUM_WARPS < r1; r += 4 * M3_COLSUM_WARPS) {
            float v[4][VEC];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                colsum_load<VEC>(col + (unsigned long long)(r + k * M3_COLSUM_WARPS) * ld, v[k]);
            }
#pragma unroll
            for (int k = 0; k < 4; ++k) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) {
                    acc[j] += v[k][j];
                }
            }
        }
        for (; r < r1; r += M3_COLSUM_WARPS) {
            float v[VEC];
            colsum_load<VEC>(col + (unsigned long long)r * ld, v);
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                acc[j] += v[j];
            }
        }
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
        s[warp][lane * VEC + j] = acc[j];
    }
    __syncthreads();
    if (threadIdx.x < 32 * VEC && c0 + threadIdx.x < d.cols) {
        float sum = 0.0f;
#pragma unroll
        for (unsigned w = 0; w < M3_COLSUM_WARPS; ++w) {
            sum += s[w][threadIdx.x];
        }
        partials[(unsigned long long)blockIdx.x * d.cols + c0 + threadIdx.x] = sum;
    }
}

extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_colsum_partials_f32(const float* __restrict__ x, float* __restrict__ partials, const M3Colsum d) {
    colsum_partials<1>(x, partials, d);
}

extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_colsum_partials_f32x4(const float* __restrict__ x, float* __restrict__ partials, const M3Colsum d) {
    colsum_partials<4>(x, partials, d);
}

// Pass 2: block cb writes out[c] for the 32 columns c of [cb * 32, ...).
extern "C" __global__ void __launch_bounds__(SG_BLOCK)
    m3_colsum_finish_f32(const float* __restrict__ partials, float* __restrict__ out, const M3Colsum d) {
    __shared__ float s[M3_COLSUM_WARPS][32];
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned c = blockIdx.x * 32 + lane;
    float acc = 0.0f;
    if (c < d.cols) {
        const float* col = partials + c;
        const unsigned long long ld = d.cols;
        unsigned sp = warp;
        for (; sp + 3 * M3_COLSUM_WARPS < d.splits; sp += 4 * M3_COLSUM_WARPS) {
            float v[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                v[k] = col[(unsigned long long)(sp + k * M3_COLSUM_WARPS) * ld];
            }
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                acc += v[k];
            }
        }
        for (; sp < d.splits; sp += M3_COLSUM_WARPS) {
            acc += col[(unsigned long long)sp * ld];
        }
    }
    s[warp][lane] = acc;
    __syncthreads();
    if (warp == 0 && c < d.cols) {
        float sum = 0.0f;
#pragma unroll
        for (unsigned w = 0; w < M3_COLSUM_WARPS; ++w) {
            sum += s[w][lane];
        }
        out[c] = sum;
    }
}

// Embedding backward geometry (the launcher in runtime/src/kernels/
// mamba3_bwd.rs mirrors the first two; a unit test checks): warps per block,
// and the shared-memory floats a block may use, 48 KB so no opt-in is needed.
#define M3_EMB_MAX_WARPS 32
#define M3_EMB_SMEM_FLOATS 12288
#define M3_EMB_UNROLL 4
#define M3_EMB_BATCH 4

// The token index of the position 32 further on, given the current one (idx)
// and its column t < len in the [B, T + 1] token grid: one add per step, a
// division only when a step crosses several batch rows (len < 32).
__device__ __forceinline__ void m3_emb_advance(unsigned long long& idx, unsigned& t, unsigned len) {
    idx += 32;
    if (len - t > 32) {
        t += 32;
    } else if (len >= 32) {
        t = 32 - (len - t);
        idx += 1;
    } else {
        const unsigned q = (t + 32) / len;
        t = t + 32 - q * len;
        idx += q;
    }
}

// part[c] += dh[r[e], j0 + c] for e < n in order, over the lane's columns
// c < tw (VEC adjacent columns at a time; VEC 4 needs 16-byte aligned rows).
template <int VEC>
__device__ __forceinline__ void m3_emb_add_rows(float* part, const float* __restrict__ dh, const unsigned* r,
                                                unsigned n, unsigned width, unsigned j0, unsigned tw, unsigned lane) {
    for (unsigned c = VEC * lane; c < tw; c += 32 * VEC) {
        if constexpr (VEC == 4) {
            float4 x[M3_EMB_BATCH];
#pragma unroll
            for (unsigned e = 0; e < M3_EMB_BATCH; ++e) {
                x[e] = e < n ? *(const float4*)(dh + (unsigned long long)r[e] * width + j0 + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
            float4 a = *(float4*)(part + c);
#pragma unroll
            for (unsigned e = 0; e < M3_EMB_BATCH; ++e) {
                if (e < n) {
                    a.x += x[e].x;
                    a.y += x[e].y;
                    a.z += x[e].z;
                    a.w += x[e].w;
                }
            }
            *(float4*)(part + c) = a;
        } else {
            float x[M3_EMB_BATCH];
#pragma unroll
            for (unsigned e = 0; e < M3_EMB_BATCH; ++e) {
                x[e] = e < n ? dh[(unsigned long long)r[e] * width + j0 + c] : 0.0f;
            }
            float a = part[c];
#pragma unroll
            for (unsigned e = 0; e < M3_EMB_BATCH; ++e) {
                if (e < n) {
                    a += x[e];
                }
            }
            part[c] = a;
        }
    }
}

// The embedding gradient is a scatter-add of dh rows keyed by token id. To
// stay deterministic without float atomics or scratch, a block owns whole
// vocabulary rows (grid-stride) and gathers their positions itself, which
// costs vocab x rows token reads however it is laid out. The scan is split
// over the block's warps (a contiguous chunk of positions each, 32 per
// __ballot_sync) rather than each thread walking every position: a small
// vocabulary then still keeps many warps busy, and a large one pays one
// coalesced token load per 32 positions. A warp adds its matching dh rows
// in position order into its own shared-memory slice (lanes own columns, so
// no races; up to M3_EMB_BATCH rows' loads in flight), and the slices are
// summed in warp order. That order depends only on blockDim.x and `tile`,
// which the launcher derives from the shape alone, so the sums are
// bit-identical run to run; the float4 and scalar paths add the same terms
// in the same order. A row no position maps to is left untouched.
//
// blockDim.x = 32 x warps (warps <= M3_EMB_MAX_WARPS); dynamic shared memory
// holds warps x tile floats (<= M3_EMB_SMEM_FLOATS); the columns go in passes
// of `tile`, so any d_model works.
extern "C" __global__ void __launch_bounds__(M3_EMB_MAX_WARPS * 32)
    m3_embed_bwd_f32(const int* __restrict__ tokens, const float* __restrict__ dh, float* __restrict__ gemb,
                     unsigned len, unsigned width, unsigned vocab, unsigned rows, unsigned tile) {
    extern __shared__ __align__(16) float m3_emb_part[];
    if (rows == 0 || len == 0 || width == 0 || tile == 0) {
        return;
    }
    const unsigned warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const bool vec = width % 4 == 0 && tile % 4 == 0 && (unsigned long long)dh % 16 == 0;
    // Chunks start on 32-position boundaries, so only the last warp's ends
    // inside a ballot.
    const unsigned long long chunk = (((unsigned long long)rows + warps - 1) / warps + 31) & ~31ull;
    const unsigned first = (unsigned)min(warp * chunk, (unsigned long long)rows);
    const unsigned last = (unsigned)min(first + chunk, (unsigned long long)rows);
    float* part = m3_emb_part + warp * tile;
    // The lane's first position as a token index and a column of the grid.
    const unsigned long long p0 = (unsigned long long)first + lane;
    const unsigned t0 = (unsigned)(p0 % len);
    const unsigned long long idx0 = p0 / len * ((unsigned long long)len + 1) + t0;
    for (unsigned long long v = blockIdx.x; v < vocab; v += gridDim.x) {
        for (unsigned j0 = 0; j0 < width; j0 += min(tile, width - j0)) {
            const unsigned tw = min(tile, width - j0);
            for (unsigned c = lane; c < tw; c += 32) {
                part[c] = 0.0f;
            }
            __syncwarp();  // the float4 path adds to columns other lanes zeroed
            bool hit = false;
            unsigned long long idx = idx0;
            unsigned t = t0;
            // s steps past last by less than 32 x M3_EMB_UNROLL; 64-bit so it
            // cannot wrap.
            for (unsigned long long s = first; s < last; s += 32 * M3_EMB_UNROLL) {
                int tok[M3_EMB_UNROLL];
#pragma unroll
                for (unsigned k = 0; k < M3_EMB_UNROLL; ++k) {
                    tok[k] = s + 32 * k + lane < last ? tokens[idx] : -1;
                    m3_emb_advance(idx, t, len);
                }
#pragma unroll
                for (unsigned k = 0; k < M3_EMB_UNROLL; ++k) {
                    unsigned m = __ballot_sync(0xffffffffu, tok[k] >= 0 && (unsigned)tok[k] == v);
                    hit = hit || m != 0;
                    while (m != 0) {
                        unsigned r[M3_EMB_BATCH];
                        unsigned n = 0;
#pragma unroll
                        for (unsigned e = 0; e < M3_EMB_BATCH; ++e) {
                            r[e] = 0;
                            if (m != 0) {
                                r[e] = (unsigned)s + 32 * k + (unsigned)(__ffs(m) - 1);
                                m &= m - 1;
                                n = e + 1;
                            }
                        }
                        if (vec) {
                            m3_emb_add_rows<4>(part, dh, r, n, width, j0, tw, lane);
                        } else {
                            m3_emb_add_rows<1>(part, dh, r, n, width, j0, tw, lane);
                        }
                    }
                }
            }
            if (__syncthreads_or(hit)) {
                for (unsigned c = threadIdx.x; c < tw; c += blockDim.x) {
                    float sum = m3_emb_part[c];
                    for (unsigned w = 1; w < warps; ++w) {
                        sum += m3_emb_part[w * tile + c];
                    }
                    gemb[v * width + j0 + c] += sum;
                }
                __syncthreads();
            }
        }
    }
}
