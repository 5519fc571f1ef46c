// The memory model: bytes per rank by category, for one rank (estimate_rank_memory) or the worst
// rank of a layout (estimate_memory). It follows what lib/model and lib/train allocate, tensor by
// tensor, so each figure can be held to the engine exactly (tests/unit/planner_memory_test.cpp
// builds the engine for every rank of tp, pp, dp/ZeRO-1/ZeRO-2 and ep layouts and compares):
//   params/grads  the rank's ParamTable (build_param_table): its stage's layers, tp shards of the
//                 column/row-parallel matrices and the vocabulary, its ep share of the experts;
//                 ZeRO-2's grads: the rank's part, the embedding/final norm/head whole and two
//                 slots of the largest block (ParamStore's sharded gradients); ZeRO-3's params
//                 the same way (its sharded values);
//   optimizer     its part of the ZeRO partition (model::zero_partition, the engine's own
//                 function: dp parts cut at row boundaries of the flat buffer), all of it
//                 without ZeRO, times the optimizer's moments (train::optimizer_moments; 2 bytes
//                 each with state_dtype bf16); Muon's and Adafactor's own buffers
//                 (train::Optimizer::bytes);
//   activations   Transformer::assign(): every tensor of every activation slot (the
//                 schedule's micro-batches in flight on the stage; with ZB-H1 each slot also
//                 keeps the output gradients its weight-gradient pass W needs) rounded to 64 bytes
//                 as the arena does.
// Tensor parallelism shards only what the engine shards: qkv, attention output, MLP/expert hidden
// and the logits. The engine has no sequence parallelism, so [N, C] tensors (residual stream,
// norm outputs) are whole on every tp rank (Korthikanti et al. 2022's sbh(10 + 24/t), not 34/t;
// no [T, T] score matrix is kept, so their 5as/h term does not appear).
#include <algorithm>
#include <cmath>

#include "model/zero_partition.hpp"
#include "planner/planner.hpp"
#include "planner/shape.hpp"

