// Mixture-of-experts routing and token permutation.
// Router: probs = softmax(logits) (compute type, max-subtracted); top-k per token, best first, ties
// to the lower expert index; gates = the chosen probs, divided by their sum when renormalize; slots
// are handed out in GShard priority order: every token's first choice (in token order), then every
// token's second choice, ... An assignment whose expert is already full (capacity; <= 0 means N) is
// dropped: slot -1. Dropped assignments contribute nothing to unpermute and get dgates = 0 from
// unpermute_backward. Permute/unpermute move rows between token order [N, C] and expert buffers [E
// * capacity, C]; every output is overwritten (unused expert rows are zeroed).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.hpp"

namespace trainctl::backend::cpu {

namespace {

// Row-major softmax of one row in compute type; returns the log-sum-exp.
template <class S, class A>
A softmax_row(A* probs, const S* logits, int64_t E) {
  A mx = -std::numeric_limits<A>::infinity();
  for (int64_t e = 0; e < E; ++e)
    mx = std::max(mx, tensor::load(logits[e]));
  A total = 0;
  for (int64_t e = 0; e < E; ++e)
    total += std::exp(tensor::load(logits[e]) - mx);
  const A lse = mx + std::log(total);
  for (int64_t e = 0; e < E; ++e)
    probs[e] = std::exp(tensor::load(logits[e]) - lse);
  return lse;
}

struct PermuteDims {
  int64_t N, K, C, R;
};

// The shapes (checked by Backend's wrapper: tokens [N, C], expert rows [R, C], slot [N, K]), then
// the slot values, which only a host backend can read.
PermuteDims check_slots(std::string_view op, const Tensor& tokens, const Tensor& experts,
                        const Tensor& slot) {
  const int64_t N = tokens.shape[0], C = tokens.shape[1];
  const PermuteDims dims{N, slot.numel() / N, C, experts.numel() / C};
  const int32_t* s = slot.as<int32_t>();
  for (int64_t i = 0; i < dims.N * dims.K; ++i)
    if (s[i] < -1 || s[i] >= dims.R)
      fail(op, fmt::format("slot[{}] = {} is outside the {} expert rows", i, s[i], dims.R));
  return dims;
}

}  // namespace

RouterLosses CpuBackend::do_moe_router_forward(const RouterArgs& r) {
  const ScopedOp timed(timer_, OpFamily::moe);
  constexpr std::string_view op = "moe_router_forward";
  const int64_t N = r.logits.shape[0], E = r.logits.shape[1], K = r.top_k;
  const int64_t capacity = r.capacity > 0 ? r.capacity : N;
  return dispatch_float(r.logits.dtype, op, "logits", [&]<class S>(Tag<S>) {
    using A = compute_t<S>;
    A* probs = r.probs.as<A>();
    int32_t* idx = r.expert_idx.as<int32_t>();
    A* gates = r.gates.as<A>();
    double z_loss = 0;
    std::vector<int64_t> chosen(static_cast<size_t>(E), 0);
    for (int64_t n = 0; n < N; ++n) {
      A* p = probs + n * E;
      const double lse = softmax_row(p, r.logits.as<S>() + n * E, E);
      z_loss += lse * lse;
      for (int64_t j = 0; j < K; ++j) {  // selection: strict > keeps the lower index on ties
        int64_t best = -1;
        for (int64_t e = 0; e < E; ++e) {
          bool taken = false;
          for (int64_t i = 0; i < j; ++i)
            taken = taken || idx[n * K + i] == e;
          if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        idx[n * K + j] = static_cast<int32_t>(best);
        gates[n * K + j] = p[best];
        ++chosen[static_cast<size_t>(best)];
      }
      if (r.renormalize) {
        A chosen_sum = 0;
        for (int64_t j = 0; j < K; ++j)
          chosen_sum += gates[n * K + j];
        for (int64_t j = 0; j < K; ++j)
          gates[n * K + j] /= chosen_sum;
      }
    }
    int32_t* counts = r.counts.as<int32_t>();
    int32_t* slot = r.slot.as<int32_t>();
    std::fill(counts, counts + E, 0);
    for (int64_t j = 0; j < K; ++j)
      for (int64_t n = 0; n < N; ++n) {
        const int32_t e = idx[n * K + j];
        slot[n * K + j] =
            counts[e] < capacity ? static_cast<int32_t>(e * capacity + counts[e]++) : -1;
      }
    RouterLosses losses;
    A* load = r.load.as<A>();
    for (int64_t e = 0; e < E; ++e) {
      load[e] = static_cast<A>(static_cast<double>(chosen[static_cast<size_t>(e)]) /
                               static_cast<double>(N * K));
      double mean_prob = 0;
      for (int64_t n = 0; n < N; ++n)
        mean_prob += probs[n * E + e];
      losses.aux_loss += static_cast<double>(load[e]) * mean_prob / static_cast<double>(N);
    }
    losses.aux_loss *= static_cast<double>(E);
    losses.z_loss = z_loss / static_cast<double>(N);
    return losses;
  });
}

void CpuBackend::do_moe_router_backward(const Tensor& dlogits, const Tensor& dgates,
                                        const RouterArgs& r, double aux_coef, double z_coef,
                                        double grad_scale) {
  const ScopedOp timed(timer_, OpFamily::moe);
  constexpr std::string_view op = "moe_router_backward";
  const int64_t N = r.logits.shape[0], E = r.logits.shape[1], K = r.top_k;
  dispatch_float(r.logits.dtype, op, "logits", [&]<class S>(Tag<S>) {
    using A = compute_t<S>;
    const A* probs = r.probs.as<A>();
    const A* load = r.load.as<A>();
    const int32_t* idx = r.expert_idx.as<int32_t>();
    const A* dg = dgates.as<A>();
    const A inv_n = A(1) / static_cast<A>(N);
    const A aux = static_cast<A>(aux_coef) * static_cast<A>(E) * inv_n;
    const A gs = static_cast<A>(grad_scale);
    A* dprobs = scratch_.get<A>(kSlotGemmA, static_cast<size_t>(E));
    for (int64_t n = 0; n < N; ++n) {
      const A* p = probs + n * E;
      const S* row = r.logits.as<S>() + n * E;
      // lse is not kept by forward: recompute it (max-subtracted) for the z-loss term.
      A mx = -std::numeric_limits<A>::infinity();
      for (int64_t e = 0; e < E; ++e)
        mx = std::max(mx, tensor::load(row[e]));
      A total = 0;
      for (int64_t e = 0; e < E; ++e)
        total += std::exp(tensor::load(row[e]) - mx);
      const A lse = mx + std::log(total);
      for (int64_t e = 0; e < E; ++e)
        dprobs[e] = aux * load[e];
      if (!r.renormalize) {
        for (int64_t j = 0; j < K; ++j)
          dprobs[idx[n * K + j]] += dg[n * K + j];
      } else {
        // gate_j = p_j / s with s the chosen probabilities' sum:
        // d/dp_i = (dgate_i - sum_j dgate_j gate_j) / s for a chosen i.
        A s = 0, dot_g = 0;
        for (int64_t j = 0; j < K; ++j)
          s += p[idx[n * K + j]];
        for (int64_t j = 0; j < K; ++j)
          dot_g += dg[n * K + j] * p[idx[n * K + j]] / s;
        for (int64_t j = 0; j < K; ++j)
          dprobs[idx[n * K + j]] += (dg[n * K + j] - dot_g) / s;
      }
      A dot = 0;
      for (int64_t e = 0; e < E; ++e)
        dot += p[e] * dprobs[e];
      const A z = static_cast<A>(z_coef) * A(2) * lse * inv_n;
      S* d = dlogits.as<S>() + n * E;
      for (int64_t e = 0; e < E; ++e)
        d[e] = tensor::store<S>((p[e] * (dprobs[e] - dot) + z * p[e]) * gs);
    }
  });
}

void CpuBackend::do_moe_permute(const Tensor& expert_in, const Tensor& x, const Tensor& slot) {
  const ScopedOp timed(timer_, OpFamily::moe);
  const auto [N, K, C, R] = check_slots("moe_permute", x, expert_in, slot);
  const size_t row_bytes = static_cast<size_t>(C) * tensor::dtype_size(x.dtype);
  auto* dst = static_cast<char*>(expert_in.data);
  const auto* src = static_cast<const char*>(x.data);
  std::memset(dst, 0, static_cast<size_t>(R) * row_bytes);
  const int32_t* s = slot.as<int32_t>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K; ++j)
      if (s[n * K + j] >= 0)
        std::memcpy(dst + static_cast<size_t>(s[n * K + j]) * row_bytes,
                    src + static_cast<size_t>(n) * row_bytes, row_bytes);
}

void CpuBackend::do_moe_permute_backward(const Tensor& dx, const Tensor& dexpert_in,
                                         const Tensor& slot) {
  const ScopedOp timed(timer_, OpFamily::moe);
  constexpr std::string_view op = "moe_permute_backward";
  const auto [N, K, C, R] = check_slots(op, dx, dexpert_in, slot);
  dispatch_float(dx.dtype, op, "dx", [&]<class S>(Tag<S>) {
    using Cm = compute_t<S>;
    const int32_t* s = slot.as<int32_t>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) {
        Cm total = 0;
        for (int64_t j = 0; j < K; ++j)
          if (s[n * K + j] >= 0) total += tensor::load(dexpert_in.as<S>()[s[n * K + j] * C + c]);
        dx.as<S>()[n * C + c] = tensor::store<S>(total);
      }
  });
}

