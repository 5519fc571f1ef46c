// The CPU backend's fp8 GEMM operands (and its fast fp8 rounding, amax and given amaxes) (the
// reference the CUDA backend's fp8 tensor-core path is compared with), the GELU epilogue and the
// multi-tensor AdamW, against independent references.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "backend_test_util.hpp"
#include "tensor/dtype.hpp"

using namespace backend_test;
using trainctl::backend::Epilogue;
using trainctl::backend::fp8_scale;
using trainctl::backend::GemmArgs;

namespace {

constexpr double kE4M3Max = 448.0, kE5M2Max = 57344.0;

double max_of(DType format) {
  return format == DType::e4m3 ? kE4M3Max : kE5M2Max;
}

// The reference quantization, in double: the scale from the definition (search over powers of
// two), the value through the tensor module's fp8 encoder.
Values quantized(const Values& x, DType format, double& scale) {
  double amax = 0;
  for (double v : x)
    amax = std::max(amax, std::abs(v));
  scale = 1;
  if (amax > 0) {
    int e = 126;
    while (e > -126 && amax * std::ldexp(1.0, e) > max_of(format))
      --e;
    scale = std::ldexp(1.0, e);
  }
  Values q(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    q[i] = trainctl::tensor::round_to(format, static_cast<float>(x[i] * scale));
  return q;
}

// Element (i, j) of op(X) [rows, cols], X stored [rows, cols] or, transposed, [cols, rows].
double at(const Values& x, bool trans, int64_t rows, int64_t cols, int64_t i, int64_t j) {
  return trans ? x[static_cast<size_t>(j * rows + i)] : x[static_cast<size_t>(i * cols + j)];
}

struct Case {
  bool trans_a, trans_b;
  DType fp8_a, fp8_b;
  DType c_type;
  double beta;
  bool bias;
};

std::string name(const Case& c) {
  return std::string(c.trans_a ? "T" : "N") + (c.trans_b ? "T" : "N") + " " +
         std::string(trainctl::tensor::dtype_name(c.fp8_a)) + "x" +
         std::string(trainctl::tensor::dtype_name(c.fp8_b)) + " -> " +
         std::string(trainctl::tensor::dtype_name(c.c_type)) + (c.beta != 0 ? " beta 1" : "") +
         (c.bias ? " bias" : "");
}

// The forward form of a Linear layer in fp8: c[m, n] = a[m, k] b[n, k]^T, both operands e4m3.
GemmArgs fp8_forward(const Tensor& a, const Tensor& b, const Tensor& c, int64_t m, int64_t n,
                     int64_t k) {
  GemmArgs g;
  g.a = a;
  g.b = b;
  g.c = c;
  g.trans_b = true;
  g.m = m;
  g.n = n;
  g.k = k;
  g.fp8_a = g.fp8_b = DType::e4m3;
  return g;
}

}  // namespace

TEST_CASE("fp8_scale: the largest power of two that keeps amax inside the format") {
  CHECK(fp8_scale(DType::e4m3, 448.0f) == 1.0f);
  CHECK(fp8_scale(DType::e4m3, 449.0f) == 0.5f);
  CHECK(fp8_scale(DType::e4m3, 1.0f) == 256.0f);  // 448 / 1 = 448: 2^8 fits, 2^9 does not
  CHECK(fp8_scale(DType::e4m3, 224.0f) == 2.0f);
  CHECK(fp8_scale(DType::e5m2, 1.0f) == 32768.0f);
  CHECK(fp8_scale(DType::e5m2, 57344.0f) == 1.0f);
  CHECK(fp8_scale(DType::e4m3, 0.0f) == 1.0f);
  CHECK(fp8_scale(DType::e4m3, 1e-40f) == std::ldexp(1.0f, 126));  // clamped
  CHECK(std::isnan(fp8_scale(DType::e4m3, std::numeric_limits<float>::infinity())));
  CHECK(std::isnan(fp8_scale(DType::e5m2, std::numeric_limits<float>::quiet_NaN())));
  CHECK_THROWS_WITH(fp8_scale(DType::bf16, 1.0f), Catch::Contains("e4m3 or e5m2"));
  // Over many magnitudes: a power of two, inside the format, and the next one is not.
  for (DType format : {DType::e4m3, DType::e5m2}) {
    const Values amaxes = random_values(2000, 7);
    for (size_t i = 0; i < amaxes.size(); ++i) {
      const float amax =
          static_cast<float>(std::abs(amaxes[i]) * std::ldexp(1.0, int(i % 60) - 30));
      if (amax == 0) continue;
      const float p = fp8_scale(format, amax);
      int e = 0;
      REQUIRE(std::frexp(p, &e) == 0.5f);
      REQUIRE(double(amax) * p <= max_of(format));
      REQUIRE(double(amax) * 2 * p > max_of(format));
    }
  }
}

TEST_CASE("gemm with fp8 operands: the product of the quantized values, scaled back") {
  const int64_t m = 24, n = 40, k = 56;
  // The three forms a Linear layer uses (forward NT, dX = dY W as NN, dW = dY^T X as TN) and
  // both fp8 recipes.
  const Case cases[] = {
      {false, true, DType::e4m3, DType::e4m3, DType::bf16, 0.0, true},
      {false, false, DType::e5m2, DType::e4m3, DType::bf16, 0.0, false},
      {true, false, DType::e5m2, DType::e4m3, DType::f32, 1.0, false},
      {true, false, DType::e4m3, DType::e4m3, DType::f32, 1.0, false},
      {false, true, DType::e4m3, DType::e4m3, DType::f32, 0.0, false},
  };
  for (const Case& c : cases) {
    SECTION(name(c)) {
      // Operands of very different magnitudes: each gets its own scale.
      const Values a = rounded(DType::bf16, random_values(size_t(m * k), 1, 3e-3));
      const Values b = rounded(DType::bf16, random_values(size_t(k * n), 2, 40.0));
      const Values c0 = rounded(c.c_type, random_values(size_t(m * n), 3));
      const Values bias = rounded(DType::bf16, random_values(size_t(n), 4));
      OwnedTensor ta = make(DType::bf16, Shape{m * k}, a), tb = make(DType::bf16, Shape{k * n}, b);
      OwnedTensor tc = make(c.c_type, Shape{m * n}, c0), tbias = make(DType::bf16, Shape{n}, bias);
      GemmArgs g;
      g.a = ta;
      g.b = tb;
      g.c = tc;
      g.trans_a = c.trans_a;
      g.trans_b = c.trans_b;
      g.m = m;
      g.n = n;
      g.k = k;
      g.alpha = 0.5;
      g.beta = c.beta;
      if (c.bias) g.bias = tbias;
      g.fp8_a = c.fp8_a;
      g.fp8_b = c.fp8_b;
      cpu().gemm(g);

      double pa = 0, pb = 0;
      const Values qa = quantized(a, c.fp8_a, pa), qb = quantized(b, c.fp8_b, pb);
      Values ref(size_t(m * n)), exact(size_t(m * n));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double q = 0, x = 0;
          for (int64_t l = 0; l < k; ++l) {
            q += at(qa, c.trans_a, m, k, i, l) * at(qb, c.trans_b, k, n, l, j);
            x += at(a, c.trans_a, m, k, i, l) * at(b, c.trans_b, k, n, l, j);
          }
          const double rest = c.beta * c0[size_t(i * n + j)] + (c.bias ? bias[size_t(j)] : 0.0);
          ref[size_t(i * n + j)] = 0.5 * q / (pa * pb) + rest;
          exact[size_t(i * n + j)] = 0.5 * x + rest;
        }
      const Values got = read(tc);
      // The same quantized values as the reference: only f32 accumulation and C's rounding.
      CHECK(rel_error(got, ref) < (c.c_type == DType::f32 ? 1e-5 : 8e-3));
      // And really quantized: fp8 is visibly coarser than the exact product, within its error.
      const double fp8_error = rel_error(got, exact);
      CHECK(fp8_error > 1e-3);
      CHECK(fp8_error < 0.1);
    }
  }
}

