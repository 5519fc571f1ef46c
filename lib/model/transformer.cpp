#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>

#include "model/layers.hpp"
#include "model/model.hpp"

namespace trainctl::model {

namespace {

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

}  // namespace

// One layer of this stage: its parameters (views into the ParamStore) and global index.
struct Block {
  int layer = 0;
  Norm ln1, ln2;
  Attention attn;
  std::optional<Mlp> mlp;
  std::optional<Moe> moe;
};

// What one block keeps between forward and backward of one micro-batch (views into the arena).
struct BlockActs {
  Tensor x_in, x_out, x_mid, ln1_out, ln2_out;
  Norm::Saved ln1_s, ln2_s;
  Attention::Saved attn_s;
  Mlp::Saved mlp_s;
  Moe::Saved moe_s;
};

// The activations of one micro-batch in flight (a pipeline stage holds several).
struct Slot {
  std::vector<Tensor> resid;  // stage layers + 1 residual-stream tensors [N, C]
  Tensor tokens, targets;     // [N] i32, global ids
  Tensor local_targets;       // [N] i32, tp: targets inside this vocab shard, else -1
  Tensor lse;                 // [N] A, tp: log-sum-exp over the whole vocabulary
  Norm::Saved lnf_s;
  Tensor lnf_out;
  std::vector<BlockActs> acts;
  int64_t valid_targets = 0;
  bool have_forward = false;
};

struct Transformer::Impl {
  ModelConfig cfg;
  Backend& be;
  ModelParallel par;
  int64_t B, T, N;
  StageRange stage;
  ParamStore store;
  Param wte, wpe, head;
  std::vector<Block> blocks;
  Norm final_norm;
  TensorParallel tp;
  int64_t vocab_begin = 0, local_vocab = 0;

  // Activations and scratch.
  backend::Allocation memory;
  ActivationBytes bytes;
  std::vector<Slot> slots;
  Tensor logits, lse, losses, dlogits, d_lnf_out;
  Tensor branch, d_resid, d_ln_out, d_norm_in, out_grad, in_grad;
  Attention::Scratch attn_scratch;
  Mlp::Scratch mlp_scratch;
  Moe::Scratch moe_scratch;
  int logits_slot = -1;  // whose logits `logits` holds (the last stage recomputes them if not)

  Impl(const ModelConfig& config, Backend& backend, int64_t micro_batch,
       const ModelParallel& parallel)
      : cfg(config),
        be(backend),
        par(parallel),
        B(micro_batch),
        T(config.seq_len),
        N(micro_batch * config.seq_len),
        stage(checked_stage(config, parallel)),
        store(backend, build_param_table(config, parallel), config.storage, parallel.zero_parts,
              parallel.zero_rank) {
    if (B < 1) throw std::invalid_argument("micro_batch must be >= 1");
    if (par.activation_slots < 1)
      throw std::invalid_argument("activation_slots = " + std::to_string(par.activation_slots) +
                                  " must be >= 1");
    if (par.tp && par.tp->size() > 1) tp.comm = par.tp;
    local_vocab = cfg.vocab / par.tp_size();
    vocab_begin = par.tp_rank() * local_vocab;
    build_layers();
    plan_activations();
  }

  static StageRange checked_stage(const ModelConfig& config, const ModelParallel& parallel) {
    config.check();
    const auto ranges = stage_ranges(config.layers, parallel.pp_size, parallel.stage_layers);
    if (parallel.pp_rank < 0 || parallel.pp_rank >= parallel.pp_size)
      throw std::invalid_argument("pp_rank " + std::to_string(parallel.pp_rank) +
                                  " outside [0, pp_size = " + std::to_string(parallel.pp_size) +
                                  ")");
    return ranges[static_cast<size_t>(parallel.pp_rank)];
  }

  bool tp_on() const { return tp.active(); }
  int num_layers() const { return stage.end - stage.first; }

