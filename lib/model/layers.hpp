// The layers of the transformer, each an explicit forward/backward pair over Backend ops.
//
// Contract (llm.c's): backward ACCUMULATES (+=) into parameter gradients and OVERWRITES
// activation gradients. `Saved` holds what forward keeps for backward; `Scratch` holds backward
// temporaries that the caller may share between layers.
//
// Split backward (zero-bubble pipeline schedules): given a `Deferred`, a layer's backward computes
// the input gradient only (and the norms' weight gradients, which need no GEMM) and keeps the
// output gradient of each of its GEMMs; backward_weights later adds the GEMMs' weight and bias
// gradients from those and the saved inputs (gathered again under sequence parallel). The two
// passes run the same GEMMs on the same operands as one backward: the same bits. Where a saved
// activation of the same shape is dead once the backward has read it, the gradient takes its
// place (qkv's in Attention::Saved::qkv, fc1's in Mlp::Saved::fc1_out, the router's in the
// route's logits); the others go to the Deferred tensors.
//
// Dimension legend: N = B*T tokens of a micro-batch, C = hidden, H query heads, KV key/value heads,
// D = head dim, F = ffn hidden, F1 = rows of fc1 (F, or 2F for SwiGLU), E experts, k = top_k,
// cap = tokens per expert buffer, V = vocab. Under tensor parallel H, KV, F, F1 and V are this
// rank's local counts; under expert parallel `experts` holds this rank's experts only.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "comm/background_reducer.hpp"
#include "comm/communicator.hpp"
#include "model/config.hpp"
#include "model/params.hpp"

