// Exporting a checkpoint's model weights (the model/* tensors) as one safetensors file with the
// names and layouts Hugging Face uses, so `transformers` can load a trainctl model.
//
// The naming follows the manifest's model description (train::describe_model):
//   gpt2     layernorm + gelu + learned positions, dense: GPT2LMHeadModel names without the
//            "transformer." prefix (wte.weight, h.{i}.attn.c_attn.weight, ...). HF GPT-2 uses
//            Conv1D, which stores weights [in, out]: our Linear weights [out, in] are transposed.
//   llama    rmsnorm + swiglu + rope, dense: LlamaForCausalLM names; the fused qkv rows are split
//            into q_proj/k_proj/v_proj and SwiGLU fc1 rows into gate_proj [0,F) and up_proj [F,2F).
//            trainctl's RoPE is the rotate-half convention HF Llama uses: no row permutation.
//   mixtral  the same with MoE layers: block_sparse_moe.gate (router), experts.{e}.w1 (gate),
//            w3 (up), w2 (down). Dense layers of a mixed model keep the llama mlp names.
//   trainctl any other combination (e.g. gpt + MoE, gpt without biases): trainctl's own names,
//            never an invented mapping; the plan carries a note saying so.
// GPT-2 has no grouped-query attention: a gpt model with kv_heads != heads is refused.
// Dtypes are exported as stored. Every model/* tensor must land in the file exactly once and have
// the shape the description implies, otherwise the export is refused (CheckpointError) rather than
// writing a file that loads into the wrong places.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/format.hpp"
#include "ckpt/reader.hpp"

namespace trainctl::ckpt {

enum class Naming { gpt2, llama, mixtral, trainctl };
std::string_view naming_name(Naming naming);

// One tensor of the output: the box `region` of checkpoint tensor `source`, with leading
// dimensions of extent 1 dropped to `shape` (an expert's slice of a stacked tensor), then
// transposed when `transpose` (2-D only).
struct ExportTensor {
  std::string name;    // output name ("h.0.attn.c_attn.weight")
  std::string source;  // checkpoint tensor ("model/layers.0.attn.qkv.weight")
  DType dtype = DType::f32;
  std::vector<Range> region;   // one range per dimension of the source
  std::vector<int64_t> shape;  // output shape (after transposition)
  bool transpose = false;
};

struct ExportPlan {
  Naming naming = Naming::trainctl;
  std::vector<ExportTensor> tensors;  // sorted by output name
  std::vector<std::string> notes;     // for the user: why trainctl names, what HF class to use
};

// Decides the output names and layouts from the manifest alone (no data is read). Throws
// CheckpointError naming the problem: a model description missing a field, a model/* tensor the
// naming has no place for or with an unexpected shape, GQA with the gpt2 naming.
ExportPlan plan_export(const Manifest& manifest, const std::string& source);

// "BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2", "I32", "U16".
std::string_view safetensors_dtype(DType dtype);

// Bytes of the tensor's data in the output.
uint64_t tensor_bytes(const ExportTensor& t);

// Writes `tensors` to `file` as one safetensors file: 8-byte little-endian header length, the JSON
// header {name(t): {dtype, shape, data_offsets}} plus "__metadata__" (string values), padded with
// spaces to a multiple of 8, then the data in the given order, each slice's checksum checked as it
// is read. Returns the data bytes. The caller makes the file appear atomically.
uint64_t write_safetensors(io::File& file, const CheckpointReader& reader,
                           const std::vector<const ExportTensor*>& tensors,
                           const std::function<std::string(const ExportTensor&)>& name,
                           const nlohmann::json& metadata);

struct ExportResult {
  fs::path file;
  ExportPlan plan;
  uint64_t bytes = 0;  // tensor data bytes (the file adds the header)
};

// Writes the plan's tensors to `out` as safetensors: 8-byte little-endian header length, the JSON
// header {name: {dtype, shape, data_offsets}} plus "__metadata__" {"format": "pt", "trainctl_step",
// "trainctl_recipe_hash", "trainctl_naming"}, padded with spaces to a multiple of 8, then the data
// in header order. Written to a temporary file beside `out`, fsynced and renamed over it, so `out`
// is either the old file or the complete new one. Each slice's checksum is checked as it is read.
ExportResult export_safetensors(const CheckpointReader& reader, const fs::path& out);

}  // namespace trainctl::ckpt