TEST_CASE("gemm with fp8 operands: a non-finite element makes every output NaN") {
  const int64_t m = 4, n = 8, k = 16;
  for (double poison : {std::numeric_limits<double>::infinity(), std::nan("")}) {
    Values a = random_values(size_t(m * k), 5);
    a[7] = poison;
    OwnedTensor ta = make(DType::bf16, Shape{m * k}, a);
    OwnedTensor tb = make(DType::bf16, Shape{n * k}, random_values(size_t(n * k), 6));
    OwnedTensor tc(DType::bf16, Shape{m * n});
    cpu().gemm(fp8_forward(ta, tb, tc, m, n, k));
    for (double v : read(tc))
      REQUIRE(std::isnan(v));
  }
}

TEST_CASE("amax: the largest magnitude, exactly; +inf for a NaN or an infinity anywhere") {
  OwnedTensor out(DType::f32, Shape{1});
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (size_t count : {size_t{1}, size_t{17}, size_t{4099}}) {
      INFO(trainctl::tensor::dtype_name(dtype) << " x " << count);
      Values x = rounded(dtype, random_values(count, 40 + count, 3.0));
      x[count / 2] = -7.5;  // the largest magnitude is negative and exact in every dtype
      OwnedTensor t = make(dtype, Shape{int64_t(count)}, x);
      write(out, {-1.0});
      cpu().amax(out, t);
      double want = 0;
      for (double v : x)
        want = std::max(want, std::abs(v));
      CHECK(read(out)[0] == want);
      for (double poison : {std::nan(""), -std::numeric_limits<double>::infinity()}) {
        x[count - 1] = poison;
        write(t, x);
        cpu().amax(out, t);
        CHECK(read(out)[0] == std::numeric_limits<double>::infinity());
      }
    }
  }
  OwnedTensor zeros(DType::bf16, Shape{5});
  cpu().amax(out, zeros);
  CHECK(read(out)[0] == 0.0);
  OwnedTensor wide(DType::f32, Shape{2}), f64(DType::f64, Shape{3});
  CHECK_THROWS_WITH(cpu().amax(wide, zeros), Catch::Contains("out has shape"));
  CHECK_THROWS_WITH(cpu().amax(out, f64), Catch::Contains("src is f64"));
}