  Param param(const std::string& name) const { return store.param(name); }
  Param optional_param(const std::string& name) const {
    return store.table().contains(name) ? param(name) : Param{};
  }
  Linear linear(const std::string& prefix) const {
    return Linear{param(prefix + ".weight"), optional_param(prefix + ".bias")};
  }
  Norm norm(const std::string& prefix) const {
    return Norm{cfg.norm, param(prefix + ".weight"), optional_param(prefix + ".bias"),
                cfg.norm_eps};
  }

  // Expert e's [rows, cols] matrix inside a stacked [E, rows, cols] (or [E, n]) parameter.
  static Param expert_slice(const Param& stacked, int64_t e) {
    if (stacked.value.empty()) return {};
    const Shape& s = stacked.value.shape;
    Shape one = s.rank == 3 ? Shape{s[1], s[2]} : Shape{s[1]};
    return Param{stacked.value.rows(e, 1).reshaped(one), stacked.grad.rows(e, 1).reshaped(one)};
  }

  void build_layers() {
    const int64_t tps = par.tp_size();
    if (par.first_stage()) {
      wte = param("embed.wte");
      wpe = optional_param("embed.wpe");
    }
    if (par.last_stage()) {
      // With tied embeddings the head is embed.wte: the table's own, or the last stage's copy.
      head = cfg.tied_embeddings ? param("embed.wte") : param("lm_head.weight");
      final_norm = norm("final_norm");
    }
    blocks.resize(static_cast<size_t>(num_layers()));
    for (int i = stage.first; i < stage.end; ++i) {
      Block& b = blocks[static_cast<size_t>(i - stage.first)];
      b.layer = i;
      const std::string l = "layers." + std::to_string(i);
      b.ln1 = norm(l + ".attn_norm");
      b.ln2 = norm(l + ".mlp_norm");
      b.attn = Attention{linear(l + ".attn.qkv"), linear(l + ".attn.proj"),
                         cfg.heads / tps,         cfg.kv_heads / tps,
                         cfg.head_dim(),          cfg.position == PositionKind::rope,
                         cfg.rope_theta,          &tp};
      if (cfg.is_moe_layer(i)) {
        Moe moe;
        moe.router = Linear{param(l + ".moe.router.weight"), Param{}};
        const Linear fc1 = linear(l + ".moe.fc1"), fc2 = linear(l + ".moe.fc2");
        const int64_t local_experts = fc1.weight.value.shape[0];
        for (int64_t e = 0; e < local_experts; ++e) {
          // Under tp the fc2 bias is added by the Moe after the reduce over tp, not by the expert.
          const Param fc2_bias = expert_slice(fc2.bias, e);
          moe.experts.push_back(
              Mlp{Linear{expert_slice(fc1.weight, e), expert_slice(fc1.bias, e)},
                  Linear{expert_slice(fc2.weight, e), tp_on() ? Param{} : fc2_bias}, cfg.activation,
                  nullptr});
          moe.fc2_bias.push_back(fc2_bias);
        }
        moe.total_experts = cfg.moe.experts;
        moe.top_k = cfg.moe.top_k;
        moe.capacity_factor = cfg.moe.capacity_factor;
        moe.aux_loss_coef = cfg.moe.aux_loss_coef;
        moe.z_loss_coef = cfg.moe.z_loss_coef;
        moe.tp = &tp;
        moe.ep = par.ep && par.ep->size() > 1 ? par.ep : nullptr;
        b.moe = std::move(moe);
      } else {
        b.mlp = Mlp{linear(l + ".mlp.fc1"), linear(l + ".mlp.fc2"), cfg.activation, &tp};
      }
    }
  }

