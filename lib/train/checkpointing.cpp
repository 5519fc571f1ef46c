#include "train/checkpointing.hpp"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "data/data.hpp"
#include "train/optimizer.hpp"
#include "train/state_json.hpp"

namespace trainctl::train {

namespace {

using ckpt::Range;

std::vector<int64_t> dims(const tensor::Shape& s) {
  return std::vector<int64_t>(s.dims.begin(), s.dims.begin() + s.rank);
}

// A spec's global shape and pieces; a spec made by hand without them is unsplit.
std::vector<int64_t> global_dims(const model::ParamSpec& spec) {
  return spec.global_shape.rank == spec.shape.rank ? dims(spec.global_shape) : dims(spec.shape);
}

int64_t rows_of(const model::ParamSpec& spec) {
  return spec.shape.rank > 0 ? spec.shape[0] : 1;
}

// One checkpointed buffer of a ParamStore: whole values cover the whole flat buffer, the
// optimizer state and sharded values (ZeRO-3) the part [optimizer_begin, optimizer_end) of it.
// ZeRO-3's outer regions are read on restore (they are whole for the step) but never written:
// the parts write those elements.
struct Buffer {
  std::string prefix;
  tensor::Tensor whole;
  int64_t begin = 0;         // flat element index of whole's first element
  bool partitioned = false;  // the ZeRO part: written by every dp rank (SaveRole::writes_part)
  bool written = true;
  bool moment = false;  // the optimizer's moments: read from f32 or bf16 (state_dtype changed)
};

std::vector<Buffer> buffers(const model::ParamStore& p) {
  const int64_t b = p.optimizer_begin();
  std::vector<Buffer> out;
  if (!p.values_sharded()) {
    out.push_back({"model/", p.values(), 0, false});
  } else {
    out.push_back({"model/", p.value_part(), b, true});
    const std::array<model::IndexRange, 2> regions = p.outer_regions();
    for (size_t r = 0; r < regions.size(); ++r)
      out.push_back({"model/", p.outer_values(r), regions[r].begin, false, false});
  }
  if (p.has_master()) out.push_back({"master/", p.master(), b, true});
  // The optimizer's state, by the names it gives its buffers (train::moment_names).
  const tensor::Tensor moments[] = {p.moment1(), p.moment2()};
  for (size_t i = 0; i < p.moment_names().size(); ++i)
    out.push_back({p.moment_names()[i] + "/", moments[i], b, true, true, true});
  return out;
}

// The local rows of `spec` whose elements `buffer` holds: all of them for values, the rows inside
// the ZeRO part for the optimizer state (zero_partition cuts at row boundaries). Empty: none.
std::pair<int64_t, int64_t> rows_in(const model::ParamSpec& spec, const Buffer& buffer) {
  const int64_t numel = spec.shape.numel(), rows = rows_of(spec);
  const int64_t first = std::max(spec.offset, buffer.begin);
  const int64_t last = std::min(spec.offset + numel, buffer.begin + buffer.whole.numel());
  if (first >= last) return {0, 0};
  const int64_t row = numel / rows;
  if ((first - spec.offset) % row != 0 || (last - spec.offset) % row != 0)
    throw std::logic_error(fmt::format(
        "checkpoint: the optimizer part [{}, {}) cuts parameter {} inside a row (rows of {} "
        "elements from {}); zero_partition must cut at row boundaries",
        buffer.begin, buffer.begin + buffer.whole.numel(), spec.name, row, spec.offset));
  return {(first - spec.offset) / row, (last - spec.offset) / row};
}

// Copies box `box` of a row-major tensor of shape `shape` at `tensor` to or from `packed`
// (the box's elements, row-major), one contiguous run at a time.
void copy_box(const std::vector<int64_t>& shape, const std::vector<Range>& box, size_t element,
              char* tensor, char* packed, bool to_packed) {
  const auto n = static_cast<int>(shape.size());
  if (n == 0) {
    to_packed ? std::memcpy(packed, tensor, element) : std::memcpy(tensor, packed, element);
    return;
  }
  std::vector<int64_t> stride(static_cast<size_t>(n), 1);
  for (int d = n - 2; d >= 0; --d)
    stride[static_cast<size_t>(d)] =
        stride[static_cast<size_t>(d) + 1] * shape[static_cast<size_t>(d) + 1];
  // The run: dimension `inner` from box begin to end, and every dimension after it whole.
  int inner = n - 1;
  int64_t run = box.back().size();
  while (inner > 0 && box[static_cast<size_t>(inner)].size() == shape[static_cast<size_t>(inner)]) {
    --inner;
    run *= box[static_cast<size_t>(inner)].size();
  }
  const size_t run_bytes = static_cast<size_t>(run) * element;
  std::vector<int64_t> at(static_cast<size_t>(inner));  // position among the outer dimensions
  for (int d = 0; d < inner; ++d)
    at[static_cast<size_t>(d)] = box[static_cast<size_t>(d)].begin;
  for (;;) {
    int64_t offset = box[static_cast<size_t>(inner)].begin * stride[static_cast<size_t>(inner)];
    for (int d = 0; d < inner; ++d)
      offset += at[static_cast<size_t>(d)] * stride[static_cast<size_t>(d)];
    char* t = tensor + static_cast<size_t>(offset) * element;
    to_packed ? std::memcpy(packed, t, run_bytes) : std::memcpy(t, packed, run_bytes);
    packed += run_bytes;
    int d = inner - 1;
    for (; d >= 0; --d) {
      if (++at[static_cast<size_t>(d)] < box[static_cast<size_t>(d)].end) break;
      at[static_cast<size_t>(d)] = box[static_cast<size_t>(d)].begin;
    }
    if (d < 0) return;
  }
}

// The flat element offset of a box inside its tensor when the box is one contiguous run of it,
// else -1.
int64_t contiguous_offset(const std::vector<int64_t>& shape, const std::vector<Range>& box) {
  int64_t offset = 0, stride = 1;
  bool outer_single = false;  // past a partial dimension, every outer one must have extent 1
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    const Range r = box[static_cast<size_t>(d)];
    if (outer_single && r.size() != 1) return -1;
    if (r.size() != shape[static_cast<size_t>(d)]) outer_single = true;
    offset += r.begin * stride;
    stride *= shape[static_cast<size_t>(d)];
  }
  return offset;
}

// Where capture puts its host memory: a SaveRequest, or nowhere while counting bytes.
class CaptureTarget {
 public:
  explicit CaptureTarget(ckpt::SaveRequest* request) : request_(request) {}
  std::byte* allocate(size_t bytes) {
    bytes_ += (std::max<size_t>(bytes, 1) + 63) / 64 * 64;  // HostArena's rounding
    return request_ ? request_->allocate(bytes) : nullptr;
  }
  bool counting() const { return request_ == nullptr; }
  ckpt::SaveRequest& request() { return *request_; }
  size_t bytes() const { return bytes_; }

