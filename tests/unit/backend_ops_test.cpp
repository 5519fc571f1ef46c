// Every forward op of the CPU backend against a plain double-precision reference written here with
// naive loops, in each storage dtype (inputs are rounded to the dtype first, so the reference sees
// exactly what the op sees), over the reference rows of the shared case table
// (backend_op_cases.hpp, which tests/gpu iterates too). Backward ops in narrow dtypes are compared
// with the same op in f64 on the same rounded inputs; the f64 backward ops themselves are proven by
// finite differences in backend_grad_test.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "backend_op_cases.hpp"
#include "backend_test_util.hpp"

using namespace backend_test;
using op_cases::kReference;
using op_cases::kReferenceTypes;
using op_cases::rows;
using trainctl::backend::AttentionShape;
using trainctl::backend::GemmArgs;
using trainctl::backend::grad_dtype;
using trainctl::backend::stats_dtype;
using trainctl::tensor::dtype_name;

namespace {

// C = alpha op(A) op(B) + beta C0 + bias, one product.
Values ref_gemm(const Values& a, const Values& b, const Values& c0, const Values& bias, bool ta,
                bool tb, int64_t m, int64_t n, int64_t k, double alpha, double beta) {
  Values c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p)
        s += a[static_cast<size_t>(ta ? p * m + i : i * k + p)] *
             b[static_cast<size_t>(tb ? j * k + p : p * n + j)];
      double v = alpha * s + (beta != 0 ? beta * c0[static_cast<size_t>(i * n + j)] : 0);
      if (!bias.empty()) v += bias[static_cast<size_t>(j)];
      c[static_cast<size_t>(i * n + j)] = v;
    }
  return c;
}

Values slice(const Values& v, int64_t first, int64_t count) {
  return Values(v.begin() + first, v.begin() + first + count);
}

// Naive causal attention over qkv [B*T, (H + 2KV) D]; returns out [B*T, H*D] and lse [B, H, T].
void ref_attention(const Values& qkv, const AttentionShape& s, Values& out, Values& lse) {
  const int64_t W = s.qkv_width(), group = s.H / s.KV;
  out.assign(static_cast<size_t>(s.B * s.T * s.H * s.D), 0);
  lse.assign(static_cast<size_t>(s.B * s.H * s.T), 0);
  const auto at = [&](int64_t b, int64_t t, int64_t col) {
    return qkv[static_cast<size_t>((b * s.T + t) * W + col)];
  };
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < s.T; ++i) {
        Values score(static_cast<size_t>(i + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t c = 0; c < s.D; ++c)
            d += at(b, i, h * s.D + c) * at(b, j, (s.H + g) * s.D + c);
          score[static_cast<size_t>(j)] = d / std::sqrt(static_cast<double>(s.D));
          mx = std::max(mx, score[static_cast<size_t>(j)]);
        }
        double total = 0;
        for (double x : score)
          total += std::exp(x - mx);
        lse[static_cast<size_t>((b * s.H + h) * s.T + i)] = mx + std::log(total);
        for (int64_t j = 0; j <= i; ++j) {
          const double p = std::exp(score[static_cast<size_t>(j)] - mx) / total;
          for (int64_t c = 0; c < s.D; ++c)
            out[static_cast<size_t>((b * s.T + i) * s.H * s.D + h * s.D + c)] +=
                p * at(b, j, (s.H + s.KV + g) * s.D + c);
        }
      }
    }
}

}  // namespace