namespace trainctl::model {

// The tensor-parallel group as the layers see it. Megatron's conjugate pairs, each defined once:
//   gather   before a column-parallel GEMM: its input, whole. With sequence parallelism an
//            all-gather of the rank's token rows (into `gathered`); without, the input itself.
//   reduce   after a row-parallel GEMM: the partial outputs summed over tp. With sequence
//            parallelism a reduce-scatter that leaves the rank its token rows; without, an
//            all-reduce in place.
// The backward of one is the other: a column-parallel layer reduces its input gradient, a
// row-parallel layer gathers its output gradient. A row-parallel layer adds its (replicated) bias
// after the sum, so the bias counts once.
// Sequence parallel: between the GEMMs (norms, residual adds, embedding output, final norm) a rank
// holds rows [rank * n, (rank + 1) * n) of the micro-batch's N tokens, n = N / tp. The norms'
// weight gradients then cover those rows only and are summed over tp (norm_grads); a row-parallel
// bias's gradient comes from the gathered output gradient, whole on every rank.
// fp8 under tp: a per-tensor scale taken from a shard alone could differ from the one a single
// rank takes from the whole tensor, so every fp8 operand of a sharded Linear is scaled by its amax
// max-reduced over the group (one small all-reduce per GEMM pass): each shard is then quantized
// exactly like its slice of the whole tensor. (The scales are powers of two, so they differ in
// effect only for elements that one of them puts below the format's normal range.)
struct TensorParallel {
  comm::Communicator* comm = nullptr;  // null: tp = 1, nothing to do
  bool sequence_parallel = false;
  Tensor ones;  // [rows] S of 1.0: adds a bias to every row as a rank-1 GEMM after a reduction
  Tensor amax;  // [kMaxAmax] f32, fp8 only: group amaxes of one GEMM pass's operands
  static constexpr int kMaxAmax = 3;
  // Sequence parallel only: [N, C] S, the gathered input or output gradient of a GEMM, and the
  // partial sums of a row-parallel output or a column-parallel input gradient; [2C] G, a norm's
  // weight (and bias) gradient of the local rows.
  Tensor gathered, partial, norm_grads;
  bool active() const { return comm != nullptr; }
  bool split_rows() const { return comm != nullptr && sequence_parallel; }
  void all_reduce(const Tensor& t) const;
  // The whole [N, C] of `local` (sequence parallel: gathered into `gathered`; else `local`).
  Tensor gather(const Tensor& local) const;
  // Where a row-parallel layer writes the partial sums that reduce() turns into `out`.
  Tensor partial_for(const Tensor& out) const;
  // out <- partial summed over tp: out is partial_for(out), all-reduced in place, or this rank's
  // rows of the sum (sequence parallel).
  void reduce(const Tensor& out) const;
  // This rank's rows of a whole [N, ...] tensor (sequence parallel).
  Tensor local_rows(const Tensor& whole) const;
  // y[rows, n] += bias[n] (bias optional).
  void add_bias(Backend& be, const Tensor& y, const Tensor& bias) const;
  // amax[i] = max over the group of max |operands[i]|, in one all-reduce.
  void group_amax(Backend& be, std::initializer_list<Tensor> operands) const;
  Tensor amax_of(int i) const { return amax.rows(i, 1); }
};

// The context-parallel group as attention sees it: this rank holds T tokens of every sequence at
// global positions `positions`; rank r's are `ring_positions[r]`. Attention merges every rank's
// key/value block into its queries' output, passing the blocks around the ring (rank r sends to
// r + 1 and receives from r - 1); backward sends each block's key/value gradients along with it
// and returns them to their owner at the end.
struct ContextParallel {
  comm::Communicator* comm = nullptr;  // null: cp = 1
  // Overlap: passes run on this reducer's worker (its own cp group) while attention computes,
  // each after a fence of `backend` (the block's device writes complete first). Null: the passes
  // block, before each block's attention.
  comm::BackgroundReducer* ring = nullptr;
  Backend* backend = nullptr;
  Tensor positions;                    // [T] i32
  std::vector<Tensor> ring_positions;  // per cp rank, [T] i32
  // Scratch: the key/value block held and the one arriving [N, 2 KV D] S; their gradients
  // [N, 2 KV D] A, and this rank's share of the held block's; the running output (forward) or
  // the output in A (backward) [N, H D] A; dq [N, H D] A; the assembled dqkv [N, (H + 2 KV) D] A.
  Tensor kv[2], dkv[2], dkv_local, out, dq, dqkv;
  bool active() const { return comm != nullptr; }
  // Sends `send` to the next rank and receives the previous rank's into `receive`: blocking, or
  // started on `ring` and returned to wait for (null when it already finished).
  std::shared_ptr<comm::Work> pass(const Tensor& send, const Tensor& receive) const;
  // Waits for a started pass (null: nothing to wait for).
  void finish(const std::shared_ptr<comm::Work>& work) const;
  // Seconds the passes held up the calling thread: a blocking pass whole, an overlapped one
  // only as long as it outlasted the compute it ran beside (the exposed exchange).
  mutable double waited_s = 0;
};

// The context-parallel group as a MoE layer sees it. Routing is not token-local: capacity, the
// order in which slots fill and the balance loss depend on the whole micro-batch. So each rank's
// router logits are gathered over cp into the micro-batch's order and every rank routes the whole
// micro-batch (the same bits everywhere, and the same as one rank); a rank then takes its own
// tokens' assignments, renumbered densely per expert in the same order, and sends only its own
// tokens through the experts. Backward gathers the gate gradients the same way, runs the router's
// backward for the micro-batch and keeps its rows, so each token's router gradient (balance and z
// terms included) is counted by one rank and the sum over the gradient group is one rank's.
struct MoeContext {
  comm::Communicator* comm = nullptr;  // null: cp = 1
  Tensor to_whole;                     // [P*N] i32: the micro-batch row of each gathered row
  Tensor own;                          // [N] i32: the micro-batch rows of this rank's tokens
  std::vector<int32_t> own_host;       // the same on the host
  // Scratch: the gathered logits [P*N, E] S (then in the micro-batch's order in Saved::route);
  // the gathered gate gradients [P*N, k] A, and in the micro-batch's order; the router's logit
  // gradients for the micro-batch [P*N, E] S.
  Tensor logits, dgates, dgates_whole, dlogits_whole;
  std::vector<int32_t> slot_host, own_slot_host;  // the routed slots, and this rank's renumbered
  bool active() const { return comm != nullptr; }
};

// y[N, out] = x[N, in] W^T + b.   Optional bias: a Param whose value is empty.
// fp8 (ModelConfig::fp8): the three GEMMs take fp8 operands with per-tensor scales (see
// backend::GemmArgs): x and W in e4m3; dy in e4m3 (Fp8Mode::e4m3) or e5m2 (Fp8Mode::hybrid).
// With tp set and active (a tp-sharded layer), the scales come from the group's amaxes.
struct Linear {
  Param weight;
  Param bias;
  Fp8Mode fp8 = Fp8Mode::none;
  const TensorParallel* tp = nullptr;
  void forward(Backend& be, const Tensor& y, const Tensor& x) const;
  // y = gelu(x W^T + b) in one GEMM (the GELU epilogue); pre receives x W^T + b. Not with fp8.
  void forward_gelu(Backend& be, const Tensor& y, const Tensor& pre, const Tensor& x) const;
  // dx may be empty (no input gradient wanted).
  void backward(Backend& be, const Tensor& dx, const Tensor& dy, const Tensor& x) const;
  // backward() in two passes: dx now, the weight (and bias) gradient later from the same dy, x.
  void backward_input(Backend& be, const Tensor& dx, const Tensor& dy) const;
  void backward_weights(Backend& be, const Tensor& dy, const Tensor& x) const;