 private:
  ckpt::SaveRequest* request_;
  size_t bytes_ = 0;
};

// `be` may be null while counting.
void capture_params(CaptureTarget& target, const model::ParamStore& params, const SaveRole& role,
                    backend::Backend* be) {
  for (const Buffer& buffer : buffers(params)) {
    if (!buffer.written) continue;
    const auto writes = [&](const model::ParamSpec& spec) {
      const auto [first, last] = rows_in(spec, buffer);
      return first < last &&
             (buffer.partitioned ? role.writes_part(spec) : role.writes_values(spec));
    };
    const auto& specs = params.table().specs();
    if (std::none_of(specs.begin(), specs.end(), writes)) continue;
    const size_t element = tensor::dtype_size(buffer.whole.dtype);
    std::byte* host = target.allocate(buffer.whole.bytes());
    if (!target.counting()) {
      if (buffer.whole.device == tensor::Device::cpu)
        ckpt::copy_parallel(host, buffer.whole.data, buffer.whole.bytes());
      else
        be->copy_to_host(host, buffer.whole);
    }
    for (const model::ParamSpec& spec : specs) {
      if (!writes(spec)) continue;
      const auto [first, last] = rows_in(spec, buffer);
      const std::vector<int64_t> local_shape = dims(spec.shape), global_shape = global_dims(spec);
      std::byte* local = target.counting()
                             ? nullptr
                             : host + static_cast<size_t>(spec.offset - buffer.begin) * element;
      for (ParamBox& box : param_boxes(spec, first, last)) {
        const int64_t offset = contiguous_offset(local_shape, box.local);
        std::byte* data = nullptr;
        if (offset >= 0) {
          data = target.counting() ? nullptr : local + static_cast<size_t>(offset) * element;
        } else {  // a box strided in the local tensor: pack it
          int64_t count = 1;
          for (const Range& r : box.local)
            count *= r.size();
          data = target.allocate(static_cast<size_t>(count) * element);
          if (!target.counting())
            copy_box(local_shape, box.local, element, reinterpret_cast<char*>(local),
                     reinterpret_cast<char*>(data), true);
        }
        if (!target.counting())
          target.request().add_view(buffer.prefix + spec.name, buffer.whole.dtype, global_shape,
                                    std::move(box.global), data);
      }
    }
  }
}

// Whether this rank writes the optimizer's state tensor `t` (Optimizer::state_tensors): every
// rank holding the parameter keeps the same whole statistics, so the dp, tp (and, but for an
// expert's, ep) coordinate 0 writes them; the last stage's tied copy never does.
bool writes_state(const Optimizer::StateTensor& t, const SaveRole& role) {
  return role.dp == 0 && role.tp == 0 && (t.spec->expert || role.ep == 0) && !t.spec->tied_copy;
}

std::vector<Range> box_of(const Optimizer::StateTensor& t) {
  std::vector<Range> box;
  for (const auto& [begin, end] : t.box)
    box.push_back({begin, end});
  return box;
}

// The optimizer's own state (Adafactor's statistics) into the request, as capture_params does
// for the store's buffers. `be` may be null while counting.
void capture_optimizer_state(CaptureTarget& target, const Optimizer& optimizer,
                             const SaveRole& role, backend::Backend* be) {
  const tensor::Tensor state = optimizer.state();
  const std::vector<Optimizer::StateTensor>& tensors = optimizer.state_tensors();
  if (state.empty() ||
      std::none_of(tensors.begin(), tensors.end(),
                   [&](const Optimizer::StateTensor& t) { return writes_state(t, role); }))
    return;
  std::byte* host = target.allocate(state.bytes());
  if (target.counting()) return;
  be->copy_to_host(host, state);
  const size_t item = tensor::dtype_size(state.dtype);
  for (const Optimizer::StateTensor& t : tensors)
    if (writes_state(t, role))
      target.request().add_view(t.name, state.dtype, t.global_shape, box_of(t),
                                host + static_cast<size_t>(t.offset) * item);
}

bool float_state(tensor::DType t) {
  return t == tensor::DType::f32 || t == tensor::DType::bf16;
}

// `count` moments of type `from` (f32 or bf16) at `src` as `to` at `dst`.
void convert_state(tensor::DType from, const char* src, tensor::DType to, char* dst,
                   int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    float x = 0;
    if (from == tensor::DType::f32) {
      std::memcpy(&x, src + i * 4, 4);
    } else {
      tensor::bf16 b;
      std::memcpy(&b.bits, src + i * 2, 2);
      x = tensor::to_float(b);
    }
    if (to == tensor::DType::f32) {
      std::memcpy(dst + i * 4, &x, 4);
    } else {
      const tensor::bf16 b = tensor::to_bf16(x);
      std::memcpy(dst + i * 2, &b.bits, 2);
    }
  }
}

}  // namespace

