// Causal multi-head attention with grouped-query heads, softmax scale 1/sqrt(D).
// Per (sequence b, kv head g) the K and V head is gathered once into compute-type scratch; for each
// query head h of the group: scores = scale Q K^T (GEMM, T x T), causal row softmax storing lse,
// O = P V (GEMM). Backward recomputes P = exp(s - lse) and runs
//   dV += P^T dO,  dP = dO V^T,  dS = P (dP - rowsum(dO O)),  dQ = scale dS K,  dK += scale dS^T Q
// with dK/dV summed over the group's query heads in compute-type scratch and stored once, so narrow
// storage types round Q/K/V loads and each stored output exactly once.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.hpp"

namespace trainctl::backend::cpu {

namespace {

void check_shape(std::string_view op, const AttentionShape& s) {
  if (s.B <= 0 || s.T <= 0 || s.H <= 0 || s.KV <= 0 || s.D <= 0)
    fail(op, fmt::format("B={}, T={}, H={}, KV={}, D={} must all be positive", s.B, s.T, s.H, s.KV,
                         s.D));
  if (s.H % s.KV != 0)
    fail(op,
         fmt::format("H={} query heads are not a multiple of KV={} key/value heads", s.H, s.KV));
}

// dst[t, 0:D] = src[(row0 + t) * stride + col, ...] in compute type C.
template <class S, class C>
void gather(C* dst, const S* src, int64_t row0, int64_t T, int64_t stride, int64_t col, int64_t D) {
  for (int64_t t = 0; t < T; ++t) {
    const S* s = src + (row0 + t) * stride + col;
    for (int64_t d = 0; d < D; ++d)
      dst[t * D + d] = tensor::load(s[d]);
  }
}

template <class S, class C>
void scatter(S* dst, const C* src, int64_t row0, int64_t T, int64_t stride, int64_t col,
             int64_t D) {
  for (int64_t t = 0; t < T; ++t) {
    S* o = dst + (row0 + t) * stride + col;
    for (int64_t d = 0; d < D; ++d)
      o[d] = tensor::store<S>(src[t * D + d]);
  }
}

// p [T, T] holds scaled scores; turns each row i into exp(s - lse_i) for j <= i and 0 beyond.
// With compute_lse the row's lse is computed (max-subtracted) and written; else it is read.
template <class C>
void causal_softmax(C* p, C* lse, int64_t T, bool compute_lse) {
  for (int64_t i = 0; i < T; ++i) {
    C* row = p + i * T;
    if (compute_lse) {
      C mx = -std::numeric_limits<C>::infinity();
      for (int64_t j = 0; j <= i; ++j)
        mx = std::max(mx, row[j]);
      C total = 0;
      for (int64_t j = 0; j <= i; ++j)
        total += std::exp(row[j] - mx);
      lse[i] = mx + std::log(total);
    }
    const C l = lse[i];
    for (int64_t j = 0; j <= i; ++j)
      row[j] = std::exp(row[j] - l);
    for (int64_t j = i + 1; j < T; ++j)
      row[j] = 0;
  }
}

}  // namespace

void CpuBackend::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                   const AttentionShape& shape) {
  const ScopedOp timed(timer_, OpFamily::attention);
  constexpr std::string_view op = "attention_forward";
  check_shape(op, shape);
  const auto [B, T, H, KV, D] = shape;
  const int64_t W = shape.qkv_width();
  expect_present(op, "qkv", qkv);
  expect_numel(op, "qkv", qkv, B * T * W);
  expect_dtype(op, "out", out, qkv.dtype);
  expect_numel(op, "out", out, B * T * H * D);
  expect_dtype(op, "lse", lse, stats_dtype(qkv.dtype));
  expect_numel(op, "lse", lse, B * H * T);
  dispatch_float(qkv.dtype, op, "qkv", [&]<class S>(Tag<S>) {
    using C = compute_t<S>;
    const auto td = static_cast<size_t>(T * D);
    C* k = scratch_.get<C>(kSlotAttention + 0, td);
    C* v = scratch_.get<C>(kSlotAttention + 1, td);
    C* q = scratch_.get<C>(kSlotAttention + 2, td);
    C* o = scratch_.get<C>(kSlotAttention + 3, td);
    C* p = scratch_.get<C>(kSlotAttention + 4, static_cast<size_t>(T * T));
    const C scale = C(1) / std::sqrt(static_cast<C>(D));
    const int64_t group = H / KV;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t g = 0; g < KV; ++g) {
        gather(k, qkv.as<S>(), b * T, T, W, (H + g) * D, D);
        gather(v, qkv.as<S>(), b * T, T, W, (H + KV + g) * D, D);
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          gather(q, qkv.as<S>(), b * T, T, W, h * D, D);
          blas_gemm<C>(false, true, T, T, D, scale, q, D, k, D, C(0), p, T);
          causal_softmax(p, lse.as<C>() + (b * H + h) * T, T, true);
          blas_gemm<C>(false, false, T, D, T, C(1), p, T, v, D, C(0), o, D);
          scatter(out.as<S>(), o, b * T, T, H * D, h * D, D);
        }
      }
  });
}

