// Float64 finite-difference checks of every backward op: for a random projection
// L = sum(out * R), the analytic gradients from the backward op (called with dout = R) must match
// central differences (eps = 1e-6) to a max relative error below 1e-6.
#include <catch2/catch.hpp>

#include "backend_test_util.hpp"

using namespace backend_test;
using trainctl::backend::AttentionShape;
using trainctl::backend::GemmArgs;

namespace {

constexpr double kMaxError = 1e-6;
constexpr DType F = DType::f64;

OwnedTensor random64(Shape shape, uint64_t stream, double scale = 1.0) {
  return make(F, shape, random_values(static_cast<size_t>(shape.numel()), stream, scale));
}

}  // namespace

TEST_CASE("finite differences: layernorm dx, dweight, dbias") {
  const int64_t N = 3, C = 5;
  OwnedTensor x = random64(Shape{N, C}, 100, 2.0), w = random64(Shape{C}, 101),
              b = random64(Shape{C}, 102), R = random64(Shape{N, C}, 103);
  OwnedTensor out(F, Shape{N, C}), mean(F, Shape{N}), rstd(F, Shape{N});
  const auto loss = [&] {
    cpu().layernorm_forward(out, mean, rstd, x, w, b, 1e-5);
    return dot(read(out), read(R));
  };
  loss();
  OwnedTensor dx(F, Shape{N, C}), dw(F, Shape{C}), db(F, Shape{C});
  cpu().layernorm_backward(dx, dw, db, R, x, w, mean, rstd);
  CHECK(fd_error(x, read(dx), loss) < kMaxError);
  CHECK(fd_error(w, read(dw), loss) < kMaxError);
  CHECK(fd_error(b, read(db), loss) < kMaxError);
  // Parameter gradients accumulate: a second backward doubles them, dx is overwritten.
  const Values dx1 = read(dx), dw1 = read(dw);
  cpu().layernorm_backward(dx, dw, db, R, x, w, mean, rstd);
  CHECK(read(dx) == dx1);
  CHECK(read(dw)[2] == 2 * dw1[2]);
}

TEST_CASE("finite differences: rmsnorm dx, dweight") {
  const int64_t N = 4, C = 7;
  OwnedTensor x = random64(Shape{N, C}, 110, 2.0), w = random64(Shape{C}, 111),
              R = random64(Shape{N, C}, 112);
  OwnedTensor out(F, Shape{N, C}), rstd(F, Shape{N});
  const auto loss = [&] {
    cpu().rmsnorm_forward(out, rstd, x, w, 1e-5);
    return dot(read(out), read(R));
  };
  loss();
  OwnedTensor dx(F, Shape{N, C}), dw(F, Shape{C});
  cpu().rmsnorm_backward(dx, dw, R, x, w, rstd);
  CHECK(fd_error(x, read(dx), loss) < kMaxError);
  CHECK(fd_error(w, read(dw), loss) < kMaxError);
}

TEST_CASE("finite differences: gelu and swiglu") {
  OwnedTensor x = random64(Shape{3, 10}, 120, 2.0), R = random64(Shape{3, 10}, 121);
  OwnedTensor out(F, Shape{3, 10}), dx(F, Shape{3, 10});
  const auto gelu_loss = [&] {
    cpu().gelu_forward(out, x);
    return dot(read(out), read(R));
  };
  cpu().gelu_backward(dx, R, x);
  CHECK(fd_error(x, read(dx), gelu_loss) < kMaxError);

  OwnedTensor Rs = random64(Shape{3, 5}, 122), sw(F, Shape{3, 5});
  const auto swiglu_loss = [&] {
    cpu().swiglu_forward(sw, x);
    return dot(read(sw), read(Rs));
  };
  cpu().swiglu_backward(dx, Rs, x);
  CHECK(fd_error(x, read(dx), swiglu_loss) < kMaxError);
}

TEST_CASE("finite differences: rope backward is the inverse rotation") {
  const int64_t T = 5, D = 4, width = 3 * D + 2;
  OwnedTensor x = random64(Shape{2 * T, width}, 130), R = random64(Shape{2 * T, width}, 131);
  OwnedTensor out(F, Shape{2 * T, width}), dx(F, Shape{2 * T, width});
  const auto loss = [&] {
    cpu().rope(out, x, T, 2, D, 500.0, false);
    return dot(read(out), read(R));
  };
  cpu().rope(dx, R, T, 2, D, 500.0, true);
  CHECK(fd_error(x, read(dx), loss) < kMaxError);
}

