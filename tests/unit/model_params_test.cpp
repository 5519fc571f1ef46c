// The typed facts of the parameter table (each spec's layer and role, set by build_param_table)
// agree with the naming scheme that checkpoints and exports use, and the small range helpers that
// the model, the trainer and the planner share behave as their contracts say.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "model/model.hpp"
#include "model/zero_partition.hpp"
#include "small_models.hpp"

using namespace trainctl;
using model::IndexRange;
using model::ParamRole;
using model::ParamSpec;

namespace {

// What the name says, read the way code must no longer read it: "layers.<i>." and the tensor.
int layer_in_name(const std::string& name) {
  if (name.rfind("layers.", 0) != 0) return -1;
  return std::stoi(name.substr(7));
}

ParamRole role_in_name(const std::string& name) {
  const std::string tensor =
      name.rfind("layers.", 0) == 0 ? name.substr(name.find('.', 7) + 1) : name;
  const std::string base = tensor.substr(0, tensor.rfind('.'));  // without .weight / .bias
  static const std::map<std::string, ParamRole> roles{
      {"embed", ParamRole::embedding},       {"attn_norm", ParamRole::attn_norm},
      {"attn.qkv", ParamRole::qkv},          {"attn.proj", ParamRole::attn_proj},
      {"mlp_norm", ParamRole::mlp_norm},     {"mlp.fc1", ParamRole::fc1},
      {"mlp.fc2", ParamRole::fc2},           {"moe.router", ParamRole::router},
      {"moe.fc1", ParamRole::expert_fc1},    {"moe.fc2", ParamRole::expert_fc2},
      {"final_norm", ParamRole::final_norm}, {"lm_head", ParamRole::head}};
  if (tensor == "embed.wpe") return ParamRole::position;
  const auto it = roles.find(base);
  return it == roles.end() ? ParamRole::none : it->second;
}

void check_layers_and_roles(const model::ParamTable& table) {
  REQUIRE(!table.specs().empty());
  for (const ParamSpec& spec : table.specs()) {
    INFO(spec.name);
    CHECK(spec.layer == layer_in_name(spec.name));
    CHECK(spec.role == role_in_name(spec.name));
    CHECK(spec.role != ParamRole::none);
  }
}

}  // namespace

TEST_CASE("every parameter carries the layer and role its name says", "[model][params]") {
  model::ModelConfig gpt = small_models::gpt(3);  // layernorm with biases, learned positions, tied
  check_layers_and_roles(model::build_param_table(gpt));

  model::ModelConfig llama = model::llama_preset();  // rmsnorm, swiglu, untied head
  llama.layers = 2;
  check_layers_and_roles(model::build_param_table(llama));

  model::ModelConfig moe = small_models::gpt(4);
  moe.moe.experts = 4;
  moe.moe.every = 2;  // dense and MoE layers
  check_layers_and_roles(model::build_param_table(moe));

  // A pipeline stage numbers its layers globally; the last stage's tied copy of embed.wte is an
  // embedding outside every layer.
  for (int stage = 0; stage < 2; ++stage) {
    model::ModelParallel parallel;
    parallel.layout.pp = 2;
    parallel.at.pp = stage;
    const model::ParamTable table = model::build_param_table(gpt, parallel);
    check_layers_and_roles(table);
    int first = gpt.layers;
    for (const ParamSpec& spec : table.specs())
      if (spec.layer >= 0) first = std::min(first, spec.layer);
    CHECK(first == (stage == 0 ? 0 : 2));
    CHECK(table.contains("embed.wte"));
    CHECK(table.find("embed.wte").tied_copy == (stage == 1));
  }
}

TEST_CASE("a hand-built table's parameters have no layer and no role", "[model][params]") {
  model::ParamTable table;
  const ParamSpec& w = table.add("w", {4, 4}, model::Init::zeros, 0, true);
  CHECK(w.layer == -1);
  CHECK(w.role == ParamRole::none);
}

TEST_CASE("append_joined joins touching ranges of one kind and drops empty ones",
          "[model][params]") {
  std::vector<IndexRange> ranges;
  for (const IndexRange& r :
       {IndexRange{0, 4}, IndexRange{4, 6}, IndexRange{6, 6}, IndexRange{8, 9}, IndexRange{9, 12}})
    model::append_joined(ranges, r);
  CHECK(ranges == std::vector<IndexRange>{{0, 6}, {8, 12}});

  struct Kinded {
    int64_t begin = 0, end = 0;
    bool decay = false;
  };
  std::vector<Kinded> kinded;
  auto same_decay = [](const Kinded& a, const Kinded& b) { return a.decay == b.decay; };
  for (const Kinded& r : {Kinded{0, 2, true}, Kinded{2, 3, true}, Kinded{3, 5, false},
                          Kinded{5, 5, true}, Kinded{5, 7, false}})
    model::append_joined(kinded, r, same_decay);
  REQUIRE(kinded.size() == 2);
  CHECK((kinded[0].begin == 0 && kinded[0].end == 3 && kinded[0].decay));
  CHECK((kinded[1].begin == 3 && kinded[1].end == 7 && !kinded[1].decay));
}

TEST_CASE("zero_partition of a table is the partition of its tensors' rows; zero_shares counts",
          "[model][params]") {
  const model::ParamTable table = model::build_param_table(small_models::gpt(2));
  std::vector<model::TensorRows> tensors;
  for (const ParamSpec& spec : table.specs())
    tensors.push_back({spec.shape.numel(), spec.shape[0]});
  for (int parts : {1, 2, 3, 7}) {
    const std::vector<int64_t> bounds = model::zero_partition(table, parts);
    CHECK(bounds == model::zero_partition(tensors, parts));
    // The shares of the whole buffer are the parts' sizes; of a range, its elements in each part.
    const std::vector<size_t> sizes = model::zero_shares(bounds, 0, table.numel());
    REQUIRE(sizes.size() == static_cast<size_t>(parts));
    size_t total = 0;
    for (int k = 0; k < parts; ++k) {
      CHECK(
          sizes[static_cast<size_t>(k)] ==
          static_cast<size_t>(bounds[static_cast<size_t>(k) + 1] - bounds[static_cast<size_t>(k)]));
      total += sizes[static_cast<size_t>(k)];
    }
    CHECK(total == static_cast<size_t>(table.numel()));
    const int64_t begin = table.numel() / 3, end = 2 * table.numel() / 3;
    size_t inside = 0;
    for (size_t share : model::zero_shares(bounds, begin, end))
      inside += share;
    CHECK(inside == static_cast<size_t>(end - begin));
  }
  CHECK(model::zero_shares({0, 10, 10, 30}, 5, 25) == std::vector<size_t>{5, 0, 15});
}