TEST_CASE("gemm matches a triple loop for every transpose, dtype, batch and bias") {
  const int64_t batch = 3;
  for (const op_cases::GemmShape& shape : rows(op_cases::kGemmShapes, kReference))
    for (DType d : kReferenceTypes)
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (double beta : {0.0, 0.5}) {
            const int64_t m = shape.m, n = shape.n, k = shape.k;
            INFO("m=" << m << " n=" << n << " k=" << k << " " << dtype_name(d) << " ta=" << ta
                      << " tb=" << tb << " beta=" << beta);
            const Values a = rounded(d, random_values(batch * m * k, 10));
            const Values b = rounded(d, random_values(batch * k * n, 11));
            const Values c0 = rounded(d, random_values(batch * m * n, 12));
            const Values bias = rounded(d, random_values(n, 13));
            OwnedTensor ta_t = make(d, Shape{batch * m * k}, a),
                        tb_t = make(d, Shape{batch * k * n}, b);
            OwnedTensor c = make(d, Shape{batch, m, n}, c0), bias_t = make(d, Shape{n}, bias);
            GemmArgs args{.a = ta_t,
                          .b = tb_t,
                          .c = c,
                          .trans_a = ta,
                          .trans_b = tb,
                          .m = m,
                          .n = n,
                          .k = k,
                          .alpha = 0.75,
                          .beta = beta,
                          .bias = bias_t,
                          .batch = batch,
                          .stride_a = m * k,
                          .stride_b = k * n,
                          .stride_c = m * n};
            cpu().gemm(args);
            Values ref;
            for (int64_t p = 0; p < batch; ++p) {
              const Values one =
                  ref_gemm(slice(a, p * m * k, m * k), slice(b, p * k * n, k * n),
                           slice(c0, p * m * n, m * n), bias, ta, tb, m, n, k, 0.75, beta);
              ref.insert(ref.end(), one.begin(), one.end());
            }
            CHECK(rel_error(read(c), ref) < tolerance(d));
          }
}

TEST_CASE("gemm accumulates bf16 and f16 products into f32 with beta = 1") {
  for (const op_cases::GemmAccumulateCase& g : rows(op_cases::kGemmAccumulate, kReference))
    for (DType d : {DType::bf16, DType::f16}) {
      const int64_t m = g.m, n = g.n, k = g.k;
      INFO("m=" << m << " n=" << n << " k=" << k << " " << dtype_name(d));
      const Values a = rounded(d, random_values(m * k, 20)),
                   b = rounded(d, random_values(k * n, 21));
      const Values c0 = random_values(m * n, 22);
      OwnedTensor at = make(d, g.trans_a ? Shape{k, m} : Shape{m, k}, a),
                  bt = make(d, g.trans_b ? Shape{n, k} : Shape{k, n}, b);
      OwnedTensor c = make(DType::f32, Shape{m, n}, c0);
      const Values c0f = read(c);
      for (int rep = 0; rep < 2; ++rep)  // twice: the warm call reuses the scratch
        cpu().gemm({.a = at,
                    .b = bt,
                    .c = c,
                    .trans_a = g.trans_a,
                    .trans_b = g.trans_b,
                    .m = m,
                    .n = n,
                    .k = k,
                    .beta = 1.0,
                    .bias = {}});
      Values ref = ref_gemm(a, b, c0f, {}, g.trans_a, g.trans_b, m, n, k, 2.0, 1.0);
      CHECK(rel_error(read(c), ref) < 1e-5);
    }
}

TEST_CASE("gemm rejects mismatched arguments with the op and argument named") {
  OwnedTensor a(DType::bf16, Shape{4, 4}), b(DType::f32, Shape{4, 4}), c(DType::f32, Shape{4, 4});
  CHECK_THROWS_WITH(cpu().gemm({.a = a, .b = b, .c = c, .m = 4, .n = 4, .k = 4, .bias = {}}),
                    Catch::Contains("gemm") && Catch::Contains("a is bf16 but b is f32"));
  OwnedTensor small(DType::f32, Shape{3, 4});
  CHECK_THROWS_WITH(cpu().gemm({.a = b, .b = b, .c = small, .m = 4, .n = 4, .k = 4, .bias = {}}),
                    Catch::Contains("c has 12 elements"));
}

TEST_CASE("bias_backward sums columns into the gradient dtype") {
  for (const op_cases::BiasBackwardShape& shape : rows(op_cases::kBiasBackward, kReference))
    for (DType d : kReferenceTypes) {
      const int64_t R = shape.rows, C = shape.cols;
      INFO("rows=" << R << " cols=" << C << " " << dtype_name(d));
      const Values dout = rounded(d, random_values(R * C, 30));
      OwnedTensor dy = make(d, Shape{R, C}, dout);
      OwnedTensor db = make(grad_dtype(d), Shape{C}, random_values(C, 31));
      Values ref = read(db);
      cpu().bias_backward(db, dy);
      for (int64_t n = 0; n < R; ++n)
        for (int64_t c = 0; c < C; ++c)
          ref[static_cast<size_t>(c)] += dout[static_cast<size_t>(n * C + c)];
      CHECK(rel_error(read(db), ref) < tolerance(grad_dtype(d)));
    }
}

