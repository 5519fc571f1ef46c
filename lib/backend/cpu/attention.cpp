// Causal multi-head attention with grouped-query heads, softmax scale 1/sqrt(D).
// Work is split into blocks of kQueryBlock query rows; a block ending at row i1 only meets keys
// [0, i1), so the masked upper triangle is (almost all) skipped: per block and query head h,
//   S = scale Q_blk K[0:i1]^T (GEMM), causal row softmax (lse stored), O_blk = P V[0:i1] (GEMM).
// Backward recomputes P = exp(S - lse) per block and runs
//   dV += P^T dO,  dP = dO V^T,  dS = P (dP - rowsum(dO O)),  dQ = scale dS K,  dK += scale dS^T Q
// with dK/dV of a kv head summed over its query heads in the compute type and stored once.
// The GEMMs read Q, K, V in place with leading dimension W = qkv_width() (f32/f64 storage) or from
// one compute-type copy of qkv (bf16/f16), and narrow outputs are rounded once at the end.
// Float softmax uses fast_exp and lane sums (fast_math.hpp); the block size is a constant, so the
// order of every operation depends only on the shapes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/fast_math.hpp"

namespace trainctl::backend::cpu {

namespace {

inline constexpr int64_t kQueryBlock = 64;

// A compute-type view of a storage matrix [rows, cols]: the storage itself when S is already the
// compute type, else a widened copy in scratch.
template <class S, class C>
const C* compute_view(const S* src, int64_t count, C* scratch) {
  if constexpr (std::is_same_v<S, C>) {
    return src;
  } else {
    for (int64_t i = 0; i < count; ++i)
      scratch[i] = tensor::load(src[i]);
    return scratch;
  }
}

template <class S, class C>
void store_all(S* dst, const C* src, int64_t count) {
  if constexpr (!std::is_same_v<S, C>)
    for (int64_t i = 0; i < count; ++i)
      dst[i] = tensor::store<S>(src[i]);
}

// p: rows [i0, i0 + rows) of scaled scores against keys [0, keys), leading dimension ldp. Each row
// i becomes softmax over j <= i (0 beyond). With compute_lse the row's lse is computed
// (max-subtracted) and written, else it is read and P = exp(s - lse).
template <class C>
void causal_softmax(C* p, int64_t ldp, C* lse, int64_t i0, int64_t rows, int64_t keys,
                    bool compute_lse) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    C* row = p + r * ldp;
    const int64_t n = i + 1;
    if (compute_lse) {
      const C mx = lane_max<C>(n, [&](int64_t j) { return row[j]; });
      for (int64_t j = 0; j < n; ++j)
        row[j] = exp_of(row[j] - mx);
      const C total = lane_sum<C>(n, [&](int64_t j) { return row[j]; });
      lse[i] = mx + std::log(total);
      const C inv = C(1) / total;
      for (int64_t j = 0; j < n; ++j)
        row[j] *= inv;
    } else {
      const C l = lse[i];
      for (int64_t j = 0; j < n; ++j)
        row[j] = exp_of(row[j] - l);
    }
    std::fill(row + n, row + keys, C(0));
  }
}

}  // namespace

void CpuBackend::do_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                      const AttentionShape& shape) {
  const ScopedOp timed(timer_, OpFamily::attention);
  constexpr std::string_view op = "attention_forward";
  const auto [B, T, H, KV, D] = shape;
  const int64_t W = shape.qkv_width();
  dispatch_float(qkv.dtype, op, "qkv", [&]<class S>(Tag<S>) {
    using C = compute_t<S>;
    constexpr bool narrow = !std::is_same_v<S, C>;
    const int64_t N = B * T, HD = H * D;
    const C* x = compute_view(qkv.as<S>(), N * W,
                              narrow ? scratch_.get<C>(kSlotAttention + 0, N * W) : nullptr);
    C* o = narrow ? scratch_.get<C>(kSlotAttention + 1, N * HD) : static_cast<C*>(out.data);
    const int64_t block = std::min(kQueryBlock, T);
    C* p = scratch_.get<C>(kSlotAttention + 2, static_cast<size_t>(block * T));
    const C scale = C(1) / std::sqrt(static_cast<C>(D));
    const int64_t group = H / KV;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const C* q = x + b * T * W + h * D;
        const C* k = x + b * T * W + (H + h / group) * D;
        const C* v = x + b * T * W + (H + KV + h / group) * D;
        C* oh = o + b * T * HD + h * D;
        C* lse_h = lse.as<C>() + (b * H + h) * T;
        for (int64_t i0 = 0; i0 < T; i0 += block) {
          const int64_t rows = std::min(block, T - i0), keys = i0 + rows;
          blas_gemm<C>(false, true, rows, keys, D, scale, q + i0 * W, W, k, W, C(0), p, keys);
          causal_softmax(p, keys, lse_h, i0, rows, keys, true);
          blas_gemm<C>(false, false, rows, D, keys, C(1), p, keys, v, W, C(0), oh + i0 * HD, HD);
        }
      }
    store_all(out.as<S>(), o, N * HD);
  });
}

