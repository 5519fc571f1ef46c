// Private to lib/model (not installed; included only by lib/model .cpp files): the state of one
// Transformer and the per-micro-batch activation records, shared by the files that implement it:
//   transformer.cpp  construction (layers from the ParamStore), forward/backward, public methods
//   activations.cpp  the activation arena: where every activation and scratch tensor lives
//   vocab_loss.cpp   the vocab-parallel cross-entropy and its host-side helpers
// Dimension legend: see layers.hpp.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/layers.hpp"
#include "model/model.hpp"

namespace trainctl::model {

class Arena;  // activations.cpp

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
  // Split backward (ModelParallel::split_backward): the GEMMs' output gradients for the W pass.
  Attention::Deferred attn_w;
  Mlp::Deferred mlp_w;
  Moe::Deferred moe_w;
};

// The activations of one micro-batch in flight (a pipeline stage holds several).
// Sequence parallel: the residual stream, the norms' inputs and outputs and their gradients hold
// this rank's `rows` of the N tokens ([N / tp, C]); the GEMMs' inputs are gathered.
// The slot's first residual tensor is the chunk's input (received from the previous stage), the
// second, after backward, the input's gradient sent back (so the next micro-batch's input may
// arrive in the first before it leaves, as 1F1B's order has it), and the one after the chunk's
// last layer its output and the gradient received for it. With chunks the input's gradient has
// a tensor of its own (grad_in), so the next forward in the slot need not wait for its send.
struct Slot {
  std::vector<Tensor> resid;  // the largest chunk's layers + 1 residual-stream tensors [rows, C]
  Tensor tokens, targets;     // [N] i32, global ids
  Tensor local_targets;       // [N] i32, tp: targets inside this vocab shard, else -1
  Tensor lse;                 // [N] A, tp: log-sum-exp over the whole vocabulary
  Norm::Saved lnf_s;
  Tensor lnf_out;
  std::vector<BlockActs> acts;
  int64_t valid_targets = 0;
  bool have_forward = false;
  bool weights_pending = false;  // split backward: B ran, W not yet
  int chunk = 0;                 // the chunk of the last forward
  Tensor grad_in;                // [rows, C] with chunks: the input's gradient sent back
};

struct Transformer::Impl {
  using GradsReadyHook = Transformer::GradsReadyHook;
  using ParamsNeededHook = Transformer::ParamsNeededHook;
  ModelConfig cfg;
  Backend& be;
  ModelParallel par;
  int64_t B, T, N;  // T: the tokens of a sequence on this rank (seq_len / cp), N = B * T
  int64_t rows;  // token rows of the residual stream on this rank: N, or N / tp (sequence parallel)
  std::vector<StageRange> chunks;   // this rank's layers: one range, or one per virtual stage
  std::vector<size_t> chunk_begin;  // blocks[chunk_begin[c], chunk_begin[c + 1]) run chunk c
  ParamStore store;
  Param wte, wpe, head;
  std::vector<Block> blocks;
  Norm final_norm;
  TensorParallel tp;
  int64_t vocab_begin = 0, local_vocab = 0;
  // Context parallel: the ring, the global position of each of the N rows (learned positions),
  // the [N, C] rows of wpe at those positions, and forward()'s copies of the rank's tokens.
  ContextParallel cp;
  MoeContext moe_cp;                                 // the MoE layers' view of the cp group
  std::unique_ptr<comm::BackgroundReducer> cp_ring;  // with ModelParallel::cp_background
  Tensor row_positions, position_rows;
  std::vector<int32_t> cp_tokens, cp_targets;
  bool cp_on() const { return cp.active(); }
  // The tokens a MoE layer routes together: the micro-batch's, on every cp rank.
  int64_t routed_tokens() const { return cp_on() ? B * cfg.seq_len : N; }
  // The global positions of cp rank r's T tokens of a sequence: chunks r and 2P-1-r; this rank's,
  // computed once.
  std::vector<int32_t> cp_positions(int r) const;
  std::vector<int32_t> cp_local;

  // Activations and scratch.
  backend::Allocation memory;
  ActivationBytes bytes;
  std::vector<Slot> slots;
  Tensor logits, lse, losses, dlogits, d_lnf_out;
  Tensor branch, d_resid, d_ln_out, d_norm_in;
  Attention::Scratch attn_scratch;
  Mlp::Scratch mlp_scratch;
  Moe::Scratch moe_scratch;
  int logits_slot = -1;  // whose logits `logits` holds (the last stage recomputes them if not)

