// The memory model: bytes per GPU by category, per pipeline stage, the worst stage reported.
// Per-layer activations follow lib/model/transformer.cpp assign() tensor by tensor (each tensor
// rounded to 64 bytes as the engine's arena does), so a single-rank layout reproduces the
// engine's activation_bytes(); tensor parallelism divides every per-layer tensor by tp
// (Megatron-style tensor + sequence parallelism, Korthikanti et al. 2022 "sbh(34/t)"; our engine
// keeps no [T, T] attention matrix, so their 5as/h term does not appear).
#include <algorithm>
#include <cmath>

#include "planner/planner.hpp"
#include "planner/shape.hpp"

namespace trainctl::planner {

namespace {

double round64(double bytes) {
  return std::ceil(bytes / 64.0) * 64.0;
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// Gradient all-reduce buckets: 25M elements, double-buffered (DDP's default bucket size).
constexpr double kBucketElements = 25e6;

struct Tally {
  double kept = 0, shared = 0;
};

// One block's activations for one micro-batch of N tokens, split into what stays until backward
// (kept) and what the recompute region reuses across layers (shared), as assign() does.
Tally block_activations(const ModelShape& s, const Sizes& z, bool moe, recipe::Recompute mode,
                        int64_t N, int tp) {
  const bool full = mode == recipe::Recompute::full;
  const bool none = mode == recipe::Recompute::none;
  Tally t;
  auto unless_full = [&](double elements, double size) {
    (full ? t.shared : t.kept) += round64(elements * size) / tp;
  };
  auto if_none = [&](double elements, double size) {
    (none ? t.kept : t.shared) += round64(elements * size) / tp;
  };
  const double n = static_cast<double>(N);
  unless_full(n, z.stats);  // ln1 mean/rstd
  unless_full(n, z.stats);
  if_none(n * s.C, z.storage);            // ln1_out
  unless_full(n * s.W, z.storage);        // qkv
  unless_full(n * s.H * s.D, z.storage);  // attention output
  unless_full(n * s.H, z.stats);          // softmax log-sum-exp: [B, H, T]
  unless_full(n * s.C, z.storage);        // x_mid
  unless_full(n, z.stats);                // ln2 mean/rstd
  unless_full(n, z.stats);
  if_none(n * s.C, z.storage);  // ln2_out
  if (!moe) {
    unless_full(n * s.F1, z.storage);  // fc1 output
    if_none(n * s.F, z.storage);       // activation output
    return t;
  }
  const double rows = static_cast<double>(s.E * s.capacity(N));
  unless_full(n * s.E, z.storage);       // router logits
  unless_full(n * s.E, z.stats);         // probs
  unless_full(n * s.K, 4);               // expert index
  unless_full(n * s.K, z.stats);         // gates
  unless_full(n * s.K, 4);               // slot
  unless_full(s.E, 4);                   // counts
  unless_full(s.E, z.stats);             // load
  unless_full(rows * s.C, z.storage);    // expert_in
  unless_full(rows * s.C, z.storage);    // expert_out
  unless_full(rows * s.EF1, z.storage);  // expert fc1 output
  if_none(rows * s.EF, z.storage);       // expert activation output
  return t;
}

struct StageShape {
  int first_layer = 0, layers = 0, moe_layers = 0;
  bool first = false, last = false;
};

StageShape stage_shape(const recipe::Recipe& r, int stage, int pp) {
  StageShape st;
  st.layers = r.model.layers / pp;
  st.first_layer = stage * st.layers;
  for (int i = st.first_layer; i < st.first_layer + st.layers; ++i)
    st.moe_layers += r.is_moe_layer(i) ? 1 : 0;
  st.first = stage == 0;
  st.last = stage == pp - 1;
  return st;
}

MemoryEstimate stage_memory(const recipe::Recipe& r, const ModelShape& s, const Sizes& z,
                            const topology::ClusterSpec& cluster, const Layout& lay,
                            const MemoryOptions& options, int stage) {
  const StageShape st = stage_shape(r, stage, lay.pp);
  const int dense_layers = st.layers - st.moe_layers;
  const double tp = lay.tp, b = s.bias ? 1 : 0;
  const double norm = static_cast<double>(s.C) * (s.norm_bias ? 2 : 1);

  // ---- parameters on this GPU (elements) ----
  const double attention =
      2 * norm + (s.W * s.C + b * s.W + s.C * s.H * s.D) / tp + b * s.C;  // proj bias replicated
  const double dense = (s.F1 * s.C + b * s.F1 + s.C * s.F) / tp + b * s.C;
  double shared_params = st.layers * attention + dense_layers * dense +
                         st.moe_layers * static_cast<double>(s.moe_shared);
  const double expert_params = st.moe_layers * static_cast<double>(s.moe_experts) / lay.ep / tp;
  const double vocab_shard = static_cast<double>(s.V * s.C) / tp;
  if (st.first) shared_params += vocab_shard + static_cast<double>(s.wpe);
  if (st.last) {
    shared_params += norm;
    if (!s.tied)
      shared_params += vocab_shard;
    else if (lay.pp > 1)
      shared_params += vocab_shard;  // the last stage keeps its own copy of the tied matrix
  }
  const double elements = shared_params + expert_params;

  MemoryEstimate m;
  m.params = elements * z.storage;
  m.grads = elements * z.grad;
  const double per_element_optimizer = z.master + 2 * z.moment;
  const double shared_shards = lay.zero ? static_cast<double>(lay.dp) * lay.ep : 1.0;
  const double expert_shards = lay.zero ? static_cast<double>(lay.dp) : 1.0;
  m.optimizer =
      per_element_optimizer * (shared_params / shared_shards + expert_params / expert_shards);

  // ---- activations ----
  const int64_t N = int64_t{lay.micro_batch} * s.T;
  const double n = static_cast<double>(N);
  double kept = round64(n * s.C * z.storage) / tp * (st.layers + 1);  // the residual stream
  kept += 2 * round64(n * 4);                                         // tokens, targets
  double shared_peak = 0;
  if (dense_layers > 0) {
    const Tally d = block_activations(s, z, false, lay.recompute, N, lay.tp);
    kept += d.kept * dense_layers;
    shared_peak = std::max(shared_peak, d.shared);
  }
  if (st.moe_layers > 0) {
    const Tally e = block_activations(s, z, true, lay.recompute, N, lay.tp);
    kept += e.kept * st.moe_layers;
    shared_peak = std::max(shared_peak, e.shared);
  }
  if (st.last)
    kept += (2 * round64(n * z.stats) + round64(n * s.C * z.storage)) / tp;  // final norm

  double scratch = 0;
  auto take = [&](double count, double size) { scratch += round64(count * size) / tp; };
  if (st.last) {
    take(n * s.V, z.storage);  // logits
    take(n, z.stats);          // lse
    take(n, z.stats);          // losses
    take(n * s.V, z.storage);  // dlogits
  }
  take(n * s.C, z.storage);  // d_lnf_out (allocated by every stage of the engine's layout)
  for (int i = 0; i < 4; ++i)
    take(n * s.C, z.storage);  // branch, d_resid, d_ln_out, d_norm_in
  if (s.rope) take(n * s.W, z.storage);
  take(n * s.H * s.D, z.storage);
  take(n * s.W, z.storage);
  if (s.rope) take(n * s.W, z.storage);
  if (dense_layers > 0) {
    take(n * s.F, z.storage);
    take(n * s.F1, z.storage);
  }
  if (st.moe_layers > 0) {
    const double rows = static_cast<double>(s.E * s.capacity(N));
    take(rows * s.C, z.storage);
    take(rows * s.C, z.storage);
    take(n * s.K, z.stats);
    take(n * s.E, z.storage);
    take(n * s.C, z.storage);
    take(rows * s.EF, z.storage);
    take(rows * s.EF1, z.storage);
  }

  // 1F1B: stage i has min(pp - i, micro-batches per step) forwards outstanding at its peak.
  const int micro_batches =
      std::max(1, r.training.global_batch / (lay.micro_batch * lay.dp * lay.ep));
  m.in_flight = std::min(lay.pp - stage, micro_batches);
  m.activations_kept = kept * m.in_flight;
  m.activations = m.activations_kept + shared_peak + scratch;

  // ---- communication buffers and framework overhead ----
  const double hidden_bytes = n * s.C * z.storage;
  if (lay.tp > 1) m.comm_buffers += 2 * hidden_bytes;       // sequence-parallel all-gather in/out
  if (lay.pp > 1) m.comm_buffers += 2 * hidden_bytes / tp;  // send and receive
  if (lay.dp * lay.ep > 1) m.comm_buffers += 2 * std::min(m.grads, kBucketElements * z.grad);
  if (lay.ep > 1 && st.moe_layers > 0)
    m.comm_buffers += 2 * static_cast<double>(s.E * s.capacity(N)) * s.C * z.storage / tp;
  m.overhead = options.overhead_bytes >= 0 ? options.overhead_bytes
               : cluster.gpus_per_node > 0 ? 1.0 * kGiB
                                           : 0.0;
  m.worst_stage = stage;
  return m;
}

}  // namespace

MemoryEstimate estimate_memory(const recipe::Recipe& recipe, const topology::ClusterSpec& cluster,
                               const Layout& layout, const MemoryOptions& options) {
  const ModelShape s = shape_of(recipe);
  const Sizes z = sizes_of(recipe.precision.compute);
  // The first stage holds the embedding and the most micro-batches in flight, the last the head
  // and the logits; middle stages are dominated by the first (same layers, more in flight).
  MemoryEstimate worst = stage_memory(recipe, s, z, cluster, layout, options, 0);
  if (layout.pp > 1) {
    // MoE layers may fall unevenly across stages: check every stage when the model has them.
    for (int stage = 1; stage < layout.pp; ++stage) {
      if (s.moe_layers == 0 && stage != layout.pp - 1) continue;
      MemoryEstimate m = stage_memory(recipe, s, z, cluster, layout, options, stage);
      if (m.total() > worst.total()) worst = m;
    }
  }
  return worst;
}

}  // namespace trainctl::planner
