// Valid recipes: presets, flow style, overrides, the dump round trip, the hash, --explain, and the
// schema's bindings (each key reads and writes its own struct member).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "recipe/recipe.hpp"
#include "recipe/schema.hpp"

namespace {

using namespace trainctl::recipe;

// A folder for this process's recipe files, removed when the tests end.
const std::filesystem::path& temp_dir() {
  struct Dir {
    std::filesystem::path path = std::filesystem::temp_directory_path() /
                                 ("trainctl_recipe_test_" + std::to_string(::getpid()));
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

std::string write_temp(const std::string& text, const std::string& name = "good.yaml") {
  auto path = temp_dir() / name;
  std::ofstream(path) << text;
  return path.string();
}

Recipe load_text(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return load_recipe(write_temp(text), overrides);
}

// An existing data file (load_recipe checks that data files exist), as an absolute path.
std::string data_file(const std::string& name) {
  auto path = temp_dir() / name;
  if (!std::filesystem::exists(path)) std::ofstream(path) << "some text to train on\n";
  return path.string();
}

// `text` with every CORPUS replaced by the absolute path of an existing corpus.txt.
std::string with_corpus(std::string text) {
  const std::string corpus = data_file("corpus.txt");
  for (auto at = text.find("CORPUS"); at != std::string::npos; at = text.find("CORPUS", at))
    text.replace(at, 6, corpus);
  return text;
}

const char* kBlockTemplate = R"(# a small llama with experts
name: run-1.b
model:
  arch: llama
  layers: 6
  hidden: 256
  heads: 8
  kv_heads: 2
  vocab: 512
moe:
  experts: 4
  top_k: 2
  every: 1
parallel:
  dp: 2
  ep: 2
  tp: 2
training:
  global_batch: 32
  micro_batch: 2
data:
  source: text
  path: CORPUS
)";

const char* kFlowTemplate =
    "{name: run-1.b, model: {arch: llama, layers: 6, hidden: 256, heads: 8, kv_heads: 2, "
    "vocab: 512}, moe: {experts: 4, top_k: 2, every: 1}, parallel: {dp: 2, ep: 2, tp: 2}, "
    "training: {global_batch: 32, micro_batch: 2}, data: {source: text, path: CORPUS}}\n";

std::string block_text() {
  return with_corpus(kBlockTemplate);
}
std::string flow_text() {
  return with_corpus(kFlowTemplate);
}

}  // namespace

TEST_CASE("gpt preset fills unset model keys") {
  Recipe r = load_text("name: g\ndata: {source: synthetic}\nmodel: {hidden: 64, heads: 2}\n");
  CHECK(r.model.arch == Arch::gpt);
  CHECK(r.model.kv_heads == 2);
  CHECK(r.model.ffn_hidden == 256);
  CHECK(r.model.norm == Norm::layernorm);
  CHECK(r.model.activation == Activation::gelu);
  CHECK(r.model.position == Position::learned);
  CHECK(r.model.tied_embeddings);
  CHECK(r.model.bias);
  CHECK(r.model.layers == 4);  // plain default
  CHECK(r.optimizer.betas == std::array<double, 2>{0.9, 0.95});
  CHECK(r.precision.loss_scale == LossScale{LossScaleMode::dynamic, 0.0});
}

TEST_CASE("llama preset: rmsnorm, swiglu, rope, untied, no bias, ffn rounded up to 64") {
  Recipe r = load_text("name: l\ndata: {source: synthetic}\nmodel: {arch: llama}\n");
  CHECK(r.model.norm == Norm::rmsnorm);
  CHECK(r.model.activation == Activation::swiglu);
  CHECK(r.model.position == Position::rope);
  CHECK_FALSE(r.model.tied_embeddings);
  CHECK_FALSE(r.model.bias);
  CHECK(r.model.kv_heads == r.model.heads);
  CHECK(r.model.ffn_hidden == 384);  // 2/3 * 4 * 128 = 341.3 -> 384
  Recipe big = load_text(
      "name: l\ndata: {source: synthetic}\nmodel: {arch: llama, hidden: 4096, heads: 32}\n");
  CHECK(big.model.ffn_hidden == 10944);  // 2/3 * 4 * 4096 = 10922.7 -> 10944
}

TEST_CASE("keys the recipe sets win over the preset") {
  Recipe r = load_text(
      "name: l\ndata: {source: synthetic}\n"
      "model: {arch: llama, norm: layernorm, bias: yes, ffn_hidden: 100, kv_heads: 1}\n");
  CHECK(r.model.norm == Norm::layernorm);
  CHECK(r.model.bias);
  CHECK(r.model.ffn_hidden == 100);
  CHECK(r.model.kv_heads == 1);
  CHECK(r.model.activation == Activation::swiglu);  // still from the preset
}

TEST_CASE("flow style and block style give the same recipe") {
  Recipe block = load_text(block_text());
  Recipe flow = load_text(flow_text());
  CHECK(block == flow);
  CHECK(block.name == "run-1.b");
  CHECK(block.model.kv_heads == 2);
  CHECK(block.data.path == data_file("corpus.txt"));
}

TEST_CASE("derived quantities: world size, data-parallel size, accumulation, MoE layers") {
  Recipe r = load_text(block_text());
  CHECK(r.world_size() == 8);          // tp 2 * ep 2 * dp 2 * pp 1
  CHECK(r.data_parallel_size() == 4);  // dp * ep
  CHECK(r.grad_accum_steps() == 4);    // 32 / (2 * 4)
  CHECK(r.tokens_per_step() == 32 * 128);
  CHECK(r.model.is_moe_layer(0));  // every: 1
  Recipe every2 = load_text(block_text(), {"moe.every=2"});
  CHECK_FALSE(every2.model.is_moe_layer(0));
  CHECK(every2.model.is_moe_layer(1));
  CHECK_FALSE(every2.model.is_moe_layer(2));
  CHECK(every2.model.is_moe_layer(5));
  Recipe dense = load_text("name: d\ndata: {source: synthetic}\nmoe: {every: 1}\n");
  CHECK_FALSE(dense.model.is_moe_layer(0));
}

TEST_CASE("overrides (--set) replace file values, even ones that were wrong") {
  Recipe r = load_text("name: o\ndata: {source: synthetic}\nmodel: {layers: abc}\n",
                       {"model.layers=8", "optimizer.betas=[0.8, 0.99]", "data.val_path=",
                        "precision.loss_scale=1024", "checkpoint.resume=auto", "name=other"});
  CHECK(r.model.layers == 8);
  CHECK(r.optimizer.betas == std::array<double, 2>{0.8, 0.99});
  CHECK(r.data.val_path.empty());
  CHECK(r.precision.loss_scale == LossScale{LossScaleMode::fixed, 1024.0});
  CHECK(r.checkpoint.resume == Resume::automatic);
  CHECK(r.name == "other");
  Recipe none = load_text("name: o\ndata: {source: synthetic}\nprecision: {loss_scale: none}\n");
  CHECK(none.precision.loss_scale.mode == LossScaleMode::none);
}

TEST_CASE("dump then load gives back the identical recipe") {
  Recipe original = load_text(
      block_text(), {"optimizer.lr=3e-4", "schedule.min_lr=3e-5", "precision.loss_scale=512.5",
                     "data.val_fraction=0.1", "model.norm_eps=1e-6", "checkpoint.async=false",
                     "data.val_path=" + data_file("a \"quoted\" \\ path")});
  std::string dumped = dump_recipe(original);
  Recipe reloaded = load_recipe(write_temp(dumped, "dumped.yaml"));
  CHECK(reloaded == original);
  CHECK(dump_recipe(reloaded) == dumped);
  for (const auto& key : schema())  // every key is written out
    CHECK(dumped.find(std::string(key.leaf()) + ": ") != std::string::npos);
}

TEST_CASE("default_recipe is valid and round-trips") {
  for (Arch arch : {Arch::gpt, Arch::llama}) {
    Recipe d = default_recipe(arch);
    CHECK(parse_recipe(dump_recipe(d), "default") == d);
  }
}

TEST_CASE("the hash depends on the values only, not on how the file is written") {
  Recipe block = load_text(block_text());
  Recipe flow = load_text(flow_text());
  Recipe explicit_defaults = load_text(block_text() + "optimizer: {lr: 0.001}\n");
  std::string h = recipe_hash(block);
  CHECK(h.size() == 16);
  CHECK(h.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(recipe_hash(flow) == h);
  CHECK(recipe_hash(explicit_defaults) == h);
  CHECK(recipe_hash(load_text(block_text(), {"determinism.seed=7"})) != h);
}

// A checkpoint keeps the hash of the recipe that wrote it, and a resume notes when the recipe's
// differs, so the hash must not move when the code behind the keys does (the schema filling the
// modules' own structs, a choice mapped onto a module enum such as precision.compute onto
// tensor::DType). The values were printed by `trainctl validate` before that change (commit
// 7b6e0f8); a new key changes every hash and must update them here, on purpose (the last time:
// optimizer.state_dtype).
TEST_CASE("the hash of a recipe is stable across versions of the code") {
  CHECK(recipe_hash(default_recipe(Arch::gpt)) == "cb37947cfd60c61d");
  CHECK(recipe_hash(load_text("name: default\ndata:\n  source: synthetic\n")) ==
        "cb37947cfd60c61d");
  CHECK(recipe_hash(default_recipe(Arch::llama)) == "2c588e358ed7914a");
  CHECK(
      recipe_hash(load_text("name: f\nprecision: {compute: fp64}\ndata: {source: synthetic}\n")) ==
      "af718afc5093e045");
  // Every choice key at a value other than its default.
  const Recipe every_choice = load_text(
      "name: every-choice\n"
      "model: {arch: llama, norm: layernorm, activation: gelu, position: learned}\n"
      "moe: {experts: 4, top_k: 1, every: 1, router: softmax_topk_renorm}\n"
      "parallel: {recompute: selective, zero: 2, tp: 2, sequence_parallel: true, pp: 2, "
      "pp_schedule: interleaved, pp_virtual: 2}\n"
      "precision: {compute: fp16, loss_scale: 512, reduce_dtype: bf16}\n"
      "optimizer: {name: muon, state_dtype: bf16}\n"
      "schedule: {decay: wsd}\n"
      "data: {source: synthetic}\n"
      "checkpoint: {resume: auto, memory_every_steps: 10}\n"
      "stability: {action: rollback}\n"
      "logging: {progress: plain}\n"
      "cluster: {device: cpu}\n");
  CHECK(every_choice.model.storage == DType::f16);
  CHECK(every_choice.precision.loss_scale == LossScale{LossScaleMode::fixed, 512.0});
  CHECK(recipe_hash(every_choice) == "dd5fe519c1ef446a");
}

TEST_CASE("each schema key stores into and fetches from its own member only") {
  const Recipe base = default_recipe();
  for (const auto& key : schema()) {
    INFO("key " << key.path);
    Value changed = key.fetch(base);
    switch (key.kind) {
      case Kind::integer:
        changed = std::get<int64_t>(changed) + 1;
        break;
      case Kind::number:
        changed = std::get<double>(changed) + 0.5;
        break;
      case Kind::boolean:
        changed = !std::get<bool>(changed);
        break;
      case Kind::string:
        changed = std::string("changed");
        break;
      case Kind::number_pair:
        changed = std::array<double, 2>{0.25, 0.5};
        break;
      case Kind::loss_scale:
        changed = LossScale{LossScaleMode::fixed, 3.0};
        break;
      case Kind::integer_list:
        changed = std::vector<int64_t>{3, 1};
        break;
      case Kind::blend_list:
        changed = std::vector<trainctl::data::BlendItem>{{"a", 0.25}, {"b", 0.75}};
        break;
      case Kind::choice:
        if (key.choices.size() < 2) continue;
        changed = (std::get<int64_t>(changed) + 1) % static_cast<int64_t>(key.choices.size());
        break;
    }
    Recipe r = base;
    key.store(r, changed);
    CHECK(key.fetch(r) == changed);
    for (const auto& other : schema())
      if (&other != &key) CHECK(other.fetch(r) == other.fetch(base));
  }
}

TEST_CASE("the explain table lists every key with its type, default and help") {
  std::string table = explain_table();
  for (const auto& key : schema()) {
    INFO("key " << key.path);
    std::string needle = "\n";
    needle += key.path;
    needle += ' ';
    auto at = table.find(needle);
    REQUIRE(at != std::string::npos);
    std::string line = table.substr(at + 1, table.find('\n', at + 1) - at - 1);
    CHECK(line.find(std::string(key.help)) != std::string::npos);
    CHECK(line.find(std::string(kind_name(key.kind))) != std::string::npos);
  }
  CHECK(table.find("(preset) gpt: layernorm; llama: rmsnorm") != std::string::npos);
  CHECK(table.find("gpt | llama") != std::string::npos);
  CHECK(table.find("(required)") != std::string::npos);
}

TEST_CASE("parallel.pp_layers and parallel.timeout_s: uneven stages, read and dumped back") {
  const std::string yaml =
      "name: t\ndata: {source: synthetic}\nmodel: {layers: 5}\n"
      "parallel: {pp: 2, pp_layers: [3, 2], timeout_s: 3}\n";
  const Recipe r = parse_recipe(yaml, "t.yaml");
  CHECK(r.parallel.pp_layers == std::vector<int>{3, 2});
  CHECK(r.parallel.timeout_s == 3.0);
  CHECK(parse_recipe(dump_recipe(r), "dump.yaml") == r);
  CHECK(dump_recipe(r).find("pp_layers: [3, 2]") != std::string::npos);
  // An even split needs no divisibility: 5 layers over 2 stages is 3 + 2.
  CHECK_NOTHROW(
      parse_recipe("name: t\ndata: {source: synthetic}\nmodel: {layers: 5}\n"
                   "parallel: {pp: 2}\n",
                   "t.yaml"));
  CHECK(default_recipe().parallel.timeout_s == 60.0);
  CHECK(default_recipe().parallel.pp_layers.empty());
}

TEST_CASE("parallel.pp_schedule interleaved with pp_virtual chunks: read and dumped back") {
  const std::string yaml =
      "name: t\ndata: {source: synthetic}\nmodel: {layers: 8}\n"
      "parallel: {pp: 2, pp_schedule: interleaved, pp_virtual: 2, pp_layers: [1, 3, 3, 1]}\n";
  const Recipe r = parse_recipe(yaml, "t.yaml");
  CHECK(r.parallel.pp_schedule == PipeSchedule::interleaved);
  CHECK(r.parallel.pp_virtual == 2);
  CHECK(r.parallel.pp_layers == std::vector<int>{1, 3, 3, 1});
  CHECK(parse_recipe(dump_recipe(r), "dump.yaml") == r);
  CHECK(dump_recipe(r).find("pp_schedule: interleaved") != std::string::npos);
  CHECK(default_recipe().parallel.pp_schedule == PipeSchedule::one_f_one_b);
  CHECK(default_recipe().parallel.pp_virtual == 1);
}

TEST_CASE("data.sources: a blend of megatron datasets, read from block and flow style and --set") {
  const std::string a = data_file("a.bin"), b = data_file("b.idx");
  data_file("a.idx");
  data_file("b.bin");
  const std::string prefix_a = a.substr(0, a.size() - 4), prefix_b = b.substr(0, b.size() - 4);
  const Recipe block =
      load_text("name: t\ndata:\n  source: megatron\n  sources:\n    - path: " + prefix_a +
                "\n      weight: 0.7\n    - {path: " + b + ", weight: 0.3}\n");
  CHECK(block.data.source == DataSource::megatron);
  CHECK(block.data.sources == std::vector<trainctl::data::BlendItem>{{prefix_a, 0.7}, {b, 0.3}});
  CHECK(parse_recipe(dump_recipe(block), "dump.yaml") == block);
  CHECK(dump_recipe(block).find("sources: [{path: \"" + prefix_a + "\", weight: 0.7}, {path: \"" +
                                b + "\", weight: 0.3}]") != std::string::npos);
  // A bare path weighs 1; --set takes the same YAML.
  const Recipe set = load_text("name: t\ndata: {source: megatron}\n",
                               {"data.sources=[" + prefix_a + ", {path: " + prefix_b + "}]"});
  CHECK(set.data.sources ==
        std::vector<trainctl::data::BlendItem>{{prefix_a, 1.0}, {prefix_b, 1.0}});
  CHECK(default_recipe().data.sources.empty());
}