// What tensor parallel relies on: a shard of an operand, scaled by the whole operand's amax,
// quantizes exactly like its slice of the whole, so its product rows and columns are the whole
// product's, bit for bit. Scaled by its own (smaller) amax it would not be.
TEST_CASE("gemm with a given amax quantizes a shard like its slice of the whole operand") {
  const int64_t m = 16, n = 24, k = 32, half = n / 2;
  // W [n, k] (the forward NT form): the first half of its rows is 4096x larger than the second.
  // Powers of two only move the exponent, so the scales differ in effect where the whole's puts a
  // shard element below e4m3's normal range (about 1 in 7 here) and its own does not.
  Values w = rounded(DType::bf16, random_values(size_t(n * k), 51, 0.05));
  for (size_t i = 0; i < size_t(half * k); ++i)
    w[i] *= 4096;  // exact in bf16
  const Values x = rounded(DType::bf16, random_values(size_t(m * k), 52, 2.0));
  OwnedTensor tx = make(DType::bf16, Shape{m * k}, x), tw = make(DType::bf16, Shape{n * k}, w);
  OwnedTensor whole(DType::bf16, Shape{m * n}), amax_w(DType::f32, Shape{1});
  const GemmArgs g = fp8_forward(tx, tw, whole, m, n, k);
  cpu().gemm(g);
  cpu().amax(amax_w, tw);
  const Values full = read(whole);

  // The second half of W's rows, as tp rank 1 holds it.
  OwnedTensor shard = make(DType::bf16, Shape{half * k}, Values(w.begin() + half * k, w.end()));
  OwnedTensor part(DType::bf16, Shape{m * half});
  GemmArgs h = g;
  h.b = shard;
  h.c = part;
  h.n = half;
  auto columns_match = [&] {
    const Values got = read(part);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < half; ++j)
        if (got[size_t(i * half + j)] != full[size_t(i * n + half + j)]) return false;
    return true;
  };
  cpu().gemm(h);
  CHECK_FALSE(columns_match());  // its own scale: other fp8 values
  h.amax_b = amax_w;
  cpu().gemm(h);
  CHECK(columns_match());

  // An amax below the operand's own saturates, as the GPU's satfinite conversion does.
  OwnedTensor tiny = make(DType::f32, Shape{1}, {1e-3});
  h.amax_b = tiny;
  cpu().gemm(h);
  for (double v : read(part))
    CHECK(std::isfinite(v));
  // +inf (a non-finite element somewhere in the group) makes every output NaN.
  OwnedTensor inf = make(DType::f32, Shape{1}, {std::numeric_limits<double>::infinity()});
  h.amax_b = inf;
  cpu().gemm(h);
  for (double v : read(part))
    REQUIRE(std::isnan(v));
}

