#include "ckpt/export.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ckpt/file_io.hpp"

namespace trainctl::ckpt {

namespace {

using nlohmann::json;

constexpr std::string_view kModelPrefix = "model/";

// The model description fields the naming depends on (train::describe_model writes them).
struct Description {
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn_hidden = 0;
  int64_t experts = 0, moe_every = 1, expert_ffn_hidden = 0;
  std::string norm, activation, position;
  bool tied_embeddings = true, bias = false;

  int64_t head_dim() const { return hidden / heads; }
  bool is_moe_layer(int64_t layer) const { return experts > 0 && (layer + 1) % moe_every == 0; }
};

const json& field(const json& model, const char* key, const std::string& source) {
  const auto it = model.find(key);
  if (it == model.end())
    throw CheckpointError(fmt::format(
        "{}: the manifest's model description has no \"{}\", so the export cannot tell which "
        "names to use; re-save the checkpoint with this trainctl (resume it for 0 steps)",
        source, key));
  return *it;
}

Description describe(const json& model, const std::string& source) {
  Description d;
  try {
    auto integer = [&](const char* key) { return field(model, key, source).get<int64_t>(); };
    auto text = [&](const char* key) { return field(model, key, source).get<std::string>(); };
    auto flag = [&](const char* key) { return field(model, key, source).get<bool>(); };
    d.layers = integer("layers");
    d.hidden = integer("hidden");
    d.heads = integer("heads");
    d.kv_heads = integer("kv_heads");
    d.ffn_hidden = integer("ffn_hidden");
    d.norm = text("norm");
    d.activation = text("activation");
    d.position = text("position");
    d.tied_embeddings = flag("tied_embeddings");
    d.bias = flag("bias");
    d.experts = integer("experts");
    if (d.experts > 0) {
      d.moe_every = integer("moe_every");
      d.expert_ffn_hidden = integer("expert_ffn_hidden");
    }
  } catch (const json::type_error& e) {
    throw CheckpointError(
        fmt::format("{}: the manifest's model description has a field of the wrong type: {}",
                    source, e.what()));
  }
  if (d.layers < 0 || d.hidden <= 0 || d.heads <= 0 || d.kv_heads <= 0 || d.hidden % d.heads ||
      d.heads % d.kv_heads || d.moe_every <= 0)
    throw CheckpointError(fmt::format(
        "{}: the manifest's model description is inconsistent (layers {}, hidden {}, heads {}, "
        "kv_heads {}, moe_every {})",
        source, d.layers, d.hidden, d.heads, d.kv_heads, d.moe_every));
  return d;
}

// Builds a plan from the model/* tensors, each used at most once; finish() refuses leftovers.
class Planner {
 public:
  Planner(const Manifest& manifest, std::string source, Naming naming)
      : source_(std::move(source)) {
    plan_.naming = naming;
    for (const TensorEntry& t : manifest.tensors)
      if (t.name.starts_with(kModelPrefix)) tensors_.emplace(t.name, &t);
  }

  // The checkpoint tensor model/<param>; its shape must be `expected` when given.
  const TensorEntry& param(const std::string& name, const std::vector<int64_t>& expected = {}) {
    const auto it = tensors_.find(std::string(kModelPrefix) + name);
    if (it == tensors_.end())
      throw CheckpointError(fmt::format(
          "{}: the model description implies a tensor {}{} but the checkpoint has none; the "
          "manifest does not describe its own tensors (a corrupt or hand-edited manifest?)",
          source_, kModelPrefix, name));
    if (!expected.empty() && it->second->shape != expected)
      throw CheckpointError(fmt::format(
          "{}: tensor {} has shape [{}] but the model description implies [{}]", source_, it->first,
          fmt::join(it->second->shape, ", "), fmt::join(expected, ", ")));
    return *it->second;
  }

  // The whole tensor (transposed when asked: 2-D only).
  void whole(std::string out, const std::string& name, bool transpose = false) {
    const TensorEntry& t = param(name);
    std::vector<Range> region;
    for (int64_t d : t.shape)
      region.push_back({0, d});
    std::vector<int64_t> shape = t.shape;
    if (transpose) {
      if (shape.size() != 2)
        throw CheckpointError(fmt::format("{}: tensor {} is not 2-D", source_, t.name));
      std::swap(shape[0], shape[1]);
    }
    add(std::move(out), t, std::move(region), std::move(shape), transpose);
  }

