// When to save: every N steps, every M minutes (whichever comes first), at the end of training,
// and when a stop signal arrives. With several ranks, rank 0 decides and the decision is broadcast
// so every rank saves the same step (minutes differ between clocks; steps do not).
#pragma once

#include <cstdint>

namespace trainctl::train {

class CheckpointPolicy {
 public:
  // every_steps 0 and every_minutes 0 turn the periodic saves off.
  CheckpointPolicy(int64_t every_steps, double every_minutes, int64_t total_steps);
  // Called after each finished step. `seconds_since_save` counts from the start of the process
  // or the last save.
  bool due(int64_t step, double seconds_since_save, bool stop_requested) const;

 private:
  int64_t every_steps_;
  double every_seconds_;
  int64_t total_steps_;
};

}  // namespace trainctl::train