namespace {

// Fills every box of this rank's parameters in the buffers `take` accepts: fill(buffer, spec,
// name, global box, dst, count) writes the box's `count` elements, row-major in the buffer's
// dtype, to dst; a box that is strided in the local tensor goes through scratch. Device buffers
// are staged on the host and copied once.
template <class Take, class Fill>
void fill_param_boxes(const model::ParamStore& params, backend::Backend& be, Take take, Fill fill) {
  std::vector<char> staging, scratch;
  for (const Buffer& buffer : buffers(params)) {
    if (buffer.whole.numel() == 0 || !take(buffer)) continue;
    const size_t element = tensor::dtype_size(buffer.whole.dtype);
    char* base = static_cast<char*>(buffer.whole.data);
    if (buffer.whole.device != tensor::Device::cpu) {
      staging.resize(buffer.whole.bytes());
      base = staging.data();
    }
    for (const model::ParamSpec& spec : params.table().specs()) {
      const auto [first, last] = rows_in(spec, buffer);
      if (first >= last) continue;
      const std::string name = buffer.prefix + spec.name;
      const std::vector<int64_t> local_shape = dims(spec.shape);
      char* local = base + static_cast<size_t>(spec.offset - buffer.begin) * element;
      for (const ParamBox& box : param_boxes(spec, first, last)) {
        int64_t count = 1;
        for (const Range& r : box.local)
          count *= r.size();
        const int64_t offset = contiguous_offset(local_shape, box.local);
        if (offset >= 0) {
          fill(buffer, spec, name, box.global, local + static_cast<size_t>(offset) * element,
               count);
          continue;
        }
        scratch.resize(static_cast<size_t>(count) * element);
        fill(buffer, spec, name, box.global, scratch.data(), count);
        copy_box(local_shape, box.local, element, local, scratch.data(), false);
      }
    }
    if (buffer.whole.device != tensor::Device::cpu) be.copy_from_host(buffer.whole, staging.data());
  }
}

}  // namespace

