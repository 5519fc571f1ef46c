// The stability guard: watches each step's loss and gradient norm before the update is applied
// and says when a step must not be: a non-finite loss or gradient, or a spike (a z-score over the
// last applied steps above stability.loss_z or grad_z, the test llm.c's outlier detector makes).
// The trainer acts on its verdict (skip the batch, or roll back to the in-memory snapshot and skip
// every batch since it); the guard counts events in a row and says when to give up.
//
// Every rank holds one with the same inputs (the job's loss and gradient norm), so every rank
// reaches the same verdict without talking. Its state travels in checkpoints, so a resumed run
// decides as the uninterrupted one would.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "train/config.hpp"

namespace trainctl::train {

enum class StabilityEventKind { nonfinite, loss_spike, grad_spike };
const char* event_name(StabilityEventKind kind);  // "non_finite", "loss_spike", "grad_spike"

struct StabilityEvent {
  StabilityEventKind kind = StabilityEventKind::nonfinite;
  int64_t step = 0;   // the step the batch was taken for (1-based)
  int64_t batch = 0;  // the offending batch: 1-based index of the global batch in the data order
  double loss = 0;
  double grad_norm = 0;  // NaN/inf for a non-finite gradient
  double z = 0;          // the spike's z-score (0 for non-finite)
  double threshold = 0;  // the z-score it exceeded
  int window = 0;        // applied steps the z-score was taken over
  StabilityAction action = StabilityAction::skip;
  // What the action did: the step the run went back to (rollback; skip: step - 1) and the
  // batches it skipped, [first_batch, batch].
  int64_t to_step = 0;
  int64_t first_batch = 0;
  int in_a_row = 1;  // events without the run getting past its furthest step, this one included
};

// One line for the log: "step 9: loss spike (loss 412.5, z 38.2 > 6 over the last 8 steps):
// batch 9 skipped, step 9 retried with the next batch".
std::string describe(const StabilityEvent& event);

// Too many events in a row: the run stops. what() lists them and says what to try.
class StabilityError : public std::runtime_error {
 public:
  explicit StabilityError(const std::vector<StabilityEvent>& events);
  const std::vector<StabilityEvent>& events() const { return events_; }
  // How many of the last events no StepMetrics carried (the trainer sets it): the run's reporter
  // records those.
  size_t unreported() const { return unreported_; }
  void set_unreported(size_t count) { unreported_ = std::min(count, events_.size()); }

 private:
  std::vector<StabilityEvent> events_;
  size_t unreported_ = 0;
};

class StabilityGuard {
 public:
  // What a checkpoint carries.
  struct State {
    std::vector<double> losses, grad_norms;  // the window, oldest first
    int64_t events = 0;                      // in the whole run
    int64_t in_a_row = 0;                    // since the run last got past `furthest`
    int64_t furthest = 0;                    // the furthest step applied
    int64_t lr_factor_until = 0;             // rollback: steps below this one use lr_factor
    bool operator==(const State&) const = default;
  };

  explicit StabilityGuard(const StabilityConfig& config);
  const StabilityConfig& config() const { return config_; }

  // The event this step's numbers make, if any (its kind, z, threshold and window; the caller
  // fills in where it happened and what was done). `finite`: the gradient is.
  std::optional<StabilityEvent> check(double loss, double grad_norm, bool finite) const;
  // An event was acted on: counts it; throws StabilityError when it is the max_events-th in a
  // row (the error lists those events).
  void record(const StabilityEvent& event);
  // A step's update was applied: its numbers join the windows.
  void applied(int64_t step, double loss, double grad_norm);
  // The learning-rate multiplier for the step with 0-based index `step`.
  double lr_factor(int64_t step) const {
    return step < state_.lr_factor_until ? config_.lr_factor : 1.0;
  }
  // Rollback to a snapshot taken at `step` whose windows were `windows`: the windows go back,
  // the counters stay, and the lowered learning rate starts.
  void rolled_back(int64_t step, const State& windows);

  const State& state() const { return state_; }
  // A checkpoint's state; throws std::invalid_argument when its windows are longer than this
  // recipe's stability.window allows.
  void restore(const State& state);

 private:
  StabilityConfig config_;
  State state_;
  std::vector<StabilityEvent> recent_;  // the events in a row
};

}  // namespace trainctl::train