  // Gives every activation tensor its place. `kept` grows (per slot); `shared` is rewound for
  // each layer of each slot, so tensors that are recomputed in backward occupy the bytes of one
  // layer only; `scratch` is shared by all layers and slots.
  void assign(Arena& kept, Arena& shared, Arena& scratch) {
    const DType S = cfg.storage, A = backend::stats_dtype(S);
    const int64_t tps = par.tp_size();
    const int64_t C = cfg.hidden, D = cfg.head_dim(), H = cfg.heads / tps, KV = cfg.kv_heads / tps;
    const int64_t W = (H + 2 * KV) * D;
    const int64_t dense_F = cfg.ffn_hidden / tps, dense_F1 = cfg.fc1_rows(cfg.ffn_hidden) / tps;
    const int64_t expert_F = cfg.expert_ffn() / tps,
                  expert_F1 = cfg.fc1_rows(cfg.expert_ffn()) / tps;
    const bool full = cfg.recompute == RecomputeMode::full;
    const bool none = cfg.recompute == RecomputeMode::none;
    auto keep_unless_full = [&](DType dt, Shape s) {
      return full ? shared.take(dt, s) : kept.take(dt, s);
    };
    auto keep_if_none = [&](DType dt, Shape s) {
      return none ? kept.take(dt, s) : shared.take(dt, s);
    };

    slots.assign(static_cast<size_t>(par.activation_slots), Slot{});
    // Every dense layer has the same FFN shape and every MoE layer the same expert shapes.
    int64_t expert_rows = 0;
    for (Slot& slot : slots) {
      for (int l = 0; l <= num_layers(); ++l)
        slot.resid.push_back(kept.take(S, {N, C}));
      slot.tokens = kept.take(DType::i32, {N});
      slot.targets = kept.take(DType::i32, {N});
      if (tp_on() && par.last_stage()) {
        slot.local_targets = kept.take(DType::i32, {N});
        slot.lse = kept.take(A, {N});
      }
      slot.acts.assign(blocks.size(), BlockActs{});
      for (size_t i = 0; i < blocks.size(); ++i) {
        const Block& b = blocks[i];
        BlockActs& a = slot.acts[i];
        shared.rewind(0);
        a.x_in = slot.resid[i];
        a.x_out = slot.resid[i + 1];
        a.ln1_s = {keep_unless_full(A, {N}), keep_unless_full(A, {N})};
        a.ln1_out = keep_if_none(S, {N, C});
        a.attn_s = {keep_unless_full(S, {N, W}), keep_unless_full(S, {N, H * D}),
                    keep_unless_full(A, {B, H, T})};
        a.x_mid = keep_unless_full(S, {N, C});
        a.ln2_s = {keep_unless_full(A, {N}), keep_unless_full(A, {N})};
        a.ln2_out = keep_if_none(S, {N, C});
        if (b.mlp) {
          a.mlp_s = {keep_unless_full(S, {N, dense_F1}), keep_if_none(S, {N, dense_F})};
        } else {
          const int64_t E = cfg.moe.experts, k = cfg.moe.top_k, cap = b.moe->capacity(N);
          backend::RouterArgs& r = a.moe_s.route;
          r.logits = keep_unless_full(S, {N, E});
          r.probs = keep_unless_full(A, {N, E});
          r.expert_idx = keep_unless_full(DType::i32, {N, k});
          r.gates = keep_unless_full(A, {N, k});
          r.slot = keep_unless_full(DType::i32, {N, k});
          r.counts = keep_unless_full(DType::i32, {E});
          r.load = keep_unless_full(A, {E});
          r.top_k = k;
          r.capacity = cap;
          a.moe_s.expert_in = keep_unless_full(S, {E * cap, C});
          a.moe_s.expert_out = keep_unless_full(S, {E * cap, C});
          a.moe_s.expert = {keep_unless_full(S, {E * cap, expert_F1}),
                            keep_if_none(S, {E * cap, expert_F})};
          expert_rows = E * cap;
        }
      }
      if (par.last_stage()) {
        slot.lnf_s = {kept.take(A, {N}), kept.take(A, {N})};
        slot.lnf_out = kept.take(S, {N, C});
      }
    }

    // Scratch shared by forward and backward of all layers.
    if (par.last_stage()) {
      logits = scratch.take(S, {N, local_vocab});
      lse = scratch.take(A, {N});
      losses = scratch.take(A, {N});
      dlogits = scratch.take(S, {N, local_vocab});
      d_lnf_out = scratch.take(S, {N, C});
    }
    branch = scratch.take(S, {N, C});
    d_resid = scratch.take(S, {N, C});
    d_ln_out = scratch.take(S, {N, C});
    d_norm_in = scratch.take(S, {N, C});
    if (!par.last_stage()) out_grad = scratch.take(S, {N, C});
    if (!par.first_stage()) in_grad = scratch.take(S, {N, C});
    if (tp_on()) tp.ones = scratch.take(S, {std::max(N, expert_rows)});
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
    }
  }

