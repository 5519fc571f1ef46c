// Vectorisable math for the CPU backend's float compute path, and fixed-order multi-lane sums.
//
// fast_exp(float): Cephes' expf polynomial with Cody-Waite range reduction, written without
// branches or library calls so GCC vectorises loops that call it (std::exp is a call per element).
// Max relative error against std::exp is below 2e-7 (about 1.5 ulp) wherever the result is a normal
// float; tests/unit/backend_fast_math_test.cpp checks a dense sweep. Below ln(FLT_MIN) it returns 0
// (not a subnormal); +inf -> inf, -inf -> 0, NaN -> NaN. The double path never comes here:
// exp_of(double) is std::exp, so f64 stays the plain accurate reference.
//
// Lane sums: a float sum that must vectorise cannot be one serial chain (the compiler may not
// reorder float additions), so kLanes partial sums take elements i % kLanes, and the lanes are
// combined in one fixed tree. The order depends only on the element count: the same bits on every
// run, whatever the machine load or thread count.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace trainctl::backend::cpu {

inline float fast_exp(float x) {
  constexpr float kHi = 88.3762626647949f;  // ln(FLT_MAX)
  constexpr float kLo = -87.3365447504f;    // ln(FLT_MIN)
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  // No clamp on the way in: outside [kLo, kHi] (and for NaN) the integer steps below produce
  // garbage bits (defined behaviour: unsigned arithmetic), and the selects at the end replace them.
  const float xc = x;
  const float t = xc * kLog2e + kMagic;
  const float n = t - kMagic;  // nearest integer to x / ln 2
  float r = xc - n * kLn2Hi;
  r = r - n * kLn2Lo;
  const float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * z + r + 1.0f;
  // 2^n by adding n to the exponent field (integer arithmetic: defined even for NaN inputs).
  const uint32_t n_bits = std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(kMagic);
  float result = std::bit_cast<float>(std::bit_cast<uint32_t>(p) + (n_bits << 23));
  result = x < kLo ? 0.0f : result;
  result = x > kHi ? std::numeric_limits<float>::infinity() : result;
  return x != x ? x : result;  // NaN in, NaN out
}

// exp in the compute type: the fast float version, or std::exp for double (the f64 reference).
inline float exp_of(float x) {
  return fast_exp(x);
}
inline double exp_of(double x) {
  return std::exp(x);
}

// 1 / (1 + exp(-x)) in the compute type.
template <class T>
T sigmoid_of(T x) {
  return T(1) / (T(1) + exp_of(-x));
}

inline constexpr int kLanes = 8;

// Combines lane partial sums in a fixed tree: ((0+4)+(2+6)) + ((1+5)+(3+7)).
template <class T>
T combine_lanes(const T (&lane)[kLanes]) {
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

// Sum over i in [0, count) of f(i) in accumulator type T: element i goes to lane i % kLanes.
template <class T, class F>
T lane_sum(int64_t count, F&& f) {
  T lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes)
    for (int j = 0; j < kLanes; ++j)
      lane[j] += f(i + j);
  for (int j = 0; i + j < count; ++j)
    lane[j] += f(i + j);
  return combine_lanes(lane);
}

// Max over i in [0, count) of f(i) (-inf for none). Max is exact, so any order gives the same
// value; lanes only let it vectorise. NaN handling is not needed by its users (see loss.cpp).
template <class T, class F>
T lane_max(int64_t count, F&& f) {
  T lane[kLanes];
  for (T& l : lane)
    l = -std::numeric_limits<T>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const T v = f(i + j);
      lane[j] = v > lane[j] ? v : lane[j];
    }
  for (int j = 0; i + j < count; ++j) {
    const T v = f(i + j);
    lane[j] = v > lane[j] ? v : lane[j];
  }
  T m = lane[0];
  for (int j = 1; j < kLanes; ++j)
    m = lane[j] > m ? lane[j] : m;
  return m;
}

}  // namespace trainctl::backend::cpu