void CpuBackend::do_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                       const Tensor& out, const Tensor& lse,
                                       const AttentionShape& shape) {
  const ScopedOp timed(timer_, OpFamily::attention);
  constexpr std::string_view op = "attention_backward";
  const auto [B, T, H, KV, D] = shape;
  const int64_t W = shape.qkv_width();
  dispatch_float(qkv.dtype, op, "qkv", [&]<class S>(Tag<S>) {
    using C = compute_t<S>;
    constexpr bool narrow = !std::is_same_v<S, C>;
    const int64_t N = B * T, HD = H * D;
    const C* x = compute_view(qkv.as<S>(), N * W,
                              narrow ? scratch_.get<C>(kSlotAttention + 0, N * W) : nullptr);
    const C* dy = compute_view(dout.as<S>(), N * HD,
                               narrow ? scratch_.get<C>(kSlotAttention + 1, N * HD) : nullptr);
    C* dx = narrow ? scratch_.get<C>(kSlotAttention + 3, N * W) : static_cast<C*>(dqkv.data);
    const int64_t block = std::min(kQueryBlock, T);
    C* p = scratch_.get<C>(kSlotAttention + 4, static_cast<size_t>(block * T));
    C* dp = scratch_.get<C>(kSlotAttention + 5, static_cast<size_t>(block * T));
    C* delta = scratch_.get<C>(kSlotAttention + 6, static_cast<size_t>(T));
    const C scale = C(1) / std::sqrt(static_cast<C>(D));
    const int64_t group = H / KV;
    for (int64_t b = 0; b < B; ++b) {
      // dK and dV of this sequence accumulate over query heads and blocks: start from zero.
      for (int64_t t = 0; t < T; ++t)
        std::fill(dx + (b * T + t) * W + H * D, dx + (b * T + t + 1) * W, C(0));
      for (int64_t h = 0; h < H; ++h) {
        const int64_t kv_col = (H + h / group) * D, v_col = (H + KV + h / group) * D;
        const C* q = x + b * T * W + h * D;
        const C* k = x + b * T * W + kv_col;
        const C* v = x + b * T * W + v_col;
        const C* dyh = dy + b * T * HD + h * D;
        C* dq = dx + b * T * W + h * D;
        C* dk = dx + b * T * W + kv_col;
        C* dv = dx + b * T * W + v_col;
        C* lse_h = lse.as<C>() + (b * H + h) * T;
        for (int64_t t = 0; t < T; ++t) {  // delta = rowsum(dO * O)
          const S* o = out.as<S>() + (b * T + t) * HD + h * D;
          const C* d = dyh + t * HD;
          delta[t] = lane_sum<C>(D, [&](int64_t c) { return d[c] * tensor::load(o[c]); });
        }
        for (int64_t i0 = 0; i0 < T; i0 += block) {
          const int64_t rows = std::min(block, T - i0), keys = i0 + rows;
          blas_gemm<C>(false, true, rows, keys, D, scale, q + i0 * W, W, k, W, C(0), p, keys);
          causal_softmax(p, keys, lse_h, i0, rows, keys, false);
          blas_gemm<C>(true, false, keys, D, rows, C(1), p, keys, dyh + i0 * HD, HD, C(1), dv, W);
          blas_gemm<C>(false, true, rows, keys, D, C(1), dyh + i0 * HD, HD, v, W, C(0), dp, keys);
          for (int64_t r = 0; r < rows; ++r) {
            C* dpr = dp + r * keys;
            const C* pr = p + r * keys;
            const C di = delta[i0 + r];
            for (int64_t j = 0; j < keys; ++j)
              dpr[j] = pr[j] * (dpr[j] - di);
          }
          blas_gemm<C>(false, false, rows, D, keys, scale, dp, keys, k, W, C(0), dq + i0 * W, W);
          blas_gemm<C>(true, false, keys, D, rows, scale, dp, keys, q + i0 * W, W, C(1), dk, W);
        }
      }
    }
    store_all(dqkv.as<S>(), dx, N * W);
  });
}