TEST_CASE("layernorm and rmsnorm forward match the definitions, backward matches f64") {
  for (const op_cases::NormShape& shape : rows(op_cases::kNorms, kReference))
    for (DType d : kReferenceTypes) {
      const int64_t N = shape.N, C = shape.C;
      INFO("N=" << N << " C=" << C << " " << dtype_name(d));
      const DType A = stats_dtype(d), G = grad_dtype(d);
      const Values x = rounded(d, random_values(N * C, 40, 2.0));
      const Values w = rounded(d, random_values(C, 41)), b = rounded(d, random_values(C, 42));
      const Values dy = rounded(d, random_values(N * C, 43));
      OwnedTensor xt = make(d, Shape{N, C}, x), wt = make(d, Shape{C}, w),
                  bt = make(d, Shape{C}, b);
      OwnedTensor out(d, Shape{N, C}), mean(A, Shape{N}), rstd(A, Shape{N});
      cpu().layernorm_forward(out, mean, rstd, xt, wt, bt, 1e-5);
      Values ref(static_cast<size_t>(N * C)), ref_rms(static_cast<size_t>(N * C));
      for (int64_t n = 0; n < N; ++n) {
        double mu = 0, var = 0, ms = 0;
        for (int64_t c = 0; c < C; ++c)
          mu += x[static_cast<size_t>(n * C + c)] / C;
        for (int64_t c = 0; c < C; ++c) {
          const double v = x[static_cast<size_t>(n * C + c)];
          var += (v - mu) * (v - mu) / C;
          ms += v * v / C;
        }
        for (int64_t c = 0; c < C; ++c) {
          const auto i = static_cast<size_t>(n * C + c);
          ref[i] = (x[i] - mu) / std::sqrt(var + 1e-5) * w[static_cast<size_t>(c)] +
                   b[static_cast<size_t>(c)];
          ref_rms[i] = x[i] / std::sqrt(ms + 1e-5) * w[static_cast<size_t>(c)];
        }
      }
      CHECK(rel_error(read(out), ref) < tolerance(d));
      OwnedTensor rms_out(d, Shape{N, C}), rms_rstd(A, Shape{N});
      cpu().rmsnorm_forward(rms_out, rms_rstd, xt, wt, 1e-5);
      CHECK(rel_error(read(rms_out), ref_rms) < tolerance(d));

      // Backward against the f64 op on the same inputs.
      OwnedTensor dyt = make(d, Shape{N, C}, dy), dx(d, Shape{N, C});
      OwnedTensor dw(G, Shape{C}), db(G, Shape{C});
      cpu().layernorm_backward(dx, dw, db, dyt, xt, wt, mean, rstd);
      OwnedTensor x64 = make(DType::f64, Shape{N, C}, x), w64 = make(DType::f64, Shape{C}, w);
      OwnedTensor dy64 = make(DType::f64, Shape{N, C}, dy), dx64(DType::f64, Shape{N, C});
      OwnedTensor dw64(DType::f64, Shape{C}), db64(DType::f64, Shape{C});
      OwnedTensor mean64(DType::f64, Shape{N}), rstd64(DType::f64, Shape{N}),
          o64(DType::f64, Shape{N, C});
      cpu().layernorm_forward(o64, mean64, rstd64, x64, w64, make(DType::f64, Shape{C}, b), 1e-5);
      cpu().layernorm_backward(dx64, dw64, db64, dy64, x64, w64, mean64, rstd64);
      CHECK(rel_error(read(dx), read(dx64)) < tolerance(d));
      CHECK(rel_error(read(dw), read(dw64)) < tolerance(d));
      CHECK(rel_error(read(db), read(db64)) < tolerance(d));
      OwnedTensor rdx(d, Shape{N, C}), rdw(G, Shape{C}), rdx64(DType::f64, Shape{N, C}),
          rdw64(DType::f64, Shape{C});
      cpu().rmsnorm_backward(rdx, rdw, dyt, xt, wt, rms_rstd);
      cpu().rmsnorm_forward(o64, rstd64, x64, w64, 1e-5);
      cpu().rmsnorm_backward(rdx64, rdw64, dy64, x64, w64, rstd64);
      CHECK(rel_error(read(rdx), read(rdx64)) < tolerance(d));
      CHECK(rel_error(read(rdw), read(rdw64)) < tolerance(d));
    }
}