TEST_CASE("gemm: fp8 and epilogue arguments are checked") {
  OwnedTensor a(DType::bf16, Shape{32}), b(DType::bf16, Shape{32}), c(DType::bf16, Shape{64});
  GemmArgs g;
  g.a = a;
  g.b = b;
  g.c = c;
  g.m = g.n = 8;
  g.k = 4;
  GemmArgs bad = g;
  bad.fp8_a = DType::bf16;
  CHECK_THROWS_WITH(cpu().gemm(bad), Catch::Contains("fp8_a is bf16"));
  bad = g;
  bad.fp8_b = DType::e4m3;
  bad.batch = 2;
  bad.m = bad.n = 2;
  CHECK_THROWS_WITH(cpu().gemm(bad), Catch::Contains("fp8 operands need batch 1"));
  bad = g;
  bad.epilogue = Epilogue::gelu;
  CHECK_THROWS_WITH(cpu().gemm(bad), Catch::Contains("pre_gelu"));
  OwnedTensor pre(DType::bf16, Shape{64});
  bad.pre_gelu = pre;
  bad.beta = 1;
  CHECK_THROWS_WITH(cpu().gemm(bad), Catch::Contains("needs batch 1 and beta 0"));
  bad.beta = 0;
  bad.fp8_a = DType::e4m3;
  CHECK_THROWS_WITH(cpu().gemm(bad), Catch::Contains("fp8 operands need epilogue none"));
  OwnedTensor amax(DType::f32, Shape{1}), amax_bf16(DType::bf16, Shape{1});
  bad = g;
  bad.amax_a = amax;
  CHECK_THROWS_WITH(cpu().gemm(bad), Catch::Contains("amax_a is given but its operand is not fp8"));
  bad.fp8_a = DType::e4m3;
  bad.amax_b = amax;
  CHECK_THROWS_WITH(cpu().gemm(bad), Catch::Contains("amax_b is given but its operand is not fp8"));
  bad.fp8_b = DType::e4m3;
  bad.amax_b = amax_bf16;
  CHECK_THROWS_WITH(cpu().gemm(bad), Catch::Contains("amax_b has dtype bf16, expected f32"));
}

TEST_CASE("gemm with the gelu epilogue equals the gemm followed by gelu_forward") {
  const int64_t m = 12, n = 20, k = 16;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    OwnedTensor a = make(dtype, Shape{m * k}, random_values(size_t(m * k), 11));
    OwnedTensor b = make(dtype, Shape{n * k}, random_values(size_t(n * k), 12));
    OwnedTensor bias = make(dtype, Shape{n}, random_values(size_t(n), 13));
    OwnedTensor fused(dtype, Shape{m * n}), pre(dtype, Shape{m * n});
    OwnedTensor plain(dtype, Shape{m * n}), act(dtype, Shape{m * n});
    GemmArgs g;
    g.a = a;
    g.b = b;
    g.trans_b = true;
    g.m = m;
    g.n = n;
    g.k = k;
    g.bias = bias;
    g.c = plain;
    cpu().gemm(g);
    cpu().gelu_forward(act, plain);
    g.c = fused;
    g.epilogue = Epilogue::gelu;
    g.pre_gelu = pre;
    cpu().gemm(g);
    CHECK(read(pre) == read(plain));
    CHECK(read(fused) == read(act));
  }
}