// ---- one key/value block (context parallel) ----------------------------------------------------
// Per sequence and query head: S = scale Q K^T over the block (GEMM), masked by global position.
// Forward: the block's softmax (its own max and lse) and O_blk = P V (GEMM), merged into the
// running (out, lse): lse' = log(e^lse + e^lse_blk), out' = e^(lse - lse') out +
// e^(lse_blk - lse') O_blk. Backward: P = exp(S - lse) with the final lse, as in
// do_attention_backward, with dQ, dK, dV added (beta 1) into the stats-type outputs.

namespace {

// p[Tq, Tk] = scale q k^T (q rows of leading dimension ldq, k rows of ldk), -inf where key j is
// not visible from query i (k_pos[j] > q_pos[i]): one head's scores against one block.
template <class C>
void block_scores(C* p, const C* q, int64_t ldq, const C* k, int64_t ldk, int64_t Tq, int64_t Tk,
                  int64_t D, C scale, const Tensor& q_pos, const Tensor& k_pos) {
  blas_gemm<C>(false, true, Tq, Tk, D, scale, q, ldq, k, ldk, C(0), p, Tk);
  const int32_t* qp = q_pos.as<int32_t>();
  const int32_t* kp = k_pos.as<int32_t>();
  for (int64_t i = 0; i < Tq; ++i)
    for (int64_t j = 0; j < Tk; ++j)
      if (kp[j] > qp[i]) p[i * Tk + j] = -std::numeric_limits<C>::infinity();
}

}  // namespace

void CpuBackend::do_attention_block_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                            const Tensor& kv, const Tensor& q_pos,
                                            const Tensor& k_pos, const AttentionBlockShape& shape) {
  const ScopedOp timed(timer_, OpFamily::attention);
  constexpr std::string_view op = "attention_block_forward";
  const auto [B, Tq, Tk, H, KV, D] = shape;
  const int64_t W = shape.qkv_width(), KW = shape.kv_width(), HD = H * D;
  dispatch_float(qkv.dtype, op, "qkv", [&]<class S>(Tag<S>) {
    using C = compute_t<S>;
    constexpr bool narrow = !std::is_same_v<S, C>;
    const C* x = compute_view(qkv.as<S>(), B * Tq * W,
                              narrow ? scratch_.get<C>(kSlotAttention + 0, B * Tq * W) : nullptr);
    const C* y = compute_view(kv.as<S>(), B * Tk * KW,
                              narrow ? scratch_.get<C>(kSlotAttention + 1, B * Tk * KW) : nullptr);
    C* p = scratch_.get<C>(kSlotAttention + 2, static_cast<size_t>(Tq * Tk));
    C* o = scratch_.get<C>(kSlotAttention + 3, static_cast<size_t>(Tq * D));
    C* block_lse = scratch_.get<C>(kSlotAttention + 4, static_cast<size_t>(Tq));
    const C scale = C(1) / std::sqrt(static_cast<C>(D));
    const int64_t group = H / KV;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const C* q = x + b * Tq * W + h * D;
        const C* k = y + b * Tk * KW + (h / group) * D;
        const C* v = y + b * Tk * KW + (KV + h / group) * D;
        block_scores(p, q, W, k, KW, Tq, Tk, D, scale, q_pos, k_pos);
        for (int64_t i = 0; i < Tq; ++i) {
          C* row = p + i * Tk;
          const C mx = lane_max<C>(Tk, [&](int64_t j) { return row[j]; });
          if (mx == -std::numeric_limits<C>::infinity()) {  // no key of the block is visible
            block_lse[i] = mx;
            std::fill(row, row + Tk, C(0));
            continue;
          }
          for (int64_t j = 0; j < Tk; ++j)
            row[j] = exp_of(row[j] - mx);
          const C total = lane_sum<C>(Tk, [&](int64_t j) { return row[j]; });
          block_lse[i] = mx + std::log(total);
          const C inv = C(1) / total;
          for (int64_t j = 0; j < Tk; ++j)
            row[j] *= inv;
        }
        blas_gemm<C>(false, false, Tq, D, Tk, C(1), p, Tk, v, KW, C(0), o, D);
        C* lse_h = lse.as<C>() + (b * H + h) * Tq;
        for (int64_t i = 0; i < Tq; ++i) {
          const C lb = block_lse[i];
          if (lb == -std::numeric_limits<C>::infinity()) continue;
          const C la = lse_h[i];
          const C top = std::max(la, lb);
          const C merged = top + std::log(std::exp(la - top) + std::exp(lb - top));
          const C keep = std::exp(la - merged), add = std::exp(lb - merged);
          C* out_row = out.as<C>() + (b * Tq + i) * HD + h * D;
          for (int64_t d = 0; d < D; ++d)
            out_row[d] = keep * out_row[d] + add * o[i * D + d];
          lse_h[i] = merged;
        }
      }
  });
}

