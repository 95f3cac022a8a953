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
