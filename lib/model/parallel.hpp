// How one rank's model is cut out of the whole model: tensor parallel (Megatron style), expert
// parallel and pipeline stages, plus the ZeRO-1 partition of the optimizer state: the job's layout
// (layout/layout.hpp), this rank's coordinates in it, and the groups the layers talk over. A plain
// value built by the caller (from_mesh, or by hand in tests); the model never looks up process
// groups by itself.
//
// Tensor parallel over `tp` (size T, rank t), as in Megatron-LM:
//   attn.qkv    column-parallel: local heads [t*H/T, (t+1)*H/T) of q, and of k and v
//               (KV/T each); its rows are the three global row ranges q, k, v, concatenated
//   attn.proj   row-parallel: columns of the local heads; output all-reduced over tp, then bias
//   mlp.fc1     column-parallel (SwiGLU: the gate rows and the up rows of the rank, concatenated)
//   mlp.fc2     row-parallel, as attn.proj
//   embed.wte   vocab-parallel: rows [t*V/T, (t+1)*V/T); lookup all-reduced over tp
//   lm_head     vocab-parallel; cross-entropy over the vocab shards without gathering the logits
//   norms, biases of row-parallel layers, embed.wpe, the MoE router: replicated on every tp rank.
//   Their gradients come out identical on every tp rank (the inputs to their backward are
//   all-reduced first), so they need no synchronisation, only counting once.
// The input gradient of a column-parallel layer is all-reduced over tp in backward.
// Sequence parallel (layout.sequence_parallel, Megatron's): between the GEMMs each tp rank holds
// rows [t*N/T, (t+1)*N/T) of the micro-batch's N tokens; the all-reduces become all-gathers
// before the column-parallel GEMMs and reduce-scatters after the row-parallel ones, and the norms'
// weight gradients are summed over tp (layers.hpp, TensorParallel). Pipeline stages then pass
// each other their rows only.
//
// Expert parallel over `ep` (size P, rank p): experts [p*E/P, (p+1)*E/P) live on rank p. Routing
// runs on every rank for its own tokens (ep ranks hold different data, like dp ranks); the expert
// buffers [E*cap, C] are exchanged with all_to_all over ep (rank r receives the rows of its
// experts from every rank), computed, and sent back; capacity and dropping are decided per
// micro-batch at the source, exactly as on one rank. With tp > 1 each expert MLP is itself
// tensor-parallel (fc1 column, fc2 row with an all-reduce over tp of the expert buffer).
//
// Context parallel over `cp` (size P, rank c): each sequence of T tokens is cut into 2P chunks and
// rank c holds chunks c and 2P-1-c (T/P tokens; the pairing gives every rank the same causal
// attention work). forward() still takes whole sequences and keeps the rank's tokens. Learned
// positions and RoPE use the global positions; attention meets every rank's keys and values one
// block at a time around the cp ring (backend attention_block_*); the loss is summed over cp. All
// parameters are replicated over cp; their gradients are summed with the dp ranks' (Mesh::dp_cp).
//
// Pipeline parallel over pp stages: stage s holds layers [first_layer, end_layer); the first stage
// also the embeddings, the last the final norm and the head. With V virtual stages per rank
// (the interleaved schedule) the layers form pp * V stages and rank r holds V chunks, chunk c
// being stage c * pp + r: the embeddings stay on rank 0 (chunk 0), the head on rank pp - 1. With
// tied embeddings and pp > 1 the last stage holds a copy of embed.wte (ParamSpec::tied_copy) whose
// gradient the trainer sums with the first stage's, so both stay equal.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/mesh.hpp"
#include "layout/layout.hpp"