TEST_CASE("adamw over ranges: each range as its own call, decay per range, the rest untouched") {
  using Hyper = Backend::AdamW;
  using Range = Backend::AdamWRange;
  const int64_t count = 40;
  const Hyper h{.lr = 0.05,
                .beta1 = 0.9,
                .beta2 = 0.95,
                .eps = 1e-8,
                .weight_decay = 0.3,
                .grad_scale = 0.5,
                .step = 3};
  const Range ranges[] = {{0, 10, true}, {10, 13, false}, {20, 35, true}};
  const Values w0 = random_values(count, 21), g0 = random_values(count, 22);
  const Values m0 = random_values(count, 23, 0.1), v0 = rounded(DType::f32, [&] {
                                                     Values v = random_values(count, 24, 0.1);
                                                     for (double& x : v)
                                                       x = x * x;
                                                     return v;
                                                   }());
  // Multi-tensor: one call.
  OwnedTensor param = make(DType::bf16, Shape{count}, w0),
              master = make(DType::f32, Shape{count}, w0);
  OwnedTensor g = make(DType::f32, Shape{count}, g0), m = make(DType::f32, Shape{count}, m0),
              v = make(DType::f32, Shape{count}, v0);
  cpu().adamw(param, master, g, m, v, ranges, h);
  // One call per range on views, with the range's decay.
  OwnedTensor param1 = make(DType::bf16, Shape{count}, w0),
              master1 = make(DType::f32, Shape{count}, w0);
  OwnedTensor m1 = make(DType::f32, Shape{count}, m0), v1 = make(DType::f32, Shape{count}, v0);
  for (const Range& r : ranges) {
    const auto view = [&](const Tensor& t) { return t.rows(r.begin, r.end - r.begin); };
    Hyper hr = h;
    hr.weight_decay = r.decay ? h.weight_decay : 0.0;
    cpu().adamw(view(param1), view(master1), view(g), view(m1), view(v1), hr);
  }
  CHECK(read(param) == read(param1));
  CHECK(read(master) == read(master1));
  CHECK(read(m) == read(m1));
  CHECK(read(v) == read(v1));
  // Outside the ranges nothing moved; inside, everything did.
  const Values w = read(master);
  for (int64_t i = 0; i < count; ++i) {
    const bool inside = i < 13 || (i >= 20 && i < 35);
    CHECK((w[size_t(i)] != rounded(DType::f32, w0)[size_t(i)]) == inside);
  }
  // Decay off in [10, 13): with zero gradient and moments only the decay would move a weight.
  OwnedTensor zg(DType::f32, Shape{count}), zm(DType::f32, Shape{count}),
      zv(DType::f32, Shape{count});
  OwnedTensor p = make(DType::f32, Shape{count}, Values(size_t(count), 1.0));
  cpu().adamw(p, Tensor{}, zg, zm, zv, ranges, {0.1, 0.9, 0.95, 1e-8, 0.5, 1.0, 1});
  CHECK(read(p)[0] == Approx(0.95));
  CHECK(read(p)[11] == 1.0);
  CHECK(read(p)[15] == 1.0);
}

TEST_CASE("adamw over ranges: ranges must be ascending, disjoint and inside the tensors") {
  using Range = Backend::AdamWRange;
  OwnedTensor p(DType::f32, Shape{8}), g(DType::f32, Shape{8}), m(DType::f32, Shape{8}),
      v(DType::f32, Shape{8});
  const Backend::AdamW h{0.1, 0.9, 0.95, 1e-8, 0.0, 1.0, 1};
  const Range overlap[] = {{0, 5, true}, {4, 8, true}};
  CHECK_THROWS_WITH(cpu().adamw(p, Tensor{}, g, m, v, overlap, h),
                    Catch::Contains("range 1 is [4, 8)"));
  const Range outside[] = {{2, 9, true}};
  CHECK_THROWS_WITH(cpu().adamw(p, Tensor{}, g, m, v, outside, h),
                    Catch::Contains("inside the 8 elements"));
}

TEST_CASE("round_fp8 rounds exactly like the tensor module's fp8 encoder, ties and subnormals") {
  using trainctl::backend::cpu::round_fp8;
  for (DType format : {DType::e4m3, DType::e5m2}) {
    const float max = static_cast<float>(max_of(format));
    std::vector<float> values;
    // Every finite fp8 value, and the midpoints between neighbours (the ties) and next to them.
    std::vector<float> grid;
    for (int bits = 0; bits < 256; ++bits) {
      const float v = format == DType::e4m3
                          ? trainctl::tensor::to_float(trainctl::tensor::e4m3{uint8_t(bits)})
                          : trainctl::tensor::to_float(trainctl::tensor::e5m2{uint8_t(bits)});
      if (std::isfinite(v) && v >= 0) grid.push_back(v);
    }
    std::sort(grid.begin(), grid.end());
    for (size_t i = 0; i + 1 < grid.size(); ++i) {
      const float mid = (grid[i] + grid[i + 1]) / 2;
      for (float v : {grid[i], mid, std::nextafter(mid, 0.0f), std::nextafter(mid, max)})
        values.insert(values.end(), {v, -v});
    }
    // Random magnitudes over the whole range, subnormal floats included.
    const Values r = random_values(20000, 31);
    for (size_t i = 0; i < r.size(); ++i)
      values.push_back(static_cast<float>(r[i] * std::ldexp(1.0, int(i % 60) - 50)));
    size_t checked = 0;
    for (float v : values) {
      if (!(std::fabs(v) <= max)) continue;
      REQUIRE(round_fp8(v, format) == trainctl::tensor::round_to(format, v));
      ++checked;
    }
    CHECK(checked > 20000);
    CHECK(std::isnan(round_fp8(std::nanf(""), format)));
  }
}
