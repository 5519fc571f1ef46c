#include <algorithm>
#include <stdexcept>

#include "model/transformer_impl.hpp"

namespace trainctl::model {

Transformer::Impl::Impl(const ModelConfig& config, Backend& backend, int64_t micro_batch,
                        const ModelParallel& parallel)
    : cfg(config),
      be(backend),
      par(parallel),
      B(micro_batch),
      T(config.seq_len / parallel.cp_size()),
      N(micro_batch * (config.seq_len / parallel.cp_size())),
      rows(N),
      chunks(checked_chunks(config, parallel)),
      store(backend, build_param_table(config, parallel), config.storage, parallel.zero_parts(),
            parallel.zero_rank(), parallel.shard_grads(), parallel.shard_values(),
            parallel.optimizer_moments) {
  if (B < 1) throw std::invalid_argument("micro_batch must be >= 1");
  if (par.activation_slots < 1)
    throw std::invalid_argument("activation_slots = " + std::to_string(par.activation_slots) +
                                " must be >= 1");
  if (par.tp && par.tp->size() > 1) tp.comm = par.tp;
  if (par.cp && par.cp->size() > 1) {
    const int P = par.cp->size();
    if (cfg.seq_len % (2 * P) != 0)
      throw std::invalid_argument(
          "context parallel cuts each sequence into 2 * cp chunks: seq_len " +
          std::to_string(cfg.seq_len) + " % (2 * cp " + std::to_string(P) +
          ") = " + std::to_string(cfg.seq_len % (2 * P)) + ", must be 0");
    cp.comm = par.cp;
    for (const StageRange& chunk : chunks)
      for (int layer = chunk.first; layer < chunk.end; ++layer)
        if (cfg.is_moe_layer(layer)) moe_cp.comm = par.cp;  // this stage routes
    cp_local = cp_positions(par.cp_rank());
    if (par.cp_background) {
      cp_ring = std::make_unique<comm::BackgroundReducer>(*par.cp_background);
      cp.ring = cp_ring.get();
      cp.backend = &be;
    }
  }
  if (par.layout.sequence_parallel) {
    if (!tp.active())
      throw std::invalid_argument(
          "sequence_parallel needs tp >= 2 (tp = " + std::to_string(par.tp_size()) + ")");
    if (T % par.tp_size() != 0)
      throw std::invalid_argument("sequence_parallel splits each sequence over tp: seq_len " +
                                  std::to_string(T) + " % tp " + std::to_string(par.tp_size()) +
                                  " = " + std::to_string(T % par.tp_size()) + ", must be 0");
    tp.sequence_parallel = true;
    rows = N / par.tp_size();
  }
  if (par.split_backward) {
    // The W pass reads what B left in the slot: kept activations, not recomputed ones, and the
    // block's gradients and values in place (not bound to a ZeRO-2/3 slot for one pass).
    if (par.layout.recompute != trainctl::Recompute::none)
      throw std::invalid_argument(
          "a split backward (pp_schedule zb-h1) needs recompute: none; recompute: " +
          std::string(trainctl::kRecomputeNames[static_cast<size_t>(par.layout.recompute)]) +
          " would run the forward again for the weight-gradient pass");
    if (par.layout.zero >= 2)
      throw std::invalid_argument("a split backward (pp_schedule zb-h1) needs zero <= 1 (got " +
                                  std::to_string(par.layout.zero) +
                                  "): ZeRO-2/3 bind a block's gradients or values for one pass");
    if (chunks.size() != 1)
      throw std::invalid_argument("a split backward (pp_schedule zb-h1) runs one chunk per stage");
  }
  if (cfg.fp8 != Fp8Mode::none && !be.capabilities().fp8)
    throw std::invalid_argument("fp8 GEMMs need a backend with fp8 support; backend '" +
                                std::string(be.name()) +
                                "' has none (Hopper GPUs and the cpu "
                                "backend do): use precision.fp8: none");
  local_vocab = cfg.vocab / par.tp_size();
  vocab_begin = par.tp_rank() * local_vocab;
  build_layers();
  plan_activations();
}

std::vector<StageRange> Transformer::Impl::checked_chunks(const ModelConfig& config,
                                                          const ModelParallel& parallel) {
  config.check();
  return chunk_ranges(config.layers, parallel);
}

int Transformer::Impl::max_chunk_layers() const {
  int most = 0;
  for (int c = 0; c < num_chunks(); ++c)
    most = std::max(most, chunk_layers(c));
  return most;
}

size_t Transformer::Impl::block_of_layer(int layer) const {
  const auto it = std::lower_bound(blocks.begin(), blocks.end(), layer,
                                   [](const Block& b, int l) { return b.layer < l; });
  if (it == blocks.end() || it->layer != layer)
    throw std::logic_error("Transformer: layer " + std::to_string(layer) + " is not on this stage");
  return static_cast<size_t>(it - blocks.begin());
}

// Expert e's [rows, cols] matrix inside a stacked [E, rows, cols] (or [E, n]) parameter.
Param Transformer::Impl::expert_slice(const Param& stacked, int64_t e) {
  if (stacked.value.empty()) return {};
  const Shape& s = stacked.value.shape;
  Shape one = s.rank == 3 ? Shape{s[1], s[2]} : Shape{s[1]};
  // Sharded gradients: no grad until the block's backward binds one.
  return Param{stacked.value.rows(e, 1).reshaped(one),
               stacked.grad.empty() ? Tensor{} : stacked.grad.rows(e, 1).reshaped(one)};
}

void Transformer::Impl::build_layers() {
  if (par.first_stage()) {
    wte = param("embed.wte");
    wpe = optional_param("embed.wpe");
  }
  if (par.last_stage()) {
    // With tied embeddings the head is embed.wte: the table's own, or the last stage's copy.
    head = cfg.tied_embeddings ? param("embed.wte") : param("lm_head.weight");
    final_norm = norm("final_norm");
  }
  chunk_begin.assign(1, 0);
  for (const StageRange& chunk : chunks) {
    for (int i = chunk.first; i < chunk.end; ++i) {
      blocks.emplace_back().layer = i;
      build_block(blocks.size() - 1);
    }
    chunk_begin.push_back(blocks.size());
  }
}

// blocks[index] from the store's views: at construction, and with sharded gradients again when
// its gradients are bound to a slot.
void Transformer::Impl::build_block(size_t index) {
  const int64_t tps = par.tp_size();
  Block& b = blocks[index];
  const int i = b.layer;
  b = Block{};
  b.layer = i;
  const std::string l = "layers." + std::to_string(i);
  b.ln1 = norm(l + ".attn_norm");
  b.ln2 = norm(l + ".mlp_norm");
  b.attn = Attention{linear(l + ".attn.qkv"),
                     linear(l + ".attn.proj"),
                     cfg.heads / tps,
                     cfg.kv_heads / tps,
                     cfg.head_dim(),
                     cfg.position == PositionKind::rope,
                     cfg.rope_theta,
                     &tp,
                     &cp};
  if (cfg.is_moe_layer(i)) {
    Moe moe;
    moe.router = Linear{param(l + ".moe.router.weight"), Param{}};
    const Linear fc1 = linear(l + ".moe.fc1"), fc2 = linear(l + ".moe.fc2");
    const int64_t local_experts = fc1.weight.value.shape[0];
    for (int64_t e = 0; e < local_experts; ++e) {
      // Under tp the fc2 bias is added by the Moe after the reduce over tp, not by the expert.
      const Param fc2_bias = expert_slice(fc2.bias, e);
      moe.experts.push_back(
          Mlp{Linear{expert_slice(fc1.weight, e), expert_slice(fc1.bias, e), cfg.fp8, &tp},
              Linear{expert_slice(fc2.weight, e), tp_on() ? Param{} : fc2_bias, cfg.fp8, &tp},
              cfg.activation, nullptr});
      moe.fc2_bias.push_back(fc2_bias);
    }
    moe.total_experts = cfg.moe.experts;
    moe.top_k = cfg.moe.top_k;
    moe.capacity_factor = cfg.moe.capacity_factor;
    moe.aux_loss_coef = cfg.moe.aux_loss_coef;
    moe.z_loss_coef = cfg.moe.z_loss_coef;
    moe.tp = &tp;
    moe.ep = par.ep && par.ep->size() > 1 ? par.ep : nullptr;
    moe.cp = &moe_cp;
    b.moe = std::move(moe);
  } else {
    b.mlp = Mlp{linear(l + ".mlp.fc1"), linear(l + ".mlp.fc2"), cfg.activation, &tp};
  }
}

backend::RouterLosses Transformer::Impl::block_forward(const Block& b, BlockActs& a) {
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

void Transformer::Impl::block_recompute(const Block& b, BlockActs& a) {
  if (par.layout.recompute == trainctl::Recompute::full) {
    block_forward(b, a);
  } else if (par.layout.recompute == trainctl::Recompute::selective) {
    b.ln1.forward(be, a.ln1_out, a.ln1_s, a.x_in);
    b.ln2.forward(be, a.ln2_out, a.ln2_s, a.x_mid);
    if (b.mlp)
      b.mlp->activate(be, a.mlp_s);
    else
      b.moe->activate(be, a.moe_s);
  }
}

// d_resid: in, gradient w.r.t. the block output; out, w.r.t. the block input. split: the GEMMs'
// weight gradients are left to block_weights (layers.hpp).
void Transformer::Impl::block_backward(const Block& b, const BlockActs& a, double grad_scale,
                                       bool split) {
  if (b.mlp)
    b.mlp->backward(be, d_ln_out, d_resid, a.ln2_out, a.mlp_s, mlp_scratch,
                    split ? &a.mlp_w : nullptr);
  else
    b.moe->backward(be, d_ln_out, d_resid, a.ln2_out, a.moe_s, moe_scratch, grad_scale,
                    split ? &a.moe_w : nullptr);
  b.ln2.backward(be, d_norm_in, d_ln_out, a.x_mid, a.ln2_s);
  be.accumulate(d_resid, d_norm_in);
  b.attn.backward(be, d_ln_out, d_resid, a.ln1_out, B, T, a.attn_s, attn_scratch,
                  split ? &a.attn_w : nullptr);
  b.ln1.backward(be, d_norm_in, d_ln_out, a.x_in, a.ln1_s);
  be.accumulate(d_resid, d_norm_in);
}

// The W pass of one block, in block_backward's order.
void Transformer::Impl::block_weights(const Block& b, const BlockActs& a) {
  if (b.mlp)
    b.mlp->backward_weights(be, a.ln2_out, a.mlp_s, a.mlp_w);
  else
    b.moe->backward_weights(be, a.ln2_out, a.moe_s, a.moe_w);
  b.attn.backward_weights(be, a.ln1_out, a.attn_s, a.attn_w);
}

Slot& Transformer::Impl::slot_at(int slot, const char* what) {
  if (slot < 0 || slot >= par.activation_slots)
    throw std::out_of_range(
        std::string("Transformer::") + what + ": slot " + std::to_string(slot) +
        " outside [0, activation_slots = " + std::to_string(par.activation_slots) + ")");
  return slots[static_cast<size_t>(slot)];
}

std::vector<int32_t> Transformer::Impl::cp_positions(int r) const {
  const int P = par.cp_size();
  const int64_t chunk = cfg.seq_len / (2 * P);
  std::vector<int32_t> positions;
  for (const int64_t c : {int64_t{r}, int64_t{2 * P - 1 - r}})
    for (int64_t t = 0; t < chunk; ++t)
      positions.push_back(static_cast<int32_t>(c * chunk + t));
  return positions;
}

ForwardResult Transformer::Impl::forward(const int32_t* host_tokens, const int32_t* host_targets,
                                         int slot_index, int chunk) {
  Slot& s = slot_at(slot_index, "forward");
  if (s.weights_pending)
    throw std::logic_error("Transformer::forward: slot " + std::to_string(slot_index) +
                           " still waits for backward_weights");
  if (chunk < 0 || chunk >= num_chunks())
    throw std::out_of_range("Transformer::forward: chunk " + std::to_string(chunk) +
                            " outside [0, " + std::to_string(num_chunks()) + ")");
  s.chunk = chunk;
  s.valid_targets = 0;
  const int64_t whole = B * cfg.seq_len;  // the micro-batch's tokens, on every cp rank
  for (int64_t i = 0; i < whole; ++i) {
    if (host_tokens[i] < 0 || host_tokens[i] >= cfg.vocab || host_targets[i] >= cfg.vocab)
      throw std::out_of_range("token id " +
                              std::to_string(std::max(host_tokens[i], host_targets[i])) +
                              " at position " + std::to_string(i) +
                              " is outside the vocabulary [0, " + std::to_string(cfg.vocab) + ")");
    s.valid_targets += host_targets[i] >= 0;
  }
  if (cp_on()) {  // this rank's rows of every sequence
    cp_tokens.clear();
    cp_targets.clear();
    for (int64_t b = 0; b < B; ++b)
      for (const int32_t t : cp_local) {
        cp_tokens.push_back(host_tokens[b * cfg.seq_len + t]);
        cp_targets.push_back(host_targets[b * cfg.seq_len + t]);
      }
    host_tokens = cp_tokens.data();
    host_targets = cp_targets.data();
  }
  be.copy_from_host(s.tokens, host_tokens);
  be.copy_from_host(s.targets, host_targets);
  if (embeds(chunk)) {
    announce(embedding_ranges);  // a tied head on this stage is embed.wte: announced here
    // Context parallel: positions are global, so wpe's rows are looked up by row_positions and
    // added (by tp rank 0 only under tp) rather than taken as row % T.
    const Tensor positions = cp_on() ? Tensor{} : wpe.value;
    const bool add_positions = cp_on() && !wpe.value.empty() && par.tp_rank() == 0;
    if (add_positions) be.embedding_forward(position_rows, row_positions, wpe.value, Tensor{}, T);
    if (!tp_on()) {
      be.embedding_forward(s.resid[0], s.tokens, wte.value, positions, T);
      if (add_positions) be.accumulate(s.resid[0], position_rows);
    } else {
      // Each rank looks up its vocabulary rows (zeros elsewhere); positions are added by tp
      // rank 0 only, so the sum over tp holds them once.
      const Tensor sum = tp.partial_for(s.resid[0]);
      be.embedding_forward_shard(sum, s.tokens, wte.value,
                                 tp.comm->rank() == 0 ? positions : Tensor{}, T, vocab_begin);
      if (add_positions) be.accumulate(sum, position_rows);
      tp.reduce(s.resid[0]);
    }
  }

  ForwardResult result;
  const size_t begin = chunk_begin[static_cast<size_t>(chunk)];
  for (size_t i = begin; i < chunk_begin[static_cast<size_t>(chunk) + 1]; ++i) {
    const Block& b = blocks[i];
    BlockActs& a = s.acts[i - begin];
    announce(block_ranges[i]);
    if (store.values_sharded()) {
      want_block_values(i, +1);
      build_block(i);  // its Params now see the slot
    }
    const backend::RouterLosses l = block_forward(b, a);
    if (b.moe) {
      result.aux_loss += l.aux_loss;
      result.z_loss += l.z_loss;
      result.expert_load.push_back(to_host(a.moe_s.route.load));
      int64_t kept_assignments = 0;
      for (int32_t c : a.moe_s.counts)
        kept_assignments += c;
      result.dropped_tokens.push_back(routed_tokens() * cfg.moe.top_k - kept_assignments);
      result.moe_layers.push_back(b.layer);
    }
  }
  if (scores(chunk)) {
    announce(head_ranges);
    final_norm.forward(be, s.lnf_out, s.lnf_s, chunk_output(s));
    head_forward(s);
    logits_slot = slot_index;
    double total = 0;
    if (!tp_on()) {
      be.cross_entropy_forward(losses, lse, logits, s.targets);
      total = be.sum(losses);
    } else {
      total = vocab_parallel_loss(s, host_targets);
    }
    // Context parallel: each rank scored its own tokens; valid_targets counts the whole batch.
    if (cp_on()) cp.comm->all_reduce_sum(&total, 1, DType::f64);
    result.loss = s.valid_targets ? total / static_cast<double>(s.valid_targets) : 0.0;
  }
  result.objective =
      result.loss + cfg.moe.aux_loss_coef * result.aux_loss + cfg.moe.z_loss_coef * result.z_loss;
  s.have_forward = true;
  return result;
}

void Transformer::Impl::backward(double grad_scale, int slot_index, bool split) {
  Slot& s = slot_at(slot_index, "backward");
  if (!s.have_forward)
    throw std::logic_error("Transformer::backward called without forward (slot " +
                           std::to_string(slot_index) + ")");
  if (split && !par.split_backward)
    throw std::logic_error(
        "Transformer::backward_input: the model was built without ModelParallel::split_backward");
  s.have_forward = false;
  s.weights_pending = split;
  if (scores(s.chunk)) {
    const double ce_scale =
        s.valid_targets ? grad_scale / static_cast<double>(s.valid_targets) : 0.0;
    if (logits_slot != slot_index) head_forward(s);  // another slot's forward came in between
    logits_slot = slot_index;
    if (!tp_on())
      be.cross_entropy_backward(dlogits, logits, lse, s.targets, ce_scale);
    else
      be.cross_entropy_backward_shard(dlogits, logits, s.lse, s.targets, vocab_begin, ce_scale);
    // The head is column-parallel over the vocabulary (its input gathered again under sequence
    // parallel: the blocks of another slot may have used the buffer since).
    Linear{head, Param{}}.backward(be, tp.partial_for(d_lnf_out), dlogits, tp.gather(s.lnf_out));
    tp.reduce(d_lnf_out);
    final_norm.backward(be, d_resid, d_lnf_out, chunk_output(s), s.lnf_s);
    report_ready(head_ranges);
  } else {
    be.cast(d_resid, chunk_output(s));  // the gradient received for the chunk's output
  }
  const bool sharded = store.grads_sharded();
  const size_t begin = chunk_begin[static_cast<size_t>(s.chunk)];
  for (size_t i = chunk_begin[static_cast<size_t>(s.chunk) + 1]; i-- > begin;) {
    const int grad_slot = sharded ? bind_block_grads(i) : -1;
    if (store.values_sharded()) want_block_values(i, -1);
    if (sharded) build_block(i);  // its Params now see the slots
    block_recompute(blocks[i], s.acts[i - begin]);
    block_backward(blocks[i], s.acts[i - begin], grad_scale, split);
    if (split) continue;  // the block's gradients are complete after its W pass
    report_ready(block_ranges[i]);
    if (sharded) block_grads_done(i, grad_slot);
  }
  if (split && embeds(s.chunk)) {
    // The embedding's gradient is its weight gradient: the W pass takes it from the slot's second
    // residual tensor (dead by now: the first stage sends no input gradient).
    be.cast(s.resid[1], d_resid);
  } else if (embeds(s.chunk)) {
    embedding_backward(s, d_resid);
  } else {
    be.cast(input_grad_of(s), d_resid);
  }
}

void Transformer::Impl::backward_weights(int slot_index) {
  Slot& s = slot_at(slot_index, "backward_weights");
  if (!s.weights_pending)
    throw std::logic_error("Transformer::backward_weights: slot " + std::to_string(slot_index) +
                           " has no input-gradient pass to follow");
  s.weights_pending = false;
  const size_t begin = chunk_begin[static_cast<size_t>(s.chunk)];
  for (size_t i = chunk_begin[static_cast<size_t>(s.chunk) + 1]; i-- > begin;) {
    block_weights(blocks[i], s.acts[i - begin]);
    report_ready(block_ranges[i]);
  }
  if (embeds(s.chunk)) embedding_backward(s, s.resid[1]);
}

// d_rows: the gradient of the embedding's output (this rank's rows under sequence parallel).
void Transformer::Impl::embedding_backward(const Slot& s, const Tensor& d_rows) {
  // Context parallel: wpe's gradient goes to the rows' global positions (every tp rank adds
  // the same, as without cp).
  const Tensor dpositions = cp_on() ? Tensor{} : wpe.grad;
  const Tensor d = tp.gather(d_rows);
  if (!tp_on())
    be.embedding_backward(wte.grad, dpositions, d, s.tokens, T);
  else
    be.embedding_backward_shard(wte.grad, dpositions, d, s.tokens, T, vocab_begin);
  if (cp_on() && !wpe.grad.empty()) be.embedding_backward(wpe.grad, Tensor{}, d, row_positions, T);
  report_ready(embedding_ranges);
}

int Transformer::Impl::bind_block_grads(size_t index) {
  const int slot = store.next_grad_slot();
  if (grad_sink) grad_sink->slot_wanted(slot);
  store.bind_block_grads(blocks[index].layer, slot);
  return slot;
}

void Transformer::Impl::want_block_values(size_t index, int direction) {
  const int layer = blocks[index].layer;
  const int64_t next = static_cast<int64_t>(index) + direction;
  // The next block of the same chunk (chunks are runs of consecutive layers).
  const int next_layer = next >= 0 && next < static_cast<int64_t>(blocks.size()) &&
                                 blocks[static_cast<size_t>(next)].layer == layer + direction
                             ? layer + direction
                             : -1;
  if (value_source)
    value_source->values_wanted(layer, next_layer);
  else
    store.load_block_values(layer);
}

void Transformer::Impl::block_grads_done(size_t index, int slot) {
  const int layer = blocks[index].layer;
  if (grad_sink)
    grad_sink->block_done(layer, slot);
  else
    store.fold_block_grads(layer);
}

double Transformer::Impl::forward_flops_per_token() const {
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
    flops += 4.0 * cfg.seq_len * cfg.heads * D;
  }
  return flops + 2.0 * C * cfg.vocab;
}

Transformer::Transformer(const ModelConfig& config, Backend& backend, int64_t micro_batch,
                         const ModelParallel& parallel)
    : impl_(std::make_unique<Impl>(config, backend, micro_batch, parallel)) {}
Transformer::~Transformer() = default;

ForwardResult Transformer::forward(const int32_t* tokens, const int32_t* targets, int slot,
                                   int chunk) {
  return impl_->forward(tokens, targets, slot, chunk);
}
void Transformer::backward(double grad_scale, int slot) {
  impl_->backward(grad_scale, slot, false);
}
void Transformer::backward_input(double grad_scale, int slot) {
  impl_->backward(grad_scale, slot, true);
}
void Transformer::backward_weights(int slot) {
  impl_->backward_weights(slot);
}

// Units by layer and role: a tied head on one stage is embed.wte itself, complete only after the
// embedding backward, so it belongs to the embedding; the last stage's tied copy is the head's.
void Transformer::Impl::plan_grad_units() {
  block_ranges.assign(blocks.size(), {});
  auto add = [](std::vector<IndexRange>& ranges, const ParamSpec& spec) {
    append_joined(ranges, IndexRange{spec.offset, spec.offset + spec.shape.numel()});
  };
  for (const ParamSpec& spec : store.table().specs()) {
    const bool embedding = spec.role == ParamRole::embedding || spec.role == ParamRole::position;
    if (spec.layer >= 0) {
      add(block_ranges.at(block_of_layer(spec.layer)), spec);
    } else if (embedding && !spec.tied_copy) {
      add(embedding_ranges, spec);
    } else {
      add(head_ranges, spec);  // final_norm, lm_head, the tied copy
    }
  }
  grad_units_planned = true;
}

void Transformer::set_grads_ready_hook(GradsReadyHook hook) {
  if (hook && !impl_->grad_units_planned) impl_->plan_grad_units();
  impl_->grads_ready = std::move(hook);
}

void Transformer::set_block_grad_sink(BlockGradSink* sink) {
  impl_->grad_sink = sink;
}

void Transformer::set_block_value_source(BlockValueSource* source) {
  impl_->value_source = source;
}

void Transformer::set_params_needed_hook(ParamsNeededHook hook) {
  if (hook && !impl_->grad_units_planned) impl_->plan_grad_units();
  impl_->params_needed = std::move(hook);
}
Tensor Transformer::stage_input(int slot) {
  if (impl_->par.first_stage() && impl_->num_chunks() == 1)
    throw std::logic_error("Transformer::stage_input: the first stage embeds its own tokens");
  return impl_->slot_at(slot, "stage_input").resid.front();
}
Tensor Transformer::stage_output(int slot) {
  const Slot& s = impl_->slot_at(slot, "stage_output");
  if (impl_->scores(s.chunk))
    throw std::logic_error("Transformer::stage_output: the last stage has no next stage");
  return impl_->chunk_output(s);
}
Tensor Transformer::output_grad(int slot) {
  const Slot& s = impl_->slot_at(slot, "output_grad");
  if (impl_->scores(s.chunk))
    throw std::logic_error("Transformer::output_grad: the last stage starts from its own loss");
  return impl_->chunk_output(s);
}
Tensor Transformer::input_grad(int slot) {
  const Slot& s = impl_->slot_at(slot, "input_grad");
  if (impl_->embeds(s.chunk))
    throw std::logic_error("Transformer::input_grad: the first stage has no previous stage");
  return impl_->input_grad_of(s);
}
int Transformer::chunks() const {
  return impl_->num_chunks();
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
double Transformer::ring_wait_seconds() const {
  return impl_->cp.waited_s;
}

}  // namespace trainctl::model
