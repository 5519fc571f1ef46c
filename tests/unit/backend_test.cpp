// Backend basics on the CPU backend: derived dtypes, capabilities, allocations, casts, elementwise
// ops, reductions, argument checks and AdamW.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "backend/backend.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "backend_test_util.hpp"

using namespace backend_test;
using trainctl::backend::grad_dtype;
using trainctl::backend::OpFamily;
using trainctl::backend::stats_dtype;

TEST_CASE("grad and stats dtypes follow the storage type") {
  CHECK(grad_dtype(DType::f64) == DType::f64);
  CHECK(stats_dtype(DType::f64) == DType::f64);
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    CHECK(grad_dtype(d) == DType::f32);
    CHECK(stats_dtype(d) == DType::f32);
  }
}

TEST_CASE("cpu capabilities: the four float storage types, fp8 GEMM operands, no fp8 storage") {
  const auto caps = cpu().capabilities();
  for (DType d : kFloatTypes)
    CHECK(caps.supports(d));
  CHECK(caps.fp8);
  CHECK_FALSE(caps.supports(DType::e4m3));
  CHECK_FALSE(caps.supports(DType::i32));
  CHECK(cpu().name() == "cpu");
}

TEST_CASE("cpu capabilities: every op family, fp8 being the fp8 flag") {
  const auto caps = cpu().capabilities();
  for (int f = 0; f < trainctl::backend::kNumOpFamilies; ++f) {
    INFO(trainctl::backend::op_family_name(static_cast<OpFamily>(f)));
    CHECK(caps.supports(static_cast<OpFamily>(f)));
    CHECK(cpu().supports(static_cast<OpFamily>(f)));
  }
  trainctl::backend::Capabilities partial = caps;
  partial.set_supported(OpFamily::moe, false);
  partial.set_supported(OpFamily::fp8, false);
  CHECK_FALSE(partial.supports(OpFamily::moe));
  CHECK_FALSE(partial.supports(OpFamily::fp8));
  CHECK_FALSE(partial.fp8);
  CHECK(partial.supports(OpFamily::gemm));
  partial.set_supported(OpFamily::moe, true);
  CHECK(partial.supports(OpFamily::moe));
}

namespace {

// The CPU backend declaring that it lacks attention and fp8 GEMMs.
class PartialBackend final : public trainctl::backend::cpu::CpuBackend {
 public:
  PartialBackend() {
    trainctl::backend::Capabilities caps = capabilities();
    caps.set_supported(OpFamily::attention, false);
    caps.set_supported(OpFamily::fp8, false);
    declare_capabilities(caps);
  }
};

}  // namespace

TEST_CASE("a call into an op family the backend does not declare fails in the wrapper") {
  PartialBackend be;
  const trainctl::backend::AttentionShape s{.B = 1, .T = 2, .H = 2, .KV = 2, .D = 4};
  OwnedTensor qkv(DType::f32, Shape{2, s.qkv_width()}), out(DType::f32, Shape{2, 8}),
      lse(DType::f32, Shape{1, 2, 2});
  // Refused before any argument is looked at (an empty tensor too).
  CHECK_THROWS_AS(be.attention_forward(out, lse, Tensor{}, s), std::invalid_argument);
  CHECK_THROWS_WITH(be.attention_backward(qkv, out, qkv, out, lse, s),
                    Catch::Contains("cpu backend attention_backward: the cpu backend does not "
                                    "implement the attention op family"));
  OwnedTensor a = make(DType::f32, Shape{4}, {1, 2, 3, 4}), c(DType::f32, Shape{4});
  trainctl::backend::GemmArgs g{.a = a, .b = a, .c = c, .m = 2, .n = 2, .k = 2, .bias = {}};
  be.gemm(g);  // the gemm family is there
  CHECK(read(c) == Values{7, 10, 15, 22});
  g.fp8_a = DType::e4m3;
  CHECK_THROWS_WITH(be.gemm(g), Catch::Contains("cpu backend gemm") &&
                                    Catch::Contains("does not implement the fp8 op family"));
  CHECK_NOTHROW(cpu().gemm(g));  // the full CPU backend has it
}

