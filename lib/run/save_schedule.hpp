// When a run saves and stops, and the saves themselves. After each step every rank votes (a stop
// signal arrived; a save is due by the recipe's cadence) and every rank acts on the same outcome:
// a signal may reach one rank first, and a time-based cadence is measured by each rank's own
// clock, yet all must stop after, and save, the same step.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "ckpt/ckpt.hpp"
#include "comm/communicator.hpp"
#include "run/context.hpp"
#include "train/checkpoint_policy.hpp"

namespace trainctl::run {

using Clock = std::chrono::steady_clock;

// One rank's vote after a step, or (from exchange_step, straggler.hpp) the job's: each field
// true on every rank when it is true on any rank.
struct StepVote {
  bool stop = false;  // a stop signal arrived
  bool save = false;  // a checkpoint is due
  bool operator==(const StepVote&) const = default;
};

class SaveSchedule {
 public:
  // `enabled` false (cluster.shared_fs: false: rank 0 could not see the other ranks' shards to
  // commit them): never due.
  SaveSchedule(train::CheckpointPolicy policy, bool enabled, Clock::time_point start)
      : policy_(policy), enabled_(enabled), last_save_(start) {}
  bool enabled() const { return enabled_; }
  // This rank's vote after `step`, at `now`.
  StepVote vote(int64_t step, bool stop_requested, Clock::time_point now) const;
  // Whether the job's vote saves a checkpoint: one is due, or the run stops.
  bool saves(const StepVote& job) const { return enabled_ && (job.save || job.stop); }
  // The next cadence counts from `at`.
  void saved(Clock::time_point at) { last_save_ = at; }

 private:
  train::CheckpointPolicy policy_;
  bool enabled_;
  Clock::time_point last_save_;
};

// The run's checkpoint writer (checkpoints/ of the run directory, the recipe's async and
// keep_last, this rank's place in a multi-rank save) and what a save cost.
class Saver {
 public:
  // `provenance`: the run's provenance.json as every manifest carries it (empty off the leader).
  Saver(const SessionInput& input, RunContext& run, nlohmann::json provenance);
  // Captures the model and trainer and saves them (waiting for the previous save first);
  // returns when training may go on.
  void save();
  // A failed background save throws now (ckpt::CheckpointError), not at the next save.
  void poll() { writer_.poll(); }
  void wait() { writer_.wait(); }
  // "checkpoint step_N: <bytes> in <s> (<rate>/s), training stalled <ms> ms", once per finished
  // save; nullopt when there is none new.
  std::optional<std::string> finished_save();
  // The newest step a save of this run has finished, if any.
  std::optional<int64_t> last_saved_step() const;

 private:
  RunContext& run_;
  nlohmann::json layout_;
  nlohmann::json provenance_;
  ckpt::CheckpointWriter writer_;
  int64_t reported_ = -1;
  double stall_ms_ = 0;
};

}  // namespace trainctl::run