TEST_CASE("gelu and swiglu match their formulas, backward matches f64") {
  for (const op_cases::ActivationShape& shape : rows(op_cases::kActivations, kReference))
    for (DType d : kReferenceTypes) {
      const int64_t N = shape.N, F = shape.F;
      INFO("N=" << N << " F=" << F << " " << dtype_name(d));
      const Values x = rounded(d, random_values(N * 2 * F, 50, 2.0));
      const Values dy = rounded(d, random_values(N * 2 * F, 51));
      OwnedTensor xt = make(d, Shape{N, 2 * F}, x), out(d, Shape{N, 2 * F});
      cpu().gelu_forward(out, xt);
      Values ref(x.size());
      for (size_t i = 0; i < x.size(); ++i)
        ref[i] = 0.5 * x[i] *
                 (1 + std::tanh(std::sqrt(2 / M_PI) * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
      CHECK(rel_error(read(out), ref) < tolerance(d));
      OwnedTensor sw(d, Shape{N, F});
      cpu().swiglu_forward(sw, xt);
      Values ref_sw(static_cast<size_t>(N * F));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t f = 0; f < F; ++f) {
          const double g = x[static_cast<size_t>(n * 2 * F + f)],
                       u = x[static_cast<size_t>(n * 2 * F + F + f)];
          ref_sw[static_cast<size_t>(n * F + f)] = g / (1 + std::exp(-g)) * u;
        }
      CHECK(rel_error(read(sw), ref_sw) < tolerance(d));

      OwnedTensor x64 = make(DType::f64, Shape{N, 2 * F}, x),
                  dy64 = make(DType::f64, Shape{N, 2 * F}, dy);
      OwnedTensor dyt = make(d, Shape{N, 2 * F}, dy), dx(d, Shape{N, 2 * F}),
                  dx64(DType::f64, Shape{N, 2 * F});
      cpu().gelu_backward(dx, dyt, xt);
      cpu().gelu_backward(dx64, dy64, x64);
      CHECK(rel_error(read(dx), read(dx64)) < tolerance(d));
      const Values dsw = slice(dy, 0, N * F);
      OwnedTensor dswt = make(d, Shape{N, F}, dsw), dsw64 = make(DType::f64, Shape{N, F}, dsw);
      cpu().swiglu_backward(dx, dswt, xt);
      cpu().swiglu_backward(dx64, dsw64, x64);
      CHECK(rel_error(read(dx), read(dx64)) < tolerance(d));
    }
}

TEST_CASE("rope rotates pairs (i, i + D/2) by t * theta^(-2i/D) and copies the rest") {
  for (const op_cases::RopeShape& shape : rows(op_cases::kRope, kReference))
    for (DType d : kReferenceTypes) {
      const int64_t B = shape.B, T = shape.T, D = shape.D, rotated = shape.rotated,
                    width = shape.width();
      INFO("B=" << B << " T=" << T << " heads=" << shape.heads << " rotated=" << rotated
                << " D=" << D << " width=" << width << " " << dtype_name(d));
      const Values x = rounded(d, random_values(B * T * width, 60));
      OwnedTensor xt = make(d, Shape{B * T, width}, x), out(d, Shape{B * T, width});
      cpu().rope(out, xt, T, rotated, D, 10000.0, false);
      Values ref = x;
      for (int64_t n = 0; n < B * T; ++n)
        for (int64_t h = 0; h < rotated; ++h)
          for (int64_t i = 0; i < D / 2; ++i) {
            const double angle = static_cast<double>(n % T) * std::pow(10000.0, -2.0 * i / D);
            const auto lo = static_cast<size_t>(n * width + h * D + i), hi = lo + D / 2;
            ref[lo] = x[lo] * std::cos(angle) - x[hi] * std::sin(angle);
            ref[hi] = x[hi] * std::cos(angle) + x[lo] * std::sin(angle);
          }
      CHECK(rel_error(read(out), ref) < tolerance(d));
      // The unrotated columns are copied bit for bit.
      const Values got = read(out);
      for (int64_t n = 0; n < B * T; ++n)
        for (int64_t c = rotated * D; c < width; ++c)
          REQUIRE(got[static_cast<size_t>(n * width + c)] == x[static_cast<size_t>(n * width + c)]);
      // In place, then inverse, restores x (up to rounding).
      cpu().rope(xt, xt, T, rotated, D, 10000.0, false);
      CHECK(read(xt) == got);
      cpu().rope(xt, xt, T, rotated, D, 10000.0, true);
      CHECK(rel_error(read(xt), x) < 2 * tolerance(d));
    }
  OwnedTensor odd(DType::f32, Shape{7, 10});
  CHECK_THROWS_WITH(cpu().rope(odd, odd, 7, 2, 5, 1e4, false), Catch::Contains("D=5 must be even"));
}

// Context parallelism: a rank holds chunks r and 2P-1-r of every sequence and rotates them by
// their global positions; the result is the whole sequence's rotation at those rows, bit for bit.
TEST_CASE("rope with explicit positions rotates rows as the whole sequence does there") {
  const int64_t B = 2, T = 12, heads = 3, D = 8, width = heads * D, ranks = 3, chunk = 2;
  for (DType d : kReferenceTypes) {
    INFO(dtype_name(d));
    const Values x = rounded(d, random_values(B * T * width, 61));
    OwnedTensor whole = make(d, Shape{B * T, width}, x), rotated(d, Shape{B * T, width});
    cpu().rope(rotated, whole, T, heads, D, 10000.0, false);
    const Values want_all = read(rotated);
    for (int64_t r = 0; r < ranks; ++r) {
      std::vector<int32_t> positions;
      for (const int64_t c : {r, 2 * ranks - 1 - r})
        for (int64_t t = 0; t < chunk; ++t)
          positions.push_back(static_cast<int32_t>(c * chunk + t));
      const int64_t L = static_cast<int64_t>(positions.size());
      Values local, want;
      for (int64_t b = 0; b < B; ++b)
        for (const int32_t t : positions)
          for (int64_t c = 0; c < width; ++c) {
            local.push_back(x[static_cast<size_t>((b * T + t) * width + c)]);
            want.push_back(want_all[static_cast<size_t>((b * T + t) * width + c)]);
          }
      OwnedTensor xt = make(d, Shape{B * L, width}, local), out(d, Shape{B * L, width});
      const OwnedTensor pos = make_i32(Shape{L}, positions);
      cpu().rope(out, xt, L, heads, D, 10000.0, false, pos);
      CHECK(read(out) == want);
    }
  }
  OwnedTensor x(DType::f32, Shape{8, 8}), wrong = make_i32(Shape{3}, {0, 1, 2});
  CHECK_THROWS_WITH(cpu().rope(x, x, 4, 1, 8, 1e4, false, wrong), Catch::Contains("positions"));
}

TEST_CASE("attention matches naive causal softmax attention, with GQA, in every dtype") {
  for (const op_cases::AttentionCase& row : rows(op_cases::kAttention, kReference))
    for (DType d : kReferenceTypes) {
      const AttentionShape s = row.shape;
      const int64_t N = s.B * s.T;
      INFO("B=" << s.B << " T=" << s.T << " H=" << s.H << " KV=" << s.KV << " D=" << s.D << " "
                << dtype_name(d));
      const Values qkv = rounded(d, random_values(N * s.qkv_width(), 70));
      OwnedTensor qkv_t = make(d, Shape{N, s.qkv_width()}, qkv);
      OwnedTensor out(d, Shape{N, s.H * s.D}), lse(stats_dtype(d), Shape{s.B, s.H, s.T});
      cpu().attention_forward(out, lse, qkv_t, s);
      Values ref_out, ref_lse;
      ref_attention(qkv, s, ref_out, ref_lse);
      CHECK(rel_error(read(out), ref_out) < tolerance(d));
      CHECK(rel_error(read(lse), ref_lse) < tolerance(stats_dtype(d)));

      // Backward against f64 on the same rounded qkv, out and dout.
      const Values dy = rounded(d, random_values(N * s.H * s.D, 71));
      OwnedTensor dyt = make(d, Shape{N, s.H * s.D}, dy), dqkv(d, Shape{N, s.qkv_width()});
      cpu().attention_backward(dqkv, dyt, qkv_t, out, lse, s);
      OwnedTensor qkv64 = make(DType::f64, Shape{N, s.qkv_width()}, qkv);
      OwnedTensor out64(DType::f64, Shape{N, s.H * s.D}), lse64(DType::f64, Shape{s.B, s.H, s.T});
      cpu().attention_forward(out64, lse64, qkv64, s);
      OwnedTensor rounded_out = make(DType::f64, Shape{N, s.H * s.D}, read(out));
      OwnedTensor dqkv64(DType::f64, Shape{N, s.qkv_width()});
      cpu().attention_backward(dqkv64, make(DType::f64, Shape{N, s.H * s.D}, dy), qkv64,
                               rounded_out, lse64, s);
      CHECK(rel_error(read(dqkv), read(dqkv64)) < tolerance(d));
    }
}

TEST_CASE("embedding forward gathers rows, backward scatters in token order") {
  for (const op_cases::EmbeddingShape& shape : rows(op_cases::kEmbedding, kReference)) {
    const int64_t V = shape.V, C = shape.C, T = shape.T, N = shape.B * shape.T;
    INFO("B=" << shape.B << " T=" << T << " V=" << V << " C=" << C);
    std::vector<int32_t> tokens(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n)
      tokens[static_cast<size_t>(n)] = static_cast<int32_t>((n * 5) % V);
    tokens[3] = tokens[10] = 2;  // a repeated token
    OwnedTensor tok = make_i32(Shape{N}, tokens);
    for (DType d : kReferenceTypes) {
      INFO(dtype_name(d));
      const Values wte = rounded(d, random_values(V * C, 80)),
                   wpe = rounded(d, random_values(T * C, 81));
      OwnedTensor wte_t = make(d, Shape{V, C}, wte), wpe_t = make(d, Shape{T, C}, wpe),
                  out(d, Shape{N, C});
      cpu().embedding_forward(out, tok, wte_t, wpe_t, T);
      Values ref(static_cast<size_t>(N * C));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < C; ++c)
          ref[static_cast<size_t>(n * C + c)] =
              wte[static_cast<size_t>(tokens[static_cast<size_t>(n)] * C + c)] +
              wpe[static_cast<size_t>((n % T) * C + c)];
      CHECK(rel_error(read(out), ref) < tolerance(d));

      const Values dy = rounded(d, random_values(N * C, 82));
      OwnedTensor dwte(grad_dtype(d), Shape{V, C}), dwpe(grad_dtype(d), Shape{T, C});
      cpu().embedding_backward(dwte, dwpe, make(d, Shape{N, C}, dy), tok, T);
      Values ref_wte(static_cast<size_t>(V * C)), ref_wpe(static_cast<size_t>(T * C));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < C; ++c) {
          ref_wte[static_cast<size_t>(tokens[static_cast<size_t>(n)] * C + c)] +=
              dy[static_cast<size_t>(n * C + c)];
          ref_wpe[static_cast<size_t>((n % T) * C + c)] += dy[static_cast<size_t>(n * C + c)];
        }
      CHECK(rel_error(read(dwte), ref_wte) < tolerance(grad_dtype(d)));
      CHECK(rel_error(read(dwpe), ref_wpe) < tolerance(grad_dtype(d)));
    }
    tok.as<int32_t>()[4] = static_cast<int32_t>(V);
    OwnedTensor wte(DType::f32, Shape{V, C}), out(DType::f32, Shape{N, C});
    const std::string v = std::to_string(V);  // 9: "tokens[4] = 9 is outside the vocabulary [0, 9)"
    CHECK_THROWS_WITH(
        cpu().embedding_forward(out, tok, wte, Tensor{}, T),
        Catch::Contains("tokens[4] = " + v + " is outside the vocabulary [0, " + v + ")"));
  }
}

