// The CPU backend's float fast paths (lib/backend/cpu/fast_math.hpp) against the accurate library
// functions: fast_exp over a dense sweep of float inputs, its special values, the lane sums' fixed
// order, and the f32 GELU / softmax users on large inputs.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backend/cpu/fast_math.hpp"
#include "backend_test_util.hpp"

using namespace backend_test;
using trainctl::backend::cpu::combine_lanes;
using trainctl::backend::cpu::exp_of;
using trainctl::backend::cpu::fast_exp;
using trainctl::backend::cpu::kLanes;
using trainctl::backend::cpu::lane_max;
using trainctl::backend::cpu::lane_sum;

namespace {

// Max relative error of fast_exp against exp in double over every `stride`-th float pattern of
// [0, hi] with the given sign.
double worst_exp_error(float hi, bool negative, uint32_t stride) {
  double worst = 0;
  const uint32_t last = std::bit_cast<uint32_t>(hi);
  for (uint64_t bits = 0; bits <= last; bits += stride) {
    const float x =
        std::bit_cast<float>(static_cast<uint32_t>(bits) | (negative ? 0x80000000u : 0));
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(static_cast<double>(fast_exp(x)) - want) / want);
  }
  return worst;
}

}  // namespace

TEST_CASE("fast_exp is within 2e-7 relative of exp wherever the result is a normal float") {
  // Every 97th float pattern from 0 to ln(FLT_MAX) and to ln(FLT_MIN): ~22 million inputs,
  // covering every binade, and then every float in [-1, 1] near the reduction boundaries.
  CHECK(worst_exp_error(88.37f, false, 97) < 2e-7);
  CHECK(worst_exp_error(87.33f, true, 97) < 2e-7);
  // Every float near +-ln(2)/2, where the range reduction switches between multiples of ln 2.
  double worst = 0;
  for (const float sign : {1.0f, -1.0f})
    for (float a = 0.33f; a <= 0.36f; a = std::nextafter(a, 1.0f)) {
      const float x = sign * a;
      const double want = std::exp(static_cast<double>(x));
      worst = std::max(worst, std::abs(static_cast<double>(fast_exp(x)) - want) / want);
    }
  CHECK(worst < 2e-7);
}

TEST_CASE("fast_exp special values: 0, overflow, underflow, infinities, NaN") {
  CHECK(fast_exp(0.0f) == 1.0f);
  CHECK(fast_exp(89.0f) == std::numeric_limits<float>::infinity());
  CHECK(fast_exp(std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(fast_exp(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(fast_exp(-100.0f) == 0.0f);  // below ln(FLT_MIN): flushed, never negative or garbage
  CHECK(std::isnan(fast_exp(std::numeric_limits<float>::quiet_NaN())));
  CHECK(fast_exp(88.0f) == Approx(std::exp(88.0)).epsilon(2e-7));
  CHECK(fast_exp(-87.0f) == Approx(std::exp(-87.0)).epsilon(2e-7));
  // The double path is the library exp, bit for bit.
  CHECK(exp_of(0.3) == std::exp(0.3));
}

TEST_CASE("lane sums add element i into lane i % 8 and combine the lanes in one fixed tree") {
  std::vector<float> v(1003);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i))) * 1000.0f;
  float lane[kLanes] = {};
  for (size_t i = 0; i < v.size(); ++i)
    lane[i % kLanes] += v[i];
  const float want =
      ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  const auto at = [&](int64_t i) { return v[static_cast<size_t>(i)]; };
  CHECK(lane_sum<float>(static_cast<int64_t>(v.size()), at) == want);
  CHECK(combine_lanes(lane) == want);
  CHECK(lane_sum<float>(0, at) == 0.0f);
  CHECK(lane_sum<float>(3, at) == (v[0] + 0.0f) + (v[2] + 0.0f) + (v[1] + 0.0f));
  float mx = -std::numeric_limits<float>::infinity();
  for (float x : v)
    mx = std::max(mx, x);
  CHECK(lane_max<float>(static_cast<int64_t>(v.size()), at) == mx);
  CHECK(lane_max<float>(0, at) == -std::numeric_limits<float>::infinity());
}

TEST_CASE("sum_squares of a large f32 tensor is within 1e-12 of a long double reference") {
  const int64_t count = 1 << 20;
  const Values v = random_values(count, 11, 3.0);
  OwnedTensor t = make(DType::f32, Shape{count}, v);
  long double exact = 0;
  for (double x : read(t))
    exact += static_cast<long double>(x) * x;
  const double got = cpu().sum_squares(t);
  CHECK(std::abs(got - static_cast<double>(exact)) / static_cast<double>(exact) < 1e-12);
  CHECK(cpu().sum_squares(t) == got);  // the same bits on every call
  OwnedTensor bad = make(DType::f32, Shape{count}, v);
  set_element(bad, count - 3, std::numeric_limits<double>::infinity());
  CHECK(std::isinf(cpu().sum_squares(bad)));
  set_element(bad, 5, std::numeric_limits<double>::quiet_NaN());
  CHECK(std::isnan(cpu().sum_squares(bad)));
}

TEST_CASE("f32 gelu stays within 1e-6 of the tanh formula across [-12, 12], and is 0 far left") {
  const int64_t count = 24001;
  Values x(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    x[static_cast<size_t>(i)] = -12.0 + 0.001 * static_cast<double>(i);
  OwnedTensor xt = make(DType::f32, Shape{count}, x), out(DType::f32, Shape{count});
  OwnedTensor dy = make(DType::f32, Shape{count}, Values(static_cast<size_t>(count), 1.0));
  OwnedTensor dx(DType::f32, Shape{count});
  cpu().gelu_forward(out, xt);
  cpu().gelu_backward(dx, dy, xt);
  const Values xs = read(xt), got = read(out), got_dx = read(dx);
  double worst = 0, worst_dx = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i], u = std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v);
    const double t = std::tanh(u), want = 0.5 * v * (1 + t);
    const double want_dx =
        0.5 * (1 + t) + 0.5 * v * (1 - t * t) * std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * v * v);
    // Relative where the value is not tiny, absolute (to the scale 1) where it is.
    worst = std::max(worst, std::abs(got[i] - want) / std::max(std::abs(want), 1.0));
    worst_dx = std::max(worst_dx, std::abs(got_dx[i] - want_dx) / std::max(std::abs(want_dx), 1.0));
  }
  CHECK(worst < 1e-6);
  CHECK(worst_dx < 1e-6);
  OwnedTensor far = make(DType::f32, Shape{2}, {-200.0, -1e4});
  OwnedTensor far_out(DType::f32, Shape{2}), far_dx(DType::f32, Shape{2});
  cpu().gelu_forward(far_out, far);
  cpu().gelu_backward(far_dx, make(DType::f32, Shape{2}, {1.0, 1.0}), far);
  CHECK(read(far_out) == Values{0.0, 0.0});
  for (double d : read(far_dx))  // exp(-889) and below: tiny, finite, never NaN
    CHECK(std::abs(d) < 1e-20);
}
