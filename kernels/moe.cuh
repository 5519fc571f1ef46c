// Mixture-of-experts routing and token permutation on the GPU; the CPU reference is
// lib/backend/cpu/moe.cpp and RouterArgs in lib/backend/backend.hpp the slot convention.
//
// Router forward: one thread per token computes softmax(logits) in f32 (probs), the top-k experts
// best first with ties to the lower index (expert_idx, gates: the chosen probs, divided by their
// sum when `renormalize`) and its lse. Capacity positions are
// handed out in GShard priority order (every token's first choice in token order, then every
// second choice, ...): one block per expert scans the N*k assignments in that order with a block
// prefix count (integers: exact), so slot, counts and load equal the CPU's. The loss statistics
// come back in `stats` (device, 2E + 1 doubles): [0, E) sum over tokens of probs[:, e] (fixed
// tree), [E] sum over tokens of lse^2, [E + 1, 2E + 1) load; the host finishes aux and z loss.
// Router backward: one thread per token, the CPU's formula and order of operations.
// Permute/unpermute: every output is overwritten (unused expert rows zeroed); each output element
// is written by exactly one thread, sums over the k choices run in choice order. Slots outside
// [0, R) count as dropped.
//
// Pointers are device pointers; S-typed ones of the `storage` type, A-typed ones f32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/storage.cuh"

namespace trainctl::kernels {

cudaError_t launch_moe_router_forward(Storage storage, const void* logits, float* probs,
                                      int32_t* expert_idx, float* gates, int32_t* slot,
                                      int32_t* counts, float* load, int64_t N, int64_t E, int64_t K,
                                      int64_t capacity, bool renormalize, float* lse_scratch,
                                      double* stats, cudaStream_t stream);
cudaError_t launch_moe_router_backward(Storage storage, void* dlogits, const float* dgates,
                                       const void* logits, const float* probs,
                                       const int32_t* expert_idx, const float* load, int64_t N,
                                       int64_t E, int64_t K, bool renormalize, float aux_coef,
                                       float z_coef, float grad_scale, cudaStream_t stream);
// x [N, C], expert_in [R, C], slot [N, K].
cudaError_t launch_moe_permute(Storage storage, void* expert_in, const void* x, const int32_t* slot,
                               int64_t N, int64_t K, int64_t C, int64_t R, cudaStream_t stream);
cudaError_t launch_moe_permute_backward(Storage storage, void* dx, const void* dexpert_in,
                                        const int32_t* slot, int64_t N, int64_t K, int64_t C,
                                        int64_t R, cudaStream_t stream);
cudaError_t launch_moe_unpermute(Storage storage, void* out, const void* expert_out,
                                 const float* gates, const int32_t* slot, int64_t N, int64_t K,
                                 int64_t C, int64_t R, cudaStream_t stream);
cudaError_t launch_moe_unpermute_backward(Storage storage, void* dexpert_out, float* dgates,
                                          const void* dout, const void* expert_out,
                                          const float* gates, const int32_t* slot, int64_t N,
                                          int64_t K, int64_t C, int64_t R, cudaStream_t stream);

}  // namespace trainctl::kernels