  // Rows [begin, end) of a 2-D tensor, or of expert `expert` of a stacked 3-D one.
  void rows(std::string out, const std::string& name, int64_t begin, int64_t end,
            int64_t expert = -1) {
    const TensorEntry& t = param(name);
    std::vector<Range> region;
    if (expert >= 0) region.push_back({expert, expert + 1});
    region.push_back({begin, end});
    for (size_t d = region.size(); d < t.shape.size(); ++d)
      region.push_back({0, t.shape[d]});
    std::vector<int64_t> shape;
    for (size_t d = expert >= 0 ? 1 : 0; d < region.size(); ++d)
      shape.push_back(region[d].size());
    add(std::move(out), t, std::move(region), std::move(shape), false);
  }

  // Expert `expert` of a stacked tensor [E, ...].
  void expert(std::string out, const std::string& name, int64_t expert) {
    const TensorEntry& t = param(name);
    rows(std::move(out), name, 0, t.shape.at(1), expert);
  }

  void note(std::string text) { plan_.notes.push_back(std::move(text)); }

  ExportPlan finish() {
    for (const auto& [name, entry] : tensors_)
      if (!used_.count(name))
        throw CheckpointError(fmt::format(
            "{}: tensor {} has no place in the {} naming; the checkpoint holds parameters its "
            "model description does not explain",
            source_, name, naming_name(plan_.naming)));
    std::sort(plan_.tensors.begin(), plan_.tensors.end(),
              [](const ExportTensor& a, const ExportTensor& b) { return a.name < b.name; });
    return std::move(plan_);
  }

 private:
  void add(std::string out, const TensorEntry& t, std::vector<Range> region,
           std::vector<int64_t> shape, bool transpose) {
    for (size_t d = 0; d < region.size(); ++d)
      if (region[d].begin < 0 || region[d].end > t.shape[d] || region[d].size() <= 0)
        throw CheckpointError(fmt::format(
            "{}: tensor {} [{}] is too small for its {} rows {}: its shape does not match the "
            "model description",
            source_, t.name, fmt::join(t.shape, ", "), naming_name(plan_.naming),
            format_index(region)));
    used_.insert(t.name);
    plan_.tensors.push_back(
        {std::move(out), t.name, t.dtype, std::move(region), std::move(shape), transpose});
  }

