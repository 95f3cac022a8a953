// Shared definitions for stepgraph's CUDA kernels.
//
// Compiled by NVRTC at run time (see runtime/src/device/nvrtc.rs); this header
// is handed to NVRTC by name, so it never has to exist on the GPU machine's disk.
#pragma once

// Threads per block of every 1-D kernel. The Rust launch wrappers use the same
// number (runtime/src/kernels/launch.rs, BLOCK): the reduction's shared-memory
// tree is sized by it, so the two must agree.
#define SG_BLOCK 256

// Pi for the angle kernels (f32) and the schedule's cosine (f64).
#define SG_PI 3.14159265358979323846
#define SG_PI_F 3.14159265358979323846f
#define SG_TWO_PI_F 6.28318530717958647692f

// 64-bit grid-stride index: a 32-bit one would wrap for n close to 2^32 and
// loop forever.
#define SG_FOR_EACH(i, n)                                                      \
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + \
                                threadIdx.x;                                   \
         i < (unsigned long long)(n);                                          \
         i += (unsigned long long)gridDim.x * blockDim.x)

// Sum over a block of SG_BLOCK threads in double, in a fixed shared-memory
// tree (so the same inputs give the same bits); every thread must call it,
// and it may be called again right away (it synchronizes on entry and exit).
__device__ __forceinline__ double sg_block_sum_f64(double v, double* s) {
    __syncthreads();
    s[threadIdx.x] = v;
    __syncthreads();
    for (unsigned stride = SG_BLOCK / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            s[threadIdx.x] += s[threadIdx.x + stride];
        }
        __syncthreads();
    }
    const double r = s[0];
    __syncthreads();
    return r;
}

// Butterfly sums and maxima inside a warp (every lane gets the result) and
// the float block trees the kernels share; fixed orders, so the same inputs
// give the same bits.
__device__ __forceinline__ float sg_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

__device__ __forceinline__ float sg_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

// Sum over a block of exactly SG_BLOCK threads in a fixed shared-memory tree;
// every thread must call it and every thread gets the result (it
// synchronizes on entry and exit). `s` holds SG_BLOCK floats.
__device__ __forceinline__ float sg_block_sum(float v, float* s) {
    __syncthreads();
    s[threadIdx.x] = v;
    __syncthreads();
    for (unsigned stride = SG_BLOCK / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            s[threadIdx.x] += s[threadIdx.x + stride];
        }
        __syncthreads();
    }
    float r = s[0];
    __syncthreads();
    return r;
}

__device__ __forceinline__ float sg_block_max(float v, float* s) {
    __syncthreads();
    s[threadIdx.x] = v;
    __syncthreads();
    for (unsigned stride = SG_BLOCK / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            s[threadIdx.x] = fmaxf(s[threadIdx.x], s[threadIdx.x + stride]);
        }
        __syncthreads();
    }
    float r = s[0];
    __syncthreads();
    return r;
}
