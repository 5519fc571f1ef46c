// The decoder-only transformer (GPT and Llama families, dense and mixture-of-experts) on one
// rank: embedding -> blocks (norm, attention, residual, norm, MLP or MoE, residual) -> final norm
// -> LM head -> cross-entropy. Built for one micro-batch size; activations come from one arena
// planned up front for the recompute mode of the layout (ModelParallel::layout.recompute):
//   none       every tensor backward needs is kept per layer
//   selective  norm outputs and activation-function outputs are recomputed in backward (they
//              cost only elementwise work); GEMM outputs, attention statistics and routing are kept
//   full       only each block's input is kept; the block's forward is rerun in backward
// All three give bit-identical gradients (recomputation repeats the same deterministic ops).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "model/config.hpp"
#include "model/params.hpp"

namespace trainctl::model {

// On a pipeline stage: loss and objective count only what this stage computes (the cross-entropy
// on the last stage, the MoE losses of its own layers); the trainer sums the stages.
struct ForwardResult {
  double loss = 0;      // mean cross-entropy over the micro-batch's tokens (nats/token)
  double aux_loss = 0;  // sum over MoE layers of the load-balancing loss (before its coefficient)
  double z_loss = 0;    // sum over MoE layers of the router z-loss (before its coefficient)
  double objective =
      0;  // loss + aux_coef * aux_loss + z_coef * z_loss: what backward differentiates
  std::vector<std::vector<double>> expert_load;  // per MoE layer: share of assignments per expert
  std::vector<int64_t> dropped_tokens;           // per MoE layer: assignments over capacity
  std::vector<int> moe_layers;                   // the global layer index of each entry above
};

struct ActivationBytes {
  size_t kept = 0;     // saved for backward
  size_t scratch = 0;  // shared temporaries (recompute targets, backward buffers, logits)
  size_t total() const { return kept + scratch; }
};

// ZeRO-2 (sharded gradients, params.hpp): where a block's gradients go. Before each block's
// backward the model takes the store's next slot and calls slot_wanted (the sink waits until the
// slot's previous block was reduced out of it), binds the block to it, runs the backward, and
// calls block_done (the sink reduces the slot over the data-parallel ranks into the part). Without
// a sink the model folds the slot into the part itself (one rank). Runs on the calling thread, in
// the same order on every rank of the same stage.
class BlockGradSink {
 public:
  virtual ~BlockGradSink() = default;
  virtual void slot_wanted(int slot) = 0;
  virtual void block_done(int layer, int slot) = 0;
};

// ZeRO-3 (sharded values, params.hpp): where a block's values come from. Before each block's
// forward and backward the model calls values_wanted(layer, next): on return the block's values
// are in a value slot of the store bound to it (gathered over the data-parallel ranks), and the
// source may have started gathering `next` (-1: none), the block the model needs after this one
// in the same pass, into another slot (prefetch). Without a source the model copies the block out
// of the part itself (one rank). Runs on the calling thread, in the same order on every rank of
// the same stage.
class BlockValueSource {
 public:
  virtual ~BlockValueSource() = default;
  virtual void values_wanted(int layer, int next) = 0;
};

class Transformer {
 public:
  Transformer(const ModelConfig& config, Backend& backend, int64_t micro_batch,
              const ModelParallel& parallel = {});
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  // tokens, targets: host int32 arrays of micro_batch * seq_len. Targets < 0 are ignored.
  // `slot` (< parallel.activation_slots) picks the activation set: a pipeline stage keeps the
  // activations of several micro-batches in flight. `chunk` (< chunks()) picks the layers with
  // virtual stages. Every stage receives tokens and targets (the first stage embeds the tokens in
  // its chunk 0, the last one scores the targets in its last chunk). Otherwise stage_input(slot)
  // must hold the previous stage's output before forward.
  ForwardResult forward(const int32_t* tokens, const int32_t* targets, int slot = 0, int chunk = 0);
  // Differentiates the objective of the forward of `slot` (its chunk); parameter gradients +=
  // grad_scale * d objective. Unless the chunk scores the targets, output_grad(slot) must hold
  // d objective / d stage_output(slot) (already multiplied by grad_scale) first. Evaluation-only
  // forwards need no backward.
  void backward(double grad_scale, int slot = 0);
  // backward() in two passes, with the same results (ModelParallel::split_backward; the ZB-H1
  // schedule): backward_input computes what the previous stage waits for (input_grad(slot)), the
  // norms' weight gradients and, on the last stage, the head's; backward_weights adds the blocks'
  // GEMM weight gradients and the embedding's, and must come before the slot's next forward.
  // The grads-ready hook reports the head in backward_input, the blocks and the embedding in
  // backward_weights.
  void backward_input(double grad_scale, int slot = 0);
  void backward_weights(int slot = 0);