TEST_CASE("argument errors name the backend and the op, and a misplaced tensor is refused") {
  OwnedTensor x(DType::f32, Shape{4});
  Tensor on_gpu = x;
  on_gpu.device = trainctl::tensor::Device::cuda;
  CHECK_THROWS_WITH(cpu().scale(on_gpu, 2.0),
                    Catch::Equals("cpu backend scale: dst is not in host memory"));
  CHECK_THROWS_WITH(cpu().sum(Tensor{}),
                    Catch::Equals("cpu backend sum: src is empty (null data) but is required"));
  float host[4] = {};
  CHECK_THROWS_WITH(cpu().copy_to_host(host, on_gpu),
                    Catch::Equals("cpu backend copy_to_host: src is not in host memory"));
}

TEST_CASE("allocations are zero-filled, movable, and views are bounds-checked") {
  auto a = cpu().allocate(100);
  REQUIRE(a.data() != nullptr);
  CHECK(a.bytes() == 100);
  const auto* bytes = static_cast<const unsigned char*>(a.data());
  for (int i = 0; i < 100; ++i)
    REQUIRE(bytes[i] == 0);
  Tensor v = a.view(DType::f32, Shape{5, 5});
  CHECK(v.numel() == 25);
  CHECK_THROWS_AS(a.view(DType::f32, Shape{26}), std::out_of_range);
  auto b = std::move(a);
  CHECK(a.data() == nullptr);
  CHECK(b.bytes() == 100);
  trainctl::backend::Allocation c;
  c = std::move(b);
  CHECK(c.view(DType::f32, Shape{4}, 8).data == static_cast<char*>(c.data()) + 8);
}

TEST_CASE("copy_to_host and copy_from_host round trip") {
  auto a = cpu().allocate(4 * sizeof(float));
  Tensor t = a.view(DType::f32, Shape{4});
  const float in[4] = {1, -2, 3.5f, 4};
  float out[4] = {};
  cpu().copy_from_host(t, in);
  cpu().copy_to_host(out, t);
  for (int i = 0; i < 4; ++i)
    CHECK(out[i] == in[i]);
}

TEST_CASE("cast converts between every pair of float dtypes with one rounding") {
  const Values source = random_values(64, 1, 3.0);
  const DType all[] = {DType::f64, DType::f32, DType::bf16, DType::f16, DType::e4m3, DType::e5m2};
  for (DType from : all)
    for (DType to : all) {
      INFO(std::string(trainctl::tensor::dtype_name(from)) + " -> " +
           std::string(trainctl::tensor::dtype_name(to)));
      OwnedTensor src = make(from, Shape{64}, source);
      OwnedTensor dst(to, Shape{64});
      cpu().cast(dst, src);
      const Values in = read(src);
      const Values out = read(dst);
      for (size_t i = 0; i < in.size(); ++i) {
        const double expected =
            to == DType::f64 ? in[i] : trainctl::tensor::round_to(to, static_cast<float>(in[i]));
        REQUIRE(out[i] == expected);
      }
    }
  // Ties round to even: 1 + 2^-8 is halfway between two bf16 values; the even one is 1.
  OwnedTensor tie =
      make(DType::f32, Shape{2}, {1.0 + std::ldexp(1.0, -8), 1.0 + 3 * std::ldexp(1.0, -8)});
  OwnedTensor narrow(DType::bf16, Shape{2});
  cpu().cast(narrow, tie);
  CHECK(read(narrow) == Values{1.0, 1.0 + std::ldexp(1.0, -6)});
  OwnedTensor wrong(DType::f32, Shape{3});
  CHECK_THROWS_WITH(cpu().cast(wrong, tie), Catch::Contains("cast") && Catch::Contains("dst"));
}

TEST_CASE("fill, add, accumulate and scale in every float dtype") {
  for (DType d : kFloatTypes) {
    INFO(trainctl::tensor::dtype_name(d));
    const Values a = rounded(d, random_values(37, 2));
    const Values b = rounded(d, random_values(37, 3));
    OwnedTensor ta = make(d, Shape{37}, a), tb = make(d, Shape{37}, b), out(d, Shape{37});
    cpu().add(out, ta, tb);
    Values ref(37);
    for (size_t i = 0; i < 37; ++i)
      ref[i] = a[i] + b[i];
    CHECK(rel_error(read(out), ref) < tolerance(d));
    // accumulate a narrow tensor into its f32/f64 gradient type
    OwnedTensor g = make(grad_dtype(d), Shape{37}, a);
    cpu().accumulate(g, tb);
    CHECK(rel_error(read(g), ref) < tolerance(grad_dtype(d)));
    cpu().scale(ta, -0.5);
    for (size_t i = 0; i < 37; ++i)
      ref[i] = -0.5 * a[i];
    CHECK(rel_error(read(ta), ref) < tolerance(d));
    cpu().fill(ta, 0.25);
    for (double v : read(ta))
      REQUIRE(v == 0.25);
  }
  OwnedTensor x(DType::f32, Shape{4}), y(DType::f32, Shape{5});
  CHECK_THROWS_WITH(cpu().add(x, x, y),
                    Catch::Contains("add") && Catch::Contains("b has shape [5]"));
  OwnedTensor ints(DType::i32, Shape{4});
  CHECK_THROWS_WITH(cpu().fill(ints, 1), Catch::Contains("i32"));
}