namespace trainctl::planner {

namespace {

double round64(double bytes) {
  return std::ceil(bytes / 64.0) * 64.0;
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// model::ParamStore::kGradSlots and kValueSlots (the planner does not link the model): ZeRO-2's
// gradient slots and ZeRO-3's value slots, each of the largest block.
constexpr int64_t kGradSlots = 2, kValueSlots = 2;

struct StageShape {
  std::vector<StageLayers> chunks;  // the rank's layers: one range, or one per virtual stage
  std::vector<int> layer_list;      // all of them, ascending
  int layers = 0, moe_layers = 0;
  bool first = false, last = false;
};

// The rank's layers (stage_layers: model::chunk_ranges; chunk c of rank `stage` is virtual stage
// c * pp + stage) and where the embedding and head are.
StageShape stage_shape(const recipe::Recipe& r, int stage, const Variant& lay) {
  StageShape st;
  for (int c = 0; c < lay.pp_virtual; ++c) {
    const StageLayers chunk = stage_layers(r, c * lay.pp + stage, lay.pp * lay.pp_virtual);
    st.chunks.push_back(chunk);
    for (int i = chunk.first; i < chunk.first + chunk.count; ++i) {
      st.layer_list.push_back(i);
      st.moe_layers += r.model.is_moe_layer(i) ? 1 : 0;
    }
  }
  st.layers = static_cast<int>(st.layer_list.size());
  st.first = stage == 0;
  st.last = stage == lay.pp - 1;
  return st;
}

// The rank's parameter tensors in build_param_table's order (tp and ep shards local), as elements
// and rows: ZeRO cuts the flat buffer at their row boundaries.
// `blocks` (when given) receives [begin, end) of each block of the stage in the flat buffer.
using ElementRange = std::pair<int64_t, int64_t>;
std::vector<model::TensorRows> local_params(const recipe::Recipe& r, const ModelShape& s,
                                            const StageShape& st, const Variant& lay,
                                            std::vector<ElementRange>* blocks = nullptr) {
  int64_t offset = 0;  // of the next tensor
  const int64_t t = lay.tp, C = s.C, b = s.bias ? 1 : 0;
  std::vector<model::TensorRows> out;
  auto add = [&](int64_t rows, int64_t row_elements) {
    out.push_back({rows * row_elements, rows});
    offset += rows * row_elements;
  };
  auto norm = [&] {
    add(C, 1);
    if (s.norm_bias) add(C, 1);
  };
  if (st.first) {
    add(s.V / t, C);
    if (s.learned_positions) add(s.T, C);
  }
  for (const int i : st.layer_list) {
    const int64_t block_begin = offset;
    norm();
    add(s.W / t, C);
    if (b) add(s.W / t, 1);
    add(C, s.H * s.D / t);
    if (b) add(C, 1);
    norm();
    if (r.model.is_moe_layer(i)) {
      const int64_t experts = s.E / lay.ep;
      add(s.E, C);  // router, replicated
      add(experts, s.EF1 / t * C);
      if (b) add(experts, s.EF1 / t);
      add(experts, C * (s.EF / t));
      if (b) add(experts, C);
    } else {
      add(s.F1 / t, C);
      if (b) add(s.F1 / t, 1);
      add(C, s.F / t);
      if (b) add(C, 1);
    }
    if (blocks) blocks->emplace_back(block_begin, offset);
  }
  if (st.last) {
    norm();
    if (!s.tied || lay.pp > 1) add(s.V / t, C);  // lm_head, or the last stage's tied copy
  }
  return out;
}

struct Tally {
  double kept = 0, shared = 0;
};

// Rows per expert of a MoE layer's buffers (lib/model assign()): the capacity for N tokens; under
// context parallelism, where the route covers the micro-batch's N * cp tokens and the buffers
// this rank's N, the capacity for N * cp but at most N (a token takes an expert once).
int64_t expert_capacity(const ModelShape& s, int64_t N, int cp) {
  return cp > 1 ? std::min(s.capacity(N * cp), N) : s.capacity(N);
}

// One block's activations for one micro-batch of N tokens on one tp rank, split into what stays
// until backward (kept) and what the recompute region reuses across layers (shared), as assign()
// does. Only the head-, ffn- and expert-ffn-wide tensors are tp shards; the norms and the
// residual stream hold R token rows (N, or N / tp with sequence parallelism).
// `common_only`: the norms' and attention's part alone (every layer has it).
Tally block_activations(const ModelShape& s, const Sizes& z, bool moe, trainctl::Recompute mode,
                        int64_t N, int64_t R, int tp, int cp, bool common_only = false) {
  const bool full = mode == trainctl::Recompute::full;
  const bool none = mode == trainctl::Recompute::none;
  Tally t;
  auto unless_full = [&](double elements, double size) {
    (full ? t.shared : t.kept) += round64(elements * size);
  };
  auto if_none = [&](double elements, double size) {
    (none ? t.kept : t.shared) += round64(elements * size);
  };
  const double n = static_cast<double>(N), r = static_cast<double>(R);
  const double W = static_cast<double>(s.W / tp), HD = static_cast<double>(s.H / tp * s.D);
  unless_full(r, z.stats);  // ln1 mean/rstd
  unless_full(r, z.stats);
  if_none(r * s.C, z.storage);                              // ln1_out
  unless_full(n * W, z.storage);                            // qkv
  unless_full(n * HD, z.storage);                           // attention output
  unless_full(n * static_cast<double>(s.H / tp), z.stats);  // log-sum-exp [B, H, T]: N rows
  unless_full(r * s.C, z.storage);                          // x_mid
  unless_full(r, z.stats);                                  // ln2 mean/rstd
  unless_full(r, z.stats);
  if_none(r * s.C, z.storage);  // ln2_out
  if (common_only) return t;
  if (!moe) {
    unless_full(n * static_cast<double>(s.F1 / tp), z.storage);  // fc1 output
    if_none(n * static_cast<double>(s.F / tp), z.storage);       // activation output
    return t;
  }
  // The route covers the micro-batch: under cp, every cp rank's tokens.
  const double routed = n * cp;
  const double rows = static_cast<double>(s.E * expert_capacity(s, N, cp));  // every expert's
  unless_full(routed * s.E, z.storage);                                      // router logits
  unless_full(routed * s.E, z.stats);                                        // probs
  unless_full(routed * s.K, 4);                                              // expert index
  unless_full(routed * s.K, z.stats);                                        // gates
  unless_full(routed * s.K, 4);                                              // slot
  unless_full(s.E, 4);                                                       // counts
  unless_full(s.E, z.stats);                                                 // load
  if (cp > 1) {
    unless_full(n * s.K, 4);        // this rank's tokens' slots
    unless_full(n * s.K, z.stats);  // and gates
  }
  unless_full(rows * s.C, z.storage);                              // expert_in
  unless_full(rows * s.C, z.storage);                              // expert_out
  unless_full(rows * static_cast<double>(s.EF1 / tp), z.storage);  // expert fc1 output
  if_none(rows * static_cast<double>(s.EF / tp), z.storage);       // expert activation
  return t;
}

// ZB-H1's stash (a split backward): what B leaves in a slot for W, per layer, kept until the
// micro-batch's W: the output gradients of the block's GEMMs. Those of qkv, fc1, the router and
// the experts' fc1 take the places of saved activations of their shape that are dead by then
// (layers.hpp); proj's, fc2's and the experts' fc2 ones are kept apart. (With sequence
// parallelism W gathers the inputs it multiplies them with again: nothing more is kept.)
// `common_only`: the attention part alone (every layer has it); else with the dense MLP's or the
// MoE's part.
double split_backward_stash(const ModelShape& s, const Sizes& z, bool moe, int64_t N, int cp,
                            bool common_only = false) {
  const double n = static_cast<double>(N);
  auto take = [&](double rows, double columns) { return round64(rows * columns * z.storage); };
  double bytes = take(n, s.C);  // proj output gradient
  if (common_only) return bytes;
  if (!moe) return bytes + take(n, s.C);  // fc2 output gradient
  // Every expert's fc2 output gradients.
  return bytes + take(static_cast<double>(s.E * expert_capacity(s, N, cp)), s.C);
}

// Scratch shared by all layers and slots of the stage (assign()'s third arena).
double stage_scratch(const ModelShape& s, const Sizes& z, const StageShape& st, const Variant& lay,
                     int64_t N, int64_t R) {
  const int t = lay.tp;
  const double n = static_cast<double>(N), r = static_cast<double>(R);
  const int dense_layers = st.layers - st.moe_layers;
  const int64_t expert_rows = st.moe_layers > 0 ? s.E * expert_capacity(s, N, lay.cp) : 0;
  double scratch = 0;
  auto take = [&](double count, double size) { scratch += round64(count * size); };
  if (st.last) {
    take(n * static_cast<double>(s.V / t), z.storage);  // logits (this rank's vocab shard)
    take(n, z.stats);                                   // lse
    take(n, z.stats);                                   // losses
    take(n * static_cast<double>(s.V / t), z.storage);  // dlogits
    take(r * s.C, z.storage);                           // d_lnf_out
  }
  // (The gradients exchanged with the neighbouring stages travel in the slots' own tensors.)
  for (int i = 0; i < 4; ++i)
    take(r * s.C, z.storage);  // branch, d_resid, d_ln_out, d_norm_in
  if (R < N) {                 // sequence parallel
    take(n * s.C, z.storage);  // a GEMM's gathered input or output gradient
    take(n * s.C, z.storage);  // the partial sums before a reduce-scatter
    take(2.0 * s.C, z.grad);   // a norm's weight and bias gradients
  }
  if (t > 1) take(static_cast<double>(std::max(N, expert_rows)), z.storage);  // ones (bias grads)
  const double W = static_cast<double>(s.W / t), HD = static_cast<double>(s.H / t * s.D);
  if (lay.cp > 1) {  // the ring's key/value blocks and accumulators, and the positions
    const double kv = static_cast<double>(2 * s.KV / t * s.D);
    take(n * kv, z.storage);  // the block held
    take(n * kv, z.storage);  // the block arriving
    take(n * kv, z.stats);    // their gradients
    take(n * kv, z.stats);
    take(n * kv, z.stats);  // this rank's share of the held block's gradients
    take(n * HD, z.stats);  // the running output
    take(n * HD, z.stats);  // dq
    take(n * W, z.stats);   // the assembled dqkv
    const double local_tokens = static_cast<double>(N / lay.micro_batch);
    for (int rank = 0; rank <= lay.cp; ++rank)
      take(local_tokens, 4);  // this rank's positions, and every rank's
    if (st.first && s.learned_positions) {
      take(n, 4);                // each row's global position
      take(n * s.C, z.storage);  // wpe's rows at those positions
    }
  }
  if (s.rope) take(n * W, z.storage);
  take(n * HD, z.storage);
  take(n * W, z.storage);
  if (s.rope) take(n * W, z.storage);
  if (dense_layers > 0) {
    take(n * static_cast<double>(s.F / t), z.storage);
    take(n * static_cast<double>(s.F1 / t), z.storage);
  }
  if (st.moe_layers > 0) {
    const double rows = static_cast<double>(expert_rows);
    take(rows * s.C, z.storage);  // dexpert_in
    take(rows * s.C, z.storage);  // dexpert_out
    take(n * s.K, z.stats);       // dgates
    take(n * s.E, z.storage);     // router dlogits
    take(n * s.C, z.storage);     // dx_router
    take(rows * static_cast<double>(s.EF / t), z.storage);
    take(rows * static_cast<double>(s.EF1 / t), z.storage);
    if (lay.ep > 1) {
      take(rows * s.C, z.storage);  // all-to-all send
      take(rows * s.C, z.storage);  // all-to-all receive
    }
    if (lay.cp > 1) {  // the micro-batch's gathered logits and gate gradients, the row maps
      const double routed = n * lay.cp;
      take(routed * s.E, z.storage);  // gathered logits
      take(routed * s.K, z.stats);    // gathered gate gradients
      take(routed * s.K, z.stats);    // in the micro-batch's order
      take(routed * s.E, z.storage);  // the router's logit gradients
      take(routed, 4);                // each gathered row's place in the micro-batch
      take(n, 4);                     // this rank's rows
    }
  }
  return scratch;
}

// `zero_rank` < 0: the dp rank with the largest optimizer part.
MemoryEstimate rank_memory(const recipe::Recipe& r, const ModelShape& s, const Sizes& z,
                           const topology::ClusterSpec& cluster, const Variant& lay,
                           const MemoryOptions& options, int stage, int zero_rank) {
  const StageShape st = stage_shape(r, stage, lay);
  MemoryEstimate m;
  m.worst_stage = stage;

  // ---- parameters, gradients, optimizer state ----
  std::vector<ElementRange> blocks;
  const std::vector<model::TensorRows> tensors = local_params(r, s, st, lay, &blocks);
  int64_t elements = 0, tied_elements = 0;
  for (const model::TensorRows& x : tensors)
    elements += x.numel;
  if (s.tied && lay.pp > 1 && (st.first || st.last)) tied_elements = s.V / lay.tp * s.C;
  int64_t block_elements = 0, largest_block = 0;
  for (const auto& [begin, end] : blocks) {
    block_elements += end - begin;
    largest_block = std::max(largest_block, end - begin);
  }
  // ZeRO shards over the gradient group: the dp ranks and their context-parallel peers.
  const int zero_group = lay.dp * lay.cp;
  const bool zero = lay.zero && zero_group > 1, zero2 = lay.zero >= 2, zero3 = lay.zero >= 3;
  const bool cpu = cluster.cpu_only();
  // ZeRO-2 and 3 sum the block and outer gradients in precision.reduce_dtype: with bf16 GradSync
  // keeps a bf16 copy of a block per slot and of an outer region, and receives bf16 shares.
  const bool converts = zero2 && r.precision.reduce_dtype == recipe::ReduceDtype::bf16;
  const double reduce_item = converts ? 2.0 : z.grad;
  int64_t largest_region = 0;
  if (converts) {
    const int64_t front = blocks.empty() ? elements : blocks.front().first;
    const int64_t back = blocks.empty() ? 0 : elements - blocks.back().second;
    largest_region = std::max<int64_t>({1, front, back});
  }
  // The optimizer's per-element state (train::optimizer_moments), and its own buffers
  // (train::Optimizer::bytes). Muon's: u of the part, the table gathered over the ZeRO group, the
  // global tensor of the largest weight split over tp or ep, and Newton-Schulz's iterate and two
  // Gram matrices for the largest matrix (q, k and v apart).
  const int moments = train::optimizer_moments(r.optimizer);
  // Their element size: G's, or 2 bytes with optimizer.state_dtype bf16.
  const double moment_item = r.optimizer.state_dtype == train::StateDtype::bf16 ? 2.0 : z.moment;
  double own_fixed = 0;
  if (r.optimizer.name == recipe::OptimizerName::muon) {
    int64_t largest_global = 1, largest_matrix = 1, largest_gram = 1;
    auto matrix = [&](int64_t rows, int64_t cols) {
      largest_matrix = std::max(largest_matrix, rows * cols);
      largest_gram = std::max(largest_gram, std::min(rows, cols) * std::min(rows, cols));
    };
    for (const int i : st.layer_list) {
      matrix(s.H * s.D, s.C);
      matrix(s.KV * s.D, s.C);
      matrix(s.C, s.H * s.D);
      if (lay.tp > 1) largest_global = std::max({largest_global, s.W * s.C, s.C * s.H * s.D});
      if (r.model.is_moe_layer(i)) {
        matrix(s.EF1, s.C);
        matrix(s.C, s.EF);
        if (lay.tp > 1 || lay.ep > 1)
          largest_global = std::max({largest_global, s.E * s.EF1 * s.C, s.E * s.C * s.EF});
      } else {
        matrix(s.F1, s.C);
        matrix(s.C, s.F);
        if (lay.tp > 1) largest_global = std::max({largest_global, s.F1 * s.C, s.C * s.F});
      }
    }
    own_fixed = static_cast<double>((zero ? elements : 0) + largest_global + largest_matrix +
                                    2 * largest_gram) *
                z.grad;
  }
  // Adafactor (train::Optimizer::bytes): its statistics, R + C numbers per matrix (each expert's
  // apart) and n per vector, whole on every rank holding part of the parameter; the update of the
  // part; the table gathered over the ZeRO group; the global tensor of the largest parameter
  // split over tp or ep.
  if (r.optimizer.name == recipe::OptimizerName::adafactor) {
    const int64_t t = lay.tp, local_experts = s.E / lay.ep;
    int64_t stats = 0, largest_global = 1;
    // A parameter of global shape [rows, cols] (rows 0: a vector of cols), `subs` of them on this
    // rank (experts), split over tp or ep when `split`.
    auto add = [&](int64_t rows, int64_t cols, int64_t subs, bool split, int64_t experts = 1) {
      stats += subs * (rows > 0 ? rows + cols : cols);
      if (split)
        largest_global = std::max(largest_global, experts * std::max<int64_t>(rows, 1) * cols);
    };
    auto norm = [&] {
      add(0, s.C, 1, false);
      if (s.norm_bias) add(0, s.C, 1, false);
    };
    if (st.first) {
      add(s.V, s.C, 1, t > 1);
      if (s.learned_positions) add(s.T, s.C, 1, false);
    }
    for (const int i : st.layer_list) {
      norm();
      add(s.W, s.C, 1, t > 1);
      if (s.bias) add(0, s.W, 1, t > 1);
      add(s.C, s.H * s.D, 1, t > 1);
      if (s.bias) add(0, s.C, 1, false);
      norm();
      if (r.model.is_moe_layer(i)) {
        const bool split = t > 1 || lay.ep > 1;
        add(s.E, s.C, 1, false);
        add(s.EF1, s.C, local_experts, split, s.E);
        if (s.bias) add(0, s.EF1, local_experts, split, s.E);
        add(s.C, s.EF, local_experts, split, s.E);
        if (s.bias) add(0, s.C, local_experts, lay.ep > 1, s.E);
      } else {
        add(s.F1, s.C, 1, t > 1);
        if (s.bias) add(0, s.F1, 1, t > 1);
        add(s.C, s.F, 1, t > 1);
        if (s.bias) add(0, s.C, 1, false);
      }
    }
    if (st.last) {
      norm();
      if (!s.tied || lay.pp > 1) add(s.V, s.C, 1, t > 1);
    }
    own_fixed =
        static_cast<double>(std::max<int64_t>(stats, 1) + (zero ? elements : 0) + largest_global) *
        z.grad;
  }
  auto own_bytes = [&](int64_t p) {
    return own_fixed > 0 ? own_fixed + static_cast<double>(p) * z.grad : 0.0;
  };
  // What depends on the rank's dp coordinate: its part `p` of the ZeRO partition and, for
  // ZeRO-2 and 3, the largest share `b` of one block and `o` of an outer region (embedding before
  // the blocks, final norm and head after them) that falls in that part.
  struct Sharded {
    double params = 0, optimizer = 0, grads = 0, comm = 0;
  };
  // ParamStore's sharded buffers: the part, the outer regions whole and `slots` slots of the
  // largest block.
  auto sharded_buffer = [&](int64_t p, int64_t slots) {
    return static_cast<double>(p + (elements - block_elements) + slots * largest_block);
  };
  auto sharded = [&](int64_t p, int64_t b, int64_t o) {
    Sharded x;
    x.params = (zero3 ? sharded_buffer(p, kValueSlots) : static_cast<double>(elements)) * z.storage;
    x.optimizer = static_cast<double>(p) * (z.master + moments * moment_item) +
                  own_bytes(std::max<int64_t>(p, 1));
    x.grads = (zero2 ? sharded_buffer(p, kGradSlots) : static_cast<double>(elements)) * z.grad;
    if (zero) {
      // GradSync's buffer of the part it reduces into and gathers from (ZeRO-1 and 2; ZeRO-3
      // gathers from the values' own part), and with ZeRO-2 and 3 one received block share per
      // gradient slot.
      x.comm = static_cast<double>(zero3 ? 0 : p) * z.grad +
               static_cast<double>(zero2 ? kGradSlots * std::max<int64_t>(b, 1) : 0) * reduce_item;
      if (converts)
        x.comm += static_cast<double>(kGradSlots * std::max<int64_t>(largest_block, 1) +
                                      largest_region + std::max<int64_t>(o, 1)) *
                  reduce_item;
      // Gloo has no reduce-scatter: ours receives every rank's copy of its share and sums
      // locally (NCCL reduces in place). ZeRO-1: the part (an upper bound with
      // overlap_grad_sync, whose reduce-scatters receive one bucket's share at a time); ZeRO-2:
      // a block at a time (on the background group with overlap) and the outer regions after
      // backward (on dp).
      if (cpu)
        x.comm += zero2 ? static_cast<double>(b + o) * zero_group * reduce_item
                        : static_cast<double>(p) * zero_group * z.grad;
    }
    return x;
  };
  Sharded mine = sharded(elements, 0, 0);
  if (zero) {
    const std::vector<int64_t> bounds = model::zero_partition(tensors, zero_group);
    const std::vector<size_t> parts = model::zero_shares(bounds, 0, elements);
    std::vector<int64_t> block_shares(static_cast<size_t>(zero_group)), outer_shares(block_shares);
    // The ranks a range overlaps are consecutive: from the part holding its first element on.
    auto largest_share = [&](int64_t begin, int64_t end, std::vector<int64_t>& shares) {
      if (end <= begin) return;
      size_t k = static_cast<size_t>(std::upper_bound(bounds.begin(), bounds.end(), begin) -
                                     bounds.begin()) -
                 1;
      for (; k + 1 < bounds.size() && bounds[k] < end; ++k)
        shares[k] = std::max(shares[k], std::min(end, bounds[k + 1]) - std::max(begin, bounds[k]));
    };
    for (const auto& [begin, end] : blocks)
      largest_share(begin, end, block_shares);
    largest_share(0, blocks.empty() ? elements : blocks.front().first, outer_shares);
    largest_share(blocks.empty() ? elements : blocks.back().second, elements, outer_shares);
    // The rank asked for, or the one whose rank-dependent bytes add up most.
    double most = -1;
    for (int k = 0; k < zero_group; ++k) {
      if (zero_rank >= 0 && k != zero_rank) continue;
      const size_t i = static_cast<size_t>(k);
      const Sharded x = sharded(static_cast<int64_t>(parts[i]), block_shares[i], outer_shares[i]);
      if (x.params + x.optimizer + x.grads + x.comm > most) {
        most = x.params + x.optimizer + x.grads + x.comm;
        mine = x;
      }
    }
  }
  m.params = mine.params;
  m.optimizer = mine.optimizer;
  m.grads = mine.grads;

  // ---- activations: activation_slots copies of the kept set, one shared set, the scratch ----
  // Context parallel: a rank holds seq_len / cp tokens of each sequence.
  const int64_t N = int64_t{lay.micro_batch} * (s.T / lay.cp);
  const bool sp = lay.sequence_parallel && lay.tp > 1;
  const int64_t R = sp ? N / lay.tp : N;  // token rows of the residual stream and the norms
  const double n = static_cast<double>(N), rows = static_cast<double>(R);
  // A slot serves any chunk: its j-th layer holds what the j-th layer of every chunk needs (a
  // dense MLP's, an MoE's, or both where the chunks differ), as assign() lays it out.
  int depth = 0;
  for (const StageLayers& chunk : st.chunks)
    depth = std::max(depth, chunk.count);
  std::vector<char> dense_at(static_cast<size_t>(depth), 0), moe_at(static_cast<size_t>(depth), 0);
  for (const StageLayers& chunk : st.chunks)
    for (int j = 0; j < chunk.count; ++j)
      (r.model.is_moe_layer(chunk.first + j) ? moe_at : dense_at)[static_cast<size_t>(j)] = 1;
  const int dense_positions = static_cast<int>(std::count(dense_at.begin(), dense_at.end(), 1));
  const int moe_positions = static_cast<int>(std::count(moe_at.begin(), moe_at.end(), 1));
  double kept = round64(rows * s.C * z.storage) * (depth + 1);               // the residual stream
  if (lay.pp_virtual > 1) kept += round64(rows * s.C * z.storage);           // the input's gradient
  kept += 2 * round64(n * 4);                                                // tokens, targets
  if (lay.tp > 1 && st.last) kept += round64(n * 4) + round64(n * z.stats);  // local targets, lse
  double shared_peak = 0;
  // The norms and attention are every layer's; the MLP's or MoE's part where a chunk has one.
  const Tally d = dense_positions > 0
                      ? block_activations(s, z, false, lay.recompute, N, R, lay.tp, lay.cp)
                      : Tally{};
  const Tally e = moe_positions > 0
                      ? block_activations(s, z, true, lay.recompute, N, R, lay.tp, lay.cp)
                      : Tally{};
  const Tally common = block_activations(s, z, false, lay.recompute, N, R, lay.tp, lay.cp, true);
  kept += common.kept * depth + (d.kept - common.kept) * dense_positions +
          (e.kept - common.kept) * moe_positions;
  if (splits_backward(lay.pp_schedule)) {  // ZB-H1: every slot also holds its W's inputs
    const double stash = split_backward_stash(s, z, false, N, lay.cp, true);
    kept += stash * depth;
    if (dense_positions > 0)
      kept += (split_backward_stash(s, z, false, N, lay.cp) - stash) * dense_positions;
    if (moe_positions > 0)
      kept += (split_backward_stash(s, z, true, N, lay.cp) - stash) * moe_positions;
  }
  // The shared region is rewound per layer: its peak is the largest layer's.
  for (int j = 0; j < depth; ++j)
    shared_peak = std::max(shared_peak,
                           common.shared +
                               (dense_at[static_cast<size_t>(j)] ? d.shared - common.shared : 0.0) +
                               (moe_at[static_cast<size_t>(j)] ? e.shared - common.shared : 0.0));
  if (st.last) kept += 2 * round64(rows * z.stats) + round64(rows * s.C * z.storage);  // final norm

  // The schedule's slots (pipeline_slots): 1F1B's stage i has min(pp - i, micro-batches per step)
  // forwards outstanding at its peak; interleaved more, each of a chunk; ZB-H1 min(pp,
  // micro-batches) on every stage (a slot is held from the forward to the W).
  const PipelineShape pipeline = lay.pipeline(r);
  m.in_flight = pipeline.problem().empty()
                    ? schedule_slots(pipeline, stage)
                    : std::max(1, std::min(lay.pp - stage, pipeline.micro_batches));
  m.activations_kept = kept * m.in_flight;
  m.activations = m.activations_kept + shared_peak + stage_scratch(s, z, st, lay, N, R);

  // ---- buffers of the collectives (lib/train GradSync, lib/comm, the vocab-parallel loss) ----
  // Gradients are all-reduced in place; GradSync keeps the ZeRO buffers above and one for the
  // tied embedding's peer gradient (first and last stage): the peer arrives while background
  // reduce-scatters still write the part.
  m.comm_buffers += mine.comm + static_cast<double>(tied_elements) * z.grad;
  // Gloo keeps one receive buffer per group, as large as its largest use. Over tp: it all-reduces
  // 16-bit tensors through an f32 copy (an [N, C] activation or gradient without sequence
  // parallelism, on a MoE stage the [E * capacity, C] expert outputs), and it receives every
  // rank's [N / tp, C] share of a sequence-parallel reduce-scatter before summing them.
  if (cpu && lay.tp > 1) {
    const int64_t expert_rows = st.moe_layers > 0 ? s.E * expert_capacity(s, N, lay.cp) : 0;
    double largest = 0;
    if (z.storage == 2)
      largest = static_cast<double>(std::max<int64_t>(sp ? 0 : N, expert_rows) * s.C) * 4;
    if (sp) largest = std::max(largest, n * s.C * z.storage);
    m.comm_buffers += largest;
  }
  // The vocab-parallel loss combines the shards' log-sum-exp on the host: int32 local targets,
  // four f64 [N] vectors, the gathered [tp, N] and a float copy. An upper bound (not all live at
  // once); host memory on a GPU machine too.
  if (lay.tp > 1 && st.last) m.comm_buffers += n * (4 + 8 * (4 + lay.tp) + 4);
  m.overhead = options.overhead_bytes >= 0 ? options.overhead_bytes
               : !cluster.cpu_only()       ? 1.0 * kGiB
                                           : 0.0;
  return m;
}

}  // namespace

MemoryEstimate estimate_rank_memory(const recipe::Recipe& recipe,
                                    const topology::ClusterSpec& cluster, const Variant& layout,
                                    const Coordinates& at, const MemoryOptions& options) {
  return rank_memory(recipe, shape_of(recipe), sizes_of(recipe.model.storage), cluster, layout,
                     options, at.pp, group_rank(layout, at, {Axis::dp, Axis::cp}));
}

MemoryEstimate estimate_memory(const recipe::Recipe& recipe, const topology::ClusterSpec& cluster,
                               const Variant& layout, const MemoryOptions& options) {
  const ModelShape s = shape_of(recipe);
  const Sizes z = sizes_of(recipe.model.storage);
  // Stages differ in layers, embedding (first), head and logits (last) and micro-batches in
  // flight; tp and ep ranks of a stage hold equal shards; dp ranks differ only in their ZeRO part
  // (the largest is taken).
  // A stage whose layers are the previous stage's shifted (the same count, MoE where it had MoE)
  // and which holds neither end holds the same tensors and, under 1F1B and ZB-H1, no more
  // micro-batches in flight (min(pp - i, m), min(pp, m)): it cannot be the worst, so only the
  // first of such a run is built (a deep pipeline has many).
  const bool monotone = layout.pp_schedule != PipeSchedule::interleaved;
  auto pattern = [&](int stage) {
    const StageLayers l = stage_layers(recipe, stage, layout.pp);
    std::vector<bool> moe;
    for (int i = l.first; i < l.first + l.count; ++i)
      moe.push_back(recipe.model.is_moe_layer(i));
    return moe;
  };
  MemoryEstimate worst = rank_memory(recipe, s, z, cluster, layout, options, 0, -1);
  std::vector<bool> previous = monotone ? pattern(0) : std::vector<bool>{};
  for (int stage = 1; stage < layout.pp; ++stage) {
    if (monotone) {
      std::vector<bool> here = pattern(stage);
      const bool same = here == previous && stage > 1 && stage < layout.pp - 1;
      previous = std::move(here);
      if (same) continue;
    }
    MemoryEstimate m = rank_memory(recipe, s, z, cluster, layout, options, stage, -1);
    if (m.total() > worst.total()) worst = m;
  }
  return worst;
}

}  // namespace trainctl::planner