TEST_CASE("finite differences: attention dq, dk, dv with and without GQA") {
  for (const AttentionShape s : {AttentionShape{.B = 2, .T = 4, .H = 4, .KV = 2, .D = 3},
                                 AttentionShape{.B = 1, .T = 5, .H = 2, .KV = 2, .D = 4},
                                 AttentionShape{.B = 1, .T = 3, .H = 3, .KV = 1, .D = 2}}) {
    INFO("H=" << s.H << " KV=" << s.KV);
    const int64_t N = s.B * s.T;
    OwnedTensor qkv = random64(Shape{N, s.qkv_width()}, 140),
                R = random64(Shape{N, s.H * s.D}, 141);
    OwnedTensor out(F, Shape{N, s.H * s.D}), lse(F, Shape{s.B, s.H, s.T});
    const auto loss = [&] {
      cpu().attention_forward(out, lse, qkv, s);
      return dot(read(out), read(R));
    };
    loss();
    OwnedTensor dqkv = random64(Shape{N, s.qkv_width()}, 142);  // garbage: must be overwritten
    cpu().attention_backward(dqkv, R, qkv, out, lse, s);
    CHECK(fd_error(qkv, read(dqkv), loss) < kMaxError);
  }
}

TEST_CASE("finite differences: embedding dwte and dwpe") {
  const int64_t V = 6, C = 3, T = 4;
  OwnedTensor tokens = make_i32(Shape{8}, {1, 5, 1, 0, 2, 2, 2, 4});
  OwnedTensor wte = random64(Shape{V, C}, 150), wpe = random64(Shape{T, C}, 151),
              R = random64(Shape{8, C}, 152), out(F, Shape{8, C});
  const auto loss = [&] {
    cpu().embedding_forward(out, tokens, wte, wpe, T);
    return dot(read(out), read(R));
  };
  OwnedTensor dwte(F, Shape{V, C}), dwpe(F, Shape{T, C});
  cpu().embedding_backward(dwte, dwpe, R, tokens, T);
  CHECK(fd_error(wte, read(dwte), loss) < kMaxError);
  CHECK(fd_error(wpe, read(dwpe), loss) < kMaxError);
}

TEST_CASE("finite differences: cross-entropy with an ignored target and a grad scale") {
  const int64_t N = 4, V = 7;
  OwnedTensor logits = random64(Shape{N, V}, 160, 2.0), targets = make_i32(Shape{N}, {2, -1, 6, 0});
  OwnedTensor losses(F, Shape{N}), lse(F, Shape{N});
  const auto loss = [&] {
    cpu().cross_entropy_forward(losses, lse, logits, targets);
    return 0.3 * cpu().sum(losses);
  };
  loss();
  OwnedTensor dlogits(F, Shape{N, V});
  cpu().cross_entropy_backward(dlogits, logits, lse, targets, 0.3);
  CHECK(fd_error(logits, read(dlogits), loss) < kMaxError);
}

TEST_CASE("finite differences: gemm for every transpose pair, and bias_backward") {
  const int64_t m = 3, n = 4, k = 5;
  const double alpha = 0.8;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      INFO("ta=" << ta << " tb=" << tb);
      OwnedTensor a = random64(ta ? Shape{k, m} : Shape{m, k}, 170);
      OwnedTensor b = random64(tb ? Shape{n, k} : Shape{k, n}, 171);
      OwnedTensor bias = random64(Shape{n}, 172), R = random64(Shape{m, n}, 173), c(F, Shape{m, n});
      const auto loss = [&] {
        GemmArgs g{.a = a,
                   .b = b,
                   .c = c,
                   .trans_a = ta,
                   .trans_b = tb,
                   .m = m,
                   .n = n,
                   .k = k,
                   .alpha = alpha,
                   .beta = 0.0,
                   .bias = bias};
        cpu().gemm(g);
        return dot(read(c), read(R));
      };
      // dA = alpha R op(B)^T (stored transposed when ta); dB = alpha op(A)^T R (likewise).
      OwnedTensor da(F, a.view().shape), db(F, b.view().shape), dbias(F, Shape{n});
      if (!ta)
        cpu().gemm({.a = R,
                    .b = b,
                    .c = da,
                    .trans_a = false,
                    .trans_b = !tb,
                    .m = m,
                    .n = k,
                    .k = n,
                    .alpha = alpha,
                    .bias = {}});
      else
        cpu().gemm({.a = b,
                    .b = R,
                    .c = da,
                    .trans_a = tb,
                    .trans_b = true,
                    .m = k,
                    .n = m,
                    .k = n,
                    .alpha = alpha,
                    .bias = {}});
      if (!tb)
        cpu().gemm({.a = a,
                    .b = R,
                    .c = db,
                    .trans_a = !ta,
                    .trans_b = false,
                    .m = k,
                    .n = n,
                    .k = m,
                    .alpha = alpha,
                    .bias = {}});
      else
        cpu().gemm({.a = R,
                    .b = a,
                    .c = db,
                    .trans_a = true,
                    .trans_b = ta,
                    .m = n,
                    .n = k,
                    .k = m,
                    .alpha = alpha,
                    .bias = {}});
      cpu().bias_backward(dbias, R);
      CHECK(fd_error(a, read(da), loss) < kMaxError);
      CHECK(fd_error(b, read(db), loss) < kMaxError);
      CHECK(fd_error(bias, read(dbias), loss) < kMaxError);
    }
}
