// Where a run's words and numbers go: the progress line (rank 0, stderr), the rank's log, and on
// rank 0 metrics.jsonl and TensorBoard. One call per step feeds every sink; a new sink is one
// member here.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "recipe/recipe.hpp"
#include "run/peak.hpp"
#include "run/rank_log.hpp"
#include "run/straggler.hpp"
#include "telemetry/telemetry.hpp"
#include "train/trainer.hpp"

namespace trainctl::run {

// What the steps added up to, for the summary.
struct StepTotals {
  train::StepMetrics last;         // the newest step
  std::optional<double> last_val;  // the newest validation loss
  int64_t skipped = 0;             // steps skipped for non-finite gradients (fp16)
  int64_t stability_events = 0;    // the stability guard's events in the whole run
};

class StepReporter {
 public:
  struct Options {
    bool leader = false;            // rank 0: progress line, metrics.jsonl, TensorBoard
    bool resuming = false;          // append to the rank log of the run
    bool fp16 = false;              // loss scale and skipped steps
    bool moe = false;               // router losses, expert load, dropped tokens
    bool multi = false;             // comm_ms
    bool overlapping = false;       // comm_background_ms: the gradient reduction's busy time
    bool context_parallel = false;  // cp_wait_ms: the ring's exposed exchange
    // MFU (leader): 3 x forward_flops_per_token x tokens_per_step per step, against
    // peak_devices devices of `peak` each; no MFU while the peak is unknown (0).
    double forward_flops_per_token = 0;
    double tokens_per_step = 0;
    Peak peak;
    int peak_devices = 1;
    uint64_t memory_bytes = 0;  // the rank's peak memory (all categories); 0: not shown
    // Several ranks (leader): each rank's host and pipeline stage, in rank order, for the
    // straggler watch (only ranks of one stage are compared).
    std::vector<std::string> hosts;
    std::vector<int> stages;
  };
  // Opens metrics.jsonl and the TensorBoard event file (leader), then the rank log when the
  // rendezvous has not opened it. Throws std::runtime_error naming a file it cannot open.
  StepReporter(const recipe::Recipe& recipe, const std::filesystem::path& run_dir, RankLog& log,
               Options options);

  // A line for the user (above the progress line) and the rank log.
  void say(const std::string& line);
  // Every sink's record of step m; `loss_scale` is the scaler's scale after it. `ranks`: every
  // rank's time in the step (several ranks): the communication share and the slowest rank go
  // into metrics.jsonl and TensorBoard, and a straggler is named (straggler.hpp).
  void step(const train::StepMetrics& m, double loss_scale,
            std::span<const RankStepTime> ranks = {});
  // The stability guard's events (each a metrics.jsonl record and a TensorBoard point of
  // stability/events); `total`: the run's count with these. step() reports a step's own.
  void events(std::span<const train::StabilityEvent> events, int64_t total);
  void flush();   // TensorBoard's buffered events to disk (before a save, at the end)
  void finish();  // ends the progress line
  const StepTotals& totals() const { return totals_; }

 private:
  Options options_;
  std::chrono::steady_clock::time_point start_;  // elapsed time counts from here
  std::optional<telemetry::MetricsWriter> metrics_;
  std::optional<telemetry::TensorBoardWriter> tensorboard_;
  std::optional<telemetry::Progress> progress_;
  std::optional<telemetry::Progress> log_;
  std::optional<StragglerWatch> stragglers_;  // leader, several ranks
  StepTotals totals_;
};

}  // namespace trainctl::run
