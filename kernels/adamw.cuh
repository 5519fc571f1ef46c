// AdamW on the GPU: one contiguous parameter range, fp32 moments, optional fp32 master weights.
//
// Contract: the same arithmetic as lib/backend/cpu/adamw.cpp, operation for operation, in fp32
// with every step correctly rounded (no FMA contraction; IEEE division and square root), so the
// results are bit-identical to the CPU backend's given the same AdamWConstants, which the host
// computes exactly as the CPU backend does (make them with the same expressions):
//   g = grad * grad_scale
//   m = beta1 * m + one_minus_beta1 * g;   v = beta2 * v + one_minus_beta2 * g * g
//   w = w * decay - step_size * m / (sqrt(v * inv_correction2) + eps)
// w is master[i] when master is not null (and param[i] = round(w)), else param[i] itself
// (loaded to fp32, updated, rounded once). param is f32, bf16 or f16; grad, m, v, master f32.
// Asynchronous on `stream`; returns cudaErrorInvalidValue for bad arguments, else the launch
// status. Vectorised (8 elements per thread step) when every pointer is 16-byte aligned.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/storage.cuh"

namespace trainctl::kernels {

struct AdamWConstants {
  float beta1 = 0, beta2 = 0;
  float one_minus_beta1 = 0, one_minus_beta2 = 0;
  float eps = 0;
  float decay = 0;            // 1 - lr * weight_decay
  float grad_scale = 1;       //
  float step_size = 0;        // lr / (1 - beta1^step)
  float inv_correction2 = 0;  // 1 / (1 - beta2^step)
};

cudaError_t launch_adamw(void* param, Storage param_type, float* master, const float* grad,
                         float* m, float* v, int64_t n, const AdamWConstants& constants,
                         cudaStream_t stream);

}  // namespace trainctl::kernels
