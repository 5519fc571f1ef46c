// Exporting a checkpoint as a Hugging Face model folder that `from_pretrained` loads as it is:
//   config.json              every field that changes the computation (sizes, norm epsilon, RoPE
//                            base, activation, biases, tied head, dtype), for GPT2LMHeadModel,
//                            LlamaForCausalLM or MixtralForCausalLM
//   generation_config.json   the end-of-document token as bos/eos when the run's data records it
//   model.safetensors        the weights under plan_export's names (GPT-2's with the
//                            "transformer." prefix save_pretrained writes); above max_shard_bytes
//                            model-0000i-of-0000N.safetensors and model.safetensors.index.json
//   tokenizer.json / tokenizer.model and tokenizer_config.json, when the caller passes the
//                            tokenizer the run's data was made with
// A model that no Hugging Face class computes as trainctl does is refused (HfRefused) before
// anything is written: trainctl's own naming (no HF architecture), MoE on only some layers,
// Mixtral with biases, or a router that is not Mixtral's (softmax over all experts, top-k gates
// renormalised to sum to one, no token dropped: moe.router softmax_topk_renorm with
// moe.capacity_factor 0). The folder is written beside `out` under a temporary name and renamed
// into place, so `out` is either absent (or empty) or the complete export.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/export.hpp"

namespace trainctl::ckpt {

// Bad input for the Hugging Face export: the model has no faithful HF form (exit 2).
class HfRefused : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

// The tokenizer the run's data was made with (data.json, written by data prepare's sidecar).
struct HfTokenizer {
  fs::path file;     // the tokenizer file as it is now (its SHA-256 checked by the caller)
  std::string kind;  // "hf-bpe" (tokenizer.json) | "sentencepiece" (tokenizer.model)
  int32_t eod_id = -1;
  std::string eod_token;
};

struct HfExportOptions {
  // The largest safetensors file; a larger model is split with an index (the Hub's usual 5 GB).
  uint64_t max_shard_bytes = 5'000'000'000ULL;
  std::optional<HfTokenizer> tokenizer;
};

struct HfExportResult {
  fs::path dir;
  ExportPlan plan;
  std::string architecture;        // "LlamaForCausalLM"
  std::vector<std::string> files;  // written, in order
  uint64_t bytes = 0;              // tensor data bytes
};

// config.json for the manifest's model under `naming`; throws HfRefused when no Hugging Face class
// computes that model as trainctl does, CheckpointError when the description lacks a field.
nlohmann::ordered_json hf_config(const ManifestHeader& header, Naming naming,
                                 const std::optional<HfTokenizer>& tokenizer,
                                 const std::string& source);

// Writes the folder (see above). `out` must not exist or be an empty directory.
HfExportResult export_hf(const CheckpointReader& reader, const fs::path& out,
                         const HfExportOptions& options);

}  // namespace trainctl::ckpt
