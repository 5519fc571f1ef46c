// Where a run's initial weights can come from (model.init_from): a Hugging Face model folder
// (config.json and model.safetensors, or shards listed by model.safetensors.index.json) or a
// trainctl checkpoint (a step, checkpoints or run directory: its newest valid step).
//
// Both give the model description of train::describe_model (the recipe takes its model keys from
// it) and read boxes of trainctl's global parameter tensors, converted to the dtype asked for
// (f64/f32/bf16/f16; narrowing rounds to nearest even). A Hugging Face folder is read through the
// inverse of the export mapping (export.hpp): the tensor's export plan says which Hugging Face
// tensor, which rows and whether transposed holds each element.
//
// Everything read is untrusted: every safetensors header is checked in full before use (dtype
// known, shape and offsets consistent, inside the file, no two tensors overlapping, no element
// count that overflows), config.json and the index are size-limited, and every problem is a
// WeightsError naming the file, the value and what to do, never a crash or a huge allocation.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/format.hpp"

namespace trainctl::ckpt {

// Bad input in model.init_from's source (exit 2).
class WeightsError : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

// One tensor of a safetensors file: its dtype, shape and absolute byte range in the file.
struct SafetensorsTensor {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

// The largest header the format allows (the safetensors library's own limit).
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

// Parses a safetensors header (the JSON after the 8-byte length) of a file whose data section
// (after the header) holds `data_bytes` bytes; offsets come back absolute (header_bytes + 8 added).
// Throws WeightsError naming `file` and the tensor: not a JSON object, an unknown or unsupported
// dtype (F64, F32, BF16, F16 are read), a shape that is not a list of non-negative integers, an
// element count past 2^62 bytes, offsets that do not match the shape or lie past the end, two
// tensors that overlap.
std::map<std::string, SafetensorsTensor> parse_safetensors_header(std::string_view header,
                                                                  uint64_t data_bytes,
                                                                  const std::string& file);

// The model description (describe_model's keys) a Hugging Face config.json implies: GPT2LMHeadModel
// (gpt2), LlamaForCausalLM (llama), MixtralForCausalLM (mixtral). Throws WeightsError for any
// other model_type and for what the engine does not compute (RoPE scaling, attention and MLP
// biases that differ, a head_dim other than hidden/heads, sliding-window attention, GELU other
// than the tanh form, scaled or upcast GPT-2 attention variants).
nlohmann::json describe_hf_config(const nlohmann::json& config, const std::string& file);

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Opens `path`: a folder with config.json is a Hugging Face model; a step, checkpoints or run
  // directory a trainctl checkpoint. Throws WeightsError naming the path and the problem.
  static std::unique_ptr<WeightSource> open(const fs::path& path);

  // The model description (describe_model's keys; a Hugging Face folder's adds "arch").
  virtual const nlohmann::json& description() const = 0;
  // "hf/config.json" or "run/checkpoints/step_00000200": for messages.
  virtual std::string where() const = 0;
  // Checks that the source holds every tensor of `wanted` (the run's model/* tensors with their
  // global shapes and header.model = the run's description) with that shape, and nothing the
  // model has no place for; throws WeightsError naming the first problem.
  virtual void bind(const Manifest& wanted) = 0;
  // The box `region` of model tensor `name` ("model/layers.0.attn.qkv.weight"), row-major,
  // converted to `dtype`. bind() first.
  virtual void read(const std::string& name, const std::vector<Range>& region, DType dtype,
                    void* dst) const = 0;
};

}  // namespace trainctl::ckpt
