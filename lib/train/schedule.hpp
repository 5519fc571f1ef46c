// Learning-rate schedules: linear warmup, then cosine / linear / constant / warmup-stable-decay
// down to min_lr at the last step. `lr(step)` is the rate used by optimizer update `step`
// (0-based), a pure function so resumes and restarts agree.
#pragma once

#include <cstdint>

#include "train/config.hpp"

namespace trainctl::train {

struct LrSchedule {
  double peak_lr = 1e-3;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  DecayKind decay = DecayKind::cosine;
  double wsd_decay_fraction = 0.2;  // wsd: share of the post-warmup steps spent decaying

  double lr(int64_t step) const;

  // The schedule a run follows: peak optimizer.lr, decaying until schedule.decay_steps (or the
  // run's last step when that is 0).
  static LrSchedule of(const OptimizerConfig& optimizer, const ScheduleConfig& schedule,
                       int64_t steps);
};

}  // namespace trainctl::train