  std::string source_;
  std::map<std::string, const TensorEntry*> tensors_;
  std::set<std::string> used_;
  ExportPlan plan_;
};

void plan_gpt2(Planner& p, const Description& d) {
  const int64_t C = d.hidden, F = d.ffn_hidden;
  p.whole("wte.weight", "embed.wte");
  p.whole("wpe.weight", "embed.wpe");
  for (int64_t i = 0; i < d.layers; ++i) {
    const std::string l = fmt::format("layers.{}.", i), h = fmt::format("h.{}.", i);
    for (const char* part : {".weight", ".bias"}) {
      p.whole(h + "ln_1" + part, l + "attn_norm" + part);
      p.whole(h + "ln_2" + part, l + "mlp_norm" + part);
    }
    p.param(l + "attn.qkv.weight", {3 * C, C});
    p.whole(h + "attn.c_attn.weight", l + "attn.qkv.weight", true);
    p.whole(h + "attn.c_attn.bias", l + "attn.qkv.bias");
    p.whole(h + "attn.c_proj.weight", l + "attn.proj.weight", true);
    p.whole(h + "attn.c_proj.bias", l + "attn.proj.bias");
    p.param(l + "mlp.fc1.weight", {F, C});
    p.whole(h + "mlp.c_fc.weight", l + "mlp.fc1.weight", true);
    p.whole(h + "mlp.c_fc.bias", l + "mlp.fc1.bias");
    p.whole(h + "mlp.c_proj.weight", l + "mlp.fc2.weight", true);
    p.whole(h + "mlp.c_proj.bias", l + "mlp.fc2.bias");
  }
  p.whole("ln_f.weight", "final_norm.weight");
  p.whole("ln_f.bias", "final_norm.bias");
  if (!d.tied_embeddings) p.whole("lm_head.weight", "lm_head.weight");
}

void plan_llama(Planner& p, const Description& d) {
  const int64_t C = d.hidden, D = d.head_dim(), Q = d.heads * D, KV = d.kv_heads * D;
  const std::vector<std::string> parts =
      d.bias ? std::vector<std::string>{"weight", "bias"} : std::vector<std::string>{"weight"};
  p.whole("model.embed_tokens.weight", "embed.wte");
  for (int64_t i = 0; i < d.layers; ++i) {
    const std::string l = fmt::format("layers.{}.", i), h = fmt::format("model.layers.{}.", i);
    p.whole(h + "input_layernorm.weight", l + "attn_norm.weight");
    p.whole(h + "post_attention_layernorm.weight", l + "mlp_norm.weight");
    p.param(l + "attn.qkv.weight", {Q + 2 * KV, C});
    for (const std::string& part : parts) {
      const std::string qkv = l + "attn.qkv." + part;
      p.rows(h + "self_attn.q_proj." + part, qkv, 0, Q);
      p.rows(h + "self_attn.k_proj." + part, qkv, Q, Q + KV);
      p.rows(h + "self_attn.v_proj." + part, qkv, Q + KV, Q + 2 * KV);
      p.whole(h + "self_attn.o_proj." + part, l + "attn.proj." + part);
    }
    if (d.is_moe_layer(i)) {
      const int64_t E = d.experts, F = d.expert_ffn_hidden;
      const std::string moe = h + "block_sparse_moe.";
      p.param(l + "moe.fc1.weight", {E, 2 * F, C});
      p.whole(moe + "gate.weight", l + "moe.router.weight");
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = fmt::format("{}experts.{}.", moe, e);
        for (const std::string& part : parts) {
          p.rows(x + "w1." + part, l + "moe.fc1." + part, 0, F, e);
          p.rows(x + "w3." + part, l + "moe.fc1." + part, F, 2 * F, e);
          p.expert(x + "w2." + part, l + "moe.fc2." + part, e);
        }
      }
    } else {
      const int64_t F = d.ffn_hidden;
      p.param(l + "mlp.fc1.weight", {2 * F, C});
      for (const std::string& part : parts) {
        p.rows(h + "mlp.gate_proj." + part, l + "mlp.fc1." + part, 0, F);
        p.rows(h + "mlp.up_proj." + part, l + "mlp.fc1." + part, F, 2 * F);
        p.whole(h + "mlp.down_proj." + part, l + "mlp.fc2." + part);
      }
    }
  }
  p.whole("model.norm.weight", "final_norm.weight");
  if (!d.tied_embeddings) p.whole("lm_head.weight", "lm_head.weight");
}

void plan_trainctl(Planner& p, const Manifest& manifest) {
  for (const TensorEntry& t : manifest.tensors)
    if (t.name.starts_with(kModelPrefix))
      p.whole(t.name.substr(kModelPrefix.size()), t.name.substr(kModelPrefix.size()));
}

// Copies a [rows, cols] matrix of `Element`s to [cols, rows].
template <size_t Element>
void transpose_into(const unsigned char* in, unsigned char* out, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      std::memcpy(out + static_cast<size_t>(j * rows + i) * Element,
                  in + static_cast<size_t>(i * cols + j) * Element, Element);
}

void transpose(const unsigned char* in, unsigned char* out, int64_t rows, int64_t cols,
               size_t element) {
  switch (element) {
    case 1:
      return transpose_into<1>(in, out, rows, cols);
    case 2:
      return transpose_into<2>(in, out, rows, cols);
    case 4:
      return transpose_into<4>(in, out, rows, cols);
    default:
      return transpose_into<8>(in, out, rows, cols);
  }
}

}  // namespace

std::string_view naming_name(Naming naming) {
  switch (naming) {
    case Naming::gpt2:
      return "gpt2";
    case Naming::llama:
      return "llama";
    case Naming::mixtral:
      return "mixtral";
    case Naming::trainctl:
      return "trainctl";
  }
  return "?";
}

std::string_view safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return "F64";
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::e4m3:
      return "F8_E4M3";
    case DType::e5m2:
      return "F8_E5M2";
    case DType::i32:
      return "I32";
    case DType::u16:
      return "U16";
  }
  return "?";
}

