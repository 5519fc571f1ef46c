#include "layout/timeline.hpp"

#include <algorithm>
#include <stdexcept>

namespace trainctl {

namespace {

// The action the other side of a message runs.
PipeOp partner(PipeOp op) {
  switch (op) {
    case PipeOp::send_activation:
      return PipeOp::recv_activation;
    case PipeOp::recv_activation:
      return PipeOp::send_activation;
    case PipeOp::send_grad:
      return PipeOp::recv_grad;
    case PipeOp::recv_grad:
      return PipeOp::send_grad;
    default:
      break;
  }
  throw std::logic_error("partner: " + std::to_string(static_cast<int>(op)) + " is not a transfer");
}

bool downstream(PipeOp op) {
  return op == PipeOp::send_activation || op == PipeOp::recv_grad;
}

}  // namespace

double Timeline::busy(int stage) const {
  double total = 0;
  for (const TimedAction& a : stages.at(static_cast<size_t>(stage)))
    if (a.compute()) total += a.end - a.start;
  return total;
}

int Timeline::micro_batches() const {
  int count = 0;
  if (!stages.empty())
    for (const TimedAction& a : stages.front())
      count += a.action.op == PipeOp::forward && a.action.chunk == 0;
  return count;
}

double Timeline::bubble_share() const {
  if (stages.empty() || makespan <= 0) return 0;
  double busy_total = 0;
  for (size_t s = 0; s < stages.size(); ++s)
    busy_total += busy(static_cast<int>(s));
  return 1.0 - busy_total / (static_cast<double>(stages.size()) * makespan);
}

namespace {

// simulate() and makespan(): the intervals into `record` when it is not null.
double run(const std::vector<std::vector<PipeAction>>& lists, const std::vector<StageTimes>& times,
           double transfer_s, bool buffered, Timeline* record) {
  const size_t P = lists.size();
  if (P == 0 ? !times.empty() : times.empty() || times.size() % P != 0)
    throw std::invalid_argument("pipeline timeline: " + std::to_string(P) + " action lists but " +
                                std::to_string(times.size()) +
                                " stage times (one per virtual stage: a multiple of the lists)");
  const size_t S = times.size();  // virtual stages: chunk c of rank r is c * P + r
  for (const StageTimes& t : times)
    if (!(t.forward >= 0 && t.backward >= 0 && t.weight >= 0))
      throw std::invalid_argument("pipeline timeline: a stage time is negative or not a number");
  if (!(transfer_s >= 0))
    throw std::invalid_argument("pipeline timeline: the transfer time is negative");
  if (record) {
    record->stages.assign(P, {});
    for (size_t s = 0; s < P; ++s)
      record->stages[s].reserve(lists[s].size());
  }
  const bool split = has_weight_passes(lists);  // the backward runs as B and W (StageTimes)
  std::vector<size_t> done(P, 0);
  std::vector<double> clock(P, 0.0);
  // Buffered sends: the arrival time of each message posted (negative: not yet), by (virtual
  // stage it goes to, micro-batch, gradient?).
  int micro_batches = 0;
  if (buffered)
    for (const std::vector<PipeAction>& list : lists)
      for (const PipeAction& a : list)
        micro_batches = std::max(micro_batches, a.micro_batch + 1);
  std::vector<double> mailbox(buffered ? S * static_cast<size_t>(micro_batches) * 2 : 0, -1.0);
  auto message = [&](size_t to, int micro_batch, bool grad) -> double& {
    return mailbox[(to * static_cast<size_t>(micro_batches) + static_cast<size_t>(micro_batch)) *
                       2 +
                   (grad ? 1 : 0)];
  };
  // A stage runs until it waits for a peer; the peer, on reaching the other side of that
  // transfer, completes it and wakes the stage again. Every action is visited once or twice.
  std::vector<size_t> ready(P);
  for (size_t s = 0; s < P; ++s)
    ready[s] = P - 1 - s;
  while (!ready.empty()) {
    const size_t s = ready.back();
    ready.pop_back();
    const std::vector<PipeAction>& list = lists[s];
    size_t& i = done[s];
    for (; i < list.size(); ++i) {
      const PipeAction& a = list[i];
      const size_t v = static_cast<size_t>(a.chunk) * P + s;
      if (v >= S) break;  // no such chunk: stuck
      if (computes(a.op)) {
        const double d = a.op == PipeOp::forward ? times[v].forward
                         : a.op == PipeOp::backward
                             ? times[v].backward + (split ? 0 : times[v].weight)
                             : times[v].weight;
        if (record) record->stages[s].push_back({a, clock[s], clock[s] + d});
        clock[s] += d;
        continue;
      }
      const bool down = downstream(a.op);
      if ((down && v + 1 >= S) || (!down && v == 0)) break;  // no such peer: stuck
      const size_t to = down ? v + 1 : v - 1, peer = to % P;
      if (buffered) {
        const bool grad = a.op == PipeOp::send_grad || a.op == PipeOp::recv_grad;
        if (a.op == PipeOp::send_activation || a.op == PipeOp::send_grad) {
          message(to, a.micro_batch, grad) = clock[s] + transfer_s;
          if (record) record->stages[s].push_back({a, clock[s], clock[s]});
          ready.push_back(peer);  // it may wait for this message
          continue;
        }
        const double arrival = message(v, a.micro_batch, grad);
        if (arrival < 0) break;  // waits for the message
        const double end = std::max(clock[s], arrival);
        if (record) record->stages[s].push_back({a, clock[s], end});
        clock[s] = end;
        continue;
      }
      if (done[peer] >= lists[peer].size()) break;
      const PipeAction& b = lists[peer][done[peer]];
      if (b.op != partner(a.op) || b.micro_batch != a.micro_batch ||
          b.chunk != static_cast<int>(to / P))
        break;  // waits for the peer
      const double end = std::max(clock[s], clock[peer]) + transfer_s;
      if (record) {
        record->stages[s].push_back({a, clock[s], end});
        record->stages[peer].push_back({b, clock[peer], end});
      }
      clock[s] = clock[peer] = end;
      ++done[peer];
      ready.push_back(peer);  // it waited on this transfer
    }
  }
  std::string stuck;
  for (size_t s = 0; s < P; ++s)
    if (done[s] < lists[s].size())
      stuck += (stuck.empty() ? "" : ", ") +
               ("stage " + std::to_string(s) + " at " + to_string(lists[s][done[s]]));
  if (!stuck.empty())
    throw std::logic_error("pipeline timeline: the action lists deadlock (" + stuck + ")");
  return P ? *std::max_element(clock.begin(), clock.end()) : 0.0;
}

}  // namespace

Timeline simulate(const std::vector<std::vector<PipeAction>>& lists,
                  const std::vector<StageTimes>& times, double transfer_s, bool buffered_sends) {
  Timeline t;
  t.makespan = run(lists, times, transfer_s, buffered_sends, &t);
  return t;
}

double makespan(const std::vector<std::vector<PipeAction>>& lists,
                const std::vector<StageTimes>& times, double transfer_s, bool buffered_sends) {
  return run(lists, times, transfer_s, buffered_sends, nullptr);
}

}  // namespace trainctl
