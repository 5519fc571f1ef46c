// AdamW over a ParamStore: decoupled weight decay on matrices and embeddings, none on norms and
// biases (ParamSpec::weight_decay). Moments live in the store's m/v buffers; for bf16/fp16
// storage the update runs on the fp32 master weights and the storage copy is their rounding.
#pragma once

#include <array>
#include <cstdint>

#include "backend/backend.hpp"
#include "model/params.hpp"
#include "train/config.hpp"

namespace trainctl::train {

class AdamW {
 public:
  // Takes betas, eps and weight_decay from `config`; the learning rate comes with each step.
  explicit AdamW(const OptimizerConfig& config) : config_(config) {}
  // One update with learning rate `lr`; every gradient is first multiplied by `grad_scale`
  // (1 / loss scale times the clipping coefficient). Updates only the elements the store's
  // optimizer state covers, [optimizer_begin(), optimizer_end()) (its ZeRO-1 part; all of them
  // without ZeRO); a parameter cut by that range is updated on the part inside it.
  void step(backend::Backend& be, model::ParamStore& params, double lr, double grad_scale);
  int64_t updates() const { return updates_; }  // Adam's t (bias correction)
  void restore(int64_t updates) { updates_ = updates; }

 private:
  OptimizerConfig config_;
  int64_t updates_ = 0;
};

}  // namespace trainctl::train
