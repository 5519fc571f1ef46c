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

// ---- context-parallel ("ring") attention ----
// P ranks each hold 2 of the 2P chunks of every sequence, chunk r and chunk 2P-1-r (the causal
// load balance), and meet every rank's keys and values one block at a time. Put back at their
// positions, the ranks' outputs and gradients must be one-rank attention's.

namespace {

using trainctl::backend::AttentionBlockShape;

struct Ring {
  AttentionShape whole;
  int ranks = 1;
  DType dtype = F;
  int64_t chunk() const { return whole.T / (2 * ranks); }
  int64_t local() const { return 2 * chunk(); }  // tokens of a sequence on one rank
  // The global positions of rank r's tokens: its two chunks, in order.
  std::vector<int32_t> positions(int r) const {
    std::vector<int32_t> p;
    for (const int64_t c : {int64_t{r}, int64_t{2 * ranks - 1 - r}})
      for (int64_t t = 0; t < chunk(); ++t)
        p.push_back(static_cast<int32_t>(c * chunk() + t));
    return p;
  }
  AttentionBlockShape block() const {
    return {whole.B, local(), local(), whole.H, whole.KV, whole.D};
  }
};

// Rows of `values` (a [B*T, width] matrix) at rank r's positions, columns [first, first + count).
Values rows_of(const Ring& g, const Values& values, int64_t width, int r, int64_t first,
               int64_t count) {
  Values out;
  for (int64_t b = 0; b < g.whole.B; ++b)
    for (const int32_t t : g.positions(r))
      for (int64_t c = 0; c < count; ++c)
        out.push_back(values[static_cast<size_t>((b * g.whole.T + t) * width + first + c)]);
  return out;
}

// The inverse: adds rank r's rows into `values`.
void add_rows(const Ring& g, Values& values, int64_t width, int r, int64_t first, int64_t count,
              const Values& local) {
  size_t i = 0;
  for (int64_t b = 0; b < g.whole.B; ++b)
    for (const int32_t t : g.positions(r))
      for (int64_t c = 0; c < count; ++c)
        values[static_cast<size_t>((b * g.whole.T + t) * width + first + c)] += local[i++];
}

struct RingResult {
  Values out, dqkv;  // whole [B*T, H*D] and [B*T, W]
};

// The ring over P ranks on one process: forward (each rank's out and lse over every rank's
// block, in ring order), and with `dout` the backward (each block's dK, dV summed over the
// ranks, as they would be returned to their owner).
RingResult ring_attention(const Ring& g, const Values& qkv, const Values* dout) {
  const auto [B, T, H, KV, D] = g.whole;
  const int64_t W = g.whole.qkv_width(), HD = H * D, L = g.local();
  const DType A = trainctl::backend::stats_dtype(g.dtype);
  std::vector<OwnedTensor> q, kv, pos, out, lse;
  for (int r = 0; r < g.ranks; ++r) {
    q.push_back(make(g.dtype, Shape{B * L, W}, rows_of(g, qkv, W, r, 0, W)));
    kv.push_back(make(g.dtype, Shape{B * L, 2 * KV * D}, rows_of(g, qkv, W, r, HD, 2 * KV * D)));
    pos.push_back(make_i32(Shape{L}, g.positions(r)));
    out.emplace_back(A, Shape{B * L, HD});
    lse.emplace_back(A, Shape{B, H, L});
    cpu().fill(out.back(), 0.0);
    cpu().fill(lse.back(), -INFINITY);
  }
  RingResult result{Values(static_cast<size_t>(B * T * HD), 0.0),
                    Values(static_cast<size_t>(B * T * W), 0.0)};
  for (int r = 0; r < g.ranks; ++r) {
    for (int step = 0; step < g.ranks; ++step) {
      const int from = (r - step + g.ranks) % g.ranks;  // the block that has reached rank r
      cpu().attention_block_forward(out[r], lse[r], q[r], kv[from], pos[r], pos[from], g.block());
    }
    add_rows(g, result.out, HD, r, 0, HD, read(out[r]));
  }
  if (!dout) return result;
  std::vector<OwnedTensor> dkv;
  for (int r = 0; r < g.ranks; ++r) {
    dkv.emplace_back(A, Shape{B * L, 2 * KV * D});
    cpu().fill(dkv.back(), 0.0);
  }
  for (int r = 0; r < g.ranks; ++r) {
    OwnedTensor dq(A, Shape{B * L, HD}),
        dy = make(g.dtype, Shape{B * L, HD}, rows_of(g, *dout, HD, r, 0, HD));
    cpu().fill(dq, 0.0);
    for (int step = 0; step < g.ranks; ++step) {
      const int from = (r - step + g.ranks) % g.ranks;
      cpu().attention_block_backward(dq, dkv[from], dy, q[r], kv[from], out[r], lse[r], pos[r],
                                     pos[from], g.block());
    }
    add_rows(g, result.dqkv, W, r, 0, HD, read(dq));
  }
  for (int r = 0; r < g.ranks; ++r)
    add_rows(g, result.dqkv, W, r, HD, 2 * KV * D, read(dkv[r]));
  return result;
}

}  // namespace

