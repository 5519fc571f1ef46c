#include "train/checkpoint_policy.hpp"

namespace trainctl::train {

CheckpointPolicy::CheckpointPolicy(int64_t every_steps, double every_minutes, int64_t total_steps)
    : every_steps_(every_steps), every_seconds_(every_minutes * 60.0), total_steps_(total_steps) {}

bool CheckpointPolicy::due(int64_t step, double seconds_since_save, bool stop_requested) const {
  if (stop_requested || step == total_steps_) return true;
  if (every_steps_ > 0 && step % every_steps_ == 0) return true;
  return every_seconds_ > 0 && seconds_since_save >= every_seconds_;
}

}  // namespace trainctl::train