 private:
  void input_gemm(Backend& be, const Tensor& dx, const Tensor& dy, const Tensor& amax_dy,
                  const Tensor& amax_w) const;
  void weight_gemm(Backend& be, const Tensor& dy, const Tensor& x, const Tensor& amax_dy,
                   const Tensor& amax_x) const;
};

// LayerNorm (weight, optional bias) or RMSNorm (weight) over the last dim of [N, C].
struct Norm {
  NormKind kind = NormKind::layernorm;
  Param weight;
  Param bias;
  double eps = 1e-5;
  // Sequence parallel (tp->split_rows()): x holds this rank's token rows, so the weight
  // gradients are summed over tp before they are added.
  const TensorParallel* tp = nullptr;
  struct Saved {
    Tensor mean, rstd;  // [N] A; mean unused by RMSNorm
  };
  void forward(Backend& be, const Tensor& out, const Saved& saved, const Tensor& x) const;
  void backward(Backend& be, const Tensor& dx, const Tensor& dout, const Tensor& x,
                const Saved& saved) const;
};

// Causal self-attention: qkv projection, optional RoPE on q and k, attention, output projection.
struct Attention {
  Linear qkv, proj;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  bool rope = false;
  double rope_theta = 10000.0;
  const TensorParallel* tp = nullptr;   // qkv column-parallel, proj row-parallel
  const ContextParallel* cp = nullptr;  // the ring over the sequence's chunks (T local tokens)
  struct Saved {
    Tensor qkv;       // [N, (H+2KV)D] after RoPE
    Tensor attn_out;  // [N, H*D]
    Tensor lse;       // [B, H, T] A
  };
  struct Scratch {
    Tensor qkv_raw;   // [N, (H+2KV)D] before RoPE (forward only, rope only)
    Tensor dattn;     // [N, H*D]
    Tensor dqkv;      // [N, (H+2KV)D]
    Tensor dqkv_raw;  // [N, (H+2KV)D] (rope only)
  };
  struct Deferred {  // split backward: proj's output gradient (qkv's goes to Saved::qkv)
    Tensor dproj;    // [N, C] (whole rows under sequence parallel)
  };
  backend::AttentionShape shape(int64_t B, int64_t T) const {
    return {B, T, heads, kv_heads, head_dim};
  }
  void forward(Backend& be, const Tensor& out, const Tensor& x, int64_t B, int64_t T,
               const Saved& saved, const Scratch& scratch) const;
  void backward(Backend& be, const Tensor& dx, const Tensor& dout, const Tensor& x, int64_t B,
                int64_t T, const Saved& saved, const Scratch& scratch,
                const Deferred* defer = nullptr) const;
  void backward_weights(Backend& be, const Tensor& x, const Saved& saved,
                        const Deferred& defer) const;
};

// Feed-forward: fc1, GELU or SwiGLU, fc2.
struct Mlp {
  Linear fc1, fc2;
  ActivationKind activation = ActivationKind::gelu;
  const TensorParallel* tp = nullptr;  // fc1 column-parallel, fc2 row-parallel
  struct Saved {
    Tensor fc1_out;  // [N, F1]
    Tensor act_out;  // [N, F]
  };
  struct Scratch {
    Tensor dact;  // [N, F]
    Tensor dfc1;  // [N, F1]
  };
  struct Deferred {  // split backward: fc2's output gradient (fc1's goes to Saved::fc1_out)
    Tensor dfc2;     // [N, C] (whole rows under sequence parallel)
  };
  void forward(Backend& be, const Tensor& out, const Tensor& x, const Saved& saved) const;
  void activate(Backend& be, const Saved& saved) const;  // act_out from fc1_out (recompute)
  void backward(Backend& be, const Tensor& dx, const Tensor& dout, const Tensor& x,
                const Saved& saved, const Scratch& scratch, const Deferred* defer = nullptr) const;
  void backward_weights(Backend& be, const Tensor& x, const Saved& saved,
                        const Deferred& defer) const;
};

// Mixture of experts: softmax router, top-k, capacity with dropping, E expert MLPs, weighted
// combine. Dropped tokens contribute nothing (the block's residual carries them on).
//
// Expert parallel over `ep` (P ranks, E/P experts each): the [E*cap, C] buffer of this rank's
// tokens is in source layout (rows of expert e at e*cap); all_to_all sends the rows of rank r's
// experts to rank r, which then holds "execution layout": block b = source * (E/P) + local expert
// at rows b*cap, `block_counts[b]` of them valid. With P = 1 both layouts are the same buffer.
// With tp the experts are tensor-parallel: the expert outputs of all blocks are all-reduced over
// tp in one call, then each block gets its fc2 bias; the input gradients likewise.
// Context parallel (cp active): see MoeContext. The route covers the micro-batch; `slot`, `gates`
// and `own_counts` describe this rank's N tokens in buffers of `capacity` = min(the route's
// capacity, N) rows per expert (a token takes an expert once, so N always suffice).
struct Moe {
  Linear router;                // [E, C], no bias
  std::vector<Mlp> experts;     // this rank's experts: views into the stacked [E/P, ...] parameters
  std::vector<Param> fc2_bias;  // tp only: each local expert's fc2 bias, added after the reduce
  int64_t total_experts = 0;    // E of the whole model (routing, capacity); 0: experts.size()
  int64_t top_k = 1;
  double capacity_factor = 0;
  double aux_loss_coef = 0, z_loss_coef = 0;
  const TensorParallel* tp = nullptr;
  comm::Communicator* ep = nullptr;  // null: every expert is local
  MoeContext* cp = nullptr;          // null or inactive: cp = 1

