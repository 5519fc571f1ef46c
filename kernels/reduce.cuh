// Reductions of the CUDA backend: whole-tensor sum and sum of squares (f64 accumulation), the
// finiteness check, and the column sums of bias_backward.
//
// Contract:
//   - Deterministic: the order of every addition depends only on n (or rows, cols), never on
//     timing: a fixed grid, per-thread strided sums, fixed shared-memory trees, then one block
//     over the per-block partials. No atomics. So repeats on the same GPU give identical bits.
//     The order differs from the CPU backend's (which adds sequentially or in fixed lanes), so
//     results agree with it to rounding, not bit for bit.
//   - `scratch` is device memory of at least the bytes the matching *_scratch_bytes() names;
//     the result is written to device memory (the caller copies it back on the same stream).
//   - Asynchronous on `stream`; returns the launch status (cudaErrorInvalidValue for bad
//     arguments), else cudaGetLastError() after the last launch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/storage.cuh"

namespace trainctl::kernels {

enum class ReduceKind : uint8_t { sum, sum_squares };

size_t reduce_scratch_bytes(int64_t n);

// *result = sum_i x_i (or x_i^2) in double; x_i loaded exactly from f32/bf16/f16. n == 0: 0.
cudaError_t launch_reduce(const void* src, Storage type, int64_t n, ReduceKind kind, void* scratch,
                          size_t scratch_bytes, double* result, cudaStream_t stream);

// *flag = 1 when some element is inf or NaN, else 0 (the launcher zeroes it first).
cudaError_t launch_all_finite(const void* src, Storage type, int64_t n, int* flag,
                              cudaStream_t stream);

size_t column_sums_scratch_bytes(int64_t rows, int64_t cols);

// dbias[c] += sum over r < rows of x[r * cols + c], summed in fp32 (x f32/bf16/f16, dbias f32).
cudaError_t launch_column_sums_accumulate(float* dbias, const void* x, Storage type, int64_t rows,
                                          int64_t cols, void* scratch, size_t scratch_bytes,
                                          cudaStream_t stream);

}  // namespace trainctl::kernels
