// Pipeline schedules as data (Megatron's schedules.py idea): the ordered list of actions (receive,
// compute, send) one stage runs for one optimizer step. The trainer executes the list; tests, the
// planner and the timeline read it.
//
// 1F1B (PipeDream-Flush): stage s of P over M micro-batches runs a warm-up of min(P - s - 1, M)
// forwards, then one forward and one backward in turn, then the remaining backwards. At most
// min(P - s, M) micro-batches are in flight (forwarded, not yet backwarded) at once.
//
// Interleaved 1F1B (Narayanan et al. 2021, Megatron's virtual pipeline): each rank holds V model
// chunks. The model's layers form P * V virtual stages; virtual stage v = c * P + r is chunk c of
// rank r, so a micro-batch goes around the ranks V times (rank P - 1 hands chunk c's output to
// rank 0's chunk c + 1). A rank's compute order is Megatron's: forwards of micro-batch groups of P,
// chunk by chunk, a warm-up of 2 (P - r - 1) + (V - 1) P forwards, then one forward and one
// backward in turn. It needs M % P == 0 and P >= 2. The bubble shrinks by V (each chunk is 1/V of
// the stage) for more activations in flight.
//
// ZB-H1 (Qi et al. 2024, zero bubble): the backward is split into the input-gradient pass B (what
// the previous stage waits for) and the weight-gradient pass W (what nobody waits for). Stage s
// runs a warm-up of min(P - s, M) forwards, then for each micro-batch k in turn B_k, W_{k - s}
// (from k = s on) and the next forward, then its last s W passes. The gradient goes back one B
// per stage instead of one B + W, and the W passes held back on the later stages fill their
// tails, so with F = B = W and M >= P the bubble is (P - 1) / (3M + P - 1), a third of 1F1B's (a
// test runs both on the clock). A micro-batch is in flight from its forward to its W: min(P, M) on
// every stage, 1F1B's peak on stage 0 (the paper's "same peak memory"), more than 1F1B on the later
// stages. It needs P >= 2.

// Sends are blocking and may be unbuffered (a send returns only once the peer receives), so the
// order of sends and receives between two adjacent ranks must match exactly. 1F1B's steady state
// has stage s send activation f to s + 1 and then wait for the gradient of b, while s + 1 has just
// finished backward b and needs activation f next: s + 1 therefore receives activation f BEFORE it
// sends gradient b (Megatron pairs these two in one batched send/recv for the same reason). The
// interleaved and ZB-H1 lists place their transfers by a rule that is deadlock-free by
// construction: the compute orders are run on a clock with free, buffered messages (forward 1,
// backward 2), every message gets the time its producer finished, and each rank performs its
// computes (at their start) and its messages (at that time, before a compute starting then) in the
// order of one global key, so the pending action with the smallest key can always run.
//
// Activations travel in slots: a micro-batch's chunk takes a slot when it is received (or
// forwarded, on the first virtual stage) and frees it after its last action (the gradient sent
// back, or the backward; with a split backward the weight-gradient pass). plan_slots numbers them;
// the slot's input tensor also carries the gradient sent back and its output tensor the gradient
// received (model.hpp).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trainctl {

enum class PipeOp : uint8_t {
  recv_activation,  // from the previous virtual stage into stage_input(slot)
  forward,
  send_activation,  // stage_output(slot) to the next virtual stage
  recv_grad,        // from the next virtual stage into output_grad(slot)
  backward,         // the whole backward; with ZB-H1 the input-gradient pass (B) only
  send_grad,        // input_grad(slot) to the previous virtual stage
  weight_grad,      // ZB-H1: the weight-gradient pass (W) of a micro-batch whose B ran
};

// Whether the op is compute (forward, backward, W) rather than a transfer.
inline bool computes(PipeOp op) {
  return op == PipeOp::forward || op == PipeOp::backward || op == PipeOp::weight_grad;
}

struct PipeAction {
  PipeOp op;
  int micro_batch;
  int chunk = 0;  // the rank's model chunk (interleaved); 0 otherwise
  bool operator==(const PipeAction&) const = default;
};

enum class PipeSchedule : uint8_t { one_f_one_b, interleaved, zb_h1 };
inline constexpr std::array<std::string_view, 3> kPipeScheduleNames{"1f1b", "interleaved", "zb-h1"};
// "1f1b", "interleaved", "zb-h1" (the recipe's words)
const char* schedule_name(PipeSchedule schedule);
// Whether the schedule splits the backward into B and W (PipeOp::weight_grad).
inline bool splits_backward(PipeSchedule schedule) {
  return schedule == PipeSchedule::zb_h1;
}
std::optional<PipeSchedule> parse_schedule(std::string_view name);

// One step's pipeline: its ranks, micro-batches, schedule and chunks per rank.
struct PipelineShape {
  int stages = 1;  // pipeline ranks
  int micro_batches = 1;
  PipeSchedule schedule = PipeSchedule::one_f_one_b;
  int virtual_stages = 1;  // model chunks per rank: >= 2 for interleaved, else 1
  // Why the shape cannot run, in the recipe's words; empty when it can.
  std::string problem() const;
};

// Whether lists (one per rank) split the backward into B and W: every stage of such lists has W
// passes, so the first list says it.
bool has_weight_passes(const std::vector<std::vector<PipeAction>>& lists);

// Every rank's actions (index: rank). Throws std::invalid_argument with problem() when the shape
// cannot run.
std::vector<std::vector<PipeAction>> pipeline_lists(const PipelineShape& shape);

// Activation slots of one rank's list: the slot of each action (-1 for none) and how many.
struct SlotPlan {
  std::vector<int> slot;
  int slots = 0;
};
SlotPlan plan_slots(const std::vector<PipeAction>& actions);
// plan_slots(pipeline_lists(shape)[stage]).slots
int pipeline_slots(const PipelineShape& shape, int stage);

// The actions of stage `stage` (0-based) of `stages` over `micro_batches` micro-batches. Throws
// std::invalid_argument on a stage outside [0, stages) or a count < 1.
std::vector<PipeAction> one_f_one_b(int stages, int stage, int micro_batches);

// Activation sets stage `stage` needs: min(stages - stage, micro_batches).
int pipeline_slots(int stages, int stage, int micro_batches);

// The message tag of a send/recv action: distinct for every (direction, micro-batch) of a step.
uint32_t pipeline_tag(PipeOp op, int micro_batch);
// With chunks: distinct for every message between two ranks in a step, the same on both sides.
// `stage` is the rank of the action, `virtual_stages` the chunks per rank.
uint32_t pipeline_tag(const PipeAction& action, int stage, int virtual_stages);

std::string to_string(const PipeAction& action);  // "F3", "B0", "W0", "sendA1", chunk 1: "F3.1"
// "recv_activation", "forward", ... (the enumerator's name, for files).
const char* op_name(PipeOp op);

}  // namespace trainctl
