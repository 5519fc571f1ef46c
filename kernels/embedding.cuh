// Token (+ learned position) embedding on the GPU; the CPU reference is
// lib/backend/cpu/embedding.cpp. `wte` holds vocabulary rows [vocab_begin, vocab_begin + V) (the
// whole table: vocab_begin 0); tokens are global ids, i32 [N], N = B*T; wpe (optional) [>= T, C].
//
// Forward: out[n] = wte[tokens[n] - vocab_begin] + wpe[n % T], summed in f32 and rounded once.
// A token outside the rows reads zeros when `shard` (vocab-parallel: another rank owns it); for a
// whole table it is a data error the GPU cannot throw, so the row is written as NaN: the loss
// turns non-finite and the trainer's finite check stops the step instead of training on garbage.
//
// Backward: dwte (f32) += dout rows by token, dwpe (f32, optional) += dout summed over sequences.
// Deterministic without atomics, in exactly the CPU's order: the tokens are sorted by row with a
// stable radix sort (CUB), then one thread per (row, column) starts from the old dwte value and
// adds that row's dout rows in token order. So f32 results equal the CPU's bit for bit. Tokens
// outside the rows take no gradient.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/storage.cuh"

namespace trainctl::kernels {

cudaError_t launch_embedding_forward(Storage storage, void* out, const int32_t* tokens,
                                     const void* wte, const void* wpe, int64_t N, int64_t C,
                                     int64_t V, int64_t T, int64_t vocab_begin, bool shard,
                                     cudaStream_t stream);

// Bytes of device scratch launch_embedding_backward needs (the sort's buffers).
size_t embedding_backward_scratch_bytes(int64_t N, int64_t V);

cudaError_t launch_embedding_backward(Storage storage, float* dwte, float* dwpe, const void* dout,
                                      const int32_t* tokens, int64_t N, int64_t C, int64_t V,
                                      int64_t T, int64_t vocab_begin, void* scratch,
                                      size_t scratch_bytes, cudaStream_t stream);

}  // namespace trainctl::kernels
