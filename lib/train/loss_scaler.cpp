#include "train/loss_scaler.hpp"

#include <algorithm>

namespace trainctl::train {

LossScaler::LossScaler(const Config& config) : config_(config) {
  state_.scale = config.kind == LossScaleKind::none ? 1.0 : config.initial_scale;
}

bool LossScaler::update(bool grads_finite) {
  if (!grads_finite) {
    ++state_.skipped_steps;
    state_.good_steps = 0;
    if (config_.kind == LossScaleKind::dynamic)
      state_.scale = std::max(config_.min_scale, state_.scale * config_.backoff);
    return false;
  }
  if (config_.kind == LossScaleKind::dynamic && ++state_.good_steps >= config_.window) {
    state_.scale *= config_.growth;
    state_.good_steps = 0;
  }
  return true;
}

}  // namespace trainctl::train