void read_param_tensors(const ckpt::CheckpointReader& reader, const model::ParamStore& params,
                        backend::Backend& be) {
  std::vector<char> stored;
  fill_param_boxes(
      params, be, [](const Buffer&) { return true; },
      [&](const Buffer& buffer, const model::ParamSpec& spec, const std::string& name,
          const std::vector<Range>& global, char* dst, int64_t count) {
        const ckpt::TensorEntry& entry = reader.tensor(name);
        const std::vector<int64_t> global_shape = global_dims(spec);
        // Moments saved under another optimizer.state_dtype are converted: bf16 to f32 exactly,
        // f32 to bf16 rounded to nearest.
        const bool converted = buffer.moment && entry.dtype != buffer.whole.dtype &&
                               float_state(entry.dtype) && float_state(buffer.whole.dtype);
        if ((entry.dtype != buffer.whole.dtype && !converted) || entry.shape != global_shape)
          throw CheckpointMismatch(
              fmt::format("{}: tensor {} is {} [{}] in the checkpoint but {} [{}] in this model",
                          reader.dir().string(), name, tensor::dtype_name(entry.dtype),
                          fmt::join(entry.shape, ", "), tensor::dtype_name(buffer.whole.dtype),
                          fmt::join(global_shape, ", ")));
        if (!converted) return reader.read(name, global, buffer.whole.dtype, dst);
        stored.resize(static_cast<size_t>(count) * tensor::dtype_size(entry.dtype));
        reader.read(name, global, entry.dtype, stored.data());
        convert_state(entry.dtype, stored.data(), buffer.whole.dtype, dst, count);
      });
}

ckpt::Manifest weights_wanted(const model::ModelConfig& config) {
  ckpt::Manifest m;
  m.header.model = describe_model(config);
  const model::ParamTable table = model::build_param_table(config);
  for (const model::ParamSpec& spec : table.specs())
    if (!spec.tied_copy && !m.find("model/" + spec.name))
      m.tensors.push_back({"model/" + spec.name, config.storage, global_dims(spec), {}});
  return m;
}

void load_initial_weights(const ckpt::WeightSource& source, model::ParamStore& params,
                          backend::Backend& be) {
  // The values, and the fp32 master copy of 16-bit storage (the same weights, wider); the
  // optimizer's state stays as a fresh run's.
  fill_param_boxes(
      params, be,
      [](const Buffer& buffer) { return buffer.prefix == "model/" || buffer.prefix == "master/"; },
      [&](const Buffer& buffer, const model::ParamSpec& spec, const std::string&,
          const std::vector<Range>& global, char* dst,
          int64_t) { source.read("model/" + spec.name, global, buffer.whole.dtype, dst); });
  if (params.values_sharded()) params.release_block_values();
}

