// Parameters: every logical tensor of the model is declared once in a ParamTable (name, shape,
// initialisation, weight decay) and lives at an offset in ONE contiguous buffer per kind, so
// gradient buckets, ZeRO shards and checkpoint slices are plain ranges of that buffer:
//   values  (storage type S)              grads   (G: f32, or f64 when S is f64)
//   master  (f32, only when S is bf16/f16) moments m, v (f32, or f64 when S is f64)
// Names follow one scheme ("layers.3.attn.qkv.weight") used by init, checkpoints and export.
// Code that needs to know what a tensor is reads its typed `layer` and `role`, never its name.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.hpp"
#include "model/config.hpp"
#include "model/parallel.hpp"
#include "model/zero_partition.hpp"
#include "tensor/rng.hpp"

namespace trainctl::model {

using backend::Backend;
using tensor::DType;
using tensor::Shape;
using tensor::Tensor;

enum class Init { normal, zeros, ones };

// What a parameter is in the model (the weight and the bias of one layer share a role).
enum class ParamRole {
  none,        // declared outside a model (a table built by hand)
  embedding,   // embed.wte (also the last stage's tied copy)
  position,    // embed.wpe (learned positions)
  attn_norm,   // layers.i.attn_norm
  qkv,         // layers.i.attn.qkv
  attn_proj,   // layers.i.attn.proj
  mlp_norm,    // layers.i.mlp_norm
  fc1,         // layers.i.mlp.fc1 (dense MLP)
  fc2,         // layers.i.mlp.fc2
  router,      // layers.i.moe.router
  expert_fc1,  // layers.i.moe.fc1 (stacked [E, ...] experts)
  expert_fc2,  // layers.i.moe.fc2
  final_norm,  // final_norm
  head,        // lm_head (untied)
};

// [begin, end) along one dimension of a parameter's global shape.
struct IndexRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const IndexRange&) const = default;
};

// Appends `range` to `ranges` (kept in order), extending the last one instead when `range` starts
// where it ends and `joinable(last, range)` holds; an empty range is dropped. Range: any type with
// int64_t begin and end (IndexRange, Backend::AdamWRange).
template <class Range, class Joinable>
void append_joined(std::vector<Range>& ranges, const Range& range, Joinable joinable) {
  if (range.end <= range.begin) return;
  if (!ranges.empty() && ranges.back().end == range.begin && joinable(ranges.back(), range))
    ranges.back().end = range.end;
  else
    ranges.push_back(range);
}
inline void append_joined(std::vector<IndexRange>& ranges, const IndexRange& range) {
  append_joined(ranges, range, [](const IndexRange&, const IndexRange&) { return true; });
}

struct ParamSpec {
  std::string name;
  int layer = -1;  // the transformer block it belongs to; -1: embeddings, final norm, head
  ParamRole role = ParamRole::none;
  Shape shape;  // this rank's (local) shape
  Init init = Init::normal;
  double std = 0.0;          // for Init::normal
  bool weight_decay = true;  // false for norms and biases
  int64_t offset = 0;        // element offset in the contiguous buffers
  // Where the local tensor sits in the whole one. global_shape has the same rank as shape;
  // pieces[d] lists the global index ranges along dimension d whose concatenation is the local
  // extent of d (one range covering the dimension when it is not split; three for the rows of a
  // tensor-parallel qkv: its q, k and v heads). The local tensor is the product of the pieces, so
  // it is made of prod(pieces[d].size()) boxes of the global tensor.
  Shape global_shape;
  std::vector<std::vector<IndexRange>> pieces;
  bool tp_sharded = false;  // split over tp (else identical on every tp rank)
  bool expert = false;      // split over ep (else identical on every ep rank): grads sum over dp
  bool tied_copy = false;   // the last stage's copy of embed.wte (pp > 1, tied embeddings)

  // The global flat index (row-major in global_shape) of local flat element i.
  int64_t global_index(int64_t local_index) const;
};

class ParamTable {
 public:
  // An unsharded parameter (global shape = shape, one piece per dimension).
  const ParamSpec& add(std::string name, Shape shape, Init init, double std, bool decay);
  // A parameter whose global_shape, pieces and flags are set in `spec` (shape and offset are
  // derived from the pieces). Checks that the pieces lie inside global_shape.
  const ParamSpec& add(ParamSpec spec);
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const ParamSpec& find(const std::string& name) const;  // throws std::out_of_range
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  int64_t numel() const { return numel_; }

 private:
  std::vector<ParamSpec> specs_;
  std::unordered_map<std::string, size_t> index_;
  int64_t numel_ = 0;
};

