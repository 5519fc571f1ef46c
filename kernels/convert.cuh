// Scalar dtype conversions for device code, bit-identical to the CPU reference in
// lib/tensor/dtype.hpp (round to nearest, ties to even; tests/gpu proves it on random inputs).
//
// Finite values and infinities use the hardware conversion instructions (cvt.rn.*), which round
// exactly like the CPU code. NaN is the one case where hardware and our CPU reference differ (cvt
// makes a canonical NaN, the CPU keeps the sign and top payload bits), so NaN is fixed up here to
// the CPU's answer: a checkpoint written on either backend then holds the same bits.
//
// Storage types travel as raw uint16_t bits so host headers need no cuda_fp16/cuda_bf16 types.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace trainctl::kernels {

__device__ __forceinline__ uint16_t f32_to_bf16_bits(float value) {
  const uint32_t u = __float_as_uint(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return __bfloat16_as_ushort(__float2bfloat16_rn(value));
}

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);  // exact, NaN payload kept
}

__device__ __forceinline__ uint16_t f32_to_f16_bits(float value) {
  const uint32_t u = __float_as_uint(value);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7e00u);
  return __half_as_ushort(__float2half_rn(value));
}

__device__ __forceinline__ float f16_bits_to_f32(uint16_t bits) {
  const uint32_t h = bits;
  if ((h & 0x7fffu) > 0x7c00u) {  // NaN: keep sign and payload, as the CPU reference does
    return __uint_as_float(((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13));
  }
  return __half2float(__ushort_as_half(bits));
}

}  // namespace trainctl::kernels
