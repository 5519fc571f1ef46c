#include <algorithm>

#include "model/transformer_impl.hpp"

namespace trainctl::model {

// Bump allocator over one allocation, run twice: first to measure (null pointers), then for real.
// `mark/rewind` lets tensors shared by all layers (recomputed ones) reuse the same bytes.
class Arena {
 public:
  Arena(char* base, bool measuring) : base_(base), measuring_(measuring) {}
  Tensor take(DType dtype, Shape shape) {
    Tensor t;
    t.dtype = dtype;
    t.shape = shape;
    t.data = measuring_ ? nullptr : base_ + used_;
    used_ += (t.bytes() + 63) / 64 * 64;
    peak_ = std::max(peak_, used_);
    return t;
  }
  size_t used() const { return used_; }
  size_t peak() const { return peak_; }
  void rewind(size_t to) { used_ = to; }

 private:
  char* base_;
  bool measuring_;
  size_t used_ = 0;
  size_t peak_ = 0;
};

// Gives every activation tensor its place. `kept` grows (per slot); `shared` is rewound for
// each layer of each slot, so tensors that are recomputed in backward occupy the bytes of one
// layer only; `scratch` is shared by all layers and slots.
void Transformer::Impl::assign(Arena& kept, Arena& shared, Arena& scratch) {
  const DType S = cfg.storage, A = backend::stats_dtype(S);
  const int64_t tps = par.tp_size();
  const int64_t C = cfg.hidden, D = cfg.head_dim(), H = cfg.heads / tps, KV = cfg.kv_heads / tps;
  const int64_t W = (H + 2 * KV) * D;
  const int64_t dense_F = cfg.ffn_hidden / tps, dense_F1 = cfg.fc1_rows(cfg.ffn_hidden) / tps;
  const int64_t expert_F = cfg.expert_ffn() / tps, expert_F1 = cfg.fc1_rows(cfg.expert_ffn()) / tps;
  const bool full = par.layout.recompute == trainctl::Recompute::full;
  const bool none = par.layout.recompute == trainctl::Recompute::none;
  auto keep_unless_full = [&](DType dt, Shape s) {
    return full ? shared.take(dt, s) : kept.take(dt, s);
  };
  auto keep_if_none = [&](DType dt, Shape s) {
    return none ? kept.take(dt, s) : shared.take(dt, s);
  };

  slots.assign(static_cast<size_t>(par.activation_slots), Slot{});
  // Every dense layer has the same FFN shape and every MoE layer the same expert shapes. With
  // chunks a slot serves any of them: its j-th layer holds what the j-th layer of every chunk
  // needs (a dense MLP's, an MoE's, or both when the chunks differ there).
  const int depth = max_chunk_layers();
  std::vector<const Block*> dense_at(static_cast<size_t>(depth)),
      moe_at(static_cast<size_t>(depth));
  for (int c = 0; c < num_chunks(); ++c)
    for (int j = 0; j < chunk_layers(c); ++j) {
      const Block& b = blocks[chunk_begin[static_cast<size_t>(c)] + static_cast<size_t>(j)];
      (b.mlp ? dense_at : moe_at)[static_cast<size_t>(j)] = &b;
    }
  int64_t expert_rows = 0;
  for (Slot& slot : slots) {
    for (int l = 0; l <= depth; ++l)
      slot.resid.push_back(kept.take(S, {rows, C}));
    if (num_chunks() > 1) slot.grad_in = kept.take(S, {rows, C});
    slot.tokens = kept.take(DType::i32, {N});
    slot.targets = kept.take(DType::i32, {N});
    if (tp_on() && par.last_stage()) {
      slot.local_targets = kept.take(DType::i32, {N});
      slot.lse = kept.take(A, {N});
    }
    slot.acts.assign(static_cast<size_t>(depth), BlockActs{});
    for (size_t i = 0; i < slot.acts.size(); ++i) {
      BlockActs& a = slot.acts[i];
      shared.rewind(0);
      a.x_in = slot.resid[i];
      a.x_out = slot.resid[i + 1];
      a.ln1_s = {keep_unless_full(A, {rows}), keep_unless_full(A, {rows})};
      a.ln1_out = keep_if_none(S, {rows, C});
      a.attn_s = {keep_unless_full(S, {N, W}), keep_unless_full(S, {N, H * D}),
                  keep_unless_full(A, {B, H, T})};
      a.x_mid = keep_unless_full(S, {rows, C});
      a.ln2_s = {keep_unless_full(A, {rows}), keep_unless_full(A, {rows})};
      a.ln2_out = keep_if_none(S, {rows, C});
      if (par.split_backward) a.attn_w = {kept.take(S, {N, C})};
      if (dense_at[i]) {
        a.mlp_s = {keep_unless_full(S, {N, dense_F1}), keep_if_none(S, {N, dense_F})};
        if (par.split_backward) a.mlp_w = {kept.take(S, {N, C})};
      }
      if (const Block* moe = moe_at[i]) {
        const Block& b = *moe;
        // Context parallel: the route covers the micro-batch (every cp rank's tokens), the
        // buffers this rank's tokens, at most N per expert.
        const int64_t E = cfg.moe.experts, k = cfg.moe.top_k, routed = routed_tokens();
        const int64_t cap = cp_on() ? std::min(b.moe->capacity(routed), N) : b.moe->capacity(N);
        backend::RouterArgs& r = a.moe_s.route;
        r.logits = keep_unless_full(S, {routed, E});
        r.probs = keep_unless_full(A, {routed, E});
        r.expert_idx = keep_unless_full(DType::i32, {routed, k});
        r.gates = keep_unless_full(A, {routed, k});
        r.slot = keep_unless_full(DType::i32, {routed, k});
        r.counts = keep_unless_full(DType::i32, {E});
        r.load = keep_unless_full(A, {E});
        r.top_k = k;
        r.renormalize = cfg.moe.router == model::MoeRouter::softmax_topk_renorm;
        r.capacity = b.moe->capacity(routed);
        a.moe_s.capacity = cap;
        a.moe_s.slot = cp_on() ? keep_unless_full(DType::i32, {N, k}) : r.slot;
        a.moe_s.gates = cp_on() ? keep_unless_full(A, {N, k}) : r.gates;
        a.moe_s.expert_in = keep_unless_full(S, {E * cap, C});
        a.moe_s.expert_out = keep_unless_full(S, {E * cap, C});
        a.moe_s.expert = {keep_unless_full(S, {E * cap, expert_F1}),
                          keep_if_none(S, {E * cap, expert_F})};
        if (par.split_backward) a.moe_w = {kept.take(S, {E * cap, C})};
        expert_rows = E * cap;
      }
    }
    if (par.last_stage()) {
      slot.lnf_s = {kept.take(A, {rows}), kept.take(A, {rows})};
      slot.lnf_out = kept.take(S, {rows, C});
    }
  }

  // Scratch shared by forward and backward of all layers.
  if (par.last_stage()) {
    logits = scratch.take(S, {N, local_vocab});
    lse = scratch.take(A, {N});
    losses = scratch.take(A, {N});
    dlogits = scratch.take(S, {N, local_vocab});
    d_lnf_out = scratch.take(S, {rows, C});
  }
  branch = scratch.take(S, {rows, C});
  d_resid = scratch.take(S, {rows, C});
  d_ln_out = scratch.take(S, {rows, C});
  d_norm_in = scratch.take(S, {rows, C});
  if (cp_on()) {  // the ring's blocks and accumulators, and the positions
    const int64_t KVW = 2 * KV * D;
    cp.kv[0] = scratch.take(S, {N, KVW});
    cp.kv[1] = scratch.take(S, {N, KVW});
    cp.dkv[0] = scratch.take(A, {N, KVW});
    cp.dkv[1] = scratch.take(A, {N, KVW});
    cp.dkv_local = scratch.take(A, {N, KVW});
    cp.out = scratch.take(A, {N, H * D});
    cp.dq = scratch.take(A, {N, H * D});
    cp.dqkv = scratch.take(A, {N, W});
    cp.positions = scratch.take(DType::i32, {T});
    cp.ring_positions.clear();
    for (int r = 0; r < par.cp_size(); ++r)
      cp.ring_positions.push_back(scratch.take(DType::i32, {T}));
    if (par.first_stage() && cfg.position == PositionKind::learned) {
      row_positions = scratch.take(DType::i32, {N});
      position_rows = scratch.take(S, {N, C});
    }
  }
  if (tp.split_rows()) {
    tp.gathered = scratch.take(S, {N, C});
    tp.partial = scratch.take(S, {N, C});
    tp.norm_grads = scratch.take(store.grad_dtype(), {2 * C});
  }
  if (tp_on()) tp.ones = scratch.take(S, {std::max(N, expert_rows)});
  if (tp_on() && cfg.fp8 != Fp8Mode::none)
    tp.amax = scratch.take(DType::f32, {TensorParallel::kMaxAmax});
  const bool rope = cfg.position == PositionKind::rope;
  attn_scratch = {rope ? scratch.take(S, {N, W}) : Tensor{}, scratch.take(S, {N, H * D}),
                  scratch.take(S, {N, W}), rope ? scratch.take(S, {N, W}) : Tensor{}};
  const bool any_dense =
      std::any_of(blocks.begin(), blocks.end(), [](const Block& b) { return b.mlp.has_value(); });
  if (any_dense) mlp_scratch = {scratch.take(S, {N, dense_F}), scratch.take(S, {N, dense_F1})};
  if (expert_rows > 0) {
    const int64_t R = expert_rows;
    moe_scratch.dexpert_in = scratch.take(S, {R, C});
    moe_scratch.dexpert_out = scratch.take(S, {R, C});
    moe_scratch.dgates = scratch.take(A, {N, cfg.moe.top_k});
    moe_scratch.dlogits = scratch.take(S, {N, cfg.moe.experts});
    moe_scratch.dx_router = scratch.take(S, {N, C});
    moe_scratch.expert = {scratch.take(S, {R, expert_F}), scratch.take(S, {R, expert_F1})};
    if (par.ep_size() > 1) {
      moe_scratch.send = scratch.take(S, {R, C});
      moe_scratch.recv = scratch.take(S, {R, C});
    }
    if (moe_cp.active()) {  // the micro-batch's logits and gate gradients, and the row maps
      const int64_t routed = routed_tokens(), E = cfg.moe.experts, k = cfg.moe.top_k;
      moe_cp.logits = scratch.take(S, {routed, E});
      moe_cp.dgates = scratch.take(A, {routed, k});
      moe_cp.dgates_whole = scratch.take(A, {routed, k});
      moe_cp.dlogits_whole = scratch.take(S, {routed, E});
      moe_cp.to_whole = scratch.take(DType::i32, {routed});
      moe_cp.own = scratch.take(DType::i32, {N});
    }
  }
}

void Transformer::Impl::plan_activations() {
  Arena kept(nullptr, true), shared(nullptr, true), scratch(nullptr, true);
  assign(kept, shared, scratch);
  bytes.kept = kept.peak();
  bytes.scratch = shared.peak() + scratch.peak();
  memory = be.allocate(kept.peak() + shared.peak() + scratch.peak());
  char* base = static_cast<char*>(memory.data());
  Arena kept2(base, false), shared2(base + kept.peak(), false),
      scratch2(base + kept.peak() + shared.peak(), false);
  assign(kept2, shared2, scratch2);
  if (tp_on()) be.fill(tp.ones, 1.0);
  if (cp_on()) {
    const std::vector<int32_t>& mine = cp_local;
    be.copy_from_host(cp.positions, mine.data());
    for (int r = 0; r < par.cp_size(); ++r)
      be.copy_from_host(cp.ring_positions[static_cast<size_t>(r)], cp_positions(r).data());
    if (!row_positions.empty()) {
      std::vector<int32_t> rows;
      for (int64_t b = 0; b < B; ++b)
        rows.insert(rows.end(), mine.begin(), mine.end());
      be.copy_from_host(row_positions, rows.data());
    }
    if (moe_cp.active()) {  // rank r's rows of sequence b sit at b * seq_len + its positions
      std::vector<int32_t> to_whole;
      for (int r = 0; r < par.cp_size(); ++r) {
        const std::vector<int32_t> theirs = cp_positions(r);
        for (int64_t b = 0; b < B; ++b)
          for (const int32_t t : theirs)
            to_whole.push_back(static_cast<int32_t>(b * cfg.seq_len + t));
      }
      const auto mine_begin = to_whole.begin() + static_cast<std::ptrdiff_t>(par.cp_rank() * N);
      moe_cp.own_host.assign(mine_begin, mine_begin + static_cast<std::ptrdiff_t>(N));
      be.copy_from_host(moe_cp.to_whole, to_whole.data());
      be.copy_from_host(moe_cp.own, moe_cp.own_host.data());
    }
  }
}

}  // namespace trainctl::model
