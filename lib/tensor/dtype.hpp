// Element types and their conversions. Every narrowing conversion rounds to nearest, ties to even
// (what cuBLAS/cuDNN and PyTorch do), so the CPU backend produces the exact values a GPU would
// store. fp8 formats follow the OCP FP8 spec (e4m3 "fn": no inf, max 448; e5m2: IEEE-like, max
// 57344) with saturation to the largest finite value, as Transformer Engine does.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace trainctl::tensor {

enum class DType : uint8_t { f64, f32, bf16, f16, e4m3, e5m2, i32, u16 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
bool is_floating(DType dtype);

// ---- bfloat16 -----------------------------------------------------------------------------------
struct bf16 {
  uint16_t bits = 0;
};

inline bf16 to_bf16(float value) {
  uint32_t u = std::bit_cast<uint32_t>(value);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                         // round to nearest even
  return bf16{static_cast<uint16_t>(u >> 16)};
}
inline float to_float(bf16 value) {
  return std::bit_cast<float>(uint32_t{value.bits} << 16);
}

// ---- IEEE binary16 ------------------------------------------------------------------------------
struct f16 {
  uint16_t bits = 0;
};

// Branch-light conversions (F. Giesen's float_to_half_fast3_rtne / half_to_float): these run on
// every fp16 activation, so they must be cheap. tests/unit/tensor_test.cpp checks them against the
// generic exact encoder (to_f16_exact) on every half and on millions of random floats.
inline f16 to_f16(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return f16{static_cast<uint16_t>(sign | 0x7e00u)};   // NaN
  if (x >= 0x477ff000u) return f16{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (x < 0x38800000u) {  // result is subnormal or zero: let the FPU round (to nearest even)
    const float f = std::bit_cast<float>(x) + 0.5f;
    return f16{static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(f) - 0x3f000000u))};
  }
  const uint32_t mantissa_odd = (x >> 13) & 1u;
  x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + mantissa_odd;
  return f16{static_cast<uint16_t>(sign | (x >> 13))};
}
inline float to_float(f16 value) {
  const uint32_t h = value.bits;
  uint32_t o = (h & 0x7fffu) << 13;
  const uint32_t exponent = o & (0x7c00u << 13);
  o += static_cast<uint32_t>(127 - 15) << 23;
  if (exponent == (0x7c00u << 13)) {
    o += static_cast<uint32_t>(128 - 16) << 23;  // inf / NaN
  } else if (exponent == 0) {
    o += 1u << 23;  // zero / subnormal: renormalise
    o = std::bit_cast<uint32_t>(std::bit_cast<float>(o) - std::bit_cast<float>(113u << 23));
  }
  return std::bit_cast<float>(o | ((h & 0x8000u) << 16));
}
// The slow, obviously-correct encoder the fast one is tested against.
f16 to_f16_exact(float value);

// ---- fp8 ----------------------------------------------------------------------------------------
struct e4m3 {
  uint8_t bits = 0;
};
struct e5m2 {
  uint8_t bits = 0;
};
e4m3 to_e4m3(float value);
float to_float(e4m3 value);
e5m2 to_e5m2(float value);
float to_float(e5m2 value);

// Round a float through a storage type and back: the value a tensor of that type would hold.
float round_to(DType dtype, float value);

// Generic load/store used by the CPU kernels: S is the storage type, the result is the compute
// type (double for f64 storage, float for everything narrower).
template <class S>
struct Compute {
  using type = float;
};
template <>
struct Compute<double> {
  using type = double;
};
template <class S>
using compute_t = typename Compute<S>::type;

inline float load(float v) {
  return v;
}
inline double load(double v) {
  return v;
}
inline float load(bf16 v) {
  return to_float(v);
}
inline float load(f16 v) {
  return to_float(v);
}

template <class S>
inline S store(compute_t<S> v);
template <>
inline float store<float>(float v) {
  return v;
}
template <>
inline double store<double>(double v) {
  return v;
}
template <>
inline bf16 store<bf16>(float v) {
  return to_bf16(v);
}
template <>
inline f16 store<f16>(float v) {
  return to_f16(v);
}

}  // namespace trainctl::tensor