  // Called by backward() each time a group of parameter gradients is complete for this backward:
  // the head and final norm (last stage), each block (last layer first), the embedding (first
  // stage). `ranges` are [begin, end) element ranges of the flat buffer; every parameter of the
  // table is reported exactly once per backward (with chunks: once per backward of each chunk,
  // the chunk's own), and backward writes no reported range again. The data-parallel reduction
  // starts a bucket once all of it was reported (overlap); with gradient accumulation arm it only
  // for the last backward of a step (with chunks: of each chunk). Runs on the calling
  // thread, in the same order on every rank of the same stage.
  using GradsReadyHook = std::function<void(const std::vector<IndexRange>& ranges)>;
  void set_grads_ready_hook(GradsReadyHook hook);  // an empty function disarms it

  // Called by forward() before each unit reads its parameters, with the same units as the grads
  // hook in forward order: the embedding (first stage), each block (first layer first), the final
  // norm and head (last stage). `ranges` are element ranges of params().values(); every
  // parameter of the table is announced exactly once per forward (with chunks: per forward of
  // each chunk, the chunk's own). ZeRO-1 waits here for the gather of the updated parameters
  // (overlap); arm it for the step's first forward (with chunks: each chunk's first). Runs on the
  // calling thread.
  using ParamsNeededHook = std::function<void(const std::vector<IndexRange>& ranges)>;
  void set_params_needed_hook(ParamsNeededHook hook);  // an empty function disarms it

  // Sharded gradients: the sink of every block's backward (null: fold on this rank).
  void set_block_grad_sink(BlockGradSink* sink);
  // Sharded values: the source of every block's values (null: copy from this rank's part).
  void set_block_value_source(BlockValueSource* source);

  // Pipeline boundaries, [micro_batch * seq_len, hidden] tensors in the storage type, all in the
  // slot: the gradients take the places of activations that are dead by then (with chunks the
  // input's gradient has a tensor of its own), so a slot's transfers may wait while other slots
  // compute. A slot whose backward ran may receive the next input before its input_grad is sent;
  // without chunks its next forward must come after that send, with chunks its next backward.
  Tensor stage_input(int slot);   // receive the previous stage's output here before forward
  Tensor stage_output(int slot);  // after forward, send this to the next stage
  Tensor output_grad(int slot);   // receive the next stage's input_grad here before backward
  Tensor input_grad(int slot);    // after backward, send this to the previous stage
  int chunks() const;             // model chunks on this rank (ModelParallel::virtual_stages)
  const ModelParallel& parallel() const;

  ParamStore& params();
  const ParamStore& params() const;
  const ModelConfig& config() const;
  int64_t micro_batch() const;
  ActivationBytes activation_bytes() const;
  // Forward FLOPs per token (matmuls + attention scores), for throughput and MFU.
  double forward_flops_per_token() const;
  // Context parallel: seconds the ring's key/value passes have held up this thread so far
  // (blocking passes whole, overlapped ones only past the attention beside them); 0 without cp.
  double ring_wait_seconds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainctl::model
