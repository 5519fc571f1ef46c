// The 1F1B pipeline schedule as data (Megatron's schedules.py idea): the ordered list of actions
// (receive, compute, send) one stage runs for one optimizer step. The trainer executes the list;
// tests and the planner can read it.
//
// Stage s of P over M micro-batches: a warm-up of min(P - s - 1, M) forwards, then one forward and
// one backward in turn, then the remaining backwards. At most min(P - s, M) micro-batches are in
// flight (forwarded, not yet backwarded) at once, so micro-batch m can use activation slot m %
// slots.
//
// Sends are blocking and may be unbuffered (a send returns only once the peer receives), so the
// order of sends and receives between two adjacent stages must match exactly. In the steady state
// stage s sends activation f to s + 1 and then waits for the gradient of b, while s + 1 has just
// finished backward b and needs activation f next: s + 1 therefore receives activation f BEFORE it
// sends gradient b (Megatron pairs these two in one batched send/recv for the same reason).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainctl {

enum class PipeOp : uint8_t {
  recv_activation,  // from stage s - 1 into stage_input(slot)
  forward,
  send_activation,  // stage_output(slot) to stage s + 1
  recv_grad,        // from stage s + 1 into output_grad()
  backward,
  send_grad,  // input_grad() to stage s - 1
};

struct PipeAction {
  PipeOp op;
  int micro_batch;
  bool operator==(const PipeAction&) const = default;
};

// The actions of stage `stage` (0-based) of `stages` over `micro_batches` micro-batches. Throws
// std::invalid_argument on a stage outside [0, stages) or a count < 1.
std::vector<PipeAction> one_f_one_b(int stages, int stage, int micro_batches);

// Activation sets stage `stage` needs: min(stages - stage, micro_batches).
int pipeline_slots(int stages, int stage, int micro_batches);

// The message tag of a send/recv action: distinct for every (direction, micro-batch) of a step.
uint32_t pipeline_tag(PipeOp op, int micro_batch);

std::string to_string(const PipeAction& action);  // "F3", "B0", "sendA1", ...
// "recv_activation", "forward", ... (the enumerator's name, for files).
const char* op_name(PipeOp op);

}  // namespace trainctl
