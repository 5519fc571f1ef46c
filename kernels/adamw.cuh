// AdamW on the GPU over many parameter ranges of flat buffers in one launch (multi-tensor, as
// apex's multi_tensor_apply: the ranges travel by value in the kernel's arguments), fp32 moments,
// optional fp32 master weights.
//
// Contract: the same arithmetic as lib/backend/cpu/adamw.cpp, operation for operation, in fp32
// with every step correctly rounded (no FMA contraction; IEEE division and square root), so the
// results are bit-identical to the CPU backend's given the same AdamWConstants, which the host
// computes exactly as the CPU backend does (make them with the same expressions):
//   g = grad * grad_scale
//   m = beta1 * m + one_minus_beta1 * g;   v = beta2 * v + one_minus_beta2 * g * g
//   w = w * decay - step_size * m / (sqrt(v * inv_correction2) + eps)
// w is master[i] when master is not null (and param[i] = round(w)), else param[i] itself
// (loaded to fp32, updated, rounded once). param is f32, bf16 or f16; grad and master f32; m and v
// f32, or bf16 (bf16_state: widened, updated as above, stored stochastically rounded with the
// bits of the element's global index, tensor/stochastic_round.hpp, as the CPU backend does).
// decay is per range (AdamWRange::decay: 1 - lr * weight_decay, or 1 without decay).
// Asynchronous on `stream`; returns cudaErrorInvalidValue for bad arguments (ranges not ascending
// and disjoint, a null pointer), else the launch status. One launch per kAdamWRangesPerLaunch
// ranges; a range is vectorised (8 elements per thread step) when every pointer at its start is
// 16-byte aligned.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/storage.cuh"

namespace trainctl::kernels {

struct AdamWConstants {
  float beta1 = 0, beta2 = 0;
  float one_minus_beta1 = 0, one_minus_beta2 = 0;
  float eps = 0;
  float grad_scale = 1;       //
  float step_size = 0;        // lr / (1 - beta1^step)
  float inv_correction2 = 0;  // 1 / (1 - beta2^step)
  uint64_t step = 1;          // bf16 moments: the stochastic rounding's step
};

struct AdamWSpan {
  int64_t begin = 0, end = 0;  // element indices into every buffer
  float decay = 1;             // 1 - lr * weight_decay (rounded to f32 as the CPU does), or 1
  // bf16 moments: the range's rounding key and global placement (Backend::AdamWRange).
  uint64_t key = 0;
  int64_t global_begin = 0, local_width = 1, global_width = 1;
};

inline constexpr int kAdamWRangesPerLaunch = 48;

// Updates elements [span.begin, span.end) of every span; spans ascending and disjoint.
// m and v are f32, or bf16 bits when bf16_state.
cudaError_t launch_adamw(void* param, Storage param_type, float* master, const float* grad, void* m,
                         void* v, bool bf16_state, const AdamWSpan* spans, int64_t num_spans,
                         const AdamWConstants& constants, cudaStream_t stream);

}  // namespace trainctl::kernels