TEST_CASE("finite differences: context-parallel attention blocks over 1, 2 and 3 ranks") {
  for (const int ranks : {1, 2, 3})
    for (const AttentionShape s : {AttentionShape{.B = 2, .T = 12, .H = 4, .KV = 2, .D = 3},
                                   AttentionShape{.B = 1, .T = 6, .H = 3, .KV = 1, .D = 2}}) {
      if (s.T % (2 * ranks) != 0) continue;
      INFO(ranks << " ranks, T=" << s.T << " H=" << s.H << " KV=" << s.KV);
      const Ring g{s, ranks, F};
      const int64_t N = s.B * s.T;
      OwnedTensor qkv = random64(Shape{N, s.qkv_width()}, 150);
      const Values R = random_values(static_cast<size_t>(N * s.H * s.D), 151);
      // Against one rank: the same outputs and gradients.
      OwnedTensor out(F, Shape{N, s.H * s.D}), lse(F, Shape{s.B, s.H, s.T}),
          dqkv(F, Shape{N, s.qkv_width()}), dout = make(F, Shape{N, s.H * s.D}, R);
      cpu().attention_forward(out, lse, qkv, s);
      cpu().attention_backward(dqkv, dout, qkv, out, lse, s);
      const RingResult ring = ring_attention(g, read(qkv), &R);
      CHECK(rel_error(ring.out, read(out)) < 1e-12);
      CHECK(rel_error(ring.dqkv, read(dqkv)) < 1e-12);
      // And against central differences of the ring itself.
      const auto loss = [&] { return dot(ring_attention(g, read(qkv), nullptr).out, R); };
      CHECK(fd_error(qkv, ring.dqkv, loss) < kMaxError);
    }
}

TEST_CASE("context-parallel attention blocks in f32, bf16 and f16 match one-rank attention") {
  const AttentionShape s{.B = 2, .T = 24, .H = 4, .KV = 2, .D = 8};
  const int64_t N = s.B * s.T;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (const int ranks : {2, 3}) {
      INFO(trainctl::tensor::dtype_name(dtype) << ", " << ranks << " ranks");
      const Values x = rounded(dtype, random_values(static_cast<size_t>(N * s.qkv_width()), 160));
      const Values R = rounded(dtype, random_values(static_cast<size_t>(N * s.H * s.D), 161));
      OwnedTensor qkv = make(dtype, Shape{N, s.qkv_width()}, x), out(dtype, Shape{N, s.H * s.D}),
                  lse(trainctl::backend::stats_dtype(dtype), Shape{s.B, s.H, s.T}),
                  dqkv(dtype, Shape{N, s.qkv_width()}), dout = make(dtype, Shape{N, s.H * s.D}, R);
      cpu().attention_forward(out, lse, qkv, s);
      cpu().attention_backward(dqkv, dout, qkv, out, lse, s);
      const RingResult ring = ring_attention(Ring{s, ranks, dtype}, x, &R);
      // The ring keeps out and the gradients in f32 until the end; one rank rounds them to the
      // storage type, so the bound is that of one rounding.
      CHECK(rel_error(ring.out, read(out)) < tolerance(dtype));
      CHECK(rel_error(ring.dqkv, read(dqkv)) < tolerance(dtype));
    }
}
