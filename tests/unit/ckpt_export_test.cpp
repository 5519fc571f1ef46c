// The safetensors export at the format level: the file layout, dtypes, metadata, atomic
// replacement, and the refusals (GQA under GPT-2 names, tensors the model description does not
// explain, wrong shapes, missing description fields). The Hugging Face mappings of real models
// are proven in train_export_test.cpp (it builds the parameters with the model's own table).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <numeric>

#include "ckpt/ckpt.hpp"
#include "ckpt/export.hpp"
#include "safetensors_reader.hpp"

namespace {

namespace fs = std::filesystem;
using namespace trainctl;
using tensor::DType;

struct TempDir {
  fs::path path =
      fs::temp_directory_path() /
      ("trainctl_export_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

// A gpt description with `layers` layers (0 keeps the hand-built tensor list short).
nlohmann::json gpt_description(int layers, int heads, int kv_heads, int experts) {
  return {{"layers", layers},
          {"hidden", 4},
          {"heads", heads},
          {"kv_heads", kv_heads},
          {"ffn_hidden", 8},
          {"vocab", 5},
          {"seq_len", 3},
          {"norm", "layernorm"},
          {"activation", "gelu"},
          {"position", "learned"},
          {"tied_embeddings", true},
          {"bias", true},
          {"experts", experts},
          {"top_k", 1},
          {"moe_every", 1},
          {"expert_ffn_hidden", 8},
          {"storage", "f32"}};
}

struct Source {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// Saves a checkpoint whose tensor k holds bytes k*31 + i (distinct everywhere); returns its dir.
fs::path save_checkpoint(const fs::path& dir, const nlohmann::json& model,
                         const std::vector<Source>& sources, int64_t step = 7) {
  ckpt::SaveRequest request;
  request.header.step = step;
  request.header.recipe_hash = "abc123";
  request.header.model = model;
  int k = 0;
  for (const Source& s : sources) {
    const int64_t numel =
        std::accumulate(s.shape.begin(), s.shape.end(), int64_t{1}, std::multiplies<int64_t>());
    std::vector<unsigned char> data(static_cast<size_t>(numel) * tensor::dtype_size(s.dtype));
    for (size_t i = 0; i < data.size(); ++i)
      data[i] = static_cast<unsigned char>(k * 31 + i);
    request.add(s.name, s.dtype, s.shape, {}, data.data());
    ++k;
  }
  const auto slices = request.slices();
  return ckpt::save(dir / "checkpoints", request.header, slices).path;
}

const std::vector<Source> kGptLayer0 = {{"model/embed.wte", DType::f32, {5, 4}},
                                        {"model/embed.wpe", DType::f32, {3, 4}},
                                        {"model/final_norm.weight", DType::f32, {4}},
                                        {"model/final_norm.bias", DType::f32, {4}},
                                        {"master/embed.wte", DType::f32, {5, 4}}};

}  // namespace

TEST_CASE("export writes a safetensors file with dtypes as stored and metadata", "[ckpt][export]") {
  TempDir tmp;
  // gpt + MoE has no Hugging Face naming: trainctl's own names, every dtype as stored.
  const std::vector<Source> sources = {{"model/a", DType::f32, {2, 3}},
                                       {"model/b", DType::bf16, {4}},
                                       {"model/c", DType::f64, {3, 1}},
                                       {"model/d", DType::f16, {5}},
                                       {"adam_m/a", DType::f32, {2, 3}}};
  const fs::path step = save_checkpoint(tmp.path, gpt_description(1, 2, 2, 2), sources);
  const auto reader = ckpt::CheckpointReader::open(step);
  const fs::path out = tmp.path / "model.safetensors";
  const ckpt::ExportResult result = ckpt::export_safetensors(reader, out);
  CHECK(result.plan.naming == ckpt::Naming::trainctl);
  REQUIRE(result.plan.notes.size() == 1);
  CHECK_THAT(result.plan.notes[0], Catch::Contains("trainctl's names"));
  CHECK(result.bytes == 2 * 3 * 4 + 4 * 2 + 3 * 8 + 5 * 2);

  const safetensors_test::File file = safetensors_test::read(out.string());
  CHECK(file.metadata == nlohmann::json{{"format", "pt"},
                                        {"trainctl_step", "7"},
                                        {"trainctl_recipe_hash", "abc123"},
                                        {"trainctl_naming", "trainctl"}});
  REQUIRE(file.tensors.size() == 4);  // adam_m/* is not a weight
  const char* dtypes[] = {"F32", "BF16", "F64", "F16"};
  for (size_t k = 0; k < 4; ++k) {
    const Source& s = sources[k];
    const safetensors_test::Tensor& t = file.tensors.at(s.name.substr(6));
    CHECK(t.dtype == dtypes[k]);
    CHECK(t.shape == s.shape);
    for (size_t i = 0; i < t.bytes.size(); ++i) {
      INFO(s.name << " byte " << i);
      REQUIRE(t.bytes[i] == static_cast<unsigned char>(k * 31 + i));
    }
  }
  // No temporary file is left beside the output.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(tmp.path))
    entries += e.path() != out;
  CHECK(entries == 1);  // checkpoints/
}

TEST_CASE("export replaces an existing file whole and fails cleanly", "[ckpt][export]") {
  TempDir tmp;
  const fs::path step = save_checkpoint(tmp.path, gpt_description(0, 2, 2, 0), kGptLayer0);
  const auto reader = ckpt::CheckpointReader::open(step);
  const fs::path out = tmp.path / "model.safetensors";
  {
    std::ofstream old(out);
    old << std::string(100000, 'x');  // longer than the export: a truncating write would show
  }
  const ckpt::ExportResult result = ckpt::export_safetensors(reader, out);
  CHECK(result.plan.naming == ckpt::Naming::gpt2);
  const safetensors_test::File file = safetensors_test::read(out.string());
  CHECK(file.tensors.size() == 4);
  CHECK(file.tensors.at("wte.weight").shape == std::vector<int64_t>{5, 4});
  CHECK(file.tensors.at("ln_f.bias").bytes[0] == static_cast<unsigned char>(3 * 31));

  CHECK_THROWS_AS(ckpt::export_safetensors(reader, tmp.path / "missing" / "x.safetensors"),
                  ckpt::CheckpointError);
  CHECK_FALSE(fs::exists(tmp.path / "missing"));
}

TEST_CASE("export refuses what it cannot map faithfully", "[ckpt][export]") {
  TempDir tmp;
  const fs::path out = tmp.path / "model.safetensors";
  auto export_of = [&](const nlohmann::json& model, std::vector<Source> sources, int64_t step) {
    const fs::path dir = save_checkpoint(tmp.path, model, sources, step);
    ckpt::export_safetensors(ckpt::CheckpointReader::open(dir), out);
  };
  SECTION("grouped-query attention under GPT-2 names") {
    CHECK_THROWS_WITH(
        export_of(gpt_description(0, 4, 2, 0), kGptLayer0, 1),
        Catch::Contains("kv_heads 2 != heads 4") && Catch::Contains("GPT-2 does not have"));
  }
  SECTION("a model tensor the description does not explain") {
    auto sources = kGptLayer0;
    sources.push_back({"model/extra.weight", DType::f32, {2}});
    CHECK_THROWS_WITH(export_of(gpt_description(0, 2, 2, 0), sources, 2),
                      Catch::Contains("model/extra.weight has no place in the gpt2 naming"));
  }
  SECTION("a tensor missing from the checkpoint") {
    auto sources = kGptLayer0;
    sources.erase(sources.begin() + 1);  // no wpe
    CHECK_THROWS_WITH(export_of(gpt_description(0, 2, 2, 0), sources, 3),
                      Catch::Contains("model/embed.wpe but the checkpoint has none"));
  }
  SECTION("a description without a field the naming needs") {
    nlohmann::json model = gpt_description(0, 2, 2, 0);
    model.erase("kv_heads");
    CHECK_THROWS_WITH(export_of(model, kGptLayer0, 4),
                      Catch::Contains("model description has no \"kv_heads\""));
  }
  SECTION("a fused tensor whose shape does not match the description") {
    nlohmann::json model = gpt_description(1, 2, 2, 0);
    model["norm"] = "rmsnorm";
    model["activation"] = "swiglu";
    model["position"] = "rope";
    model["bias"] = false;
    const std::vector<Source> sources = {{"model/embed.wte", DType::f32, {5, 4}},
                                         {"model/layers.0.attn_norm.weight", DType::f32, {4}},
                                         {"model/layers.0.attn.qkv.weight", DType::f32, {8, 4}},
                                         {"model/layers.0.attn.proj.weight", DType::f32, {4, 4}},
                                         {"model/layers.0.mlp_norm.weight", DType::f32, {4}},
                                         {"model/layers.0.mlp.fc1.weight", DType::f32, {16, 4}},
                                         {"model/layers.0.mlp.fc2.weight", DType::f32, {4, 8}},
                                         {"model/final_norm.weight", DType::f32, {4}}};
    CHECK_THROWS_WITH(export_of(model, sources, 5),
                      Catch::Contains("model/layers.0.attn.qkv.weight has shape [8, 4] but the "
                                      "model description implies [12, 4]"));
  }
  CHECK_FALSE(fs::exists(out));
}
