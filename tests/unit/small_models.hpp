// The small models the training tests run: hidden 32, 4 heads, ffn 64, vocab 32, 16 tokens a
// sequence, so a step takes milliseconds on one core.
#pragma once

#include "model/config.hpp"

namespace small_models {

inline trainctl::model::ModelConfig gpt(
    int layers = 2, trainctl::tensor::DType storage = trainctl::tensor::DType::f32) {
  trainctl::model::ModelConfig c = trainctl::model::gpt_preset();
  c.layers = layers;
  c.hidden = 32;
  c.heads = 4;
  c.kv_heads = 4;
  c.ffn_hidden = 64;
  c.vocab = 32;
  c.seq_len = 16;
  c.storage = storage;
  return c;
}

}  // namespace small_models
