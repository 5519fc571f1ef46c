// model.init_from at recipe time: the model keys its source fixes (internal.hpp), so a recipe that
// disagrees with the weights it starts from is refused with the other recipe problems, before
// anything runs.
#include <fmt/format.h>

#include "ckpt/weights.hpp"
#include "recipe/internal.hpp"

namespace trainctl::recipe::internal {

namespace {

// The description's field for each key it fixes (describe_model's names; a Hugging Face config
// is described in the same names by ckpt::describe_hf_config).
constexpr std::pair<const char*, const char*> kModelKeys[] = {
    {"layers", "model.layers"},
    {"hidden", "model.hidden"},
    {"heads", "model.heads"},
    {"kv_heads", "model.kv_heads"},
    {"ffn_hidden", "model.ffn_hidden"},
    {"vocab", "model.vocab"},
    {"norm", "model.norm"},
    {"activation", "model.activation"},
    {"position", "model.position"},
    {"tied_embeddings", "model.tied_embeddings"},
    {"bias", "model.bias"},
    {"norm_eps", "model.norm_eps"},
    {"experts", "moe.experts"}};
constexpr std::pair<const char*, const char*> kRopeKey = {"rope_theta", "model.rope_theta"};
// Learned positions are a table of seq_len rows; RoPE models train at any length.
constexpr std::pair<const char*, const char*> kLearnedKey = {"seq_len", "model.seq_len"};
constexpr std::pair<const char*, const char*> kMoeKeys[] = {
    {"top_k", "moe.top_k"},
    {"moe_every", "moe.every"},
    {"expert_ffn_hidden", "moe.expert_ffn_hidden"},
    {"router", "moe.router"},
    {"capacity_factor", "moe.capacity_factor"}};

}  // namespace

std::vector<std::string_view> init_from_key_paths() {
  std::vector<std::string_view> paths = {"model.arch", kRopeKey.second, kLearnedKey.second};
  for (const auto& [field, key] : kModelKeys)
    paths.push_back(key);
  for (const auto& [field, key] : kMoeKeys)
    paths.push_back(key);
  return paths;
}

InitFromKeys init_from_keys(const std::string& path) {
  InitFromKeys out;
  std::unique_ptr<ckpt::WeightSource> source;
  try {
    source = ckpt::WeightSource::open(path);
  } catch (const ckpt::CheckpointError& e) {
    out.error = e.what();
    return out;
  }
  out.where = source->where();
  const nlohmann::json& d = source->description();
  auto add = [&](const char* field, const char* key) {
    const auto it = d.find(field);
    if (it == d.end() || it->is_null()) return;
    out.keys.emplace_back(key, it->is_string() ? it->get<std::string>() : it->dump());
  };
  // A checkpoint's manifest names no arch: its norm says which preset family it is.
  if (d.contains("arch"))
    add("arch", "model.arch");
  else if (d.contains("norm"))
    out.keys.emplace_back("model.arch", d.at("norm") == "layernorm" ? "gpt" : "llama");
  for (const auto& [field, key] : kModelKeys)
    add(field, key);
  if (d.value("position", "") == "rope") add(kRopeKey.first, kRopeKey.second);
  if (d.value("position", "") == "learned") add(kLearnedKey.first, kLearnedKey.second);
  if (d.value("experts", 0) > 0)
    for (const auto& [field, key] : kMoeKeys)
      add(field, key);
  return out;
}

}  // namespace trainctl::recipe::internal