TEST_CASE("cross-entropy matches log-softmax, ignores negative targets, backward matches f64") {
  for (const op_cases::CrossEntropyShape& shape : rows(op_cases::kCrossEntropy, kReference))
    for (DType d : kReferenceTypes) {
      const int64_t N = shape.N, V = shape.V;
      INFO("N=" << N << " V=" << V << " " << dtype_name(d));
      // {3, 0, 12, -1, 7, 7} at N 6, V 13; a longer row continues with (7 n) % V.
      REQUIRE(N >= 6);
      REQUIRE(V > 12);
      std::vector<int32_t> targets = {3, 0, 12, -1, 7, 7};
      targets.resize(static_cast<size_t>(N));
      for (int64_t n = 6; n < N; ++n)
        targets[static_cast<size_t>(n)] = static_cast<int32_t>((7 * n) % V);
      OwnedTensor tgt = make_i32(Shape{N}, targets);
      const DType A = stats_dtype(d);
      Values logits = rounded(d, random_values(N * V, 90, 3.0));
      logits[5] = 60;  // large logits are fine: max-subtracted
      logits = rounded(d, logits);
      OwnedTensor lt = make(d, Shape{N, V}, logits), losses(A, Shape{N}), lse(A, Shape{N});
      cpu().cross_entropy_forward(losses, lse, lt, tgt);
      Values ref_loss(N), ref_lse(N);
      for (int64_t n = 0; n < N; ++n) {
        double mx = -1e300, total = 0;
        for (int64_t j = 0; j < V; ++j)
          mx = std::max(mx, logits[static_cast<size_t>(n * V + j)]);
        for (int64_t j = 0; j < V; ++j)
          total += std::exp(logits[static_cast<size_t>(n * V + j)] - mx);
        ref_lse[static_cast<size_t>(n)] = mx + std::log(total);
        const int32_t t = targets[static_cast<size_t>(n)];
        ref_loss[static_cast<size_t>(n)] =
            t < 0 ? 0 : ref_lse[static_cast<size_t>(n)] - logits[static_cast<size_t>(n * V + t)];
      }
      CHECK(rel_error(read(losses), ref_loss) < tolerance(A));
      CHECK(rel_error(read(lse), ref_lse) < tolerance(A));
      CHECK(read(losses)[3] == 0);

      OwnedTensor dl(d, Shape{N, V});
      cpu().cross_entropy_backward(dl, lt, lse, tgt, 0.5);
      Values ref_d(static_cast<size_t>(N * V));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < V; ++j) {
          const int32_t t = targets[static_cast<size_t>(n)];
          if (t < 0) continue;
          ref_d[static_cast<size_t>(n * V + j)] =
              0.5 *
              (std::exp(logits[static_cast<size_t>(n * V + j)] - ref_lse[static_cast<size_t>(n)]) -
               (j == t));
        }
      CHECK(rel_error(read(dl), ref_d) < tolerance(d));
    }
}

TEST_CASE("copy_columns copies a band of columns between matrices with as many rows") {
  for (DType d : kReferenceTypes) {
    INFO(dtype_name(d));
    const Values x = rounded(d, random_values(4 * 7, 62));
    OwnedTensor src = make(d, Shape{4, 7}, x), dst = make(d, Shape{4, 5}, Values(20, -1.0));
    cpu().copy_columns(dst, 1, src, 3, 4);
    const Values got = read(dst);
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t c = 0; c < 5; ++c)
        CHECK(got[static_cast<size_t>(r * 5 + c)] ==
              (c >= 1 ? x[static_cast<size_t>(r * 7 + 3 + c - 1)] : -1.0));
  }
  OwnedTensor a(DType::f32, Shape{4, 5}), b(DType::f32, Shape{4, 7}), c(DType::f32, Shape{3, 7});
  CHECK_THROWS_WITH(cpu().copy_columns(a, 2, b, 0, 4), Catch::Contains("out of range"));
  CHECK_THROWS_WITH(cpu().copy_columns(a, 0, c, 0, 2), Catch::Contains("as many rows"));
}
