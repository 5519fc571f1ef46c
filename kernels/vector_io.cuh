// Device helpers shared by the elementwise, reduction and optimizer kernels: the storage types as
// raw bits, their loads and stores through fp32 (convert.cuh: round to nearest even, once), and
// 8-element vector moves for the 16-byte aligned fast path. Device code only (.cu files).
#pragma once

#include <cstdint>

#include "kernels/convert.cuh"

namespace trainctl::kernels {

// Storage types as distinct C++ types so templates can dispatch on them.
struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

__device__ __forceinline__ float load_float(float v) {
  return v;
}
__device__ __forceinline__ float load_float(Bf16 v) {
  return bf16_bits_to_f32(v.bits);
}
__device__ __forceinline__ float load_float(F16 v) {
  return f16_bits_to_f32(v.bits);
}

template <class T>
__device__ __forceinline__ T store_float(float v);
template <>
__device__ __forceinline__ float store_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ Bf16 store_float<Bf16>(float v) {
  return Bf16{f32_to_bf16_bits(v)};
}
template <>
__device__ __forceinline__ F16 store_float<F16>(float v) {
  return F16{f32_to_f16_bits(v)};
}

// Elements per vector step: 16 bytes of 16-bit values, 32 bytes of fp32 values.
inline constexpr int64_t kVectorElements = 8;

// Moves kVectorElements values as 16-byte words (1 for 16-bit types, 2 for fp32). Both pointers
// must be 16-byte aligned.
template <class T>
__device__ __forceinline__ void move_vector(const T* __restrict__ src, T* __restrict__ dst) {
  constexpr int kWords = static_cast<int>(sizeof(T) * kVectorElements / sizeof(uint4));
  const uint4* from = reinterpret_cast<const uint4*>(src);
  uint4* to = reinterpret_cast<uint4*>(dst);
#pragma unroll
  for (int w = 0; w < kWords; ++w)
    to[w] = from[w];
}

template <class T>
__device__ __forceinline__ void load_vector(const T* src, float (&out)[kVectorElements]) {
  alignas(16) T raw[kVectorElements];
  move_vector(src, raw);
#pragma unroll
  for (int k = 0; k < kVectorElements; ++k)
    out[k] = load_float(raw[k]);
}

template <class T>
__device__ __forceinline__ void store_vector(T* dst, const float (&in)[kVectorElements]) {
  alignas(16) T raw[kVectorElements];
#pragma unroll
  for (int k = 0; k < kVectorElements; ++k)
    raw[k] = store_float<T>(in[k]);
  move_vector(raw, dst);
}

}  // namespace trainctl::kernels
