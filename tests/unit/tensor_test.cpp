// lib/tensor: dtype conversions (round to nearest even, subnormals, overflow, NaN), the fast fp16
// path against the exact encoder, Philox against its published test vectors, tensor views.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <limits>

#include "tensor/dtype.hpp"
#include "tensor/rng.hpp"
#include "tensor/tensor.hpp"

using namespace trainctl::tensor;

TEST_CASE("bf16: round to nearest even, NaN stays NaN", "[tensor][dtype]") {
  CHECK(to_bf16(1.0f).bits == 0x3f80);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even (1.0).
  CHECK(to_bf16(1.0f + std::ldexp(1.0f, -8)).bits == 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
  CHECK(to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)).bits == 0x3f82);
  CHECK(to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)).bits == 0x3f81);
  CHECK(std::isnan(to_float(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isinf(to_float(to_bf16(std::numeric_limits<float>::max()))));  // rounds up to inf
  CHECK(to_float(to_bf16(-2.5f)) == -2.5f);
}

TEST_CASE("f16: every half round-trips and the fast encoder equals the exact one",
          "[tensor][dtype]") {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const f16 h{static_cast<uint16_t>(bits)};
    const float f = to_float(h);
    if (std::isnan(f)) {
      CHECK(std::isnan(to_float(to_f16(f))));
      continue;
    }
    REQUIRE(to_f16(f).bits == bits);
    REQUIRE(to_f16_exact(f).bits == bits);
  }
  // Random floats over the whole range, including subnormal and overflowing results, and exact
  // midpoints between neighbouring halves.
  CounterRng rng(1, 2);
  for (uint64_t i = 0; i < 2'000'000; ++i) {
    const float f = std::bit_cast<float>(rng.bits(i));
    if (std::isnan(f)) continue;
    REQUIRE(to_f16(f).bits == to_f16_exact(f).bits);
  }
  for (uint32_t bits = 0; bits < 0x7bff; ++bits) {
    const float lo = to_float(f16{static_cast<uint16_t>(bits)});
    const float hi = to_float(f16{static_cast<uint16_t>(bits + 1)});
    const float mid = lo + (hi - lo) / 2;  // exact in float
    const uint16_t even = (bits & 1) ? bits + 1 : bits;
    REQUIRE(to_f16(mid).bits == even);
  }
  CHECK(to_f16(65504.0f).bits == 0x7bff);
  CHECK(to_f16(65519.0f).bits == 0x7bff);                 // below the midpoint to the next binade
  CHECK(to_f16(65520.0f).bits == 0x7c00);                 // rounds to inf
  CHECK(to_float(f16{0x0001}) == std::ldexp(1.0f, -24));  // smallest subnormal
}

TEST_CASE("fp8: e4m3 saturates at 448, e5m2 at 57344; ties to even", "[tensor][dtype]") {
  CHECK(to_float(to_e4m3(448.0f)) == 448.0f);
  CHECK(to_float(to_e4m3(1000.0f)) == 448.0f);
  CHECK(to_float(to_e4m3(-1e9f)) == -448.0f);
  CHECK(to_float(to_e4m3(std::numeric_limits<float>::infinity())) == 448.0f);
  CHECK(std::isnan(to_float(to_e4m3(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(to_float(to_e4m3(1.0625f)) == 1.0f);   // halfway 1 and 1.125: to even (1.0)
  CHECK(to_float(to_e4m3(1.1875f)) == 1.25f);  // halfway 1.125 and 1.25: to even (1.25)
  CHECK(to_float(to_e4m3(std::ldexp(1.0f, -9))) == std::ldexp(1.0f, -9));  // smallest subnormal
  CHECK(to_float(to_e5m2(57344.0f)) == 57344.0f);
  CHECK(to_float(to_e5m2(1e6f)) == 57344.0f);
  CHECK(to_float(to_e5m2(1.125f)) == 1.0f);  // halfway 1 and 1.25: to even
  // Every e4m3 / e5m2 value round-trips.
  for (uint32_t bits = 0; bits < 256; ++bits) {
    const float a = to_float(e4m3{static_cast<uint8_t>(bits)});
    if (!std::isnan(a)) CHECK(to_float(to_e4m3(a)) == a);
    const float b = to_float(e5m2{static_cast<uint8_t>(bits)});
    if (!std::isnan(b) && !std::isinf(b)) CHECK(to_float(to_e5m2(b)) == b);
  }
}

TEST_CASE("philox4x32-10 matches the Random123 known-answer vectors", "[tensor][rng]") {
  // From Random123's kat_vectors: philox4x32 10 rounds.
  CHECK(philox4x32({0, 0, 0, 0}, {0, 0}) ==
        std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
        std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("counter rng: values are a function of (seed, stream, index) only", "[tensor][rng]") {
  const CounterRng a(7, stream_key("layers.0.attn.qkv.weight"));
  const CounterRng b(7, stream_key("layers.0.attn.qkv.weight"));
  const CounterRng other(7, stream_key("layers.0.attn.proj.weight"));
  double sum = 0, sum_sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = a.normal(static_cast<uint64_t>(i));
    REQUIRE(x == b.normal(static_cast<uint64_t>(i)));
    sum += x;
    sum_sq += x * x;
  }
  CHECK(std::abs(sum / n) < 0.01);
  CHECK(std::abs(sum_sq / n - 1.0) < 0.01);
  CHECK(a.normal(5) != other.normal(5));
  CHECK(a.uniform(3) >= 0.0f);
  CHECK(a.uniform(3) < 1.0f);
  CHECK(stream_key("a") != stream_key("b"));
}

TEST_CASE("tensor views: rows, reshape, bounds", "[tensor]") {
  OwnedTensor t(DType::f32, {4, 3});
  for (int i = 0; i < 12; ++i)
    set_element(t, i, i);
  const Tensor r = t.view().rows(1, 2);
  CHECK(r.shape == Shape{2, 3});
  CHECK(get_element(r, 0) == 3.0);
  CHECK(t.view().reshaped({12}).numel() == 12);
  CHECK_THROWS_WITH(t.view().reshaped({5}), Catch::Contains("changes the element count"));
  CHECK_THROWS_AS(t.view().rows(3, 2), std::out_of_range);
  Buffer buffer(16);
  CHECK_THROWS_WITH(buffer.view(DType::f32, {5}), Catch::Contains("exceeds 16 bytes"));
}