  void plan_activations() {
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
  }

  backend::RouterLosses block_forward(const Block& b, BlockActs& a) {
    b.ln1.forward(be, a.ln1_out, a.ln1_s, a.x_in);
    b.attn.forward(be, branch, a.ln1_out, B, T, a.attn_s, attn_scratch);
    be.add(a.x_mid, a.x_in, branch);
    b.ln2.forward(be, a.ln2_out, a.ln2_s, a.x_mid);
    backend::RouterLosses losses;
    if (b.mlp)
      b.mlp->forward(be, branch, a.ln2_out, a.mlp_s);
    else
      losses = b.moe->forward(be, branch, a.ln2_out, a.moe_s, moe_scratch);
    be.add(a.x_out, a.x_mid, branch);
    return losses;
  }

  void block_recompute(const Block& b, BlockActs& a) {
    if (cfg.recompute == RecomputeMode::full) {
      block_forward(b, a);
    } else if (cfg.recompute == RecomputeMode::selective) {
      b.ln1.forward(be, a.ln1_out, a.ln1_s, a.x_in);
      b.ln2.forward(be, a.ln2_out, a.ln2_s, a.x_mid);
      if (b.mlp)
        b.mlp->activate(be, a.mlp_s);
      else
        b.moe->activate(be, a.moe_s);
    }
  }

  // d_resid: in, gradient w.r.t. the block output; out, w.r.t. the block input.
  void block_backward(const Block& b, const BlockActs& a, double grad_scale) {
    if (b.mlp)
      b.mlp->backward(be, d_ln_out, d_resid, a.ln2_out, a.mlp_s, mlp_scratch);
    else
      b.moe->backward(be, d_ln_out, d_resid, a.ln2_out, a.moe_s, moe_scratch, grad_scale);
    b.ln2.backward(be, d_norm_in, d_ln_out, a.x_mid, a.ln2_s);
    be.accumulate(d_resid, d_norm_in);
    b.attn.backward(be, d_ln_out, d_resid, a.ln1_out, B, T, a.attn_s, attn_scratch);
    b.ln1.backward(be, d_norm_in, d_ln_out, a.x_in, a.ln1_s);
    be.accumulate(d_resid, d_norm_in);
  }

  Slot& slot_at(int slot, const char* what) {
    if (slot < 0 || slot >= par.activation_slots)
      throw std::out_of_range(
          std::string("Transformer::") + what + ": slot " + std::to_string(slot) +
          " outside [0, activation_slots = " + std::to_string(par.activation_slots) + ")");
    return slots[static_cast<size_t>(slot)];
  }

