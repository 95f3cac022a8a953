// AdamW on the device with torch semantics, its per-step scalars living in
// device memory so that a captured graph bakes nothing in by value:
//   hyper   (f64, written by the host): [lr, beta1, beta2, eps, weight_decay]
//   step    (i32): the number of updates taken so far
//   derived (f32, written by m3_advance_schedule):
//           [lr / (1 - beta1^t), sqrt(1 - beta2^t), 1 - lr * wd,
//            beta1, 1 - beta1, beta2, 1 - beta2, eps]
// Bias corrections are computed in double, as torch does with Python floats.
#include "common.cuh"

extern "C" __global__ void m3_advance_schedule(const double* __restrict__ hyper, int* __restrict__ step,
                                               float* __restrict__ derived) {
    if (blockIdx.x != 0 || threadIdx.x != 0) {
        return;
    }
    const int t = step[0] + 1;
    step[0] = t;
    const double lr = hyper[0], b1 = hyper[1], b2 = hyper[2], eps = hyper[3], wd = hyper[4];
    const double bc1 = 1.0 - pow(b1, (double)t);
    const double bc2 = 1.0 - pow(b2, (double)t);
    derived[0] = (float)(lr / bc1);
    derived[1] = (float)sqrt(bc2);
    derived[2] = (float)(1.0 - lr * wd);
    derived[3] = (float)b1;
    derived[4] = (float)(1.0 - b1);
    derived[5] = (float)b2;
    derived[6] = (float)(1.0 - b2);
    derived[7] = (float)eps;
}
