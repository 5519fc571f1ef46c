#include "model/params.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "tensor/rng.hpp"

namespace trainctl::model {

namespace {

std::vector<std::vector<IndexRange>> whole_pieces(const Shape& shape) {
  std::vector<std::vector<IndexRange>> pieces;
  for (int d = 0; d < shape.rank; ++d)
    pieces.push_back({IndexRange{0, shape[d]}});
  return pieces;
}

// Joins ranges that touch, so a dimension that is not split is one range whatever the layout.
std::vector<IndexRange> merged(const std::vector<IndexRange>& ranges) {
  std::vector<IndexRange> out;
  for (const IndexRange& r : ranges)
    append_joined(out, r);
  return out;
}

}  // namespace

int64_t ParamSpec::global_index(int64_t local_index) const {
  if (pieces.empty()) return local_index;
  // Peel local coordinates off from the last dimension, map each through its pieces.
  int64_t global = 0, stride = 1, rest = local_index;
  for (int d = shape.rank - 1; d >= 0; --d) {
    int64_t coord = rest % shape[d];
    rest /= shape[d];
    int64_t mapped = -1;
    for (const IndexRange& r : pieces[static_cast<size_t>(d)]) {
      if (coord < r.size()) {
        mapped = r.begin + coord;
        break;
      }
      coord -= r.size();
    }
    global += mapped * stride;
    stride *= global_shape[d];
  }
  return global;
}

InitialValues::InitialValues(const ParamSpec& spec, uint64_t seed)
    : init_(spec.init), std_(spec.std), rng_(seed, tensor::stream_key(spec.name)) {}

double InitialValues::operator()(int64_t global_index) const {
  switch (init_) {
    case Init::normal:
      return rng_.normal(static_cast<uint64_t>(global_index)) * std_;
    case Init::ones:
      return 1.0;
    case Init::zeros:
      return 0.0;
  }
  return 0.0;
}

const ParamSpec& ParamTable::add(std::string name, Shape shape, Init init, double std, bool decay) {
  ParamSpec spec;
  spec.name = std::move(name);
  spec.init = init;
  spec.std = std;
  spec.weight_decay = decay;
  spec.global_shape = shape;
  return add(std::move(spec));
}

const ParamSpec& ParamTable::add(ParamSpec spec) {
  if (index_.count(spec.name))
    throw std::logic_error("ParamTable: duplicate parameter " + spec.name);
  if (spec.pieces.empty()) spec.pieces = whole_pieces(spec.global_shape);
  if (static_cast<int>(spec.pieces.size()) != spec.global_shape.rank)
    throw std::logic_error("ParamTable: " + spec.name + " has " +
                           std::to_string(spec.pieces.size()) + " piece lists for global shape " +
                           spec.global_shape.to_string());
  Shape local;
  local.rank = spec.global_shape.rank;
  for (int d = 0; d < local.rank; ++d) {
    int64_t extent = 0;
    for (const IndexRange& r : spec.pieces[static_cast<size_t>(d)]) {
      if (r.begin < 0 || r.end > spec.global_shape[d] || r.size() <= 0)
        throw std::logic_error("ParamTable: " + spec.name + " piece [" + std::to_string(r.begin) +
                               ", " + std::to_string(r.end) + ") of dim " + std::to_string(d) +
                               " lies outside global shape " + spec.global_shape.to_string());
      extent += r.size();
    }
    local.dims[static_cast<size_t>(d)] = extent;
  }
  spec.shape = local;
  spec.offset = numel_;
  numel_ += local.numel();
  index_[spec.name] = specs_.size();
  specs_.push_back(std::move(spec));
  return specs_.back();
}

const ParamSpec& ParamTable::find(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw std::out_of_range("no parameter named '" + name + "'");
  return specs_[it->second];
}

std::vector<int64_t> zero_partition(const ParamTable& table, int parts) {
  // The specs are in buffer order: add() places each one after the previous.
  std::vector<TensorRows> tensors;
  for (const ParamSpec& spec : table.specs())
    tensors.push_back({spec.shape.numel(), spec.shape.rank > 0 ? spec.shape[0] : 1});
  return zero_partition(tensors, parts);
}

ParamTable build_param_table(const ModelConfig& c, const ModelParallel& par) {
  ParamTable t;
  const int64_t C = c.hidden, V = c.vocab, D = c.head_dim();
  const int64_t T = par.tp_size(), tr = par.tp_rank(), P = par.ep_size(), er = par.ep_rank();
  const double std = c.init_std;
  // GPT-2: residual projections scaled by 1/sqrt(2 * layers) so the residual stream's variance
  // does not grow with depth.
  const double residual_std = std / std::sqrt(2.0 * c.layers);
  const bool norm_bias = c.bias && c.norm == NormKind::layernorm;

  auto divisible = [&](int64_t value, const std::string& what, int64_t by, const char* axis) {
    if (value % by != 0)
      throw std::invalid_argument("model parallel: " + what + " = " + std::to_string(value) +
                                  " is not divisible by " + axis + " = " + std::to_string(by) +
                                  ": choose a " + axis + " degree that divides it");
  };
  divisible(c.heads, "heads", T, "tp");
  divisible(c.kv_heads, "kv_heads", T, "tp");
  divisible(c.vocab, "vocab", T, "tp");
  if (c.moe.experts == 0 || c.moe.every > 1)  // some layer is dense
    divisible(c.ffn_hidden, "ffn_hidden", T, "tp");
  if (c.moe.experts > 0) {
    divisible(c.expert_ffn(), "expert ffn hidden", T, "tp");
    divisible(c.moe.experts, "experts", P, "ep");
  }
  if (par.pp_rank() < 0 || par.pp_rank() >= par.pp_size())
    throw std::invalid_argument("model parallel: pp_rank " + std::to_string(par.pp_rank()) +
                                " outside [0, " + std::to_string(par.pp_size()) + ")");
  std::vector<int> stage_layers;  // this rank's layers, chunk after chunk (ascending)
  for (const StageRange& chunk : chunk_ranges(c.layers, par))
    for (int i = chunk.first; i < chunk.end; ++i)
      stage_layers.push_back(i);

  // The local share of [0, n) along a tp-split dimension, offset by `base`.
  auto tp_range = [&](int64_t n, int64_t base = 0) {
    return IndexRange{base + tr * n / T, base + (tr + 1) * n / T};
  };
  auto full = [](int64_t n) { return std::vector<IndexRange>{IndexRange{0, n}}; };
  int layer = -1;  // the block being declared; -1 outside the blocks
  auto add = [&](ParamRole role, const std::string& name, Shape global,
                 std::vector<std::vector<IndexRange>> pieces, Init init, double init_std,
                 bool decay, bool tp_sharded, bool expert, bool tied = false) {
    ParamSpec spec;
    spec.name = name;
    spec.layer = layer;
    spec.role = role;
    spec.init = init;
    spec.std = init_std;
    spec.weight_decay = decay;
    spec.global_shape = global;
    for (auto& dim : pieces)
      dim = merged(dim);
    spec.pieces = std::move(pieces);
    spec.tp_sharded = tp_sharded && T > 1;
    spec.expert = expert;
    spec.tied_copy = tied;
    return t.add(std::move(spec));
  };
  auto add_norm = [&](ParamRole role, const std::string& prefix) {
    add(role, prefix + ".weight", {C}, {full(C)}, Init::ones, 0, false, false, false);
    if (norm_bias) add(role, prefix + ".bias", {C}, {full(C)}, Init::zeros, 0, false, false, false);
  };
  // The rows of a column-parallel fc1 of `ffn` columns: SwiGLU's gate rows, then its up rows.
  auto fc1_rows = [&](int64_t ffn) {
    std::vector<IndexRange> rows{tp_range(ffn)};
    if (c.activation == ActivationKind::swiglu) rows.push_back(tp_range(ffn, ffn));
    return rows;
  };

  const bool tied_copy = c.tied_embeddings && par.pp_size() > 1 && par.last_stage();
  if (par.first_stage()) {
    add(ParamRole::embedding, "embed.wte", {V, C}, {{tp_range(V)}, full(C)}, Init::normal, std,
        true, true, false);
    if (c.position == PositionKind::learned)
      add(ParamRole::position, "embed.wpe", {c.seq_len, C}, {full(c.seq_len), full(C)},
          Init::normal, std, true, false, false);
  }
  for (const int i : stage_layers) {
    layer = i;
    const std::string l = "layers." + std::to_string(i);
    const int64_t H = c.heads, KV = c.kv_heads, qkv = (H + 2 * KV) * D;
    const std::vector<IndexRange> qkv_rows{tp_range(H * D), tp_range(KV * D, H * D),
                                           tp_range(KV * D, (H + KV) * D)};
    add_norm(ParamRole::attn_norm, l + ".attn_norm");
    add(ParamRole::qkv, l + ".attn.qkv.weight", {qkv, C}, {qkv_rows, full(C)}, Init::normal, std,
        true, true, false);
    if (c.bias)
      add(ParamRole::qkv, l + ".attn.qkv.bias", {qkv}, {qkv_rows}, Init::zeros, 0, false, true,
          false);
    add(ParamRole::attn_proj, l + ".attn.proj.weight", {C, H * D}, {full(C), {tp_range(H * D)}},
        Init::normal, residual_std, true, true, false);
    if (c.bias)
      add(ParamRole::attn_proj, l + ".attn.proj.bias", {C}, {full(C)}, Init::zeros, 0, false, false,
          false);
    add_norm(ParamRole::mlp_norm, l + ".mlp_norm");
    if (c.is_moe_layer(i)) {
      const int64_t E = c.moe.experts, F = c.expert_ffn(), F1 = c.fc1_rows(c.expert_ffn());
      const IndexRange local_experts{er * E / P, (er + 1) * E / P};
      add(ParamRole::router, l + ".moe.router.weight", {E, C}, {full(E), full(C)}, Init::normal,
          std, true, false, false);
      add(ParamRole::expert_fc1, l + ".moe.fc1.weight", {E, F1, C},
          {{local_experts}, fc1_rows(F), full(C)}, Init::normal, std, true, true, true);
      if (c.bias)
        add(ParamRole::expert_fc1, l + ".moe.fc1.bias", {E, F1}, {{local_experts}, fc1_rows(F)},
            Init::zeros, 0, false, true, true);
      add(ParamRole::expert_fc2, l + ".moe.fc2.weight", {E, C, F},
          {{local_experts}, full(C), {tp_range(F)}}, Init::normal, residual_std, true, true, true);
      if (c.bias)
        add(ParamRole::expert_fc2, l + ".moe.fc2.bias", {E, C}, {{local_experts}, full(C)},
            Init::zeros, 0, false, false, true);
    } else {
      const int64_t F = c.ffn_hidden, F1 = c.fc1_rows(c.ffn_hidden);
      add(ParamRole::fc1, l + ".mlp.fc1.weight", {F1, C}, {fc1_rows(F), full(C)}, Init::normal, std,
          true, true, false);
      if (c.bias)
        add(ParamRole::fc1, l + ".mlp.fc1.bias", {F1}, {fc1_rows(F)}, Init::zeros, 0, false, true,
            false);
      add(ParamRole::fc2, l + ".mlp.fc2.weight", {C, F}, {full(C), {tp_range(F)}}, Init::normal,
          residual_std, true, true, false);
      if (c.bias)
        add(ParamRole::fc2, l + ".mlp.fc2.bias", {C}, {full(C)}, Init::zeros, 0, false, false,
            false);
    }
  }
  layer = -1;
  if (par.last_stage()) {
    add_norm(ParamRole::final_norm, "final_norm");
    if (!c.tied_embeddings) {
      add(ParamRole::head, "lm_head.weight", {V, C}, {{tp_range(V)}, full(C)}, Init::normal, std,
          true, true, false);
    } else if (tied_copy) {
      // Same name and global indices as the first stage's embed.wte: it starts bit-identical.
      add(ParamRole::embedding, "embed.wte", {V, C}, {{tp_range(V)}, full(C)}, Init::normal, std,
          true, true, false, true);
    }
  }
  return t;
}

namespace {
DType moment_type(DType storage, bool bf16) {
  if (bf16) return DType::bf16;
  return storage == DType::f64 ? DType::f64 : DType::f32;
}
bool needs_master(DType storage) {
  return storage == DType::bf16 || storage == DType::f16;
}
// An allocation of at least one byte: an empty ZeRO part still gets distinct, valid buffers.
backend::Allocation allocate_at_least_one(Backend& be, size_t bytes) {
  return be.allocate(std::max<size_t>(bytes, 1));
}
}  // namespace

ParamStore::ParamStore(Backend& be, ParamTable table, DType storage, int zero_parts, int zero_rank,
                       bool shard_grads, bool shard_values, MomentNames moments)
    : backend_(be),
      table_(std::move(table)),
      storage_(storage),
      shard_grads_(shard_grads),
      moment_names_(moments.list()),
      moment_dtype_(moment_type(storage, moments.bf16)),
      shard_values_(shard_values) {
  if (moments.count < 0 || moments.count > 2)
    throw std::invalid_argument("ParamStore: " + std::to_string(moments.count) +
                                " moment buffers; it keeps 0 to 2");
  if (moments.bf16 && storage == DType::f64)
    throw std::invalid_argument("ParamStore: bf16 moments beside f64 storage (its G is f64)");
  if (shard_values && !shard_grads)
    throw std::invalid_argument(
        "ParamStore: sharded values (ZeRO-3) need sharded gradients (ZeRO-2's block slots)");
  if (!be.capabilities().supports(storage))
    throw std::invalid_argument("backend '" + std::string(be.name()) +
                                "' cannot store parameters in " +
                                std::string(tensor::dtype_name(storage)));
  if (zero_rank < 0 || zero_rank >= zero_parts)
    throw std::invalid_argument("ParamStore: zero_rank " + std::to_string(zero_rank) +
                                " outside [0, zero_parts = " + std::to_string(zero_parts) + ")");
  const std::vector<int64_t> bounds = zero_partition(table_, zero_parts);
  opt_begin_ = bounds[static_cast<size_t>(zero_rank)];
  opt_end_ = bounds[static_cast<size_t>(zero_rank) + 1];
  const size_t n = static_cast<size_t>(table_.numel());
  const size_t part = static_cast<size_t>(opt_end_ - opt_begin_);
  const size_t grad_size = tensor::dtype_size(grad_dtype());
  if (!shard_grads_) {
    grads_ = be.allocate(n * grad_size);
  } else {
    plan_block_units();
    part_grads_ = allocate_at_least_one(be, part * grad_size);
    front_grads_ = allocate_at_least_one(be, static_cast<size_t>(front_end_) * grad_size);
    back_grads_ =
        allocate_at_least_one(be, static_cast<size_t>(table_.numel() - back_begin_) * grad_size);
    for (int i = 0; i < kGradSlots; ++i)
      slots_.push_back(allocate_at_least_one(be, static_cast<size_t>(largest_block()) * grad_size));
  }
  const size_t value_size = tensor::dtype_size(storage);
  if (!shard_values_) {
    values_ = be.allocate(n * value_size);
  } else {
    part_values_ = allocate_at_least_one(be, part * value_size);
    front_values_ = allocate_at_least_one(be, static_cast<size_t>(front_end_) * value_size);
    back_values_ =
        allocate_at_least_one(be, static_cast<size_t>(table_.numel() - back_begin_) * value_size);
    for (int i = 0; i < kValueSlots; ++i)
      value_slots_.push_back(
          allocate_at_least_one(be, static_cast<size_t>(largest_block()) * value_size));
    value_slot_of_block_.assign(blocks_.size(), -1);
    block_of_value_slot_.assign(kValueSlots, -1);
  }
  if (needs_master(storage)) master_ = allocate_at_least_one(be, part * sizeof(float));
  if (moments.count >= 1) m_ = allocate_at_least_one(be, part * tensor::dtype_size(moment_dtype_));
  if (moments.count >= 2) v_ = allocate_at_least_one(be, part * tensor::dtype_size(moment_dtype_));
}

Tensor ParamStore::values() const {
  if (shard_values_) return {};
  return values_.view(storage_, {table_.numel()});
}

Tensor ParamStore::value_part() const {
  const int64_t n = opt_end_ - opt_begin_;
  if (shard_values_) return part_values_.view(storage_, {n});
  return values().rows(opt_begin_, n);
}

Tensor ParamStore::outer_values(size_t region) const {
  if (!shard_values_) throw std::logic_error("ParamStore::outer_values: the values are whole");
  if (region == 0) return front_values_.view(storage_, {front_end_});
  if (region == 1) return back_values_.view(storage_, {table_.numel() - back_begin_});
  throw std::out_of_range("ParamStore::outer_values: region " + std::to_string(region));
}

int ParamStore::value_slot_of(int layer) const {
  return value_slot_of_block_.at(block_index(layer));
}

int ParamStore::claim_value_slot(int layer, int keep) {
  const size_t block = block_index(layer);
  int slot = next_value_slot_;
  if (slot == keep) slot = (slot + 1) % kValueSlots;
  next_value_slot_ = (slot + 1) % kValueSlots;
  const int previous = block_of_value_slot_[static_cast<size_t>(slot)];
  if (previous >= 0) value_slot_of_block_[block_index(previous)] = -1;
  if (value_slot_of_block_[block] >= 0)
    block_of_value_slot_[static_cast<size_t>(value_slot_of_block_[block])] = -1;
  value_slot_of_block_[block] = slot;
  block_of_value_slot_[static_cast<size_t>(slot)] = layer;
  return slot;
}

Tensor ParamStore::value_slot(int slot) const {
  const int layer = block_of_value_slot_.at(static_cast<size_t>(slot));
  if (layer < 0)
    throw std::logic_error("ParamStore: value slot " + std::to_string(slot) + " holds no block");
  return value_slots_[static_cast<size_t>(slot)].view(storage_, {block_unit(layer).numel()});
}

void ParamStore::check_part_covers(int64_t begin, int64_t end, const char* what) const {
  if (opt_begin_ > begin || opt_end_ < end)
    throw std::logic_error(std::string("ParamStore::") + what + ": the optimizer part [" +
                           std::to_string(opt_begin_) + ", " + std::to_string(opt_end_) +
                           ") does not cover [" + std::to_string(begin) + ", " +
                           std::to_string(end) + "): use the data-parallel ranks' collectives");
}

void ParamStore::load_block_values(int layer) {
  if (value_slot_of(layer) >= 0) return;
  const BlockUnit& unit = block_unit(layer);
  check_part_covers(unit.begin, unit.end, "load_block_values");
  const int slot = claim_value_slot(layer);
  backend_.cast(value_slot(slot), value_part().rows(unit.begin - opt_begin_, unit.numel()));
}

void ParamStore::release_block_values() {
  std::fill(value_slot_of_block_.begin(), value_slot_of_block_.end(), -1);
  std::fill(block_of_value_slot_.begin(), block_of_value_slot_.end(), -1);
}

void ParamStore::refresh_from_part() {
  if (!shard_values_) return;
  check_part_covers(0, table_.numel(), "refresh_from_part");
  release_block_values();
  const std::array<IndexRange, 2> regions = outer_regions();
  for (size_t r = 0; r < regions.size(); ++r)
    if (regions[r].size() > 0)
      backend_.cast(outer_values(r),
                    value_part().rows(regions[r].begin - opt_begin_, regions[r].size()));
}

int64_t ParamStore::largest_block() const {
  int64_t largest = 0;
  for (const BlockUnit& unit : blocks_)
    largest = std::max(largest, unit.numel());
  return largest;
}
Tensor ParamStore::grads() const {
  if (shard_grads_) return {};
  return grads_.view(grad_dtype(), {table_.numel()});
}

// Each block's parameters are consecutive in the table (build_param_table adds them layer by
// layer), between the embeddings before and the final norm and head after.
void ParamStore::plan_block_units() {
  for (const ParamSpec& spec : table_.specs()) {
    if (spec.layer < 0) continue;
    const int64_t end = spec.offset + spec.shape.numel();
    if (blocks_.empty() || blocks_.back().layer != spec.layer) {
      if (!blocks_.empty() && blocks_.back().end != spec.offset)
        throw std::logic_error("ParamStore: the parameters of layer " + std::to_string(spec.layer) +
                               " do not follow those of the layer before in the buffer");
      blocks_.push_back({spec.layer, spec.offset, end});
    } else if (blocks_.back().end == spec.offset) {
      blocks_.back().end = end;
    } else {
      throw std::logic_error("ParamStore: the parameters of layer " + std::to_string(spec.layer) +
                             " are not consecutive in the buffer (" + spec.name + ")");
    }
  }
  front_end_ = blocks_.empty() ? table_.numel() : blocks_.front().begin;
  back_begin_ = blocks_.empty() ? table_.numel() : blocks_.back().end;
  bound_slot_.assign(blocks_.size(), -1);
}

size_t ParamStore::block_index(int layer) const {
  // Ascending layers, consecutive within a chunk (interleaved stages hold several runs).
  const auto it = std::lower_bound(blocks_.begin(), blocks_.end(), layer,
                                   [](const BlockUnit& u, int l) { return u.layer < l; });
  if (it == blocks_.end() || it->layer != layer)
    throw std::out_of_range("ParamStore: no block of layer " + std::to_string(layer) +
                            " (sharded gradients: blocks of this stage only)");
  return static_cast<size_t>(it - blocks_.begin());
}

const BlockUnit& ParamStore::block_unit(int layer) const {
  return blocks_[block_index(layer)];
}

std::array<IndexRange, 2> ParamStore::outer_regions() const {
  return {IndexRange{0, front_end_}, IndexRange{back_begin_, table_.numel()}};
}

Tensor ParamStore::grad_part() const {
  const int64_t n = opt_end_ - opt_begin_;
  if (shard_grads_) return part_grads_.view(grad_dtype(), {n});
  return grads().rows(opt_begin_, n);
}

Tensor ParamStore::slot_grads(int slot, const BlockUnit& unit) const {
  return slots_.at(static_cast<size_t>(slot)).view(grad_dtype(), {unit.numel()});
}

Tensor ParamStore::unreduced_grads(int64_t begin, int64_t end) const {
  if (begin < 0 || end < begin || end > table_.numel())
    throw std::out_of_range("ParamStore: gradient range [" + std::to_string(begin) + ", " +
                            std::to_string(end) + ") outside the buffer");
  if (!shard_grads_) return grads().rows(begin, end - begin);
  if (end <= front_end_)
    return front_grads_.view(grad_dtype(), {front_end_}).rows(begin, end - begin);
  if (begin >= back_begin_)
    return back_grads_.view(grad_dtype(), {table_.numel() - back_begin_})
        .rows(begin - back_begin_, end - begin);
  // The block holding `begin`: blocks are sorted and back to back.
  const auto it = std::upper_bound(blocks_.begin(), blocks_.end(), begin,
                                   [](int64_t at, const BlockUnit& unit) { return at < unit.end; });
  if (it != blocks_.end() && it->begin <= begin && end <= it->end) {
    const int slot = bound_slot_[static_cast<size_t>(it - blocks_.begin())];
    if (slot < 0)
      throw std::logic_error("ParamStore: the gradients of layer " + std::to_string(it->layer) +
                             " are not bound to a slot (only during its backward)");
    return slot_grads(slot, *it).rows(begin - it->begin, end - begin);
  }
  throw std::out_of_range("ParamStore: gradient range [" + std::to_string(begin) + ", " +
                          std::to_string(end) + ") spans more than one block or region");
}

int ParamStore::next_grad_slot() {
  const int slot = next_slot_;
  next_slot_ = (next_slot_ + 1) % kGradSlots;
  return slot;
}

Tensor ParamStore::bind_block_grads(int layer, int slot) {
  const BlockUnit& unit = block_unit(layer);
  if (slot < 0 || slot >= kGradSlots)
    throw std::out_of_range("ParamStore: gradient slot " + std::to_string(slot));
  for (size_t b = 0; b < blocks_.size(); ++b)
    if (bound_slot_[b] == slot) bound_slot_[b] = -1;  // a slot holds one block
  bound_slot_[block_index(layer)] = slot;
  const Tensor grads = slot_grads(slot, unit);
  backend_.fill(grads, 0.0);
  return grads;
}

void ParamStore::release_block_grads(int layer) {
  bound_slot_[block_index(layer)] = -1;
}

void ParamStore::fold_block_grads(int layer) {
  const BlockUnit& unit = block_unit(layer);
  check_part_covers(unit.begin, unit.end, "fold_block_grads");
  backend_.accumulate(grad_part().rows(unit.begin - opt_begin_, unit.numel()),
                      unreduced_grads(unit.begin, unit.end));
  release_block_grads(layer);
}

void ParamStore::fold_outer_grads() {
  check_part_covers(0, table_.numel(), "fold_outer_grads");
  const Tensor part = grad_part();
  for (const IndexRange& region : outer_regions())
    if (region.size() > 0)
      backend_.accumulate(part.rows(region.begin, region.size()),
                          unreduced_grads(region.begin, region.end));
}

Tensor ParamStore::grad_of(const ParamSpec& spec) const {
  if (!shard_grads_) return slice(grads(), spec);
  const int64_t end = spec.offset + spec.shape.numel();
  if (spec.layer >= 0 && bound_slot_[block_index(spec.layer)] < 0)
    return {};  // not during this block's backward: no gradient
  Tensor t = unreduced_grads(spec.offset, end);
  t.shape = spec.shape;
  return t;
}
Tensor ParamStore::value_of(const ParamSpec& spec) const {
  if (!shard_values_) return slice(values(), spec);
  const int64_t n = spec.shape.numel();
  Tensor t;
  if (spec.layer >= 0) {
    const int slot = value_slot_of(spec.layer);
    if (slot < 0) return {};  // not gathered: no values
    t = value_slot(slot).rows(spec.offset - block_unit(spec.layer).begin, n);
  } else if (spec.offset + n <= front_end_) {
    t = outer_values(0).rows(spec.offset, n);
  } else {
    t = outer_values(1).rows(spec.offset - back_begin_, n);
  }
  t.shape = spec.shape;
  return t;
}

Tensor ParamStore::master() const {
  return master_.data() ? master_.view(DType::f32, {opt_end_ - opt_begin_}) : Tensor{};
}
Tensor ParamStore::moment1() const {
  return m_.data() ? m_.view(moment_dtype_, {opt_end_ - opt_begin_}) : Tensor{};
}
Tensor ParamStore::moment2() const {
  return v_.data() ? v_.view(moment_dtype_, {opt_end_ - opt_begin_}) : Tensor{};
}

Tensor ParamStore::slice(const Tensor& whole, const ParamSpec& spec) {
  if (whole.empty()) return {};
  Tensor t = whole;
  t.data = static_cast<char*>(whole.data) +
           static_cast<size_t>(spec.offset) * tensor::dtype_size(whole.dtype);
  t.shape = spec.shape;
  return t;
}

Param ParamStore::param(const std::string& name) const {
  const ParamSpec& spec = table_.find(name);
  return Param{value_of(spec), grad_of(spec)};
}

void ParamStore::initialize(uint64_t seed) {
  // Generate in f64 on the host, then store through one cast per parameter. Element i takes the
  // value of its global element, so every layout starts from the same model.
  const Tensor master_all = master();
  for (const ParamSpec& spec : table_.specs()) {
    const int64_t n = spec.shape.numel();
    std::vector<double> host(static_cast<size_t>(n));
    const InitialValues initial(spec, seed);
    const bool whole = spec.shape == spec.global_shape;
    for (int64_t i = 0; i < n; ++i)
      host[static_cast<size_t>(i)] = initial(whole ? i : spec.global_index(i));
    // copy_from_host takes the destination dtype's bytes: convert on the host first.
    if (storage_ == DType::f64) {
      store_values(spec, host.data());
    } else {
      std::vector<float> f32(host.begin(), host.end());
      // The master part of this parameter: its elements inside [opt_begin_, opt_end_).
      const int64_t lo = std::max(spec.offset, opt_begin_);
      const int64_t hi = std::min(spec.offset + n, opt_end_);
      if (!master_all.empty() && lo < hi) {
        Tensor part = master_all;
        part.data = static_cast<char*>(master_all.data) +
                    static_cast<size_t>(lo - opt_begin_) * sizeof(float);
        part.shape = {hi - lo};
        backend_.copy_from_host(part, f32.data() + (lo - spec.offset));
      }
      // Storage copy = rounding of the f32 value.
      std::vector<uint16_t> narrow;
      if (storage_ == DType::f32) {
        store_values(spec, f32.data());
      } else {
        narrow.resize(f32.size());
        for (size_t i = 0; i < f32.size(); ++i)
          narrow[i] =
              storage_ == DType::bf16 ? tensor::to_bf16(f32[i]).bits : tensor::to_f16(f32[i]).bits;
        store_values(spec, narrow.data());
      }
    }
  }
  if (shard_values_) release_block_values();
  zero_grads();
  for (const Tensor& moment : {moment1(), moment2()})
    if (!moment.empty()) backend_.fill(moment, 0.0);
}

void ParamStore::store_values(const ParamSpec& spec, const void* host) {
  if (!shard_values_) {
    backend_.copy_from_host(slice(values(), spec), host);
    return;
  }
  const int64_t n = spec.shape.numel();
  const size_t item = tensor::dtype_size(storage_);
  if (spec.layer < 0) {  // an outer region holds it whole
    Tensor outer = value_of(spec);
    backend_.copy_from_host(outer, host);
  }
  const int64_t lo = std::max(spec.offset, opt_begin_), hi = std::min(spec.offset + n, opt_end_);
  if (lo < hi)
    backend_.copy_from_host(
        value_part().rows(lo - opt_begin_, hi - lo),
        static_cast<const char*>(host) + static_cast<size_t>(lo - spec.offset) * item);
}

void ParamStore::zero_grads() {
  if (!shard_grads_) {
    backend_.fill(grads(), 0.0);
    return;
  }
  for (const Tensor& t : {grad_part(), front_grads_.view(grad_dtype(), {front_end_}),
                          back_grads_.view(grad_dtype(), {table_.numel() - back_begin_})})
    if (t.numel() > 0) backend_.fill(t, 0.0);
}

ParamStore::Bytes ParamStore::bytes() const {
  const size_t part = static_cast<size_t>(opt_end_ - opt_begin_);
  Bytes b;
  b.params = values_.bytes();
  if (shard_values_)
    b.params = (part + static_cast<size_t>(front_end_ + table_.numel() - back_begin_) +
                static_cast<size_t>(kValueSlots * largest_block())) *
               tensor::dtype_size(storage_);
  b.grads = grads_.bytes();
  if (shard_grads_) {
    const size_t item = tensor::dtype_size(grad_dtype());
    b.grads = (part + static_cast<size_t>(front_end_ + table_.numel() - back_begin_)) * item;
    b.grads += static_cast<size_t>(kGradSlots * largest_block()) * item;
  }
  b.optimizer = (has_master() ? part * sizeof(float) : 0) +
                static_cast<size_t>(moments()) * part * tensor::dtype_size(moment_dtype_);
  return b;
}

}  // namespace trainctl::model