std::vector<ParamBox> param_boxes(const model::ParamSpec& spec, int64_t row_begin,
                                  int64_t row_end) {
  const int rank = spec.shape.rank;
  if (rank == 0)
    return row_begin < row_end ? std::vector<ParamBox>{{{}, {}}} : std::vector<ParamBox>{};
  // Per dimension, the (global, local) range pairs: dimension 0 cut to the rows asked for.
  std::vector<std::vector<std::pair<Range, Range>>> per_dim(static_cast<size_t>(rank));
  for (int d = 0; d < rank; ++d) {
    std::vector<model::IndexRange> pieces;
    if (static_cast<int>(spec.pieces.size()) == rank)
      pieces = spec.pieces[static_cast<size_t>(d)];
    else
      pieces = {{0, spec.shape[d]}};
    int64_t local = 0;
    for (const model::IndexRange& p : pieces) {
      Range l{local, local + p.size()};
      local += p.size();
      if (d == 0) {
        l = {std::max(l.begin, row_begin), std::min(l.end, row_end)};
        if (l.begin >= l.end) continue;
      }
      const int64_t shift = p.begin - (local - p.size());
      per_dim[static_cast<size_t>(d)].push_back({{l.begin + shift, l.end + shift}, l});
    }
    if (local != spec.shape[d])
      throw std::logic_error(
          fmt::format("parameter {}: the pieces of dimension {} add up to {}, "
                      "its local shape says {}",
                      spec.name, d, local, spec.shape[d]));
  }
  std::vector<ParamBox> boxes{{}};
  for (const auto& choices : per_dim) {
    std::vector<ParamBox> next;
    for (const ParamBox& box : boxes)
      for (const auto& [global, local] : choices) {
        ParamBox b = box;
        b.global.push_back(global);
        b.local.push_back(local);
        next.push_back(std::move(b));
      }
    boxes = std::move(next);
  }
  return boxes;
}

bool SaveRole::writes_values(const model::ParamSpec& spec) const {
  return dp == 0 && !spec.tied_copy && (spec.tp_sharded || tp == 0) && (spec.expert || ep == 0);
}

bool SaveRole::writes_part(const model::ParamSpec& spec) const {
  return (zero || dp == 0) && !spec.tied_copy && (spec.tp_sharded || tp == 0) &&
         (spec.expert || ep == 0);
}

SaveRole save_role(const model::Transformer& model, const Trainer& trainer) {
  SaveRole role;
  if (const comm::Mesh* mesh = trainer.mesh()) {
    const comm::Coordinates& c = mesh->groups().coordinates;
    role = {c.tp, c.ep, mesh->dp_cp().rank(), false};  // dp: the replica (cp ranks are replicas)
  }
  role.zero = model.parallel().zero_parts() > 1;
  return role;
}

nlohmann::json describe_model(const model::ModelConfig& c) {
  return {{"layers", c.layers},
          {"hidden", c.hidden},
          {"heads", c.heads},
          {"kv_heads", c.kv_heads},
          {"ffn_hidden", c.ffn_hidden},
          {"vocab", c.vocab},
          {"seq_len", c.seq_len},
          {"norm", c.norm == model::NormKind::layernorm ? "layernorm" : "rmsnorm"},
          {"activation", c.activation == model::ActivationKind::gelu ? "gelu" : "swiglu"},
          // The exact forms, for readers that compute the model (ckpt export --format hf):
          // GELU's tanh approximation (GPT-2's gelu_new), SwiGLU's silu(gate) * up.
          {"activation_fn", c.activation == model::ActivationKind::gelu ? "gelu_tanh" : "silu"},
          {"norm_eps", c.norm_eps},
          {"position", c.position == model::PositionKind::learned ? "learned" : "rope"},
          {"rope_theta", c.rope_theta},
          {"tied_embeddings", c.tied_embeddings},
          {"bias", c.bias},
          {"experts", c.moe.experts},
          {"top_k", c.moe.top_k},
          {"capacity_factor", c.moe.capacity_factor},
          {"router", c.moe.router == model::MoeRouter::softmax ? "softmax" : "softmax_topk_renorm"},
          {"moe_every", c.moe.every},
          {"expert_ffn_hidden", c.expert_ffn()},
          {"storage", std::string(tensor::dtype_name(c.storage))}};
}

