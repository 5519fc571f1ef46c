// Rotary position embedding on the GPU, rotate-half convention (the CPU reference:
// lib/backend/cpu/rope.cpp). x, out: [N, width] of the `storage` type with N = B*T rows; in the
// first `rotated_heads` heads of D columns, pair (i, i + D/2) is rotated by t * theta^(-2i/D),
// t = row % T, or positions[row % T] when positions is not null (i32 [T] on the device: the
// global positions under context parallelism) (the transpose rotation when `inverse`, the backward
// pass); the other columns are copied. out may alias x. Angles and their cos/sin are computed in
// double into `table` (T * D/2 float2 of device scratch) and rounded to f32 once, as the CPU does.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/storage.cuh"

namespace trainctl::kernels {

cudaError_t launch_rope(Storage storage, void* out, const void* x, int64_t N, int64_t width,
                        int64_t T, int64_t rotated_heads, int64_t D, double theta, bool inverse,
                        const int32_t* positions, float2* table, cudaStream_t stream);

}  // namespace trainctl::kernels