namespace trainctl::model {

// The optimizer's per-element state buffers beside each parameter (train::moment_names): how
// many (0 to 2), the name a checkpoint gives each, and whether they are bf16
// (optimizer.state_dtype; else the gradient type). Trivially copyable (the names are literals).
struct MomentNames {
  int count = 2;
  std::array<const char*, 2> names{"adam_m", "adam_v"};
  bool bf16 = false;
  std::vector<std::string> list() const {
    return std::vector<std::string>(names.begin(), names.begin() + count);
  }
};

struct ModelParallel {
  Layout layout;   // the job's degrees and ZeRO stage; default: one rank
  Coordinates at;  // this rank's place in the layout
  // The groups of the tp and ep axes; null means a degree of 1.
  comm::Communicator* tp = nullptr;
  comm::Communicator* ep = nullptr;
  comm::Communicator* cp = nullptr;
  // The cp members joined a second time (Mesh::cp_bg): with it the ring passes the next key/value
  // block on a worker thread while attention computes on the one held; null: blocking passes.
  comm::Communicator* cp_background = nullptr;
  // Layers per stage (size layout.pp * virtual_stages, summing to the model's layers); empty: as
  // even as possible, the earlier stages taking the remainder (8 layers over 3 stages: 3, 3, 2).
  std::vector<int> stage_layers;
  // Model chunks per pipeline rank (interleaved schedule); 1: one contiguous stage.
  int virtual_stages = 1;
  // Micro-batches (of any chunk) whose activations this stage holds at once: the schedule's
  // pipeline_slots (1F1B: min(pp - pp_rank, M)).
  int activation_slots = 1;
  // The backward in two passes (the ZB-H1 schedule, Transformer::backward_input/_weights): each
  // slot also keeps its GEMMs' output gradients from the first pass to the second.
  bool split_backward = false;

  // The mesh's layout with ZeRO stage `zero`, this rank's coordinates in it, and its tp and ep
  // groups where their degree is above 1.
  static ModelParallel from_mesh(const comm::Mesh& mesh, int zero);

  int tp_size() const { return tp ? tp->size() : 1; }
  int tp_rank() const { return tp ? tp->rank() : 0; }
  int ep_size() const { return ep ? ep->size() : 1; }
  int cp_size() const { return cp ? cp->size() : 1; }
  int cp_rank() const { return cp ? cp->rank() : 0; }
  int ep_rank() const { return ep ? ep->rank() : 0; }
  int pp_rank() const { return at.pp; }  // this rank's pipeline stage
  int pp_size() const { return layout.pp; }
  bool first_stage() const { return pp_rank() == 0; }
  bool last_stage() const { return pp_rank() == pp_size() - 1; }
  // ZeRO-1 and 2: the optimizer state (fp32 master weights, Adam moments) of this rank covers
  // only its part of the flat parameter buffer, one of zero_parts() parts (dp * cp: the gradient
  // group, comm::Mesh::dp_cp); 1: all of it. ZeRO-2 keeps the reduced gradients of that part only
  // (ParamStore's sharded gradients).
  int zero_parts() const { return layout.zero >= 1 ? layout.dp * layout.cp : 1; }
  int zero_rank() const {
    return layout.zero >= 1 ? group_rank(layout, at, {Axis::dp, Axis::cp}) : 0;
  }
  bool shard_grads() const { return layout.zero >= 2; }
  // The optimizer's per-element state buffers beside each parameter, by their checkpoint names
  // (train::moment_names: 2 for adamw and muon, 1 for lion and sgd with momentum, 0 for sgd).
  MomentNames optimizer_moments;
  // ZeRO-3 keeps the values of that part only; each block's are gathered when it runs.
  bool shard_values() const { return layout.zero >= 3; }
};

// The layers of every stage: [first, end) of stage s at index s. Throws std::invalid_argument
// when stage_layers does not have pp_size positive entries summing to `layers`, or when there are
// fewer layers than stages.
struct StageRange {
  int first = 0;
  int end = 0;
};
std::vector<StageRange> stage_ranges(int layers, int pp_size, const std::vector<int>& stage_layers);
// The layers of each of this rank's chunks, chunk order (one range without virtual stages).
// Throws as stage_ranges does, and on virtual_stages < 1 or pp_rank outside [0, pp).
std::vector<StageRange> chunk_ranges(int layers, const ModelParallel& parallel);

}  // namespace trainctl::model
