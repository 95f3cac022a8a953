// f32 <-> bf16 conversions for the mixed-precision path. Needs cuda_bf16.h
// from the toolkit: NVRTC 13.0 does not bundle it, which is why the runtime
// looks for <CUDA_HOME>/include.
#include <cuda_bf16.h>
#include "common.cuh"

// Round to nearest even, as half::bf16::from_f32 does on the host.
extern "C" __global__ void f32_to_bf16(const float* __restrict__ x, __nv_bfloat16* __restrict__ y,
                                       unsigned n) {
    SG_FOR_EACH(i, n) { y[i] = __float2bfloat16_rn(x[i]); }
}

extern "C" __global__ void bf16_to_f32(const __nv_bfloat16* __restrict__ x, float* __restrict__ y,
                                       unsigned n) {
    SG_FOR_EACH(i, n) { y[i] = __bfloat162float(x[i]); }
}
