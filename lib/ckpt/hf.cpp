#include "ckpt/hf.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include <map>
#include <system_error>

#include <fmt/format.h>

#include "ckpt/file_io.hpp"
#include "files/files.hpp"

namespace trainctl::ckpt {

namespace {

using nlohmann::json;
using nlohmann::ordered_json;

constexpr uint64_t kMaxTokenizerBytes = 1ULL << 30;

const json& need(const json& model, const char* key, const std::string& source) {
  const auto it = model.find(key);
  if (it == model.end())
    throw CheckpointError(fmt::format(
        "{}: the manifest's model description has no \"{}\", which config.json needs; re-save "
        "the checkpoint with this trainctl (resume it for 0 steps) and export again",
        source, key));
  return *it;
}

std::string torch_dtype(const std::string& storage) {
  if (storage == "f32") return "float32";
  if (storage == "bf16") return "bfloat16";
  if (storage == "f16") return "float16";
  if (storage == "f64") return "float64";
  return storage;
}

// The end-of-document token as bos and eos (GPT-2's and Llama 3's convention for a base model);
// null when the run recorded no tokenizer.
json token_id(const std::optional<HfTokenizer>& tokenizer) {
  return tokenizer && tokenizer->eod_id >= 0 ? json(tokenizer->eod_id) : json(nullptr);
}

std::string shard_name(size_t index, size_t count) {
  return count == 1 ? std::string("model.safetensors")
                    : fmt::format("model-{:05d}-of-{:05d}.safetensors", index + 1, count);
}

void write_text(const fs::path& path, const std::string& text) {
  io::File file = io::File::create(path);
  file.write_all(text.data(), text.size());
  file.sync();
  file.close();
}

}  // namespace

ordered_json hf_config(const ManifestHeader& header, Naming naming,
                       const std::optional<HfTokenizer>& tokenizer, const std::string& source) {
  const json& m = header.model;
  try {
    const int64_t layers = need(m, "layers", source).get<int64_t>();
    const int64_t hidden = need(m, "hidden", source).get<int64_t>();
    const int64_t heads = need(m, "heads", source).get<int64_t>();
    const int64_t experts = need(m, "experts", source).get<int64_t>();
    const bool bias = need(m, "bias", source).get<bool>();
    const std::string dtype = torch_dtype(need(m, "storage", source).get<std::string>());
    ordered_json c;
    switch (naming) {
      case Naming::gpt2:
        c["architectures"] = {"GPT2LMHeadModel"};
        c["model_type"] = "gpt2";
        c["vocab_size"] = need(m, "vocab", source);
        c["n_positions"] = need(m, "seq_len", source);
        c["n_embd"] = hidden;
        c["n_layer"] = layers;
        c["n_head"] = heads;
        c["n_inner"] = need(m, "ffn_hidden", source);
        if (need(m, "activation_fn", source).get<std::string>() != "gelu_tanh")
          throw HfRefused(
              fmt::format("{}: GPT-2's activation is gelu_new (tanh); this model's is "
                          "{}",
                          source, m.at("activation_fn").dump()));
        c["activation_function"] = "gelu_new";
        c["layer_norm_epsilon"] = need(m, "norm_eps", source);
        c["resid_pdrop"] = 0.0;
        c["embd_pdrop"] = 0.0;
        c["attn_pdrop"] = 0.0;
        c["scale_attn_weights"] = true;
        c["scale_attn_by_inverse_layer_idx"] = false;
        c["reorder_and_upcast_attn"] = false;
        break;
      case Naming::llama:
      case Naming::mixtral: {
        const bool moe = naming == Naming::mixtral;
        c["architectures"] = {moe ? "MixtralForCausalLM" : "LlamaForCausalLM"};
        c["model_type"] = moe ? "mixtral" : "llama";
        c["vocab_size"] = need(m, "vocab", source);
        c["hidden_size"] = hidden;
        c["intermediate_size"] = need(m, moe ? "expert_ffn_hidden" : "ffn_hidden", source);
        c["num_hidden_layers"] = layers;
        c["num_attention_heads"] = heads;
        c["num_key_value_heads"] = need(m, "kv_heads", source);
        c["head_dim"] = hidden / heads;
        if (need(m, "activation_fn", source).get<std::string>() != "silu")
          throw HfRefused(fmt::format("{}: Llama's gated MLP uses silu; this model's is {}", source,
                                      m.at("activation_fn").dump()));
        c["hidden_act"] = "silu";
        c["max_position_embeddings"] = need(m, "seq_len", source);
        c["rms_norm_eps"] = need(m, "norm_eps", source);
        const double theta = need(m, "rope_theta", source).get<double>();
        c["rope_theta"] = theta;  // transformers 4.x
        c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", theta}};  // 5.x
        c["attention_dropout"] = 0.0;
        if (!moe) {
          c["attention_bias"] = bias;
          c["mlp_bias"] = bias;
          break;
        }
        const int64_t every = need(m, "moe_every", source).get<int64_t>();
        if (every != 1)
          throw HfRefused(fmt::format(
              "{}: MoE on every {} layers; MixtralForCausalLM makes every layer MoE, so no "
              "Mixtral folder can hold this model (train with moe.every 1 for a Mixtral export, "
              "or export --format safetensors for the tensors under Llama and Mixtral names)",
              source, every));
        if (bias)
          throw HfRefused(fmt::format(
              "{}: the model has biases; Mixtral has none, so it would load without them and "
              "compute another model (train with model.bias false for a Mixtral export)",
              source));
        const std::string router =
            m.contains("router") ? m.at("router").get<std::string>() : std::string("softmax");
        const double capacity = need(m, "capacity_factor", source).get<double>();
        if (router != "softmax_topk_renorm" || capacity != 0)
          throw HfRefused(fmt::format(
              "{}: the router is moe.router {} with moe.capacity_factor {}; Mixtral renormalises "
              "the top-k gates to sum to one and never drops a token, so this model would load "
              "as Mixtral and compute something else; train with moe.router "
              "softmax_topk_renorm and moe.capacity_factor 0 for a Mixtral export",
              source, router, capacity));
        c["num_local_experts"] = experts;
        c["num_experts_per_tok"] = need(m, "top_k", source);
        c["output_router_logits"] = false;
        c["router_jitter_noise"] = 0.0;
        c["sliding_window"] = nullptr;
        break;
      }
      case Naming::trainctl:
        throw HfRefused(fmt::format(
            "{}: no Hugging Face architecture computes this model (norm {}, activation {}, "
            "position {}, experts {}, bias {}); GPT-2 needs layernorm, gelu, learned positions "
            "and biases without experts, Llama and Mixtral rmsnorm, swiglu and rope; export "
            "--format safetensors for the tensors under trainctl's names",
            source, m.value("norm", "?"), m.value("activation", "?"), m.value("position", "?"),
            experts, bias));
    }
    c["tie_word_embeddings"] = need(m, "tied_embeddings", source);
    c["bos_token_id"] = token_id(tokenizer);
    c["eos_token_id"] = token_id(tokenizer);
    c["use_cache"] = true;
    c["dtype"] = dtype;
    return c;
  } catch (const json::exception& e) {
    throw CheckpointError(
        fmt::format("{}: the manifest's model description has a field of the wrong type: {}",
                    source, e.what()));
  }
}

HfExportResult export_hf(const CheckpointReader& reader, const fs::path& out,
                         const HfExportOptions& options) {
  const std::string source = (reader.dir() / kManifestFile).string();
  HfExportResult result{out, plan_export(reader.manifest(), source), "", {}, 0};
  const ordered_json config =
      hf_config(reader.manifest().header, result.plan.naming, options.tokenizer, source);
  result.architecture = config["architectures"][0].get<std::string>();
  const bool gpt2 = result.plan.naming == Naming::gpt2;
  auto name = [gpt2](const ExportTensor& t) {
    return gpt2 && t.name != "lm_head.weight" ? "transformer." + t.name : t.name;
  };

  // Shards in name order, a new one whenever the next tensor would pass the limit.
  std::vector<std::vector<const ExportTensor*>> shards(1);
  uint64_t shard_bytes = 0;
  for (const ExportTensor& t : result.plan.tensors) {
    const uint64_t bytes = tensor_bytes(t);
    if (!shards.back().empty() && shard_bytes + bytes > options.max_shard_bytes)
      shards.emplace_back(), shard_bytes = 0;
    shards.back().push_back(&t);
    shard_bytes += bytes;
    result.bytes += bytes;
  }
  const json metadata = {{"format", "pt"},
                         {"trainctl_step", std::to_string(reader.step())},
                         {"trainctl_recipe_hash", reader.manifest().header.recipe_hash},
                         {"trainctl_naming", std::string(naming_name(result.plan.naming))}};

  std::error_code ec;
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  const fs::path tmp = parent / fmt::format(".{}.tmp-{}", out.filename().string(), ::getpid());
  fs::remove_all(tmp, ec);
  try {
    if (!fs::create_directory(tmp, ec) || ec) io::throw_os_error("mkdir", tmp, ec.value());
    auto emit = [&](const std::string& file, const std::string& text) {
      write_text(tmp / file, text);
      result.files.push_back(file);
    };
    emit("config.json", config.dump(2) + "\n");
    ordered_json generation = {{"bos_token_id", config["bos_token_id"]},
                               {"eos_token_id", config["eos_token_id"]}};
    emit("generation_config.json", generation.dump(2) + "\n");
    ordered_json weight_map = ordered_json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string file = shard_name(i, shards.size());
      io::File shard = io::File::create(tmp / file);
      write_safetensors(shard, reader, shards[i], name, metadata);
      shard.sync();
      shard.close();
      result.files.push_back(file);
      for (const ExportTensor* t : shards[i])
        weight_map[name(*t)] = file;
    }
    if (shards.size() > 1)
      emit("model.safetensors.index.json",
           ordered_json{{"metadata", {{"total_size", result.bytes}}}, {"weight_map", weight_map}}
                   .dump(2) +
               "\n");
    if (const std::optional<HfTokenizer>& t = options.tokenizer) {
      const bool bpe = t->kind == "hf-bpe";
      emit(bpe ? "tokenizer.json" : "tokenizer.model",
           files::read_regular_file(t->file, kMaxTokenizerBytes, "tokenizer"));
      ordered_json tc = {{"tokenizer_class", bpe ? "PreTrainedTokenizerFast" : "LlamaTokenizer"},
                         {"model_max_length", reader.manifest().header.model.value("seq_len", 0)}};
      if (!bpe) tc["add_bos_token"] = false, tc["add_eos_token"] = false;
      if (!t->eod_token.empty()) tc["eos_token"] = t->eod_token, tc["bos_token"] = t->eod_token;
      emit("tokenizer_config.json", tc.dump(2) + "\n");
    }
    io::fsync_directory(tmp);
    if (::rename(tmp.c_str(), out.c_str()) != 0) io::throw_os_error("rename to", out, errno);
  } catch (const files::FileError& e) {
    fs::remove_all(tmp, ec);
    throw io::checkpoint_error(e);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  io::fsync_directory(parent);
  return result;
}

}  // namespace trainctl::ckpt