model::ModelConfig model_from_description(const nlohmann::json& d, const std::string& source) {
  auto field = [&](const char* key) -> const nlohmann::json& {
    const auto it = d.find(key);
    if (it == d.end())
      throw ckpt::CheckpointError(fmt::format(
          "{}: the manifest's model description has no \"{}\"; re-save the checkpoint with this "
          "trainctl (resume it for 0 steps)",
          source, key));
    return *it;
  };
  // One of two spellings (describe_model's), as a flag: true for `yes`.
  auto choice = [&](const char* key, const char* yes, const char* no) {
    const std::string value = field(key).get<std::string>();
    if (value != yes && value != no)
      throw ckpt::CheckpointError(
          fmt::format("{}: the manifest's model description has {} \"{}\"; expected \"{}\" or "
                      "\"{}\"",
                      source, key, value, yes, no));
    return value == yes;
  };
  model::ModelConfig c;
  try {
    c.layers = field("layers").get<int>();
    c.hidden = field("hidden").get<int>();
    c.heads = field("heads").get<int>();
    c.kv_heads = field("kv_heads").get<int>();
    c.ffn_hidden = field("ffn_hidden").get<int>();
    c.vocab = field("vocab").get<int>();
    c.seq_len = field("seq_len").get<int>();
    c.norm = choice("norm", "layernorm", "rmsnorm") ? model::NormKind::layernorm
                                                    : model::NormKind::rmsnorm;
    c.activation = choice("activation", "gelu", "swiglu") ? model::ActivationKind::gelu
                                                          : model::ActivationKind::swiglu;
    c.position = choice("position", "learned", "rope") ? model::PositionKind::learned
                                                       : model::PositionKind::rope;
    // Recorded since the Hugging Face folder export; older manifests keep the defaults.
    if (d.contains("norm_eps")) c.norm_eps = d.at("norm_eps").get<double>();
    if (d.contains("rope_theta")) c.rope_theta = d.at("rope_theta").get<double>();
    if (d.contains("capacity_factor"))
      c.moe.capacity_factor = d.at("capacity_factor").get<double>();
    if (d.contains("router") && d.at("router").get<std::string>() == "softmax_topk_renorm")
      c.moe.router = model::MoeRouter::softmax_topk_renorm;
    c.tied_embeddings = field("tied_embeddings").get<bool>();
    c.bias = field("bias").get<bool>();
    c.moe.experts = field("experts").get<int>();
    c.moe.top_k = field("top_k").get<int>();
    c.moe.every = field("moe_every").get<int>();
    // describe_model records the resolved width: 0 ("same as ffn_hidden") resolves to the same.
    c.moe.expert_ffn_hidden = field("expert_ffn_hidden").get<int>();
    const std::string storage = field("storage").get<std::string>();
    const auto dtype = ckpt::parse_dtype(storage);
    if (!dtype)
      throw ckpt::CheckpointError(fmt::format(
          "{}: the manifest's model description has storage \"{}\", not a dtype", source, storage));
    c.storage = *dtype;
  } catch (const nlohmann::json::type_error& e) {
    throw ckpt::CheckpointError(
        fmt::format("{}: the manifest's model description has a field of the wrong type: {}",
                    source, e.what()));
  }
  try {
    c.check();
  } catch (const std::invalid_argument& e) {
    throw ckpt::CheckpointError(
        fmt::format("{}: the manifest's model description is inconsistent: {}", source, e.what()));
  }
  return c;
}

ckpt::SaveRequest capture_checkpoint(ckpt::SaveRequest request, const model::Transformer& model,
                                     const Trainer& trainer, backend::Backend& be,
                                     const std::string& recipe_hash, const nlohmann::json& layout) {
  trainer.wait_parameters();  // ZeRO-1 with overlap: the other ranks' parts may still arrive
  const TrainerState state = trainer.state();
  request.header.step = state.step;
  request.header.recipe_hash = recipe_hash;
  request.header.layout = layout;
  request.header.model = describe_model(model.config());
  request.header.state = to_json(state);
  const SaveRole role = save_role(model, trainer);
  add_param_tensors(request, model.params(), role, be);
  CaptureTarget target(&request);
  capture_optimizer_state(target, trainer.optimizer(), role, &be);
  return request;
}

