#include "train/loss_scaler.hpp"

#include <algorithm>

namespace trainctl::train {

LossScaler::LossScaler(const LossScalingConfig& config, bool enabled)
    : mode_(enabled ? config.loss_scale.mode : LossScaleKind::none),
      window_(config.loss_scale_window),
      min_scale_(config.min_loss_scale) {
  switch (mode_) {
    case LossScaleKind::none:
      state_.scale = 1.0;
      break;
    case LossScaleKind::fixed:
      state_.scale = config.loss_scale.value;
      break;
    case LossScaleKind::dynamic:
      state_.scale = config.initial_loss_scale;
      break;
  }
}

bool LossScaler::update(bool grads_finite) {
  if (!grads_finite) {
    ++state_.skipped_steps;
    state_.good_steps = 0;
    if (mode_ == LossScaleKind::dynamic)
      state_.scale = std::max(min_scale_, state_.scale * kBackoff);
    return false;
  }
  if (mode_ == LossScaleKind::dynamic && ++state_.good_steps >= window_) {
    state_.scale *= kGrowth;
    state_.good_steps = 0;
  }
  return true;
}

}  // namespace trainctl::train
