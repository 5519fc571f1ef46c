// Stragglers: the rank whose compute holds up the others, named while the job runs. After every
// step each rank's step time and the time it waited in collectives travel with the job's stop and
// save vote (one all-gather, the collective the step loop makes anyway), so rank 0 sees every
// rank's compute time (step time less the time it waited for others). A slow rank computes
// longer and waits less; the others wait for it in their collectives, so their step times look
// alike and only the compute times tell. Rank 0 names the slowest rank when its compute time
// exceeds the median of its peers' (the ranks of its pipeline stage) by more than
// logging.straggler_threshold (a fraction), at most once per logging.every_steps steps, with its
// host and how much.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "run/save_schedule.hpp"

namespace trainctl::run {

// One rank's time in one step.
struct RankStepTime {
  double step_ms = 0;
  double comm_ms = 0;  // exposed: inside collectives or waiting for background reductions
  double compute_ms() const { return step_ms > comm_ms ? step_ms - comm_ms : 0.0; }
};

// The job's vote and every rank's time (rank order; empty without a group).
struct JobStep {
  StepVote vote;
  std::vector<RankStepTime> ranks;
};

// One all-gather over `world` of every rank's vote and time: a collective every rank makes at
// the same step. Without a group, `mine` alone.
JobStep exchange_step(StepVote mine, RankStepTime time, comm::Communicator* world);

// Each rank's host name, in rank order (an all-gather; names cut at 63 bytes).
std::vector<std::string> gather_hosts(comm::Communicator& world);

// The slowest rank of a step, and how it compares with the median rank.
struct Straggler {
  int rank = 0;
  double compute_ms = 0;
  double median_ms = 0;
  double ratio() const { return median_ms > 0 ? compute_ms / median_ms : 0.0; }
};
// The slowest rank by compute time, against the median of its peers: the ranks of its group
// (`groups[r]`: rank r's pipeline stage; stages do different work, the last one the LM head, so
// only ranks of one stage are compared). Of the groups of two or more ranks, the one whose
// slowest rank is furthest above its median. Empty `groups`: every rank is a peer. nullopt when
// no group has two ranks.
std::optional<Straggler> slowest_rank(std::span<const RankStepTime> ranks,
                                      std::span<const int> groups = {});

// Rank 0's watch over the steps. A step has a straggler when its slowest rank computed more than
// (1 + threshold) x the median and at least kMinExcessMs longer (timer noise on millisecond steps
// is not a straggler). The report of a window of `every_steps` steps names the rank that was the
// straggler most often in it.
class StragglerWatch {
 public:
  static constexpr double kMinExcessMs = 2.0;

  // hosts: per rank. threshold <= 0: never reports.
  StragglerWatch(std::vector<std::string> hosts, double threshold, int64_t every_steps);

  // The line to log after `step`, whose slowest rank is `slowest` (slowest_rank of the step's
  // times with this watch's groups), when it closes a window that had stragglers: "straggler:
  // rank 1 on node2 computed 61.3 ms a step, 2.41x the median rank's 25.4 ms (the slowest in 9
  // of the last 10 steps; the others waited for it)".
  std::optional<std::string> observe(int64_t step, const std::optional<Straggler>& slowest);

  bool is_straggler(const Straggler& s) const;

 private:
  std::vector<std::string> hosts_;
  double threshold_;
  int64_t every_steps_;
  int64_t window_steps_ = 0;
  std::vector<int64_t> slowest_count_;  // per rank, steps of the window it was the straggler
  std::vector<double> excess_sum_;      // its compute time and the median's, summed over those
  std::vector<double> median_sum_;
};

}  // namespace trainctl::run
