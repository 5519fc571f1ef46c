#include "model/config.hpp"

#include <stdexcept>
#include <string>

namespace trainctl::model {

void ModelConfig::check() const {
  auto fail = [](const std::string& what) { throw std::invalid_argument("model config: " + what); };
  if (layers < 1 || hidden < 1 || heads < 1 || kv_heads < 1 || ffn_hidden < 1 || vocab < 2 ||
      seq_len < 1)
    fail("every dimension must be positive");
  if (hidden % heads != 0)
    fail("hidden % heads = " + std::to_string(hidden) + " % " + std::to_string(heads) + " != 0");
  if (heads % kv_heads != 0)
    fail("heads % kv_heads = " + std::to_string(heads) + " % " + std::to_string(kv_heads) +
         " != 0");
  if (position == PositionKind::rope && head_dim() % 2 != 0)
    fail("rope needs an even head dim, got " + std::to_string(head_dim()));
  if (fp8 != Fp8Mode::none && storage != tensor::DType::bf16)
    fail("fp8 GEMMs need bf16 storage, got " + std::string(tensor::dtype_name(storage)));
  if (moe.experts > 0) {
    if (moe.top_k < 1 || moe.top_k > moe.experts)
      fail("moe.top_k = " + std::to_string(moe.top_k) +
           " must be in [1, experts = " + std::to_string(moe.experts) + "]");
    if (moe.every < 1) fail("moe.every must be >= 1");
  }
}

ModelConfig gpt_preset() {
  return ModelConfig{};
}

ModelConfig llama_preset() {
  ModelConfig c;
  c.norm = NormKind::rmsnorm;
  c.activation = ActivationKind::swiglu;
  c.position = PositionKind::rope;
  c.tied_embeddings = false;
  c.bias = false;
  return c;
}

std::string describe(const ModelConfig& c) {
  std::string s = std::to_string(c.layers) + " layers, hidden " + std::to_string(c.hidden) + ", " +
                  std::to_string(c.heads) + " heads";
  if (c.kv_heads != c.heads) s += " (" + std::to_string(c.kv_heads) + " kv)";
  s += ", ffn " + std::to_string(c.ffn_hidden) + ", vocab " + std::to_string(c.vocab) + ", seq " +
       std::to_string(c.seq_len);
  s += c.norm == NormKind::layernorm ? ", layernorm" : ", rmsnorm";
  s += c.activation == ActivationKind::gelu ? ", gelu" : ", swiglu";
  s += c.position == PositionKind::learned ? ", learned positions" : ", rope";
  if (c.moe.experts > 0)
    s += ", moe " + std::to_string(c.moe.experts) + "x top-" + std::to_string(c.moe.top_k) +
         " every " + std::to_string(c.moe.every);
  if (c.fp8 != Fp8Mode::none) s += c.fp8 == Fp8Mode::hybrid ? ", fp8 hybrid" : ", fp8 e4m3";
  return s;
}

}  // namespace trainctl::model