  // Vocab-parallel cross-entropy: each tp rank scores its shard of the logits; the log-sum-exp
  // of the whole vocabulary and the target logit are combined across tp from [N] vectors, never
  // from the logits. Returns the summed loss over the valid targets.
  double vocab_parallel_loss(Slot& s, const int32_t* host_targets) {
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

  std::vector<double> to_host(const Tensor& t) {
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
  void from_host(const Tensor& t, const std::vector<double>& values) {
    if (t.dtype == DType::f64) {
      be.copy_from_host(t, values.data());
    } else {
      const std::vector<float> f32(values.begin(), values.end());
      be.copy_from_host(t, f32.data());
    }
  }

  void head_forward(const Slot& s) { Linear{head, Param{}}.forward(be, logits, s.lnf_out); }

  ForwardResult forward(const int32_t* host_tokens, const int32_t* host_targets, int slot_index) {
    Slot& s = slot_at(slot_index, "forward");
    s.valid_targets = 0;
    for (int64_t i = 0; i < N; ++i) {
      if (host_tokens[i] < 0 || host_tokens[i] >= cfg.vocab || host_targets[i] >= cfg.vocab)
        throw std::out_of_range(
            "token id " + std::to_string(std::max(host_tokens[i], host_targets[i])) +
            " at position " + std::to_string(i) + " is outside the vocabulary [0, " +
            std::to_string(cfg.vocab) + ")");
      s.valid_targets += host_targets[i] >= 0;
    }
    be.copy_from_host(s.tokens, host_tokens);
    be.copy_from_host(s.targets, host_targets);
    if (par.first_stage()) {
      if (!tp_on()) {
        be.embedding_forward(s.resid[0], s.tokens, wte.value, wpe.value, T);
      } else {
        // Each rank looks up its vocabulary rows (zeros elsewhere); positions are added by tp
        // rank 0 only, so the sum over tp holds them once.
        be.embedding_forward_shard(s.resid[0], s.tokens, wte.value,
                                   tp.comm->rank() == 0 ? wpe.value : Tensor{}, T, vocab_begin);
        tp.all_reduce(s.resid[0]);
      }
    }

    ForwardResult result;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const Block& b = blocks[i];
      BlockActs& a = s.acts[i];
      const backend::RouterLosses l = block_forward(b, a);
      if (b.moe) {
        result.aux_loss += l.aux_loss;
        result.z_loss += l.z_loss;
        result.expert_load.push_back(to_host(a.moe_s.route.load));
        int64_t kept_assignments = 0;
        for (int32_t c : a.moe_s.counts)
          kept_assignments += c;
        result.dropped_tokens.push_back(N * cfg.moe.top_k - kept_assignments);
        result.moe_layers.push_back(b.layer);
      }
    }
    if (par.last_stage()) {
      final_norm.forward(be, s.lnf_out, s.lnf_s, s.resid.back());
      head_forward(s);
      logits_slot = slot_index;
      double total = 0;
      if (!tp_on()) {
        be.cross_entropy_forward(losses, lse, logits, s.targets);
        total = be.sum(losses);
      } else {
        total = vocab_parallel_loss(s, host_targets);
      }
      result.loss = s.valid_targets ? total / static_cast<double>(s.valid_targets) : 0.0;
    }
    result.objective =
        result.loss + cfg.moe.aux_loss_coef * result.aux_loss + cfg.moe.z_loss_coef * result.z_loss;
    s.have_forward = true;
    return result;
  }

  void backward(double grad_scale, int slot_index) {
    Slot& s = slot_at(slot_index, "backward");
    if (!s.have_forward)
      throw std::logic_error("Transformer::backward called without forward (slot " +
                             std::to_string(slot_index) + ")");
    s.have_forward = false;
    if (par.last_stage()) {
      const double ce_scale =
          s.valid_targets ? grad_scale / static_cast<double>(s.valid_targets) : 0.0;
      if (logits_slot != slot_index) head_forward(s);  // another slot's forward came in between
      logits_slot = slot_index;
      if (!tp_on())
        be.cross_entropy_backward(dlogits, logits, lse, s.targets, ce_scale);
      else
        be.cross_entropy_backward_shard(dlogits, logits, s.lse, s.targets, vocab_begin, ce_scale);
      Linear{head, Param{}}.backward(be, d_lnf_out, dlogits, s.lnf_out);
      tp.all_reduce(d_lnf_out);  // the head is column-parallel over the vocabulary
      final_norm.backward(be, d_resid, d_lnf_out, s.resid.back(), s.lnf_s);
    } else {
      be.cast(d_resid, out_grad);
    }
    for (size_t i = blocks.size(); i-- > 0;) {
      block_recompute(blocks[i], s.acts[i]);
      block_backward(blocks[i], s.acts[i], grad_scale);
    }
    if (par.first_stage()) {
      if (!tp_on())
        be.embedding_backward(wte.grad, wpe.grad, d_resid, s.tokens, T);
      else
        be.embedding_backward_shard(wte.grad, wpe.grad, d_resid, s.tokens, T, vocab_begin);
    } else {
      be.cast(in_grad, d_resid);
    }
  }

  double forward_flops_per_token() const {
    // The WHOLE model's FLOPs per token, whatever the layout (the trainer divides by the ranks).
    // 2 FLOPs per multiply-add of every matmul a token passes through (MoE: its top_k experts),
    // plus attention scores and values counted as non-causal (PaLM's convention: 4*T*H*D per
    // layer), plus the LM head.
    const double C = cfg.hidden, D = cfg.head_dim();
    double flops = 0;
    for (int i = 0; i < cfg.layers; ++i) {
      flops += 2.0 * C * (cfg.heads + 2.0 * cfg.kv_heads) * D + 2.0 * cfg.heads * D * C;
      if (cfg.is_moe_layer(i)) {
        const double F = cfg.expert_ffn();
        flops += 2.0 * C * cfg.moe.experts;
        flops += cfg.moe.top_k * (2.0 * C * cfg.fc1_rows(cfg.expert_ffn()) + 2.0 * F * C);
      } else {
        flops += 2.0 * C * cfg.fc1_rows(cfg.ffn_hidden) + 2.0 * cfg.ffn_hidden * C;
      }
      flops += 4.0 * T * cfg.heads * D;
    }
    return flops + 2.0 * C * cfg.vocab;
  }
};

Transformer::Transformer(const ModelConfig& config, Backend& backend, int64_t micro_batch,
                         const ModelParallel& parallel)
    : impl_(std::make_unique<Impl>(config, backend, micro_batch, parallel)) {}
Transformer::~Transformer() = default;

ForwardResult Transformer::forward(const int32_t* tokens, const int32_t* targets, int slot) {
  return impl_->forward(tokens, targets, slot);
}
void Transformer::backward(double grad_scale, int slot) {
  impl_->backward(grad_scale, slot);
}
Tensor Transformer::stage_input(int slot) {
  if (impl_->par.first_stage())
    throw std::logic_error("Transformer::stage_input: the first stage embeds its own tokens");
  return impl_->slot_at(slot, "stage_input").resid.front();
}
Tensor Transformer::stage_output(int slot) {
  if (impl_->par.last_stage())
    throw std::logic_error("Transformer::stage_output: the last stage has no next stage");
  return impl_->slot_at(slot, "stage_output").resid.back();
}
Tensor Transformer::output_grad() {
  if (impl_->par.last_stage())
    throw std::logic_error("Transformer::output_grad: the last stage starts from its own loss");
  return impl_->out_grad;
}
Tensor Transformer::input_grad() {
  if (impl_->par.first_stage())
    throw std::logic_error("Transformer::input_grad: the first stage has no previous stage");
  return impl_->in_grad;
}
const ModelParallel& Transformer::parallel() const {
  return impl_->par;
}
ParamStore& Transformer::params() {
  return impl_->store;
}
const ParamStore& Transformer::params() const {
  return impl_->store;
}
const ModelConfig& Transformer::config() const {
  return impl_->cfg;
}
int64_t Transformer::micro_batch() const {
  return impl_->B;
}
ActivationBytes Transformer::activation_bytes() const {
  return impl_->bytes;
}
double Transformer::forward_flops_per_token() const {
  return impl_->forward_flops_per_token();
}

}  // namespace trainctl::model
