#include "tensor/dtype.hpp"

#include <cstring>
#include <limits>
#include <stdexcept>

namespace trainctl::tensor {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 8;
    case DType::f32:
      return 4;
    case DType::i32:
      return 4;
    case DType::bf16:
    case DType::f16:
    case DType::u16:
      return 2;
    case DType::e4m3:
    case DType::e5m2:
      return 1;
  }
  throw std::logic_error("dtype_size: unknown dtype");
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return "f64";
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::e4m3:
      return "e4m3";
    case DType::e5m2:
      return "e5m2";
    case DType::i32:
      return "i32";
    case DType::u16:
      return "u16";
  }
  return "?";
}

bool is_floating(DType dtype) {
  return dtype != DType::i32 && dtype != DType::u16;
}

// Generic round-to-nearest-even encoder for a small float format with `exp_bits` exponent bits and
// `man_bits` mantissa bits. Works on the exact binary value of the float, so every rounding
// decision (including subnormals) matches hardware conversion.
namespace {

struct MiniFormat {
  int exp_bits;
  int man_bits;
  bool has_inf;      // e5m2 / f16: all-ones exponent is inf/NaN; e4m3fn: only S.1111.111 is NaN
  float max_finite;  // saturation value
};

uint32_t encode_mini(float value, const MiniFormat& f, bool saturate) {
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  const uint32_t sign = std::signbit(value) ? 1u : 0u;
  const uint32_t sign_bit = sign << (f.exp_bits + f.man_bits);
  const uint32_t nan_bits =
      f.has_inf ? (((1u << f.exp_bits) - 1) << f.man_bits) | (1u << (f.man_bits - 1))
                : (1u << (f.exp_bits + f.man_bits)) - 1;
  if (std::isnan(value)) return sign_bit | nan_bits;
  float a = std::fabs(value);
  const uint32_t inf_bits = ((1u << f.exp_bits) - 1) << f.man_bits;
  const uint32_t max_bits = [&] {
    if (f.has_inf) return inf_bits - 1;
    return (1u << (f.exp_bits + f.man_bits)) - 2;  // e4m3fn: 0.1111.110 = 448
  }();
  if (std::isinf(a)) return sign_bit | ((f.has_inf && !saturate) ? inf_bits : max_bits);
  // Scale into an integer number of units of the smallest subnormal, then round to even.
  const int min_exp = 1 - bias;  // exponent of the smallest normal
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int unbiased = e - 1;
  if (unbiased < min_exp) unbiased = min_exp;
  // quantum at this binade
  const double quantum = std::ldexp(1.0, unbiased - f.man_bits);
  double q = static_cast<double>(a) / quantum;  // exact: a has 24 bits, quantum is a power of 2
  double r = std::nearbyint(q);                 // default rounding mode: to nearest even
  double rounded = r * quantum;
  if (rounded > f.max_finite) {
    // Values that round beyond the largest finite: overflow (inf) or saturate.
    return sign_bit | ((f.has_inf && !saturate) ? inf_bits : max_bits);
  }
  if (rounded == 0.0) return sign_bit;
  int re = 0;
  std::frexp(rounded, &re);
  int rexp = re - 1;
  uint32_t bits;
  if (rexp < min_exp) {  // subnormal
    bits = static_cast<uint32_t>(rounded / std::ldexp(1.0, min_exp - f.man_bits));
  } else {
    const double mant = rounded / std::ldexp(1.0, rexp) - 1.0;  // [0,1)
    bits = (static_cast<uint32_t>(rexp + bias) << f.man_bits) |
           static_cast<uint32_t>(std::ldexp(mant, f.man_bits));
  }
  return sign_bit | bits;
}

float decode_mini(uint32_t bits, const MiniFormat& f) {
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  const bool negative = (bits >> (f.exp_bits + f.man_bits)) & 1u;
  const uint32_t exp = (bits >> f.man_bits) & ((1u << f.exp_bits) - 1);
  const uint32_t man = bits & ((1u << f.man_bits) - 1);
  float out;
  if (f.has_inf && exp == (1u << f.exp_bits) - 1) {
    out = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else if (!f.has_inf && exp == (1u << f.exp_bits) - 1 && man == (1u << f.man_bits) - 1) {
    out = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    out = static_cast<float>(std::ldexp(static_cast<double>(man), 1 - bias - f.man_bits));
  } else {
    out = static_cast<float>(
        std::ldexp(1.0 + std::ldexp(static_cast<double>(man), -f.man_bits), int(exp) - bias));
  }
  return negative ? -out : out;
}

constexpr MiniFormat kF16{5, 10, true, 65504.0f};
constexpr MiniFormat kE4M3{4, 3, false, 448.0f};
constexpr MiniFormat kE5M2{5, 2, true, 57344.0f};

}  // namespace

f16 to_f16_exact(float value) {
  return f16{static_cast<uint16_t>(encode_mini(value, kF16, false))};
}
e4m3 to_e4m3(float value) {
  return e4m3{static_cast<uint8_t>(encode_mini(value, kE4M3, true))};
}
float to_float(e4m3 value) {
  return decode_mini(value.bits, kE4M3);
}
e5m2 to_e5m2(float value) {
  return e5m2{static_cast<uint8_t>(encode_mini(value, kE5M2, true))};
}
float to_float(e5m2 value) {
  return decode_mini(value.bits, kE5M2);
}

float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::f64:
    case DType::f32:
      return value;
    case DType::bf16:
      return to_float(to_bf16(value));
    case DType::f16:
      return to_float(to_f16(value));
    case DType::e4m3:
      return to_float(to_e4m3(value));
    case DType::e5m2:
      return to_float(to_e5m2(value));
    default:
      throw std::invalid_argument("round_to: not a floating dtype");
  }
}

}  // namespace trainctl::tensor
