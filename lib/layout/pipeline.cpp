#include "layout/pipeline.hpp"

#include <algorithm>
#include <stdexcept>

namespace trainctl {

namespace {

void check(int stages, int stage, int micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1)
    throw std::invalid_argument("pipeline schedule: stage " + std::to_string(stage) + " of " +
                                std::to_string(stages) + " over " + std::to_string(micro_batches) +
                                " micro-batches (need 0 <= stage < stages, micro-batches >= 1)");
}

}  // namespace

int pipeline_slots(int stages, int stage, int micro_batches) {
  check(stages, stage, micro_batches);
  return std::min(stages - stage, micro_batches);
}

std::vector<PipeAction> one_f_one_b(int stages, int stage, int micro_batches) {
  check(stages, stage, micro_batches);
  const bool first = stage == 0, last = stage == stages - 1;
  std::vector<PipeAction> actions;
  auto forward = [&](int m) {
    if (!first) actions.push_back({PipeOp::recv_activation, m});
    actions.push_back({PipeOp::forward, m});
    if (!last) actions.push_back({PipeOp::send_activation, m});
  };
  auto backward = [&](int m) {
    if (!last) actions.push_back({PipeOp::recv_grad, m});
    actions.push_back({PipeOp::backward, m});
    if (!first) actions.push_back({PipeOp::send_grad, m});
  };
  const int warmup = std::min(stages - stage - 1, micro_batches);
  for (int m = 0; m < warmup; ++m)
    forward(m);
  for (int m = 0; m < micro_batches - warmup; ++m) {
    forward(warmup + m);
    backward(m);
  }
  for (int m = micro_batches - warmup; m < micro_batches; ++m)
    backward(m);
  // The steady-state exchange with the previous stage: receive the next activation before sending
  // the last gradient (see the header). The slot of that activation belongs to a micro-batch whose
  // backward is already done, and input_grad() is a buffer of its own, so the swap is safe.
  for (size_t i = 0; i + 1 < actions.size(); ++i)
    if (actions[i].op == PipeOp::send_grad && actions[i + 1].op == PipeOp::recv_activation)
      std::swap(actions[i], actions[i + 1]);
  return actions;
}

uint32_t pipeline_tag(PipeOp op, int micro_batch) {
  const bool activation = op == PipeOp::send_activation || op == PipeOp::recv_activation;
  return static_cast<uint32_t>(micro_batch) * 2u + (activation ? 0u : 1u);
}

std::string to_string(const PipeAction& action) {
  static const char* const names[] = {"recvA", "F", "sendA", "recvG", "B", "sendG"};
  return names[static_cast<int>(action.op)] + std::to_string(action.micro_batch);
}

const char* op_name(PipeOp op) {
  static const char* const names[] = {"recv_activation", "forward",  "send_activation",
                                      "recv_grad",       "backward", "send_grad"};
  return names[static_cast<int>(op)];
}

}  // namespace trainctl