// The initial values of one parameter: global element i of `spec` initialised with `seed` takes
// InitialValues(spec, seed)(i), a pure function of (seed, name, i) whatever the layout or backend
// (before rounding to the storage type). ParamStore::initialize fills the buffers from it, and
// the lineage test (lib/lineage) regenerates a model's birth values from it.
class InitialValues {
 public:
  InitialValues(const ParamSpec& spec, uint64_t seed);
  double operator()(int64_t global_index) const;

 private:
  Init init_;
  double std_;
  tensor::CounterRng rng_;
};

// The ZeRO-1 partition (zero_partition.hpp) of the table's flat buffer into `parts` contiguous
// ranges, cut only at row boundaries (the first dimension of the local tensor) so each part of a
// parameter is a box of it. Returns parts + 1 boundaries from 0 to table.numel().
std::vector<int64_t> zero_partition(const ParamTable& table, int parts);

// The table of a model: embeddings, blocks (attention, dense MLP or MoE), final norm, head.
// With `parallel`, only this rank's parameters with their local shapes (see parallel.hpp).
ParamTable build_param_table(const ModelConfig& config, const ModelParallel& parallel = {});

// A parameter with its gradient: what a layer holds.
struct Param {
  Tensor value;
  Tensor grad;
};

// The elements [begin, end) of the flat buffer that hold the parameters of one transformer block.
struct BlockUnit {
  int layer = 0;
  int64_t begin = 0, end = 0;
  int64_t numel() const { return end - begin; }
};

// Owns the parameter, gradient, master-weight and optimizer-moment buffers of one model.
//
// Gradients are kept in one of two ways:
//  - whole (ZeRO 0 and 1): grads() is one buffer of the whole table; backward adds into it.
//  - sharded (ZeRO-2, shard_grads): no whole buffer is kept. The reduced gradients live only in
//    this rank's optimizer part (grad_part()); the embedding, final norm and head keep theirs whole
//    for the step (the outer regions before the first and after the last block: the tied
//    embedding's stage exchange needs them whole); a block's gradients live in one of
//    kGradSlots workspace slots only during its backward (bind_block_grads), after which they are
//    reduced into the part (by the gradient sync over dp, or fold_block_grads on one rank).
//
// Values are kept in one of two ways:
//  - whole (ZeRO 0 to 2): values() is one buffer of the whole table.
//  - sharded (ZeRO-3, shard_values, which needs shard_grads): the values of this rank's part
//    (value_part()) are the only lasting copy of the blocks' values; the outer regions are kept
//    whole (the embedding's lookup and the head need every row, as FSDP keeps its root module
//    unsharded through the step); a block's values live in one of kValueSlots slots from the
//    moment they are gathered (claim_value_slot, filled by the gradient sync's all-gather over
//    dp, or load_block_values on one rank) until the slot is claimed by another block or the part
//    changes (release_block_values). After the optimizer writes the part, the outer regions are
//    refreshed from the parts (gathered over dp, or refresh_from_part on one rank).
class ParamStore {
 public:
  static constexpr int kGradSlots = 2;   // one block's backward writes one while the other reduces
  static constexpr int kValueSlots = 2;  // one block computes from one while the next gathers

  // zero_parts/zero_rank: the optimizer state (master, moments) covers only part zero_rank of
  // zero_partition(table, zero_parts); values cover the whole table unless shard_values, and
  // grads too unless shard_grads.
  // moments: the optimizer's per-element state buffers (train::moment_names), each covering the
  // optimizer part.
  ParamStore(Backend& backend, ParamTable table, DType storage, int zero_parts = 1,
             int zero_rank = 0, bool shard_grads = false, bool shard_values = false,
             MomentNames moments = {});

  // Fills every parameter from the counter RNG keyed by (seed, name, element index): identical
  // values whatever the layout or backend. Master weights get the f32 value, the storage copy its
  // rounding.
  void initialize(uint64_t seed);
  void zero_grads();

  Param param(const std::string& name) const;
  const ParamTable& table() const { return table_; }
  DType storage() const { return storage_; }
  bool has_master() const { return master_.data() != nullptr; }

