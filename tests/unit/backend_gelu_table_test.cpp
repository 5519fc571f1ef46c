// The CPU backend looks GELU up in tables for 16-bit storage (activation.cpp). The tables must be
// invisible: every one of the 65536 input patterns gives exactly the bits the formula computed in
// float and rounded once gives, forward and backward. Also checks the op timing counters.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cpu/op_timing.hpp"
#include "backend_test_util.hpp"

using namespace backend_test;
using trainctl::tensor::bf16;
using trainctl::tensor::f16;

namespace {

// The reference: the contract's formula in the compute type (float), rounded once.
float gelu_formula(float v) {
  const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
  return 0.5f * v * (1.0f + std::tanh(u));
}

float gelu_derivative_formula(float v) {
  const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
  const float t = std::tanh(u);
  const float du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * v * v);
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
}

// Bits equal, or both NaN (NaN payloads are not part of the contract).
template <class S>
bool same(S got, S want) {
  const float g = trainctl::tensor::load(got), w = trainctl::tensor::load(want);
  if (std::isnan(g) || std::isnan(w)) return std::isnan(g) && std::isnan(w);
  return got.bits == want.bits;
}

template <class S>
void check_all_patterns(DType dtype) {
  constexpr int64_t kCount = 65536;
  OwnedTensor x(dtype, Shape{kCount}), out(dtype, Shape{kCount}), dout(dtype, Shape{kCount}),
      dx(dtype, Shape{kCount});
  const Values dy = random_values(kCount, 77);
  for (int64_t i = 0; i < kCount; ++i) {
    x.as<S>()[i] = S{static_cast<uint16_t>(i)};
    dout.as<S>()[i] = trainctl::tensor::store<S>(static_cast<float>(dy[static_cast<size_t>(i)]));
  }
  cpu().gelu_forward(out, x);
  cpu().gelu_backward(dx, dout, x);
  int64_t forward_mismatches = 0, backward_mismatches = 0;
  for (int64_t i = 0; i < kCount; ++i) {
    const float v = trainctl::tensor::load(x.as<S>()[i]);
    const S want = trainctl::tensor::store<S>(gelu_formula(v));
    const S want_dx = trainctl::tensor::store<S>(gelu_derivative_formula(v) *
                                                 trainctl::tensor::load(dout.as<S>()[i]));
    forward_mismatches += !same(out.as<S>()[i], want);
    backward_mismatches += !same(dx.as<S>()[i], want_dx);
  }
  CHECK(forward_mismatches == 0);
  CHECK(backward_mismatches == 0);
}

}  // namespace

TEST_CASE("gelu on bf16 equals the float formula bit for bit on every input pattern") {
  check_all_patterns<bf16>(DType::bf16);
}

TEST_CASE("gelu on f16 equals the float formula bit for bit on every input pattern") {
  check_all_patterns<f16>(DType::f16);
}

TEST_CASE("op timing counts calls, time and GEMM FLOPs only while enabled") {
  namespace cpu_be = trainctl::backend::cpu;
  auto be = trainctl::backend::make_cpu_backend();
  OwnedTensor a(DType::f32, Shape{8, 4}), b(DType::f32, Shape{4, 3}), c(DType::f32, Shape{8, 3});
  write(a, random_values(32, 1));
  write(b, random_values(12, 2));
  trainctl::backend::GemmArgs g;
  g.a = a;
  g.b = b;
  g.c = c;
  g.m = 8;
  g.n = 3;
  g.k = 4;
  be->gemm(g);
  CHECK(cpu_be::op_stats(*be).calls[static_cast<int>(cpu_be::OpFamily::gemm)] == 0);
  cpu_be::set_op_timing(*be, true);
  be->gemm(g);
  be->gemm(g);
  be->fill(c, 0.0);
  const cpu_be::OpStats s = cpu_be::op_stats(*be);
  CHECK(s.calls[static_cast<int>(cpu_be::OpFamily::gemm)] == 2);
  CHECK(s.calls[static_cast<int>(cpu_be::OpFamily::elementwise)] == 1);
  CHECK(s.gemm_flops == 2.0 * 2 * 8 * 3 * 4);
  CHECK(s.ns[static_cast<int>(cpu_be::OpFamily::gemm)] > 0);
  CHECK(cpu_be::format_op_stats(s).find("gemm") != std::string::npos);
  cpu_be::reset_op_stats(*be);
  CHECK(cpu_be::op_stats(*be).total_ns() == 0);
}