TEST_CASE("sum and sum_squares accumulate in double in a fixed order") {
  // 1e8 + 1 + 1 ... in float would lose the ones; double keeps them.
  Values v(1001, 1.0);
  v[0] = 1e8;
  OwnedTensor t = make(DType::f32, Shape{1001}, v);
  CHECK(cpu().sum(t) == 1e8 + 1000);
  CHECK(cpu().sum_squares(make(DType::f64, Shape{3}, {1, -2, 3})) == 14);
  for (DType d : kFloatTypes) {
    OwnedTensor r = make(d, Shape{999}, random_values(999, 4));
    const double first = cpu().sum(r), second = cpu().sum(r);
    CHECK(first == second);  // bitwise the same on every call
    // sum: one sequential chain; sum_squares: element i into lane i % 8, lanes combined as
    // ((0+4)+(2+6)) + ((1+5)+(3+7)) (vectorisable, and still one fixed order).
    double ref = 0, lane[8] = {};
    const Values values = read(r);
    for (size_t i = 0; i < values.size(); ++i)
      ref += values[i], lane[i % 8] += values[i] * values[i];
    const double ref_sq =
        ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    CHECK(first == ref);
    CHECK(cpu().sum_squares(r) == ref_sq);
  }
}

TEST_CASE("all_finite detects inf and NaN in every float dtype") {
  for (DType d : kFloatTypes) {
    INFO(trainctl::tensor::dtype_name(d));
    OwnedTensor t = make(d, Shape{16}, random_values(16, 5));
    CHECK(cpu().all_finite(t));
    set_element(t, 7, std::numeric_limits<double>::infinity());
    CHECK_FALSE(cpu().all_finite(t));
    set_element(t, 7, -std::numeric_limits<double>::infinity());
    CHECK_FALSE(cpu().all_finite(t));
    set_element(t, 7, std::numeric_limits<double>::quiet_NaN());
    CHECK_FALSE(cpu().all_finite(t));
    set_element(t, 7, 1.0);
    CHECK(cpu().all_finite(t));
  }
  // A large f32 value overflows to inf when cast to f16: all_finite sees it.
  OwnedTensor big = make(DType::f32, Shape{1}, {1e6});
  OwnedTensor half(DType::f16, Shape{1});
  cpu().cast(half, big);
  CHECK_FALSE(cpu().all_finite(half));
}

TEST_CASE("adamw: one step matches the hand computation") {
  using Hyper = Backend::AdamW;
  const Hyper h{.lr = 0.1,
                .beta1 = 0.9,
                .beta2 = 0.99,
                .eps = 1e-8,
                .weight_decay = 0.0,
                .grad_scale = 0.5,
                .step = 1};
  OwnedTensor p = make(DType::f64, Shape{2}, {1.0, -2.0});
  OwnedTensor g = make(DType::f64, Shape{2}, {0.4, -0.2});
  OwnedTensor m(DType::f64, Shape{2}), v(DType::f64, Shape{2});
  cpu().adamw(p, Tensor{}, g, m, v, h);
  // g = 0.2, -0.1; m = 0.02, -0.01; v = 4e-4, 1e-4; mhat = 0.2, -0.1; vhat = 0.04, 0.01
  // step = lr * mhat / (sqrt(vhat) + eps) = 0.1 * 0.2 / (0.2 + 1e-8) ~= 0.1
  CHECK(read(m)[0] == Approx(0.02).epsilon(1e-14));
  CHECK(read(v)[1] == Approx(1e-4).epsilon(1e-14));
  CHECK(read(p)[0] == Approx(1.0 - 0.1 * 0.2 / (0.2 + 1e-8)).epsilon(1e-14));
  CHECK(read(p)[1] == Approx(-2.0 + 0.1 * 0.1 / (0.1 + 1e-8)).epsilon(1e-14));

  // Step 2 with weight decay: decoupled, p *= (1 - lr wd) before the Adam step.
  const Hyper h2{.lr = 0.1,
                 .beta1 = 0.9,
                 .beta2 = 0.99,
                 .eps = 1e-8,
                 .weight_decay = 0.5,
                 .grad_scale = 1.0,
                 .step = 2};
  OwnedTensor g2 = make(DType::f64, Shape{2}, {0.0, 0.0});
  const Values p1 = read(p), m1 = read(m), v1 = read(v);
  cpu().adamw(p, Tensor{}, g2, m, v, h2);
  for (size_t i = 0; i < 2; ++i) {
    const double mm = 0.9 * m1[i], vv = 0.99 * v1[i];
    const double mhat = mm / (1 - 0.81), vhat = vv / (1 - 0.99 * 0.99);
    const double expected = p1[i] * (1 - 0.1 * 0.5) - 0.1 * mhat / (std::sqrt(vhat) + 1e-8);
    CHECK(read(p)[i] == Approx(expected).epsilon(1e-14));
  }
}

