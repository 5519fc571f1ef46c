#include "train/checkpointing.hpp"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <vector>

#include "data/data.hpp"
#include "train/state_json.hpp"

namespace trainctl::train {

namespace {

std::vector<int64_t> dims(const tensor::Shape& s) {
  return std::vector<int64_t>(s.dims.begin(), s.dims.begin() + s.rank);
}

// The buffers of a ParamStore that a checkpoint carries, with their name prefixes.
std::vector<std::pair<std::string, tensor::Tensor>> buffers(const model::ParamStore& p) {
  std::vector<std::pair<std::string, tensor::Tensor>> out{{"model/", p.values()}};
  if (p.has_master()) out.push_back({"master/", p.master()});
  out.push_back({"adam_m/", p.moment1()});
  out.push_back({"adam_v/", p.moment2()});
  return out;
}

}  // namespace

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
          {"position", c.position == model::PositionKind::learned ? "learned" : "rope"},
          {"tied_embeddings", c.tied_embeddings},
          {"bias", c.bias},
          {"experts", c.moe.experts},
          {"top_k", c.moe.top_k},
          {"moe_every", c.moe.every},
          {"expert_ffn_hidden", c.expert_ffn()},
          {"storage", std::string(tensor::dtype_name(c.storage))}};
}

ckpt::SaveRequest capture_checkpoint(ckpt::SaveRequest request, const model::Transformer& model,
                                     const Trainer& trainer, backend::Backend& be,
                                     const std::string& recipe_hash, const nlohmann::json& layout) {
  const TrainerState state = trainer.state();
  request.header.step = state.step;
  request.header.recipe_hash = recipe_hash;
  request.header.layout = layout;
  request.header.model = describe_model(model.config());
  request.header.state = to_json(state);
  const model::ParamStore& params = model.params();
  for (const auto& [prefix, whole] : buffers(params)) {
    std::byte* host = request.allocate(whole.bytes());
    if (whole.device == tensor::Device::cpu)
      ckpt::copy_parallel(host, whole.data, whole.bytes());
    else
      be.copy_to_host(host, whole);
    for (const model::ParamSpec& spec : params.table().specs()) {
      const size_t offset = static_cast<size_t>(spec.offset) * tensor::dtype_size(whole.dtype);
      request.add_view(prefix + spec.name, whole.dtype, dims(spec.shape), {}, host + offset);
    }
  }
  return request;
}

ckpt::SaveRequest capture_checkpoint(const model::Transformer& model, const Trainer& trainer,
                                     backend::Backend& be, const std::string& recipe_hash,
                                     const nlohmann::json& layout) {
  return capture_checkpoint(ckpt::SaveRequest{}, model, trainer, be, recipe_hash, layout);
}

void restore_checkpoint(const ckpt::CheckpointReader& reader, model::Transformer& model,
                        Trainer& trainer, backend::Backend& be) {
  const nlohmann::json expected = describe_model(model.config());
  const nlohmann::json& saved = reader.manifest().header.model;
  for (const auto& [key, value] : expected.items()) {
    const auto it = saved.find(key);
    if (it == saved.end() || *it != value)
      throw CheckpointMismatch(fmt::format(
          "{}: saved for another model: model {} is {} there but {} in this recipe",
          reader.dir().string(), key, it == saved.end() ? "missing" : it->dump(), value.dump()));
  }
  const model::ParamStore& params = model.params();
  std::vector<unsigned char> staging;
  for (const auto& [prefix, whole] : buffers(params)) {
    void* base = whole.data;
    if (whole.device != tensor::Device::cpu) {
      staging.resize(whole.bytes());
      base = staging.data();
    }
    for (const model::ParamSpec& spec : params.table().specs()) {
      const std::string name = prefix + spec.name;
      const ckpt::TensorEntry& entry = reader.tensor(name);
      if (entry.dtype != whole.dtype || entry.shape != dims(spec.shape))
        throw CheckpointMismatch(fmt::format(
            "{}: tensor {} is {} [{}] in the checkpoint but {} {} in this model",
            reader.dir().string(), name, tensor::dtype_name(entry.dtype),
            fmt::join(entry.shape, ", "), tensor::dtype_name(whole.dtype), spec.shape.to_string()));
      const size_t offset = static_cast<size_t>(spec.offset) * tensor::dtype_size(whole.dtype);
      reader.read(name, whole.dtype, static_cast<char*>(base) + offset);
    }
    if (whole.device != tensor::Device::cpu) be.copy_from_host(whole, staging.data());
  }
  TrainerState state;
  try {
    state = trainer_state_from_json(reader.manifest().header.state);
  } catch (const std::runtime_error& e) {
    throw ckpt::CheckpointError(reader.dir().string() + "/manifest.json: " + e.what());
  }
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
