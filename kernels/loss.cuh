// Fused softmax cross-entropy on the GPU; the probabilities are never stored. The CPU reference is
// lib/backend/cpu/loss.cpp. logits [N, V] of the `storage` type; targets i32 [N] (global ids; a
// negative target is ignored: loss 0, gradient 0); losses and lse f32 [N].
//
// Forward: one block per row, one pass over V with an online softmax (running max and rescaled
// sum per thread), the threads' (max, sum) pairs combined in a fixed tree: lse = max + log(sum),
// loss = lse - logits[target]. A target >= V cannot be thrown from the GPU: its loss is NaN, so the
// trainer's finite check stops the step.
// Backward: dlogits = (exp(logits - lse) - onehot(target)) * grad_scale, overwritten; dlogits may
// alias logits (every element is read by the thread that then writes it). With `shard` the logits
// are columns [vocab_begin, vocab_begin + V) of a larger vocabulary and lse is that of the whole
// row; a target outside the shard contributes no -1 here.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/storage.cuh"

namespace trainctl::kernels {

cudaError_t launch_cross_entropy_forward(Storage storage, float* losses, float* lse,
                                         const void* logits, const int32_t* targets, int64_t N,
                                         int64_t V, cudaStream_t stream);
cudaError_t launch_cross_entropy_backward(Storage storage, void* dlogits, const void* logits,
                                          const float* lse, const int32_t* targets, int64_t N,
                                          int64_t V, int64_t vocab_begin, float grad_scale,
                                          cudaStream_t stream);

}  // namespace trainctl::kernels
