// Element-wise dtype casts on the GPU: fp32 <-> bf16 and fp32 <-> fp16.
//
// Contract (all four launchers):
//   - `in` and `out` are device pointers to n elements each; the ranges must not overlap.
//   - Narrowing rounds to nearest, ties to even; results are bit-identical to tensor::to_bf16 /
//     tensor::to_f16 of lib/tensor/dtype.hpp, NaN included. Widening is exact.
//   - Asynchronous on `stream`. The return value is the launch status (cudaSuccess, or
//     cudaErrorInvalidValue for n < 0 or a null pointer with n > 0); errors during execution
//     appear at the next synchronising call, as with any kernel.
//   - n == 0 launches nothing and returns cudaSuccess.
// 16-bit values travel as raw uint16_t bits so this header compiles in plain host C++.
//
// Speed: memory bound. Where both pointers are 16-byte aligned each thread moves 8 elements per
// step with 16-byte loads and stores; otherwise (sliced tensors) a scalar path handles any
// alignment. The grid is sized to the GPU (a few blocks per SM) and loops grid-stride.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace trainctl::kernels {

cudaError_t launch_cast_f32_to_bf16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream);
cudaError_t launch_cast_bf16_to_f32(const uint16_t* in, float* out, int64_t n, cudaStream_t stream);
cudaError_t launch_cast_f32_to_f16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream);
cudaError_t launch_cast_f16_to_f32(const uint16_t* in, float* out, int64_t n, cudaStream_t stream);

}  // namespace trainctl::kernels