void CpuBackend::do_moe_unpermute(const Tensor& out, const Tensor& expert_out, const Tensor& gates,
                                  const Tensor& slot) {
  const ScopedOp timed(timer_, OpFamily::moe);
  constexpr std::string_view op = "moe_unpermute";
  const auto [N, K, C, R] = check_slots(op, out, expert_out, slot);
  dispatch_float(out.dtype, op, "out", [&]<class S>(Tag<S>) {
    using Cm = compute_t<S>;
    const int32_t* s = slot.as<int32_t>();
    const Cm* g = gates.as<Cm>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) {
        Cm total = 0;
        for (int64_t j = 0; j < K; ++j)
          if (s[n * K + j] >= 0)
            total += g[n * K + j] * tensor::load(expert_out.as<S>()[s[n * K + j] * C + c]);
        out.as<S>()[n * C + c] = tensor::store<S>(total);
      }
  });
}

void CpuBackend::do_moe_unpermute_backward(const Tensor& dexpert_out, const Tensor& dgates,
                                           const Tensor& dout, const Tensor& expert_out,
                                           const Tensor& gates, const Tensor& slot) {
  const ScopedOp timed(timer_, OpFamily::moe);
  constexpr std::string_view op = "moe_unpermute_backward";
  const auto [N, K, C, R] = check_slots(op, dout, expert_out, slot);
  dispatch_float(dout.dtype, op, "dout", [&]<class S>(Tag<S>) {
    using Cm = compute_t<S>;
    const int32_t* s = slot.as<int32_t>();
    const Cm* g = gates.as<Cm>();
    Cm* dg = dgates.as<Cm>();
    std::memset(dexpert_out.data, 0, dexpert_out.bytes());
    for (int64_t n = 0; n < N; ++n) {
      const S* dy = dout.as<S>() + n * C;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t row = s[n * K + j];
        if (row < 0) {
          dg[n * K + j] = 0;
          continue;
        }
        const S* eo = expert_out.as<S>() + row * C;
        S* de = dexpert_out.as<S>() + row * C;
        Cm dot = 0;
        for (int64_t c = 0; c < C; ++c) {
          const Cm d = tensor::load(dy[c]);
          dot += d * tensor::load(eo[c]);
          de[c] = tensor::store<S>(g[n * K + j] * d);
        }
        dg[n * K + j] = dot;
      }
    }
  });
}

}  // namespace trainctl::backend::cpu