TEST_CASE("adamw: weight decay is decoupled from the gradient") {
  // Zero gradient, zero moments: only the decay acts, p *= 1 - lr wd, whatever the Adam terms.
  OwnedTensor p = make(DType::f32, Shape{3}, {1.0, -4.0, 8.0});
  OwnedTensor g(DType::f32, Shape{3}), m(DType::f32, Shape{3}), v(DType::f32, Shape{3});
  cpu().adamw(p, Tensor{}, g, m, v, {0.01, 0.9, 0.999, 1e-8, 0.1, 1.0, 1});
  CHECK(read(p) == Values{static_cast<float>(1.0f * 0.999f), static_cast<float>(-4.0f * 0.999f),
                          static_cast<float>(8.0f * 0.999f)});
}

TEST_CASE("adamw: bf16 params follow the f32 master, rounded once") {
  // An update smaller than half a bf16 ulp of the param is kept in the master and accumulates.
  OwnedTensor master = make(DType::f32, Shape{1}, {1.0});
  OwnedTensor param = make(DType::bf16, Shape{1}, {1.0});
  OwnedTensor g = make(DType::f32, Shape{1}, {-1.0});
  OwnedTensor m(DType::f32, Shape{1}), v(DType::f32, Shape{1});
  for (int step = 1; step <= 5; ++step)
    cpu().adamw(param, master, g, m, v, {1e-3, 0.9, 0.999, 1e-8, 0.0, 1.0, step});
  const double w = read(master)[0];
  CHECK(w == Approx(1.005).epsilon(1e-5));  // each step moves +lr (m/sqrt(v) = 1 for constant g)
  CHECK(read(param)[0] == trainctl::tensor::round_to(DType::bf16, static_cast<float>(w)));
  CHECK(read(param)[0] != 1.0);  // 1.005 rounds to 1.0078125 in bf16, not back to 1
  // Without the master, each bf16 step of +1e-3 would round away (ulp at 1 is 2^-7).
  OwnedTensor alone = make(DType::bf16, Shape{1}, {1.0});
  OwnedTensor m2(DType::f32, Shape{1}), v2(DType::f32, Shape{1});
  for (int step = 1; step <= 5; ++step)
    cpu().adamw(alone, Tensor{}, g, m2, v2, {1e-3, 0.9, 0.999, 1e-8, 0.0, 1.0, step});
  CHECK(read(alone)[0] == 1.0);
}

TEST_CASE("adamw rejects mismatched state") {
  OwnedTensor p(DType::bf16, Shape{4}), g(DType::bf16, Shape{4}), m(DType::f32, Shape{4}),
      v(DType::f32, Shape{4});
  CHECK_THROWS_WITH(cpu().adamw(p, Tensor{}, g, m, v, {1e-3, 0.9, 0.999, 1e-8, 0, 1, 1}),
                    Catch::Contains("adamw") && Catch::Contains("grad has dtype bf16"));
  OwnedTensor g32(DType::f32, Shape{4});
  CHECK_THROWS_WITH(cpu().adamw(p, Tensor{}, g32, m, v, {1e-3, 0.9, 0.999, 1e-8, 0, 1, 0}),
                    Catch::Contains("step=0"));
}
