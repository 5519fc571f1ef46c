// The model's own description. The recipe's schema fills it directly (model.*, moe.*,
// precision.compute and precision.fp8 are its keys: lib/recipe/schema.cpp), and tests and
// benchmarks build it by hand. The parallel layout, activation recomputation included, is not
// here: the model takes it from ModelParallel (model/params.hpp).
#pragma once

#include <cstdint>
#include <string>

#include "tensor/dtype.hpp"

namespace trainctl::model {

// model.arch: which family's defaults fill the keys a recipe leaves unset (lib/recipe presets).
enum class Arch { gpt, llama };
enum class NormKind { layernorm, rmsnorm };
enum class ActivationKind { gelu, swiglu };
enum class PositionKind { learned, rope };
// fp8 GEMMs in the blocks' linear layers (backend::GemmArgs fp8 operands): e4m3 for every operand,
// or hybrid: e4m3 for inputs and weights, e5m2 for output gradients in backward.
enum class Fp8Mode { none, e4m3, hybrid };

// How the router turns its logits into the gates that weight each chosen expert's output:
//   softmax              the chosen experts' probabilities under a softmax over all experts
//                        (GShard/Switch; the gates of a token sum to less than one)
//   softmax_topk_renorm  the same probabilities divided by their sum over the chosen experts
//                        (Mixtral, DeepSeek: the gates of a token sum to one)
enum class MoeRouter { softmax, softmax_topk_renorm };

struct MoeConfig {
  int experts = 0;  // 0: dense model
  int top_k = 2;
  MoeRouter router = MoeRouter::softmax;
  double capacity_factor = 1.25;  // 0: unlimited capacity (no dropping)
  double aux_loss_coef = 0.01;
  double z_loss_coef = 0.001;
  int every = 2;              // layer i is MoE when (i + 1) % every == 0
  int expert_ffn_hidden = 0;  // 0: ffn_hidden
  bool operator==(const MoeConfig&) const = default;
};

struct ModelConfig {
  Arch arch = Arch::gpt;
  int layers = 4;
  int hidden = 128;
  int heads = 4;
  int kv_heads = 4;
  int ffn_hidden = 512;
  int vocab = 256;
  int seq_len = 128;
  NormKind norm = NormKind::layernorm;
  ActivationKind activation = ActivationKind::gelu;
  PositionKind position = PositionKind::learned;
  double rope_theta = 10000.0;
  bool tied_embeddings = true;
  bool bias = true;
  double norm_eps = 1e-5;
  double init_std = 0.02;
  MoeConfig moe;
  tensor::DType storage = tensor::DType::f32;  // parameters and activations (precision.compute)
  Fp8Mode fp8 = Fp8Mode::none;                 // needs storage bf16
  // model.init_from: a Hugging Face folder or trainctl checkpoint the run's weights start from
  // ("": the seeded initialisation). Read by the run (lib/ckpt/weights.hpp), not the model.
  std::string init_from;

  int head_dim() const { return hidden / heads; }
  bool is_moe_layer(int layer) const { return moe.experts > 0 && (layer + 1) % moe.every == 0; }
  int expert_ffn() const { return moe.expert_ffn_hidden > 0 ? moe.expert_ffn_hidden : ffn_hidden; }
  // Rows of the first MLP matrix: SwiGLU fuses gate and up projections.
  int fc1_rows(int ffn) const { return activation == ActivationKind::swiglu ? 2 * ffn : ffn; }
  bool operator==(const ModelConfig&) const = default;
  // Throws std::invalid_argument naming the broken rule (the recipe validates first; this guards
  // direct users such as tests and benchmarks).
  void check() const;
};

// Presets matching the recipe's model.arch.
ModelConfig gpt_preset();
ModelConfig llama_preset();

std::string describe(const ModelConfig& config);

}  // namespace trainctl::model
