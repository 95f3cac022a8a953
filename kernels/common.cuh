// Shared definitions for stepgraph's CUDA kernels.
//
// Compiled by NVRTC at run time (see runtime/src/device/nvrtc.rs); this header
// is handed to NVRTC by name, so it never has to exist on the GPU machine's disk.
#pragma once

// Threads per block of every 1-D kernel. The Rust launch wrappers use the same
// number (runtime/src/kernels/launch.rs, BLOCK): the reduction's shared-memory
// tree is sized by it, so the two must agree.
#define SG_BLOCK 256

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
