#include "train/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace trainctl::train {

double LrSchedule::lr(int64_t step) const {
  if (step < warmup_steps)  // warmup reaches peak_lr at the last warmup step
    return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (decay == DecayKind::constant) return peak_lr;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps - 1);
  const double progress = std::clamp(
      static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps), 0.0, 1.0);
  switch (decay) {
    case DecayKind::cosine:
      return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
    case DecayKind::linear:
      return peak_lr - (peak_lr - min_lr) * progress;
    case DecayKind::wsd: {
      const double start = 1.0 - wsd_decay_fraction;  // stable until here, then linear decay
      if (progress <= start) return peak_lr;
      return peak_lr - (peak_lr - min_lr) * (progress - start) / wsd_decay_fraction;
    }
    case DecayKind::constant:
      break;
  }
  return peak_lr;
}

LrSchedule LrSchedule::of(const OptimizerConfig& optimizer, const ScheduleConfig& schedule,
                          int64_t steps) {
  return LrSchedule{optimizer.lr,          schedule.min_lr,
                    schedule.warmup_steps, schedule.decay_steps > 0 ? schedule.decay_steps : steps,
                    schedule.decay,        schedule.wsd_decay_fraction};
}

}  // namespace trainctl::train