  // Transformer::set_grads_ready_hook: the hook and the grads() ranges each backward unit
  // completes (filled on first arming of either hook).
  GradsReadyHook grads_ready;
  std::vector<IndexRange> head_ranges, embedding_ranges;
  std::vector<std::vector<IndexRange>> block_ranges;  // per blocks[i]
  bool grad_units_planned = false;
  void plan_grad_units();
  void report_ready(const std::vector<IndexRange>& ranges) const {
    if (grads_ready && !ranges.empty()) grads_ready(ranges);
  }
  // Transformer::set_params_needed_hook: forward announces the same units before using them.
  ParamsNeededHook params_needed;
  void announce(const std::vector<IndexRange>& ranges) const {
    if (params_needed && !ranges.empty()) params_needed(ranges);
  }

  // transformer.cpp, except where marked
  Impl(const ModelConfig& config, Backend& backend, int64_t micro_batch,
       const ModelParallel& parallel);
  static std::vector<StageRange> checked_chunks(const ModelConfig& config,
                                                const ModelParallel& parallel);

  bool tp_on() const { return tp.active(); }
  int num_chunks() const { return static_cast<int>(chunks.size()); }
  int chunk_layers(int c) const {
    return chunks[static_cast<size_t>(c)].end - chunks[static_cast<size_t>(c)].first;
  }
  int max_chunk_layers() const;
  // The embedding runs in chunk 0 of the first rank, the head in the last chunk of the last.
  bool embeds(int chunk) const { return chunk == 0 && par.first_stage(); }
  bool scores(int chunk) const { return chunk == num_chunks() - 1 && par.last_stage(); }
  size_t block_of_layer(int layer) const;
  // The chunk's output, and the gradient received for it: the residual after its last layer.
  Tensor chunk_output(const Slot& s) const {
    return s.resid[static_cast<size_t>(chunk_layers(s.chunk))];
  }
  // The gradient of the chunk's input, after backward: grad_in with chunks, else the second
  // residual tensor (every chunk has a layer), dead by then.
  static Tensor input_grad_of(const Slot& s) { return s.grad_in.empty() ? s.resid[1] : s.grad_in; }

  Param param(const std::string& name) const { return store.param(name); }
  Param optional_param(const std::string& name) const {
    return store.table().contains(name) ? param(name) : Param{};
  }
  Linear linear(const std::string& prefix) const {
    return Linear{param(prefix + ".weight"), optional_param(prefix + ".bias"), cfg.fp8, &tp};
  }
  Norm norm(const std::string& prefix) const {
    return Norm{cfg.norm, param(prefix + ".weight"), optional_param(prefix + ".bias"), cfg.norm_eps,
                &tp};
  }

  static Param expert_slice(const Param& stacked, int64_t e);
  void build_layers();
  void build_block(size_t index);

  // Sharded gradients (ParamStore): the sink, and blocks[index]'s gradients bound before its
  // backward and handed on after it.
  BlockGradSink* grad_sink = nullptr;
  int bind_block_grads(size_t index);
  void block_grads_done(size_t index, int slot);
  // Sharded values: blocks[index]'s values made available before its forward (direction +1) or
  // backward (-1), the next block in that direction announced for prefetch.
  BlockValueSource* value_source = nullptr;
  void want_block_values(size_t index, int direction);

  // activations.cpp
  void assign(Arena& kept, Arena& shared, Arena& scratch);
  void plan_activations();

  // transformer.cpp
  backend::RouterLosses block_forward(const Block& b, BlockActs& a);
  void block_recompute(const Block& b, BlockActs& a);
  void block_backward(const Block& b, const BlockActs& a, double grad_scale, bool split);
  void block_weights(const Block& b, const BlockActs& a);
  void embedding_backward(const Slot& s, const Tensor& d_rows);
  Slot& slot_at(int slot, const char* what);

  // vocab_loss.cpp
  double vocab_parallel_loss(Slot& s, const int32_t* host_targets);
  std::vector<double> to_host(const Tensor& t);
  void from_host(const Tensor& t, const std::vector<double>& values);

  // transformer.cpp
  // The head is column-parallel over the vocabulary: its input whole (gathered under sequence
  // parallel).
  void head_forward(const Slot& s) {
    Linear{head, Param{}}.forward(be, logits, tp.gather(s.lnf_out));
  }
  ForwardResult forward(const int32_t* host_tokens, const int32_t* host_targets, int slot_index,
                        int chunk);
  // split: the input-gradient pass of a split backward (the W pass is backward_weights).
  void backward(double grad_scale, int slot_index, bool split);
  void backward_weights(int slot_index);
  double forward_flops_per_token() const;
};

}  // namespace trainctl::model