void CpuBackend::do_attention_block_backward(const Tensor& dq, const Tensor& dkv,
                                             const Tensor& dout, const Tensor& qkv,
                                             const Tensor& kv, const Tensor& out, const Tensor& lse,
                                             const Tensor& q_pos, const Tensor& k_pos,
                                             const AttentionBlockShape& shape) {
  const ScopedOp timed(timer_, OpFamily::attention);
  constexpr std::string_view op = "attention_block_backward";
  const auto [B, Tq, Tk, H, KV, D] = shape;
  const int64_t W = shape.qkv_width(), KW = shape.kv_width(), HD = H * D;
  dispatch_float(qkv.dtype, op, "qkv", [&]<class S>(Tag<S>) {
    using C = compute_t<S>;
    constexpr bool narrow = !std::is_same_v<S, C>;
    const C* x = compute_view(qkv.as<S>(), B * Tq * W,
                              narrow ? scratch_.get<C>(kSlotAttention + 0, B * Tq * W) : nullptr);
    const C* y = compute_view(kv.as<S>(), B * Tk * KW,
                              narrow ? scratch_.get<C>(kSlotAttention + 1, B * Tk * KW) : nullptr);
    const C* dy = compute_view(dout.as<S>(), B * Tq * HD,
                               narrow ? scratch_.get<C>(kSlotAttention + 2, B * Tq * HD) : nullptr);
    C* p = scratch_.get<C>(kSlotAttention + 3, static_cast<size_t>(Tq * Tk));
    C* dp = scratch_.get<C>(kSlotAttention + 4, static_cast<size_t>(Tq * Tk));
    C* delta = scratch_.get<C>(kSlotAttention + 5, static_cast<size_t>(Tq));
    const C scale = C(1) / std::sqrt(static_cast<C>(D));
    const int64_t group = H / KV;
    C* dx = dkv.as<C>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t k_col = (h / group) * D, v_col = (KV + h / group) * D;
        const C* q = x + b * Tq * W + h * D;
        const C* k = y + b * Tk * KW + k_col;
        const C* v = y + b * Tk * KW + v_col;
        const C* dyh = dy + b * Tq * HD + h * D;
        const C* lse_h = lse.as<C>() + (b * H + h) * Tq;
        for (int64_t i = 0; i < Tq; ++i) {  // delta = rowsum(dO * O)
          const C* o = out.as<C>() + (b * Tq + i) * HD + h * D;
          const C* d = dyh + i * HD;
          delta[i] = lane_sum<C>(D, [&](int64_t c) { return d[c] * o[c]; });
        }
        block_scores(p, q, W, k, KW, Tq, Tk, D, scale, q_pos, k_pos);
        for (int64_t i = 0; i < Tq; ++i) {
          const C l = lse_h[i];  // -inf: the row saw no key at all, and has no gradient
          for (int64_t j = 0; j < Tk; ++j)
            p[i * Tk + j] = l == -std::numeric_limits<C>::infinity()
                                ? C(0)
                                : exp_of(p[i * Tk + j] - l);  // exp(-inf) = 0: masked
        }
        blas_gemm<C>(true, false, Tk, D, Tq, C(1), p, Tk, dyh, HD, C(1), dx + b * Tk * KW + v_col,
                     KW);
        blas_gemm<C>(false, true, Tq, Tk, D, C(1), dyh, HD, v, KW, C(0), dp, Tk);
        for (int64_t i = 0; i < Tq; ++i)
          for (int64_t j = 0; j < Tk; ++j)
            dp[i * Tk + j] = p[i * Tk + j] * (dp[i * Tk + j] - delta[i]);
        blas_gemm<C>(false, false, Tq, D, Tk, scale, dp, Tk, k, KW, C(1),
                     dq.as<C>() + b * Tq * HD + h * D, HD);
        blas_gemm<C>(true, false, Tk, D, Tq, scale, dp, Tk, q, W, C(1), dx + b * Tk * KW + k_col,
                     KW);
      }
  });
}

}  // namespace trainctl::backend::cpu