size_t capture_bytes(const model::Transformer& model, const Trainer& trainer) {
  CaptureTarget target(nullptr);
  const SaveRole role = save_role(model, trainer);
  capture_params(target, model.params(), role, nullptr);
  capture_optimizer_state(target, trainer.optimizer(), role, nullptr);
  return target.bytes();
}

void add_param_tensors(ckpt::SaveRequest& request, const model::ParamStore& params,
                       const SaveRole& role, backend::Backend& be) {
  CaptureTarget target(&request);
  capture_params(target, params, role, &be);
}

ckpt::SaveRequest capture_checkpoint(const model::Transformer& model, const Trainer& trainer,
                                     backend::Backend& be, const std::string& recipe_hash,
                                     const nlohmann::json& layout) {
  return capture_checkpoint(ckpt::SaveRequest{}, model, trainer, be, recipe_hash, layout);
}

void restore_checkpoint(const ckpt::CheckpointReader& reader, model::Transformer& model,
                        Trainer& trainer, backend::Backend& be) {
  trainer.wait_parameters();  // a gather still running would overwrite what is read
  const nlohmann::json expected = describe_model(model.config());
  const nlohmann::json& saved = reader.manifest().header.model;
  for (const auto& [key, value] : expected.items()) {
    const auto it = saved.find(key);
    if (it == saved.end() || *it != value)
      throw CheckpointMismatch(fmt::format(
          "{}: saved for another model: model {} is {} there but {} in this recipe",
          reader.dir().string(), key, it == saved.end() ? "missing" : it->dump(), value.dump()));
  }
  TrainerState state;
  try {
    state = trainer_state_from_json(reader.manifest().header.state);
  } catch (const std::runtime_error& e) {
    throw ckpt::CheckpointError(reader.dir().string() + "/manifest.json: " + e.what());
  }
  // Another optimizer's state holds other quantities (Adam's v is not Lion's momentum).
  if (state.optimizer != trainer.optimizer_name())
    throw CheckpointMismatch(fmt::format(
        "{}: saved by optimizer {}, but this recipe's optimizer.name is {}: one optimizer's "
        "state cannot continue as another's; resume with optimizer.name: {} (another optimizer "
        "needs a new run)",
        reader.dir().string(), state.optimizer, trainer.optimizer_name(), state.optimizer));
  read_param_tensors(reader, model.params(), be);
  // The optimizer's own state: each rank reads the boxes it holds (whole statistics).
  if (const tensor::Tensor own = trainer.optimizer().state(); !own.empty()) {
    std::vector<std::byte> host(own.bytes());
    const size_t item = tensor::dtype_size(own.dtype);
    for (const Optimizer::StateTensor& t : trainer.optimizer().state_tensors()) {
      const ckpt::TensorEntry& entry = reader.tensor(t.name);
      if (entry.dtype != own.dtype || entry.shape != t.global_shape)
        throw CheckpointMismatch(
            fmt::format("{}: tensor {} is {} [{}] in the checkpoint but {} [{}] in this run",
                        reader.dir().string(), t.name, tensor::dtype_name(entry.dtype),
                        fmt::join(entry.shape, ", "), tensor::dtype_name(own.dtype),
                        fmt::join(t.global_shape, ", ")));
      reader.read(t.name, box_of(t), own.dtype, host.data() + static_cast<size_t>(t.offset) * item);
    }
    be.copy_from_host(own, host.data());
  }
  // ZeRO-3: a block slot would hold the values from before.
  if (model.params().values_sharded()) model.params().release_block_values();
  if (state.step != reader.step())
    throw ckpt::CheckpointError(fmt::format("{}: state step {} does not match manifest step {}",
                                            reader.dir().string(), state.step, reader.step()));
  try {
    trainer.restore(state);
  } catch (const data::DataError& e) {
    throw CheckpointMismatch(
        fmt::format("{}: its data position does not fit this recipe's data: {}",
                    reader.dir().string(), e.what()));
  }
}

}  // namespace trainctl::train