  // Whole buffers (for the optimizer, gradient norms, checkpoints). grads() is empty when the
  // gradients are sharded, values() when the values are.
  Tensor values() const;
  Tensor grads() const;
  bool values_sharded() const { return shard_values_; }
  // The values of the optimizer part [optimizer_begin(), optimizer_end()): what the optimizer
  // writes and a checkpoint of sharded values saves. Whole: a view into values().
  Tensor value_part() const;
  // Sharded values only. The values of outer_regions()[i], whole for the step.
  Tensor outer_values(size_t region) const;
  // The slot holding `layer`'s values (-1: none holds them).
  int value_slot_of(int layer) const;
  // Binds `layer` to a value slot other than `keep` (-1: any; the one claimed longest ago) and
  // returns it; the block it held loses it. The caller fills it (value_slot) before the block
  // reads its parameters; param() of its parameters returns values there until it is released.
  int claim_value_slot(int layer, int keep = -1);
  // The values of the block bound to `slot` (its numel elements).
  Tensor value_slot(int slot) const;
  // One rank (the part covers the whole table): makes `layer`'s values available, copied from the
  // part into a claimed slot unless a slot still holds them.
  void load_block_values(int layer);
  // Every block loses its slot (the part changed: a slot would hold stale values).
  void release_block_values();
  // One rank, after the part changed: the outer regions copied from the part, every slot
  // released.
  void refresh_from_part();
  DType grad_dtype() const { return backend::grad_dtype(storage_); }
  bool grads_sharded() const { return shard_grads_; }
  // The gradients of the optimizer part [optimizer_begin(), optimizer_end()): what the optimizer
  // and the gradient norm read once the gradients are reduced. Whole: a view into grads().
  Tensor grad_part() const;
  // Elements [begin, end) of the gradient as backward writes it (unreduced): a view into grads(),
  // or, sharded, into an outer region or the slot bound to the block holding the range.
  Tensor unreduced_grads(int64_t begin, int64_t end) const;

  // Sharded gradients only. The blocks of this stage in buffer order, and the one of `layer`.
  const std::vector<BlockUnit>& block_units() const { return blocks_; }
  const BlockUnit& block_unit(int layer) const;
  // The outer regions: [0, first block) (the embedding) and [after the last block, numel) (the
  // final norm and head); either may be empty.
  std::array<IndexRange, 2> outer_regions() const;
  // The slot the next block's backward takes (they take turns).
  int next_grad_slot();
  // Binds `layer`'s gradients to `slot`, zeroed: param() of its parameters returns grads there
  // until it is released. The slot must no longer be read by a reduction.
  Tensor bind_block_grads(int layer, int slot);
  void release_block_grads(int layer);
  // One rank's reduction (the part covers the whole table): adds the block's slot into the part
  // and releases it.
  void fold_block_grads(int layer);
  // One rank, after the step's backward: adds the outer regions (embedding, final norm, head)
  // into the part.
  void fold_outer_grads();
  // The optimizer state: elements [optimizer_begin(), optimizer_end()) of the flat buffer (all of
  // it without ZeRO). Element i of these tensors is element optimizer_begin() + i of values().
  Tensor master() const;  // empty Tensor when S is f32/f64
  // Empty Tensors beyond the moments the store was made with.
  Tensor moment1() const;
  Tensor moment2() const;
  int moments() const { return static_cast<int>(moment_names_.size()); }
  // Their type: the gradient type G, or bf16 (MomentNames::bf16).
  DType moment_dtype() const { return moment_dtype_; }
  // Their checkpoint names, moment1's first.
  const std::vector<std::string>& moment_names() const { return moment_names_; }
  int64_t optimizer_begin() const { return opt_begin_; }
  int64_t optimizer_end() const { return opt_end_; }
  // The range of one parameter inside one of the buffers above.
  static Tensor slice(const Tensor& whole, const ParamSpec& spec);

  struct Bytes {
    size_t params = 0, grads = 0, optimizer = 0;
  };
  Bytes bytes() const;

 private:
  void plan_block_units();
  size_t block_index(int layer) const;  // of `layer` in blocks_ (ascending layers)
  Tensor slot_grads(int slot, const BlockUnit& unit) const;
  Tensor grad_of(const ParamSpec& spec) const;
  Tensor value_of(const ParamSpec& spec) const;
  // Host bytes of `spec` (storage type) into every buffer that holds its values.
  void store_values(const ParamSpec& spec, const void* host);
  void check_part_covers(int64_t begin, int64_t end, const char* what) const;
  int64_t largest_block() const;

  Backend& backend_;
  ParamTable table_;
  DType storage_;
  bool shard_grads_ = false;
  int64_t opt_begin_ = 0, opt_end_ = 0;
  std::vector<std::string> moment_names_;
  DType moment_dtype_;
  backend::Allocation values_, grads_, master_, m_, v_;
  // Sharded gradients: the part, the outer regions [0, front_end_) and [back_begin_, numel), the
  // block slots, and which slot each block of the stage is bound to (-1: none).
  backend::Allocation part_grads_, front_grads_, back_grads_;
  std::vector<backend::Allocation> slots_;
  std::vector<BlockUnit> blocks_;
  std::vector<int> bound_slot_;
  int64_t front_end_ = 0, back_begin_ = 0;
  int next_slot_ = 0;
  // Sharded values: the part, the outer regions, the block slots, which slot each block is bound
  // to (-1: none) and which block each slot holds (-1: none).
  bool shard_values_ = false;
  backend::Allocation part_values_, front_values_, back_values_;
  std::vector<backend::Allocation> value_slots_;
  std::vector<int> value_slot_of_block_, block_of_value_slot_;
  int next_value_slot_ = 0;
};

}  // namespace trainctl::model