  int64_t num_experts() const {
    return total_experts > 0 ? total_experts : static_cast<int64_t>(experts.size());
  }
  int64_t capacity(int64_t tokens) const;  // slots per expert
  struct Saved {
    backend::RouterArgs route;  // logits, probs, expert_idx, gates, slot, counts, load
    // This rank's tokens: their rows in the expert buffers [N, k] i32 and gates [N, k] A (the
    // route's own without cp), and the buffers' rows per expert.
    Tensor slot, gates;
    int64_t capacity = 0;
    Tensor expert_in;             // [E*cap, C] execution layout: the rows the local experts ran on
    Tensor expert_out;            // [E*cap, C] source layout: the outputs for this rank's tokens
    Mlp::Saved expert;            // [E*cap, F1] / [E*cap, F] execution layout
    std::vector<int32_t> counts;  // host copy of route.counts (the routed tokens)
    std::vector<int32_t> own_counts;    // this rank's tokens kept per expert (cp; else counts)
    std::vector<int32_t> block_counts;  // valid rows of each execution block
  };
  struct Scratch {
    Tensor dexpert_in, dexpert_out;  // [E*cap, C] source layout
    Tensor dgates;                   // [N, k] A (this rank's tokens)
    Tensor dlogits;                  // [N, E]
    Tensor dx_router;                // [N, C]
    Mlp::Scratch expert;             // [E*cap, ...], row views taken per expert
    Tensor send, recv;               // [E*cap, C] ep only: the other layout of an exchange
  };
  // Split backward: the experts' fc2 output gradients (execution layout); the router's logit
  // gradients go to the first N rows of Saved::route.logits, the experts' fc1 ones to
  // Saved::expert.fc1_out.
  struct Deferred {
    Tensor dfc2;  // [E*cap, C]
    Mlp::Deferred expert_block(int64_t block, int64_t cap, int64_t count) const;
  };
  backend::RouterLosses forward(Backend& be, const Tensor& out, const Tensor& x, Saved& saved,
                                const Scratch& scratch) const;
  void activate(Backend& be, const Saved& saved) const;
  // Runs every execution block through its expert into `out` (execution layout).
  void run_experts(Backend& be, const Tensor& out, const Saved& saved) const;
  // loss_grad_scale: d(objective)/d(this layer's aux/z loss) before the coefficients.
  void backward(Backend& be, const Tensor& dx, const Tensor& dout, const Tensor& x,
                const Saved& saved, const Scratch& scratch, double loss_grad_scale,
                const Deferred* defer = nullptr) const;
  void backward_weights(Backend& be, const Tensor& x, const Saved& saved,
                        const Deferred& defer) const;
};

}  // namespace trainctl::model
