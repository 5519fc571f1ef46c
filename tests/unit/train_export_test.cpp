// The Hugging Face mappings of the safetensors export (lib/ckpt/export.hpp) on real models: the
// parameters come from the model's own table (model::build_param_table) and description
// (train::describe_model), exactly as capture_checkpoint saves them, so a change to either that
// the export does not follow fails here. Each exported tensor is compared byte for byte with the
// transposition (GPT-2 Conv1D) or row split (fused qkv, SwiGLU fc1, stacked experts) of its
// parameter, computed independently below. (Lives in train_test: it needs the model and train
// modules, which ckpt_test does not link.)
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "backend_test_util.hpp"
#include "ckpt/ckpt.hpp"
#include "ckpt/export.hpp"
#include "ckpt/hf.hpp"
#include "ckpt/weights.hpp"
#include "files/files.hpp"
#include "model/model.hpp"
#include "safetensors_reader.hpp"
#include "train/checkpointing.hpp"

namespace {

namespace fs = std::filesystem;
using namespace trainctl;
using backend_test::cpu;
using tensor::DType;

// How an exported tensor derives from its parameter.
struct Expect {
  std::string name;   // Hugging Face name
  std::string param;  // trainctl parameter name
  bool transpose = false;
  int64_t row_begin = -1, row_end = -1;  // rows of a 2-D weight / elements of a 1-D bias
  int64_t expert = -1;                   // index into a stacked [E, ...] tensor
};

std::vector<int64_t> dims(const tensor::Shape& s) {
  return std::vector<int64_t>(s.dims.begin(), s.dims.begin() + s.rank);
}

// Saves a one-rank model's values as a checkpoint (model/* tensors, step 12) under `checkpoints`;
// returns the step directory.
fs::path save_values(const model::ModelConfig& c, const model::ParamStore& params,
                     const fs::path& checkpoints) {
  const tensor::Tensor values = params.values();
  const size_t element = tensor::dtype_size(values.dtype);
  ckpt::SaveRequest request;
  request.header.step = 12;
  request.header.recipe_hash = "feed";
  request.header.model = train::describe_model(c);
  for (const model::ParamSpec& spec : params.table().specs())
    if (!spec.tied_copy)
      request.add(
          "model/" + spec.name, values.dtype, dims(spec.shape), {},
          static_cast<const char*>(values.data) + static_cast<size_t>(spec.offset) * element);
  const auto slices = request.slices();
  return ckpt::save(checkpoints, request.header, slices).path;
}

// The bytes and shape the export must produce for `e`, from the parameter's raw bytes.
std::pair<std::vector<unsigned char>, std::vector<int64_t>> derive(const Expect& e,
                                                                   const unsigned char* data,
                                                                   std::vector<int64_t> shape,
                                                                   size_t element) {
  if (e.expert >= 0) {  // drop the expert dimension
    size_t per_expert = element;
    for (size_t d = 1; d < shape.size(); ++d)
      per_expert *= static_cast<size_t>(shape[d]);
    data += per_expert * static_cast<size_t>(e.expert);
    shape.erase(shape.begin());
  }
  const int64_t rows = shape[0], cols = shape.size() > 1 ? shape[1] : 1;
  const int64_t begin = e.row_begin >= 0 ? e.row_begin : 0, end = e.row_end >= 0 ? e.row_end : rows;
  const size_t row_bytes = static_cast<size_t>(cols) * element;
  std::vector<unsigned char> out(data + static_cast<size_t>(begin) * row_bytes,
                                 data + static_cast<size_t>(end) * row_bytes);
  shape[0] = end - begin;
  if (e.transpose) {
    std::vector<unsigned char> t(out.size());
    for (int64_t i = 0; i < shape[0]; ++i)
      for (int64_t j = 0; j < cols; ++j)
        std::memcpy(&t[static_cast<size_t>(j * shape[0] + i) * element],
                    &out[static_cast<size_t>(i * cols + j) * element], element);
    std::swap(shape[0], shape[1]);
    out = std::move(t);
  }
  return {out, shape};
}

std::vector<Expect> gpt2_expectations(const model::ModelConfig& c) {
  std::vector<Expect> x = {{"wte.weight", "embed.wte"},
                           {"wpe.weight", "embed.wpe"},
                           {"ln_f.weight", "final_norm.weight"},
                           {"ln_f.bias", "final_norm.bias"}};
  for (int i = 0; i < c.layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".", l = "layers." + std::to_string(i) + ".";
    for (const std::string p : {"weight", "bias"}) {
      x.push_back({h + "ln_1." + p, l + "attn_norm." + p});
      x.push_back({h + "ln_2." + p, l + "mlp_norm." + p});
    }
    x.push_back({h + "attn.c_attn.weight", l + "attn.qkv.weight", true});
    x.push_back({h + "attn.c_attn.bias", l + "attn.qkv.bias"});
    x.push_back({h + "attn.c_proj.weight", l + "attn.proj.weight", true});
    x.push_back({h + "attn.c_proj.bias", l + "attn.proj.bias"});
    x.push_back({h + "mlp.c_fc.weight", l + "mlp.fc1.weight", true});
    x.push_back({h + "mlp.c_fc.bias", l + "mlp.fc1.bias"});
    x.push_back({h + "mlp.c_proj.weight", l + "mlp.fc2.weight", true});
    x.push_back({h + "mlp.c_proj.bias", l + "mlp.fc2.bias"});
  }
  if (!c.tied_embeddings) x.push_back({"lm_head.weight", "lm_head.weight"});
  return x;
}

std::vector<Expect> llama_expectations(const model::ModelConfig& c) {
  const int64_t D = c.head_dim(), Q = c.heads * D, KV = c.kv_heads * D;
  std::vector<Expect> x = {{"model.embed_tokens.weight", "embed.wte"},
                           {"model.norm.weight", "final_norm.weight"}};
  if (!c.tied_embeddings) x.push_back({"lm_head.weight", "lm_head.weight"});
  std::vector<std::string> parts = {"weight"};
  if (c.bias) parts.push_back("bias");
  for (int i = 0; i < c.layers; ++i) {
    const std::string h = "model.layers." + std::to_string(i) + ".",
                      l = "layers." + std::to_string(i) + ".";
    x.push_back({h + "input_layernorm.weight", l + "attn_norm.weight"});
    x.push_back({h + "post_attention_layernorm.weight", l + "mlp_norm.weight"});
    for (const std::string& p : parts) {
      x.push_back({h + "self_attn.q_proj." + p, l + "attn.qkv." + p, false, 0, Q});
      x.push_back({h + "self_attn.k_proj." + p, l + "attn.qkv." + p, false, Q, Q + KV});
      x.push_back({h + "self_attn.v_proj." + p, l + "attn.qkv." + p, false, Q + KV, Q + 2 * KV});
      x.push_back({h + "self_attn.o_proj." + p, l + "attn.proj." + p});
    }
    if (c.is_moe_layer(i)) {
      const int64_t F = c.expert_ffn();
      x.push_back({h + "block_sparse_moe.gate.weight", l + "moe.router.weight"});
      for (int e = 0; e < c.moe.experts; ++e) {
        const std::string ex = h + "block_sparse_moe.experts." + std::to_string(e) + ".";
        for (const std::string& p : parts) {
          x.push_back({ex + "w1." + p, l + "moe.fc1." + p, false, 0, F, e});
          x.push_back({ex + "w3." + p, l + "moe.fc1." + p, false, F, 2 * F, e});
          x.push_back({ex + "w2." + p, l + "moe.fc2." + p, false, -1, -1, e});
        }
      }
    } else {
      const int64_t F = c.ffn_hidden;
      for (const std::string& p : parts) {
        x.push_back({h + "mlp.gate_proj." + p, l + "mlp.fc1." + p, false, 0, F});
        x.push_back({h + "mlp.up_proj." + p, l + "mlp.fc1." + p, false, F, 2 * F});
        x.push_back({h + "mlp.down_proj." + p, l + "mlp.fc2." + p});
      }
    }
  }
  return x;
}

// Saves a freshly initialised model as a checkpoint (as capture_checkpoint names it), exports
// it, and compares every tensor of the file with its expectation.
void check_export(const model::ModelConfig& c, ckpt::Naming naming,
                  const std::vector<Expect>& expectations) {
  const fs::path dir =
      fs::temp_directory_path() / ("trainctl_train_export_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  model::Transformer model(c, cpu(), 1);
  model.params().initialize(99);
  const model::ParamStore& params = model.params();
  const tensor::Tensor values = params.values();
  const size_t element = tensor::dtype_size(values.dtype);
  const fs::path step = save_values(c, params, dir / "checkpoints");

  const ckpt::ExportResult result =
      ckpt::export_safetensors(ckpt::CheckpointReader::open(step), dir / "out.safetensors");
  CHECK(result.plan.naming == naming);
  const safetensors_test::File file = safetensors_test::read((dir / "out.safetensors").string());
  CHECK(file.metadata.at("trainctl_naming") == std::string(ckpt::naming_name(naming)));
  CHECK(file.tensors.size() == expectations.size());
  const std::string dtype(ckpt::safetensors_dtype(values.dtype));
  for (const Expect& e : expectations) {
    INFO(e.name << " from " << e.param);
    const auto it = file.tensors.find(e.name);
    REQUIRE(it != file.tensors.end());
    const model::ParamSpec& spec = params.table().find(e.param);
    const auto [bytes, shape] = derive(
        e,
        static_cast<const unsigned char*>(values.data) + static_cast<size_t>(spec.offset) * element,
        dims(spec.shape), element);
    CHECK(it->second.dtype == dtype);
    CHECK(it->second.shape == shape);
    CHECK(it->second.bytes == bytes);
  }
  fs::remove_all(dir);
}

model::ModelConfig small(model::ModelConfig c) {
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.kv_heads = 4;
  c.ffn_hidden = 48;
  c.vocab = 40;
  c.seq_len = 16;
  return c;
}

}  // namespace

TEST_CASE("export: GPT-2 names with Conv1D-transposed weights", "[train][export]") {
  model::ModelConfig c = small(model::gpt_preset());
  SECTION("fp32, tied embeddings") {
    check_export(c, ckpt::Naming::gpt2, gpt2_expectations(c));
  }
  SECTION("bf16, untied head") {
    c.storage = DType::bf16;
    c.tied_embeddings = false;
    check_export(c, ckpt::Naming::gpt2, gpt2_expectations(c));
  }
}

TEST_CASE("export: Llama names with split qkv and SwiGLU rows", "[train][export]") {
  model::ModelConfig c = small(model::llama_preset());
  c.kv_heads = 2;  // grouped-query attention: k and v have fewer rows than q
  SECTION("bf16, untied head, no biases") {
    c.storage = DType::bf16;
    check_export(c, ckpt::Naming::llama, llama_expectations(c));
  }
  SECTION("fp32, tied, with biases") {
    c.tied_embeddings = true;
    c.bias = true;
    check_export(c, ckpt::Naming::llama, llama_expectations(c));
  }
}

TEST_CASE("export: Mixtral names for MoE layers", "[train][export]") {
  model::ModelConfig c = small(model::llama_preset());
  c.kv_heads = 2;
  c.moe.experts = 3;
  c.moe.top_k = 2;
  SECTION("MoE every second layer, distinct expert width, biases") {
    c.moe.every = 2;
    c.moe.expert_ffn_hidden = 24;
    c.bias = true;
    check_export(c, ckpt::Naming::mixtral, llama_expectations(c));
  }
  SECTION("every layer MoE") {
    c.moe.every = 1;
    check_export(c, ckpt::Naming::mixtral, llama_expectations(c));
  }
}

namespace {

// trainctl -> Hugging Face folder -> trainctl -> Hugging Face folder: the model read back through
// model.init_from's loader (the inverse mapping) holds the saved values bit for bit, and its own
// export has the same bytes in every file.
void check_round_trip(const model::ModelConfig& c, DType load_as = DType::f32) {
  const fs::path dir =
      fs::temp_directory_path() / ("trainctl_train_import_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto save_and_export = [&](const model::ParamStore& params, const std::string& name) {
    const fs::path step = save_values(c, params, dir / name);
    ckpt::HfExportOptions options;
    options.max_shard_bytes = 4000;  // several files and an index
    return ckpt::export_hf(ckpt::CheckpointReader::open(step), dir / (name + "-hf"), options);
  };
  model::Transformer original(c, cpu(), 1);
  original.params().initialize(99);
  const ckpt::HfExportResult first = save_and_export(original.params(), "a");
  REQUIRE(first.files.size() > 3);

  model::ModelConfig loaded_config = c;
  loaded_config.storage = load_as == DType::f32 ? c.storage : load_as;
  model::Transformer loaded(loaded_config, cpu(), 1);
  loaded.params().initialize(7);  // other values, all replaced
  const std::unique_ptr<ckpt::WeightSource> source = ckpt::WeightSource::open(dir / "a-hf");
  CHECK(source->description().at("layers") == c.layers);
  source->bind(train::weights_wanted(loaded_config));
  train::load_initial_weights(*source, loaded.params(), cpu());
  const tensor::Tensor a = original.params().values(), b = loaded.params().values();
  REQUIRE(a.numel() == b.numel());
  if (loaded_config.storage == c.storage) {
    CHECK(std::memcmp(a.data, b.data, a.bytes()) == 0);
    const ckpt::HfExportResult second = save_and_export(loaded.params(), "b");
    REQUIRE(second.files == first.files);
    for (const std::string& file : first.files) {
      INFO(file);
      CHECK(files::read_regular_file(dir / "a-hf" / file, 1 << 20, "a") ==
            files::read_regular_file(dir / "b-hf" / file, 1 << 20, "b"));
    }
  } else {  // fp32 weights into a bf16 model: each rounded to nearest
    for (int64_t i = 0; i < a.numel(); ++i) {
      INFO(i);
      CHECK(b.as<tensor::bf16>()[i].bits == tensor::to_bf16(a.as<float>()[i]).bits);
    }
  }
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("import: trainctl -> HF -> trainctl -> HF is bit for bit", "[train][export][import]") {
  SECTION("GPT-2, tied, fp32") {
    check_round_trip(small(model::gpt_preset()));
  }
  SECTION("GPT-2, untied, bf16") {
    model::ModelConfig c = small(model::gpt_preset());
    c.tied_embeddings = false;
    c.storage = DType::bf16;
    check_round_trip(c);
  }
  SECTION("Llama, GQA, tied, biases") {
    model::ModelConfig c = small(model::llama_preset());
    c.kv_heads = 2;
    c.tied_embeddings = true;
    c.bias = true;
    check_round_trip(c);
  }
  SECTION("Mixtral, every layer MoE, its router") {
    model::ModelConfig c = small(model::llama_preset());
    c.kv_heads = 2;
    c.moe.experts = 3;
    c.moe.top_k = 2;
    c.moe.every = 1;
    c.moe.capacity_factor = 0;
    c.moe.router = model::MoeRouter::softmax_topk_renorm;
    check_round_trip(c);
  }
  SECTION("fp32 weights into a bf16 model round to nearest") {
    model::ModelConfig c = small(model::llama_preset());
    c.kv_heads = 2;
    check_round_trip(c, DType::bf16);
  }
}
