// The momentum rules beside AdamW (SGD, Lion, Muon's momentum) and the update Muon applies, on
// the GPU over parameter ranges of flat buffers: one launch per range.
//
// Contract: the same arithmetic as lib/backend/cpu/momentum.cpp, operation for operation, in
// fp32 with every step correctly rounded (no FMA contraction), so the results are bit-identical
// to the CPU backend's given the same MomentumConstants, which the host computes as the CPU
// backend does:
//   sgd    g = grad * grad_scale + wd * w (decayed ranges; + 0 otherwise);
//          m = beta1 * m + g; d = nesterov ? g + beta1 * m : m (d = g when m is null); w -= lr * d
//   lion   g = grad * grad_scale; c = beta1 * m + one_minus_beta1 * g;
//          w = w * decay - lr * sign(c); m = beta2 * m + one_minus_beta2 * g
//   muon   g = grad * grad_scale; m = beta1 * m + g; out = nesterov ? g + beta1 * m : m
//   apply  w = w * decay - lr * update
// w is master[i] when master is not null (and param[i] = round(w)), else param[i] itself.
// param is f32, bf16 or f16; m f32 or bf16; everything else f32. Asynchronous on `stream`; returns
// cudaErrorInvalidValue for bad arguments (a span with end < begin, a null pointer the rule
// needs), else the launch status.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/storage.cuh"

namespace trainctl::kernels {

enum class MomentumKind : int { sgd, lion, muon, apply };

struct MomentumConstants {
  MomentumKind kind = MomentumKind::sgd;
  float lr = 0;
  float beta1 = 0, beta2 = 0;
  float one_minus_beta1 = 0, one_minus_beta2 = 0;
  float weight_decay = 0;  // sgd: added to the gradient in decayed ranges
  float grad_scale = 1;
  bool nesterov = false;
  uint64_t step = 1;  // bf16 m: the stochastic rounding's step
};

struct MomentumSpan {
  int64_t begin = 0, end = 0;  // element indices into every buffer
  bool decayed = true;         // sgd: wd * w added to the gradient
  float decay = 1;             // lion, apply: 1 - lr * weight_decay (f32 of the double), or 1
  // bf16 m: the range's rounding key and global placement (Backend::AdamWRange).
  uint64_t key = 0;
  int64_t global_begin = 0, local_width = 1, global_width = 1;
};

// grad: the gradient (sgd, lion, muon) or the update (apply). m: null for sgd without momentum
// and for apply; f32, or bf16 bits when bf16_state (widened, updated, stored stochastically
// rounded with the bits of the element's global index, as the CPU backend does). out: muon only.
cudaError_t launch_momentum(void* param, Storage param_type, float* master, const float* grad,
                            void* m, bool bf16_state, float* out, const MomentumSpan* spans,
                            int64_t num_spans, const MomentumConstants& constants,
                            cudaStream_t stream);

}  // namespace trainctl::kernels
