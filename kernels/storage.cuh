// What every kernel family shares: the storage type S of a run, named on the host by `Storage`
// (elementwise, reductions and AdamW take one per operand; the layer kernels one per call), and,
// in device code, loading an S value into f32 and rounding an f32 back to S once (convert.cuh:
// bit-identical to lib/tensor/dtype.hpp).
//
// Host side: launchers take `Storage` plus untyped pointers, so lib/backend/cuda needs no device
// types; each .cu switches on it once (dispatch_storage) and runs a kernel templated on the
// storage traits below. G and A (backend.hpp) are f32 for every storage type here.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace trainctl::kernels {

// The float types every kernel of kernels/ reads and writes (16-bit types travel as raw bits).
// The one home of this enum: elementwise, reduction, AdamW and layer launchers all take it.
enum class Storage : uint8_t { f32, bf16, f16 };

// Bytes of one element of `type`.
inline int64_t storage_size(Storage type) {
  return type == Storage::f32 ? 4 : 2;
}

}  // namespace trainctl::kernels

#ifdef __CUDACC__
#include "kernels/convert.cuh"

namespace trainctl::kernels {

struct StoreF32 {
  using T = float;
  __device__ __forceinline__ static float load(float v) { return v; }
  __device__ __forceinline__ static float store(float v) { return v; }
};
struct StoreBf16 {
  using T = uint16_t;
  __device__ __forceinline__ static float load(uint16_t v) { return bf16_bits_to_f32(v); }
  __device__ __forceinline__ static uint16_t store(float v) { return f32_to_bf16_bits(v); }
};
struct StoreF16 {
  using T = uint16_t;
  __device__ __forceinline__ static float load(uint16_t v) { return f16_bits_to_f32(v); }
  __device__ __forceinline__ static uint16_t store(float v) { return f32_to_f16_bits(v); }
};

// Runs f(Traits{}) for the storage traits of `storage`; unknown values are an invalid argument.
template <class F>
cudaError_t dispatch_storage(Storage storage, F&& f) {
  switch (storage) {
    case Storage::f32:
      return f(StoreF32{});
    case Storage::bf16:
      return f(StoreBf16{});
    case Storage::f16:
      return f(StoreF16{});
  }
  return cudaErrorInvalidValue;
}

// Sums over a warp in a fixed butterfly (the same bits on every run).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Blocks for a grid-stride loop over `count` items: enough to fill the GPU, never more than
// needed, never zero.
inline unsigned grid_for(int64_t count, int threads) {
  const int64_t wanted = (count + threads - 1) / threads;
  const int64_t cap = int64_t{132} * 16;  // H100/H200 SMs x resident blocks of 128 threads
  return static_cast<unsigned>(wanted < 1 ? 1 : (wanted < cap ? wanted : cap));
}

}  // namespace trainctl::kernels
#endif