void CpuBackend::attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                    const Tensor& out, const Tensor& lse,
                                    const AttentionShape& shape) {
  const ScopedOp timed(timer_, OpFamily::attention);
  constexpr std::string_view op = "attention_backward";
  check_shape(op, shape);
  const auto [B, T, H, KV, D] = shape;
  const int64_t W = shape.qkv_width();
  expect_present(op, "qkv", qkv);
  expect_numel(op, "qkv", qkv, B * T * W);
  expect_dtype(op, "dqkv", dqkv, qkv.dtype);
  expect_numel(op, "dqkv", dqkv, B * T * W);
  expect_dtype(op, "out", out, qkv.dtype);
  expect_numel(op, "out", out, B * T * H * D);
  expect_dtype(op, "dout", dout, qkv.dtype);
  expect_numel(op, "dout", dout, B * T * H * D);
  expect_dtype(op, "lse", lse, stats_dtype(qkv.dtype));
  expect_numel(op, "lse", lse, B * H * T);
  dispatch_float(qkv.dtype, op, "qkv", [&]<class S>(Tag<S>) {
    using C = compute_t<S>;
    const auto td = static_cast<size_t>(T * D);
    const auto tt = static_cast<size_t>(T * T);
    C* k = scratch_.get<C>(kSlotAttention + 0, td);
    C* v = scratch_.get<C>(kSlotAttention + 1, td);
    C* q = scratch_.get<C>(kSlotAttention + 2, td);
    C* dq = scratch_.get<C>(kSlotAttention + 3, td);
    C* p = scratch_.get<C>(kSlotAttention + 4, tt);
    C* dp = scratch_.get<C>(kSlotAttention + 5, tt);
    C* dy = scratch_.get<C>(kSlotAttention + 6, td);
    C* dk = scratch_.get<C>(kSlotAttention + 7, td);
    C* dv = scratch_.get<C>(kSlotAttention + 8, td);
    const C scale = C(1) / std::sqrt(static_cast<C>(D));
    const int64_t group = H / KV;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t g = 0; g < KV; ++g) {
        gather(k, qkv.as<S>(), b * T, T, W, (H + g) * D, D);
        gather(v, qkv.as<S>(), b * T, T, W, (H + KV + g) * D, D);
        std::fill(dk, dk + td, C(0));
        std::fill(dv, dv + td, C(0));
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          gather(q, qkv.as<S>(), b * T, T, W, h * D, D);
          gather(dy, dout.as<S>(), b * T, T, H * D, h * D, D);
          blas_gemm<C>(false, true, T, T, D, scale, q, D, k, D, C(0), p, T);
          causal_softmax(p, lse.as<C>() + (b * H + h) * T, T, false);
          blas_gemm<C>(true, false, T, D, T, C(1), p, T, dy, D, C(1), dv, D);
          blas_gemm<C>(false, true, T, T, D, C(1), dy, D, v, D, C(0), dp, T);
          for (int64_t i = 0; i < T; ++i) {
            const S* o = out.as<S>() + (b * T + i) * H * D + h * D;
            C delta = 0;  // rowsum(dO * O)
            for (int64_t d = 0; d < D; ++d)
              delta += dy[i * D + d] * tensor::load(o[d]);
            for (int64_t j = 0; j < T; ++j)
              dp[i * T + j] = p[i * T + j] * (dp[i * T + j] - delta);
          }
          blas_gemm<C>(false, false, T, D, T, scale, dp, T, k, D, C(0), dq, D);
          blas_gemm<C>(true, false, T, D, T, scale, dp, T, q, D, C(1), dk, D);
          scatter(dqkv.as<S>(), dq, b * T, T, W, h * D, D);
        }
        scatter(dqkv.as<S>(), dk, b * T, T, W, (H + g) * D, D);
        scatter(dqkv.as<S>(), dv, b * T, T, W, (H + KV + g) * D, D);
      }
  });
}

}  // namespace trainctl::backend::cpu
