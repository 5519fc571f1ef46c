// Fused causal attention on the GPU, FlashAttention-2 structure; the CPU reference is
// lib/backend/cpu/attention.cpp and the layouts those of backend.hpp: qkv [B*T, (H + 2 KV) D] (H
// query heads, then KV key heads, then KV value heads), out [B*T, H D], lse f32 [B, H, T]; query
// head h reads kv head h / (H / KV); softmax scale 1/sqrt(D). Storage f32/bf16/f16, f32 math.
//
// Forward: one block per (32 query rows, head, sequence); key tiles of 32 in shared memory, an
// online softmax per row (running max and sum), the probabilities never stored; writes out and
// lse. Backward recomputes P = exp(S - lse): delta = rowsum(dO * O) first, then one kernel per
// (32 keys, kv head, sequence) accumulating dK and dV over the group's query heads in order and
// over query tiles in order, and one kernel per (32 query rows, head, sequence) accumulating dQ
// over key tiles in order. No atomics: every output element is written once by one thread, so
// results are bit-identical run to run. dqkv is overwritten.
//
// Head sizes: D in {32, 64, 128} (kernels are templated on D); others return
// cudaErrorInvalidValue (attention_supported_head_size tells the caller first). Any T.
// `scratch` of the backward: attention_backward_scratch_floats(B, H, T) floats.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/storage.cuh"

namespace trainctl::kernels {

bool attention_supported_head_size(int64_t D);
size_t attention_backward_scratch_floats(int64_t B, int64_t H, int64_t T);

cudaError_t launch_attention_forward(Storage storage, void* out, float* lse, const void* qkv,
                                     int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                                     cudaStream_t stream);
cudaError_t launch_attention_backward(Storage storage, void* dqkv, const void* dout,
                                      const void* qkv, const void* out, const float* lse, int64_t B,
                                      int64_t T, int64_t H, int64_t KV, int64_t D, float* scratch,
                                      cudaStream_t stream);

// One block of context-parallel attention (backend.hpp's attention_block_forward/backward): the
// queries of qkv [B*Tq, (H + 2 KV) D] against kv [B*Tk, 2 KV D] (keys, then values), key j
// visible to query i when k_pos[j] <= q_pos[i]; out [B*Tq, H D] and lse [B, H, Tq] are f32
// running results merged in place; dq [B*Tq, H D] and dkv [B*Tk, 2 KV D] f32 accumulate. One warp
// per query row (forward, dq, which also writes delta = rowsum(dO * O) to `scratch`) or per key
// row and kv head (dK, dV over the group's query heads in order); no atomics. Head sizes as above.
// `scratch` of the backward: attention_block_scratch_floats(B, H, Tq) floats.
size_t attention_block_scratch_floats(int64_t B, int64_t H, int64_t Tq);
cudaError_t launch_attention_block_forward(Storage storage, float* out, float* lse, const void* qkv,
                                           const void* kv, const int32_t* q_pos,
                                           const int32_t* k_pos, int64_t B, int64_t Tq, int64_t Tk,
                                           int64_t H, int64_t KV, int64_t D, cudaStream_t stream);
cudaError_t launch_attention_block_backward(Storage storage, float* dq, float* dkv,
                                            const void* dout, const void* qkv, const void* kv,
                                            const float* out, const float* lse,
                                            const int32_t* q_pos, const int32_t* k_pos, int64_t B,
                                            int64_t Tq, int64_t Tk, int64_t H, int64_t KV,
                                            int64_t D, float* scratch, cudaStream_t stream);

}  // namespace trainctl::kernels
