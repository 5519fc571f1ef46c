// Loss scaling for fp16: the loss gradient is multiplied by `scale` so small activation gradients
// survive fp16's range; parameter gradients are divided by it before use. Dynamic mode (as in
// Megatron and torch.cuda.amp.GradScaler): a step whose gradients hold inf/NaN is skipped and the
// scale is multiplied by `backoff` (not below min_scale); after `window` finite steps in a row the
// scale is multiplied by `growth`.
#pragma once

#include <cstdint>

#include "train/config.hpp"

namespace trainctl::train {

class LossScaler {
 public:
  static constexpr double kGrowth = 2.0;
  static constexpr double kBackoff = 0.5;
  struct State {  // everything a checkpoint must carry
    double scale = 1.0;
    int64_t good_steps = 0;
    int64_t skipped_steps = 0;
  };

  // `enabled`: whether the model stores fp16; otherwise the scale stays 1 (mode none) whatever
  // the config says, since no other precision underflows.
  LossScaler(const LossScalingConfig& config, bool enabled);
  double scale() const { return state_.scale; }
  bool dynamic() const { return mode_ == LossScaleKind::dynamic; }
  // Records the outcome of a step. Returns true when the step must be applied, false when it is
  // skipped (non-finite gradients). With mode none/fixed a non-finite step is skipped too.
  bool update(bool grads_finite);
  const State& state() const { return state_; }
  void restore(const State& state) { state_ = state; }

 private:
  LossScaleKind mode_;
  int64_t window_;
  double min_scale_;
  State state_;
};

}  // namespace trainctl::train
