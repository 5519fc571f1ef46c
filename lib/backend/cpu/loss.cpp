// Cross-entropy over the last dim of logits [N, V], max-subtracted. losses and lse are A; dlogits
// (S) is overwritten and may alias logits (each element is read before it is written).
// A negative target marks an ignored position: loss 0, gradient 0.
// Speed: the float path uses fast_exp and lane sums (fast_math.hpp) so each pass over a row of V
// logits vectorises; the sum's order is fixed by V alone.
#include <cmath>
#include <string_view>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/fast_math.hpp"

namespace trainctl::backend::cpu {

namespace {

// The shapes (checked by Backend's wrapper), then what only a host backend can check: targets
// inside the vocabulary. shard: logits hold a vocab-parallel slice, so targets may lie outside
// [0, V).
int64_t check_targets(std::string_view op, const Tensor& logits, const Tensor& targets, int64_t& V,
                      bool shard = false) {
  const int64_t N = targets.numel();
  V = logits.numel() / N;
  const int32_t* t = targets.as<int32_t>();
  for (int64_t n = 0; n < N && !shard; ++n)
    if (t[n] >= V)
      fail(op, fmt::format("targets[{}] = {} is outside the vocabulary [0, {})", n, t[n], V));
  return N;
}

}  // namespace

void CpuBackend::do_cross_entropy_forward(const Tensor& losses, const Tensor& lse,
                                          const Tensor& logits, const Tensor& targets) {
  const ScopedOp timed(timer_, OpFamily::loss);
  constexpr std::string_view op = "cross_entropy_forward";
  int64_t V = 0;
  const int64_t N = check_targets(op, logits, targets, V);
  dispatch_float(logits.dtype, op, "logits", [&]<class S>(Tag<S>) {
    using A = compute_t<S>;
    const int32_t* tgt = targets.as<int32_t>();
    for (int64_t n = 0; n < N; ++n) {
      const S* row = logits.as<S>() + n * V;
      const A mx = lane_max<A>(V, [&](int64_t j) { return tensor::load(row[j]); });
      const A total = lane_sum<A>(V, [&](int64_t j) { return exp_of(tensor::load(row[j]) - mx); });
      const A l = mx + std::log(total);
      lse.as<A>()[n] = l;
      losses.as<A>()[n] = tgt[n] < 0 ? A(0) : l - tensor::load(row[tgt[n]]);
    }
  });
}

namespace {

// dlogits of a whole-vocabulary row (vocab_begin 0) or of a vocab-parallel slice, whose lse is that
// of the whole row and whose target may belong to another slice (then no -1 here).
void cross_entropy_backward_rows(std::string_view op, const Tensor& dlogits, const Tensor& logits,
                                 const Tensor& lse, const Tensor& targets, int64_t vocab_begin,
                                 double grad_scale, bool shard) {
  int64_t V = 0;
  const int64_t N = check_targets(op, logits, targets, V, shard);
  dispatch_float(logits.dtype, op, "logits", [&]<class S>(Tag<S>) {
    using A = compute_t<S>;
    const A gs = static_cast<A>(grad_scale);
    const int32_t* tgt = targets.as<int32_t>();
    for (int64_t n = 0; n < N; ++n) {
      const S* row = logits.as<S>() + n * V;
      S* d = dlogits.as<S>() + n * V;
      if (tgt[n] < 0) {
        for (int64_t j = 0; j < V; ++j)
          d[j] = tensor::store<S>(A(0));
        continue;
      }
      const A l = lse.as<A>()[n];
      const int64_t local = tgt[n] - vocab_begin;
      const bool inside = local >= 0 && local < V;
      // Read before d (which may alias row) is written.
      const A target_logit = inside ? tensor::load(row[local]) : A(0);
      for (int64_t j = 0; j < V; ++j)
        d[j] = tensor::store<S>(exp_of(tensor::load(row[j]) - l) * gs);
      if (inside) d[local] = tensor::store<S>((exp_of(target_logit - l) - A(1)) * gs);
    }
  });
}

}  // namespace

void CpuBackend::do_cross_entropy_backward(const Tensor& dlogits, const Tensor& logits,
                                           const Tensor& lse, const Tensor& targets,
                                           double grad_scale) {
  const ScopedOp timed(timer_, OpFamily::loss);
  cross_entropy_backward_rows("cross_entropy_backward", dlogits, logits, lse, targets, 0,
                              grad_scale, false);
}

void CpuBackend::do_cross_entropy_backward_shard(const Tensor& dlogits, const Tensor& logits,
                                                 const Tensor& lse, const Tensor& targets,
                                                 int64_t vocab_begin, double grad_scale) {
  const ScopedOp timed(timer_, OpFamily::loss);
  cross_entropy_backward_rows("cross_entropy_backward_shard", dlogits, logits, lse, targets,
                              vocab_begin, grad_scale, true);
}

}  // namespace trainctl::backend::cpu
