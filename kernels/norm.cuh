// LayerNorm and RMSNorm over the last dim of [N, C] on the GPU (the CPU reference:
// lib/backend/cpu/norm.cpp, same formulas). Contract of backend.hpp: out and dx are overwritten;
// dweight and dbias (f32) accumulate (+=); mean and rstd are f32 [N].
//
// Forward and the dx part of backward: one warp per row, f32 statistics, warp sums in a fixed
// butterfly. Weight/bias gradients are column sums over N rows, done without atomics in a fixed
// order: chunks of rows write per-chunk partial sums into `scratch`, then a second kernel adds the
// chunks in chunk order to dweight/dbias. Bit-identical run to run for a given shape.
//
// Pointers are device pointers; S-typed ones are `const void*`/`void*` of the `storage` type.
// The return value is the launch status; execution errors surface at the next synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/storage.cuh"

namespace trainctl::kernels {

// f32 elements of scratch the backward launchers need for N rows of C.
size_t norm_backward_scratch_floats(int64_t N, int64_t C);

// bias may be null.
cudaError_t launch_layernorm_forward(Storage storage, void* out, float* mean, float* rstd,
                                     const void* x, const void* weight, const void* bias, int64_t N,
                                     int64_t C, float eps, cudaStream_t stream);
// dbias may be null. dx may alias dout.
cudaError_t launch_layernorm_backward(Storage storage, void* dx, float* dweight, float* dbias,
                                      const void* dout, const void* x, const void* weight,
                                      const float* mean, const float* rstd, int64_t N, int64_t C,
                                      float* scratch, cudaStream_t stream);
cudaError_t launch_rmsnorm_forward(Storage storage, void* out, float* rstd, const void* x,
                                   const void* weight, int64_t N, int64_t C, float eps,
                                   cudaStream_t stream);
cudaError_t launch_rmsnorm_backward(Storage storage, void* dx, float* dweight, const void* dout,
                                    const void* x, const void* weight, const float* rstd, int64_t N,
                                    int64_t C, float* scratch, cudaStream_t stream);

}  // namespace trainctl::kernels
