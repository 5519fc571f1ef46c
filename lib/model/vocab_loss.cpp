#include <algorithm>
#include <cmath>

#include "model/transformer_impl.hpp"

namespace trainctl::model {

// Vocab-parallel cross-entropy: each tp rank scores its shard of the logits; the log-sum-exp
// of the whole vocabulary and the target logit are combined across tp from [N] vectors, never
// from the logits. Returns the summed loss over the valid targets.
double Transformer::Impl::vocab_parallel_loss(Slot& s, const int32_t* host_targets) {
  std::vector<int32_t> local(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = host_targets[n] - vocab_begin;
    local[static_cast<size_t>(n)] =
        host_targets[n] >= 0 && t >= 0 && t < local_vocab ? static_cast<int32_t>(t) : -1;
  }
  be.copy_from_host(s.local_targets, local.data());
  // Shard losses: lse_shard - target logit where the target is inside the shard, else 0.
  be.cross_entropy_forward(losses, lse, logits, s.local_targets);
  std::vector<double> shard_lse = to_host(lse), shard_loss = to_host(losses);
  // minus_target[n] = -(target logit), contributed by the one rank that holds the target.
  std::vector<double> minus_target(static_cast<size_t>(N), 0.0);
  for (size_t n = 0; n < minus_target.size(); ++n)
    if (local[n] >= 0) minus_target[n] = shard_loss[n] - shard_lse[n];
  tp.comm->all_reduce_sum(minus_target.data(), minus_target.size(), DType::f64);
  const int ranks = tp.comm->size();
  std::vector<double> all_lse(shard_lse.size() * static_cast<size_t>(ranks));
  tp.comm->all_gather(shard_lse.data(), all_lse.data(), shard_lse.size() * sizeof(double));
  std::vector<double> whole_lse(static_cast<size_t>(N));
  double total = 0;
  for (int64_t n = 0; n < N; ++n) {
    double top = -INFINITY;
    for (int r = 0; r < ranks; ++r)
      top = std::max(top, all_lse[static_cast<size_t>(r * N + n)]);
    double sum = 0;
    for (int r = 0; r < ranks; ++r)
      sum += std::exp(all_lse[static_cast<size_t>(r * N + n)] - top);
    whole_lse[static_cast<size_t>(n)] = top + std::log(sum);
    if (host_targets[n] >= 0)
      total += whole_lse[static_cast<size_t>(n)] + minus_target[static_cast<size_t>(n)];
  }
  from_host(s.lse, whole_lse);
  return total;
}

std::vector<double> Transformer::Impl::to_host(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::f64) {
    be.copy_to_host(out.data(), t);
  } else {
    std::vector<float> f32(out.size());
    be.copy_to_host(f32.data(), t);
    std::copy(f32.begin(), f32.end(), out.begin());
  }
  return out;
}

void Transformer::Impl::from_host(const Tensor& t, const std::vector<double>& values) {
  if (t.dtype == DType::f64) {
    be.copy_from_host(t, values.data());
  } else {
    const std::vector<float> f32(values.begin(), values.end());
    be.copy_from_host(t, f32.data());
  }
}

}  // namespace trainctl::model
