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

struct Block {
  Norm ln1, ln2;
  Attention attn;
  std::optional<Mlp> mlp;
  std::optional<Moe> moe;
  // Activations (views into the arena).
  Tensor x_in, x_out, x_mid, ln1_out, ln2_out;
  Norm::Saved ln1_s, ln2_s;
  Attention::Saved attn_s;
  Mlp::Saved mlp_s;
  Moe::Saved moe_s;
};

struct Transformer::Impl {
  ModelConfig cfg;
  Backend& be;
  int64_t B, T, N;
  ParamStore store;
  Param wte, wpe, head;
  std::vector<Block> blocks;
  Norm final_norm;

  // Activations and scratch.
  backend::Allocation memory;
  ActivationBytes bytes;
  std::vector<Tensor> resid;  // L + 1 residual-stream tensors [N, C]
  Tensor tokens, targets;     // [N] i32
  Norm::Saved lnf_s;
  Tensor lnf_out, logits, lse, losses, dlogits, d_lnf_out;
  Tensor branch, d_resid, d_ln_out, d_norm_in;
  Attention::Scratch attn_scratch;
  Mlp::Scratch mlp_scratch;
  Moe::Scratch moe_scratch;

  int64_t valid_targets = 0;
  bool have_forward = false;

  Impl(const ModelConfig& config, Backend& backend, int64_t micro_batch)
      : cfg(config),
        be(backend),
        B(micro_batch),
        T(config.seq_len),
        N(micro_batch * config.seq_len),
        store(backend, build_param_table(config), config.storage) {
    cfg.check();
    if (B < 1) throw std::invalid_argument("micro_batch must be >= 1");
    build_layers();
    plan_activations();
  }

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
    wte = param("embed.wte");
    wpe = optional_param("embed.wpe");
    head = cfg.tied_embeddings ? wte : param("lm_head.weight");
    final_norm = norm("final_norm");
    blocks.resize(static_cast<size_t>(cfg.layers));
    for (int i = 0; i < cfg.layers; ++i) {
      Block& b = blocks[static_cast<size_t>(i)];
      const std::string l = "layers." + std::to_string(i);
      b.ln1 = norm(l + ".attn_norm");
      b.ln2 = norm(l + ".mlp_norm");
      b.attn = Attention{
          linear(l + ".attn.qkv"), linear(l + ".attn.proj"),           cfg.heads,     cfg.kv_heads,
          cfg.head_dim(),          cfg.position == PositionKind::rope, cfg.rope_theta};
      if (cfg.is_moe_layer(i)) {
        Moe moe;
        moe.router = Linear{param(l + ".moe.router.weight"), Param{}};
        const Linear fc1 = linear(l + ".moe.fc1"), fc2 = linear(l + ".moe.fc2");
        for (int64_t e = 0; e < cfg.moe.experts; ++e)
          moe.experts.push_back(Mlp{Linear{expert_slice(fc1.weight, e), expert_slice(fc1.bias, e)},
                                    Linear{expert_slice(fc2.weight, e), expert_slice(fc2.bias, e)},
                                    cfg.activation});
        moe.top_k = cfg.moe.top_k;
        moe.capacity_factor = cfg.moe.capacity_factor;
        moe.aux_loss_coef = cfg.moe.aux_loss_coef;
        moe.z_loss_coef = cfg.moe.z_loss_coef;
        b.moe = std::move(moe);
      } else {
        b.mlp = Mlp{linear(l + ".mlp.fc1"), linear(l + ".mlp.fc2"), cfg.activation};
      }
    }
  }

  // Gives every activation tensor its place. `kept` grows; `shared` is rewound for each layer, so
  // tensors that are recomputed in backward occupy the bytes of one layer only.
  void assign(Arena& kept, Arena& shared, Arena& scratch) {
    const DType S = cfg.storage, A = backend::stats_dtype(S);
    const int64_t C = cfg.hidden, D = cfg.head_dim(), H = cfg.heads, KV = cfg.kv_heads;
    const int64_t W = (H + 2 * KV) * D;
    const bool full = cfg.recompute == RecomputeMode::full;
    const bool none = cfg.recompute == RecomputeMode::none;
    auto keep_unless_full = [&](DType dt, Shape s) {
      return full ? shared.take(dt, s) : kept.take(dt, s);
    };
    auto keep_if_none = [&](DType dt, Shape s) {
      return none ? kept.take(dt, s) : shared.take(dt, s);
    };

    resid.clear();
    for (int l = 0; l <= cfg.layers; ++l)
      resid.push_back(kept.take(S, {N, C}));
    tokens = kept.take(DType::i32, {N});
    targets = kept.take(DType::i32, {N});

    // Every dense layer has the same FFN shape and every MoE layer the same expert shapes.
    int64_t expert_rows = 0;
    for (int i = 0; i < cfg.layers; ++i) {
      Block& b = blocks[static_cast<size_t>(i)];
      shared.rewind(0);
      b.x_in = resid[static_cast<size_t>(i)];
      b.x_out = resid[static_cast<size_t>(i) + 1];
      b.ln1_s = {keep_unless_full(A, {N}), keep_unless_full(A, {N})};
      b.ln1_out = keep_if_none(S, {N, C});
      b.attn_s = {keep_unless_full(S, {N, W}), keep_unless_full(S, {N, H * D}),
                  keep_unless_full(A, {B, H, T})};
      b.x_mid = keep_unless_full(S, {N, C});
      b.ln2_s = {keep_unless_full(A, {N}), keep_unless_full(A, {N})};
      b.ln2_out = keep_if_none(S, {N, C});
      if (b.mlp) {
        const int64_t F = cfg.ffn_hidden, F1 = cfg.fc1_rows(cfg.ffn_hidden);
        b.mlp_s = {keep_unless_full(S, {N, F1}), keep_if_none(S, {N, F})};
      } else {
        const int64_t E = cfg.moe.experts, k = cfg.moe.top_k, cap = b.moe->capacity(N);
        const int64_t F = cfg.expert_ffn(), F1 = cfg.fc1_rows(F);
        backend::RouterArgs& r = b.moe_s.route;
        r.logits = keep_unless_full(S, {N, E});
        r.probs = keep_unless_full(A, {N, E});
        r.expert_idx = keep_unless_full(DType::i32, {N, k});
        r.gates = keep_unless_full(A, {N, k});
        r.slot = keep_unless_full(DType::i32, {N, k});
        r.counts = keep_unless_full(DType::i32, {E});
        r.load = keep_unless_full(A, {E});
        r.top_k = k;
        r.capacity = cap;
        b.moe_s.expert_in = keep_unless_full(S, {E * cap, C});
        b.moe_s.expert_out = keep_unless_full(S, {E * cap, C});
        b.moe_s.expert = {keep_unless_full(S, {E * cap, F1}), keep_if_none(S, {E * cap, F})};
        expert_rows = E * cap;
      }
    }
    lnf_s = {kept.take(A, {N}), kept.take(A, {N})};
    lnf_out = kept.take(S, {N, C});

    // Scratch shared by forward and backward of all layers.
    logits = scratch.take(S, {N, cfg.vocab});
    lse = scratch.take(A, {N});
    losses = scratch.take(A, {N});
    dlogits = scratch.take(S, {N, cfg.vocab});
    d_lnf_out = scratch.take(S, {N, C});
    branch = scratch.take(S, {N, C});
    d_resid = scratch.take(S, {N, C});
    d_ln_out = scratch.take(S, {N, C});
    d_norm_in = scratch.take(S, {N, C});
    const bool rope = cfg.position == PositionKind::rope;
    attn_scratch = {rope ? scratch.take(S, {N, W}) : Tensor{}, scratch.take(S, {N, H * D}),
                    scratch.take(S, {N, W}), rope ? scratch.take(S, {N, W}) : Tensor{}};
    const bool any_dense =
        std::any_of(blocks.begin(), blocks.end(), [](const Block& b) { return b.mlp.has_value(); });
    if (any_dense)
      mlp_scratch = {scratch.take(S, {N, cfg.ffn_hidden}),
                     scratch.take(S, {N, cfg.fc1_rows(cfg.ffn_hidden)})};
    if (expert_rows > 0) {
      const int64_t R = expert_rows, F = cfg.expert_ffn();
      moe_scratch.dexpert_in = scratch.take(S, {R, C});
      moe_scratch.dexpert_out = scratch.take(S, {R, C});
      moe_scratch.dgates = scratch.take(A, {N, cfg.moe.top_k});
      moe_scratch.dlogits = scratch.take(S, {N, cfg.moe.experts});
      moe_scratch.dx_router = scratch.take(S, {N, C});
      moe_scratch.expert = {scratch.take(S, {R, F}), scratch.take(S, {R, cfg.fc1_rows(F)})};
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
  }

  backend::RouterLosses block_forward(Block& b) {
    b.ln1.forward(be, b.ln1_out, b.ln1_s, b.x_in);
    b.attn.forward(be, branch, b.ln1_out, B, T, b.attn_s, attn_scratch);
    be.add(b.x_mid, b.x_in, branch);
    b.ln2.forward(be, b.ln2_out, b.ln2_s, b.x_mid);
    backend::RouterLosses losses;
    if (b.mlp)
      b.mlp->forward(be, branch, b.ln2_out, b.mlp_s);
    else
      losses = b.moe->forward(be, branch, b.ln2_out, b.moe_s);
    be.add(b.x_out, b.x_mid, branch);
    return losses;
  }

  void block_recompute(Block& b) {
    if (cfg.recompute == RecomputeMode::full) {
      block_forward(b);
    } else if (cfg.recompute == RecomputeMode::selective) {
      b.ln1.forward(be, b.ln1_out, b.ln1_s, b.x_in);
      b.ln2.forward(be, b.ln2_out, b.ln2_s, b.x_mid);
      if (b.mlp)
        b.mlp->activate(be, b.mlp_s);
      else
        b.moe->activate(be, b.moe_s);
    }
  }

  // d_resid: in, gradient w.r.t. the block output; out, w.r.t. the block input.
  void block_backward(Block& b, double grad_scale) {
    if (b.mlp)
      b.mlp->backward(be, d_ln_out, d_resid, b.ln2_out, b.mlp_s, mlp_scratch);
    else
      b.moe->backward(be, d_ln_out, d_resid, b.ln2_out, b.moe_s, moe_scratch, grad_scale);
    b.ln2.backward(be, d_norm_in, d_ln_out, b.x_mid, b.ln2_s);
    be.accumulate(d_resid, d_norm_in);
    b.attn.backward(be, d_ln_out, d_resid, b.ln1_out, B, T, b.attn_s, attn_scratch);
    b.ln1.backward(be, d_norm_in, d_ln_out, b.x_in, b.ln1_s);
    be.accumulate(d_resid, d_norm_in);
  }

  ForwardResult forward(const int32_t* host_tokens, const int32_t* host_targets) {
    valid_targets = 0;
    for (int64_t i = 0; i < N; ++i) {
      if (host_tokens[i] < 0 || host_tokens[i] >= cfg.vocab || host_targets[i] >= cfg.vocab)
        throw std::out_of_range(
            "token id " + std::to_string(std::max(host_tokens[i], host_targets[i])) +
            " at position " + std::to_string(i) + " is outside the vocabulary [0, " +
            std::to_string(cfg.vocab) + ")");
      valid_targets += host_targets[i] >= 0;
    }
    be.copy_from_host(tokens, host_tokens);
    be.copy_from_host(targets, host_targets);
    be.embedding_forward(resid[0], tokens, wte.value, wpe.value, T);

    ForwardResult result;
    for (Block& b : blocks) {
      const backend::RouterLosses l = block_forward(b);
      if (b.moe) {
        result.aux_loss += l.aux_loss;
        result.z_loss += l.z_loss;
        std::vector<double> load(static_cast<size_t>(cfg.moe.experts));
        std::vector<float> load32(load.size());
        if (b.moe_s.route.load.dtype == DType::f64)
          be.copy_to_host(load.data(), b.moe_s.route.load);
        else {
          be.copy_to_host(load32.data(), b.moe_s.route.load);
          std::copy(load32.begin(), load32.end(), load.begin());
        }
        result.expert_load.push_back(std::move(load));
        int64_t kept_assignments = 0;
        for (int32_t c : b.moe_s.counts)
          kept_assignments += c;
        result.dropped_tokens.push_back(N * cfg.moe.top_k - kept_assignments);
      }
    }
    final_norm.forward(be, lnf_out, lnf_s, resid.back());
    Linear{head, Param{}}.forward(be, logits, lnf_out);
    be.cross_entropy_forward(losses, lse, logits, targets);
    result.loss = valid_targets ? be.sum(losses) / static_cast<double>(valid_targets) : 0.0;
    result.objective =
        result.loss + cfg.moe.aux_loss_coef * result.aux_loss + cfg.moe.z_loss_coef * result.z_loss;
    have_forward = true;
    return result;
  }

  void backward(double grad_scale) {
    if (!have_forward) throw std::logic_error("Transformer::backward called without forward");
    have_forward = false;
    const double ce_scale = valid_targets ? grad_scale / static_cast<double>(valid_targets) : 0.0;
    be.cross_entropy_backward(dlogits, logits, lse, targets, ce_scale);
    Linear{head, Param{}}.backward(be, d_lnf_out, dlogits, lnf_out);
    final_norm.backward(be, d_resid, d_lnf_out, resid.back(), lnf_s);
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
      block_recompute(*it);
      block_backward(*it, grad_scale);
    }
    be.embedding_backward(wte.grad, wpe.grad, d_resid, tokens, T);
  }

  double forward_flops_per_token() const {
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

Transformer::Transformer(const ModelConfig& config, Backend& backend, int64_t micro_batch)
    : impl_(std::make_unique<Impl>(config, backend, micro_batch)) {}
Transformer::~Transformer() = default;

ForwardResult Transformer::forward(const int32_t* tokens, const int32_t* targets) {
  return impl_->forward(tokens, targets);
}
void Transformer::backward(double grad_scale) {
  impl_->backward(grad_scale);
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