ExportPlan plan_export(const Manifest& manifest, const std::string& source) {
  const Description d = describe(manifest.header.model, source);
  const bool gpt = d.norm == "layernorm" && d.activation == "gelu" && d.position == "learned";
  const bool llama = d.norm == "rmsnorm" && d.activation == "swiglu" && d.position == "rope";
  if (gpt && d.experts == 0 && d.kv_heads != d.heads)
    throw CheckpointError(fmt::format(
        "{}: this gpt model uses grouped-query attention (kv_heads {} != heads {}), which GPT-2 "
        "does not have, so no GPT-2 file can hold it; train with kv_heads = heads for a GPT-2 "
        "export, or use the llama architecture (rmsnorm + swiglu + rope)",
        source, d.kv_heads, d.heads));
  if (gpt && d.experts == 0 && d.bias) {
    Planner p(manifest, source, Naming::gpt2);
    plan_gpt2(p, d);
    p.note("load with transformers.GPT2LMHeadModel (GPT-2 Conv1D weights are stored [in, out])");
    return p.finish();
  }
  if (llama) {
    bool all_moe = d.experts > 0;
    for (int64_t i = 0; i < d.layers; ++i)
      all_moe = all_moe && d.is_moe_layer(i);
    Planner p(manifest, source, d.experts > 0 ? Naming::mixtral : Naming::llama);
    plan_llama(p, d);
    if (d.experts == 0)
      p.note("load with transformers.LlamaForCausalLM");
    else if (all_moe)
      p.note("load with transformers.MixtralForCausalLM");
    else
      p.note(fmt::format(
          "MoE on every {} layers: MoE layers use Mixtral names and dense layers Llama names; "
          "MixtralForCausalLM expects every layer to be MoE",
          d.moe_every));
    if (d.bias)
      p.note(
          "the model has biases (q_proj.bias, ...), which HF Llama/Mixtral omit "
          "unless configured with attention_bias/mlp_bias");
    return p.finish();
  }
  Planner p(manifest, source, Naming::trainctl);
  plan_trainctl(p, manifest);
  p.note(fmt::format(
      "no Hugging Face naming for this model (norm {}, activation {}, position {}, experts {}, "
      "bias {}): tensors keep trainctl's names and layouts (Linear weights [out, in])",
      d.norm, d.activation, d.position, d.experts, d.bias));
  return p.finish();
}

uint64_t write_safetensors(io::File& file, const CheckpointReader& reader,
                           const std::vector<const ExportTensor*>& tensors,
                           const std::function<std::string(const ExportTensor&)>& name,
                           const nlohmann::json& metadata) {
  json header = json::object();
  uint64_t bytes = 0;
  for (const ExportTensor* t : tensors) {
    const uint64_t size = tensor_bytes(*t);
    header[name(*t)] = {{"dtype", safetensors_dtype(t->dtype)},
                        {"shape", t->shape},
                        {"data_offsets", {bytes, bytes + size}}};
    bytes += size;
  }
  header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<unsigned char>(text.size() >> (8 * i));
  file.write_all(length, sizeof length);
  file.write_all(text.data(), text.size());
  std::vector<unsigned char> in, transposed;
  for (const ExportTensor* t : tensors) {
    in.resize(tensor_bytes(*t));
    reader.read(t->source, t->region, t->dtype, in.data());
    if (t->transpose) {
      transposed.resize(in.size());
      transpose(in.data(), transposed.data(), t->shape[1], t->shape[0], dtype_size(t->dtype));
      file.write_all(transposed.data(), transposed.size());
    } else {
      file.write_all(in.data(), in.size());
    }
  }
  return bytes;
}

uint64_t tensor_bytes(const ExportTensor& t) {
  uint64_t n = dtype_size(t.dtype);
  for (int64_t d : t.shape)
    n *= static_cast<uint64_t>(d);
  return n;
}

ExportResult export_safetensors(const CheckpointReader& reader, const fs::path& out) {
  const std::string source = (reader.dir() / kManifestFile).string();
  ExportResult result{out, plan_export(reader.manifest(), source), 0};
  std::vector<const ExportTensor*> tensors;
  for (const ExportTensor& t : result.plan.tensors)
    tensors.push_back(&t);
  const json metadata = {{"format", "pt"},
                         {"trainctl_step", std::to_string(reader.step())},
                         {"trainctl_recipe_hash", reader.manifest().header.recipe_hash},
                         {"trainctl_naming", std::string(naming_name(result.plan.naming))}};

  std::error_code ec;
  if (fs::is_directory(out, ec))
    throw CheckpointError(
        fmt::format("{}: is a directory; --out names the file to write", out.string()));
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  const fs::path tmp = parent / fmt::format(".{}.tmp-{}", out.filename().string(), ::getpid());
  try {
    io::File file = io::File::create(tmp);
    result.bytes = write_safetensors(
        file, reader, tensors, [](const ExportTensor& t) { return t.name; }, metadata);
    file.sync();
    file.close();
    if (::rename(tmp.c_str(), out.c_str()) != 0) io::throw_os_error("rename to", out, errno);
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
  io::fsync_directory(parent);
  return result;
}

}  // namespace trainctl::ckpt
