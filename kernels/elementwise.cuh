// Elementwise kernels of the CUDA backend: fill, cast, add, accumulate, scale, and the bias add
// that follows a GEMM when cuBLASLt's bias epilogue does not apply.
//
// Contract (every launcher):
//   - Pointers are device pointers to n elements of the named Storage type (f32, bf16 or f16; the
//     16-bit types travel as raw bits). Each value is loaded to fp32, computed in fp32 with one
//     correctly rounded operation per step (no contraction into FMA), and rounded once to the
//     destination type, to nearest even: bit-identical to lib/backend/cpu, NaN included.
//   - add and accumulate may alias an input with the output exactly (same pointer: in place);
//     partially overlapping ranges are not allowed. cast's ranges must not overlap.
//   - Asynchronous on `stream`. Returns the launch status: cudaErrorInvalidValue for n < 0 or a
//     null pointer with n > 0, else cudaGetLastError() after the launch. n == 0 launches nothing.
//
// Speed: memory bound. When every pointer of a call is 16-byte aligned each thread moves 8
// elements per step with 16-byte accesses; otherwise (sliced tensors) a scalar path handles any
// alignment. Grids are sized to the GPU (a few blocks per SM) and loop grid-stride.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/storage.cuh"

namespace trainctl::kernels {

// dst[i] = round(value) for every i (value is rounded to fp32 first, as the CPU backend does).
cudaError_t launch_fill(void* dst, Storage type, float value, int64_t n, cudaStream_t stream);

// dst[i] = round(src[i]). Same types: a device-to-device copy.
cudaError_t launch_cast(void* dst, Storage dst_type, const void* src, Storage src_type, int64_t n,
                        cudaStream_t stream);

// out[i] = round(a[i] + b[i]).
cudaError_t launch_add(void* out, Storage out_type, const void* a, Storage a_type, const void* b,
                       Storage b_type, int64_t n, cudaStream_t stream);

// dst[i] = round(dst[i] + src[i]).
cudaError_t launch_accumulate(void* dst, Storage dst_type, const void* src, Storage src_type,
                              int64_t n, cudaStream_t stream);

// dst[i] = round(dst[i] * factor).
cudaError_t launch_scale(void* dst, Storage type, float factor, int64_t n, cudaStream_t stream);

// For p < batch, i < rows, j < cols: c[p * stride_c + i * cols + j] = round(c[...] + bias[j]).
cudaError_t launch_add_bias_rows(void* c, Storage c_type, const void* bias, Storage bias_type,
                                 int64_t batch, int64_t rows, int64_t cols, int64_t stride_c,
                                 cudaStream_t stream);

}  // namespace trainctl::kernels
