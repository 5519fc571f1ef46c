// A pipeline schedule on a clock: the action lists of every stage (pipeline.hpp) run against each
// other as the engine runs them, with given compute and transfer times, then drawn.
//
// The rules are the engine's: a stage runs its actions in order; a forward or backward takes
// its stage's time; a send and the matching receive are one rendezvous (sends may be unbuffered,
// so both sides wait for the later of the two) that then takes the transfer time. With buffered
// sends (the interleaved schedule's, Communicator::isend) a send costs its stage nothing and the
// message arrives the transfer time later; the receive waits for it. The result is
// the schedule's own: it does not depend on the order the simulation visits the stages.
//
// The planner runs its stage times through it (its step time, and `trainctl plan --timeline`); a
// run asked for its timeline (logging.timeline_step) records the times its stages measured
// instead (Trainer::timeline). telemetry/pipeline_timeline.hpp draws both.
// The bubble share is the stages' idle time over their whole time: 1 - sum(busy) / (stages *
// makespan). For P equal stages over m micro-batches with free transfers, 1F1B's is
// (P - 1) / (m + P - 1).
#pragma once

#include <string>
#include <vector>

#include "layout/pipeline.hpp"

namespace trainctl {

// One (virtual) stage's compute per micro-batch, in seconds: the backward's input-gradient part
// and its weight-gradient part. A list with weight_grad actions (ZB-H1) runs them apart (its
// backward takes `backward`, its W `weight`); any other list's backward takes both.
struct StageTimes {
  double forward = 0, backward = 0, weight = 0;
};

struct TimedAction {
  PipeAction action;
  double start = 0, end = 0;  // seconds from the step's start; a transfer starts when its side
                              // reached it, so its span includes the wait for the peer
  bool compute() const { return computes(action.op); }
};

struct Timeline {
  std::vector<std::vector<TimedAction>> stages;  // per stage, in its action order
  double makespan = 0;                           // the last action's end
  std::string schedule = "1f1b";                 // the schedule's name, for the pictures
  double busy(int stage) const;                  // the stage's compute time
  int micro_batches() const;                     // the forwards of a stage's first chunk
  double bubble_share() const;
};

// Runs `lists` (one action list per rank) with each virtual stage's compute times (P of them, or
// P * V for V chunks per rank: chunk c of rank r at c * P + r) and `transfer_s` per message. Throws
// std::invalid_argument on mismatched sizes or a negative time, and std::logic_error naming the
// stuck actions when the lists deadlock.
Timeline simulate(const std::vector<std::vector<PipeAction>>& lists,
                  const std::vector<StageTimes>& times, double transfer_s,
                  bool buffered_sends = false);

// simulate()'s makespan alone, without recording the actions (the planner's search).
double makespan(const std::vector<std::vector<PipeAction>>& lists,
                const std::vector<StageTimes>& times, double transfer_s,
                bool buffered_sends = false);

}  // namespace trainctl
