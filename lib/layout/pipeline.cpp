#include "layout/pipeline.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

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

const char* schedule_name(PipeSchedule schedule) {
  return kPipeScheduleNames[static_cast<size_t>(schedule)].data();
}

std::optional<PipeSchedule> parse_schedule(std::string_view name) {
  for (size_t i = 0; i < kPipeScheduleNames.size(); ++i)
    if (name == kPipeScheduleNames[i]) return static_cast<PipeSchedule>(i);
  return std::nullopt;
}

std::string PipelineShape::problem() const {
  const std::string P = std::to_string(stages), M = std::to_string(micro_batches),
                    V = std::to_string(virtual_stages);
  if (stages < 1 || micro_batches < 1)
    return "pipeline of " + P + " stages over " + M + " micro-batches: both must be >= 1";
  if (schedule != PipeSchedule::interleaved) {
    if (virtual_stages != 1)
      return "parallel.pp_virtual " + V + " needs parallel.pp_schedule: interleaved (" +
             schedule_name(schedule) + " runs one chunk per stage)";
    if (schedule == PipeSchedule::zb_h1 && stages < 2)
      return "parallel.pp_schedule zb-h1 needs parallel.pp >= 2 (got " + P + ")";
    return "";
  }
  if (virtual_stages < 2)
    return "parallel.pp_schedule interleaved needs parallel.pp_virtual >= 2 model chunks per " +
           std::string("stage (got ") + V + ")";
  if (stages < 2) return "parallel.pp_schedule interleaved needs parallel.pp >= 2 (got " + P + ")";
  if (micro_batches % stages != 0)
    return "parallel.pp_schedule interleaved runs micro-batches in groups of pp: " + M +
           " micro-batches per step % pp " + P + " = " + std::to_string(micro_batches % stages) +
           ", must be 0 (micro-batches = global_batch / (micro_batch * dp * ep))";
  return "";
}

namespace {

// Megatron's interleaved compute order for rank r: forward k of the M * V runs chunk
// (k mod PV) / P of micro-batch (k / PV) P + k mod P; backward k the mirrored chunk.
std::vector<PipeAction> interleaved_compute(int P, int V, int M, int r) {
  const int total = M * V;
  auto micro_batch = [&](int k) { return (k / (P * V)) * P + k % P; };
  auto chunk = [&](int k) { return (k % (P * V)) / P; };
  const int warmup = std::min(total, 2 * (P - r - 1) + (V - 1) * P);
  std::vector<PipeAction> order;
  auto forward = [&](int k) { order.push_back({PipeOp::forward, micro_batch(k), chunk(k)}); };
  auto backward = [&](int k) {
    order.push_back({PipeOp::backward, micro_batch(k), V - 1 - chunk(k)});
  };
  for (int k = 0; k < warmup; ++k)
    forward(k);
  for (int k = warmup; k < total; ++k) {
    forward(k);
    backward(k - warmup);
  }
  for (int k = total - warmup; k < total; ++k)
    backward(k);
  return order;
}

// ZB-H1's compute order for stage s (see the header).
std::vector<PipeAction> zb_h1_compute(int P, int M, int s) {
  const int warmup = std::min(P - s, M);
  std::vector<PipeAction> order;
  for (int m = 0; m < warmup; ++m)
    order.push_back({PipeOp::forward, m});
  for (int m = 0; m < M; ++m) {
    order.push_back({PipeOp::backward, m});
    if (m >= s) order.push_back({PipeOp::weight_grad, m - s});
    if (m + warmup < M) order.push_back({PipeOp::forward, m + warmup});
  }
  for (int m = std::max(M - s, 0); m < M; ++m)
    order.push_back({PipeOp::weight_grad, m});
  return order;
}

// The transfers of compute orders over P ranks of V chunks (see the header): the compute orders
// on a clock with free, buffered messages give every message its producer's end time; each rank
// then runs its computes and messages sorted by one global key.
std::vector<std::vector<PipeAction>> place_transfers(
    const std::vector<std::vector<PipeAction>>& compute, int V) {
  const int P = static_cast<int>(compute.size()), S = P * V;
  int M = 0;
  for (const std::vector<PipeAction>& list : compute)
    for (const PipeAction& a : list)
      M = std::max(M, a.micro_batch + 1);
  // End times by (virtual stage, micro-batch); negative: not run yet.
  std::vector<double> forward_end(static_cast<size_t>(S) * static_cast<size_t>(M), -1.0),
      backward_end(forward_end);
  auto at = [&](std::vector<double>& ends, int v, int m) -> double& {
    return ends[static_cast<size_t>(v) * static_cast<size_t>(M) + static_cast<size_t>(m)];
  };
  std::vector<std::vector<std::pair<double, double>>> span(static_cast<size_t>(P));
  // A split backward (B, then W) takes 1 like a forward; a whole one 2.
  const bool split = has_weight_passes(compute);
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  std::vector<double> clock(static_cast<size_t>(P), 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      const std::vector<PipeAction>& list = compute[static_cast<size_t>(r)];
      for (size_t& i = next[static_cast<size_t>(r)]; i < list.size(); ++i) {
        const PipeAction& a = list[i];
        const int v = a.chunk * P + r;
        if (a.op == PipeOp::weight_grad) {  // after its B on this rank; sends nothing
          if (at(backward_end, v, a.micro_batch) < 0)
            throw std::logic_error("pipeline schedule: rank " + std::to_string(r) + " runs " +
                                   to_string(a) + " before its backward");
          const double start = clock[static_cast<size_t>(r)];
          span[static_cast<size_t>(r)].push_back({start, start + 1.0});
          clock[static_cast<size_t>(r)] = start + 1.0;
          progress = true;
          continue;
        }
        const bool fwd = a.op == PipeOp::forward;
        double ready = clock[static_cast<size_t>(r)];
        if (fwd && v > 0) {
          const double input = at(forward_end, v - 1, a.micro_batch);
          if (input < 0) break;
          ready = std::max(ready, input);
        }
        if (!fwd && v + 1 < S) {
          const double grad = at(backward_end, v + 1, a.micro_batch);
          if (grad < 0) break;
          ready = std::max(ready, grad);
        }
        if (!fwd && at(forward_end, v, a.micro_batch) < 0)
          throw std::logic_error("pipeline schedule: rank " + std::to_string(r) + " runs " +
                                 to_string(a) + " before its forward");
        const double end = ready + (fwd || split ? 1.0 : 2.0);
        at(fwd ? forward_end : backward_end, v, a.micro_batch) = end;
        span[static_cast<size_t>(r)].push_back({ready, end});
        clock[static_cast<size_t>(r)] = end;
        progress = true;
      }
    }
  }
  for (int r = 0; r < P; ++r)
    if (next[static_cast<size_t>(r)] < compute[static_cast<size_t>(r)].size())
      throw std::logic_error(
          "pipeline schedule: the compute orders deadlock (rank " + std::to_string(r) + " at " +
          to_string(compute[static_cast<size_t>(r)][next[static_cast<size_t>(r)]]) + ")");
  // (time, class: 0 message / 1 compute, virtual stage, micro-batch, direction, side)
  using Order = std::tuple<double, int, int, int, int, int>;
  std::vector<std::vector<std::pair<Order, PipeAction>>> events(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    const std::vector<PipeAction>& list = compute[static_cast<size_t>(r)];
    for (size_t i = 0; i < list.size(); ++i) {
      const PipeAction& a = list[i];
      const int v = a.chunk * P + r, m = a.micro_batch;
      const double end = span[static_cast<size_t>(r)][i].second;
      events[static_cast<size_t>(r)].push_back(
          {{span[static_cast<size_t>(r)][i].first, 1, v, m, 0, 0}, a});
      if (a.op == PipeOp::weight_grad) continue;
      const bool fwd = a.op == PipeOp::forward;
      const int to = fwd ? v + 1 : v - 1;  // the virtual stage the result goes to
      if (to < 0 || to >= S) continue;
      const int direction = fwd ? 0 : 1;
      events[static_cast<size_t>(r)].push_back(
          {{end, 0, v, m, direction, 0},
           {fwd ? PipeOp::send_activation : PipeOp::send_grad, m, a.chunk}});
      events[static_cast<size_t>(to % P)].push_back(
          {{end, 0, v, m, direction, 1},
           {fwd ? PipeOp::recv_activation : PipeOp::recv_grad, m, to / P}});
    }
  }
  std::vector<std::vector<PipeAction>> lists(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    auto& e = events[static_cast<size_t>(r)];
    std::sort(e.begin(), e.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [order, action] : e)
      lists[static_cast<size_t>(r)].push_back(action);
  }
  return lists;
}

}  // namespace

std::vector<std::vector<PipeAction>> pipeline_lists(const PipelineShape& shape) {
  if (const std::string problem = shape.problem(); !problem.empty())
    throw std::invalid_argument("pipeline schedule: " + problem);
  std::vector<std::vector<PipeAction>> lists;
  if (shape.schedule == PipeSchedule::one_f_one_b) {
    for (int s = 0; s < shape.stages; ++s)
      lists.push_back(one_f_one_b(shape.stages, s, shape.micro_batches));
    return lists;
  }
  std::vector<std::vector<PipeAction>> compute;
  for (int r = 0; r < shape.stages; ++r)
    compute.push_back(
        shape.schedule == PipeSchedule::zb_h1
            ? zb_h1_compute(shape.stages, shape.micro_batches, r)
            : interleaved_compute(shape.stages, shape.virtual_stages, shape.micro_batches, r));
  return place_transfers(compute, shape.virtual_stages);
}

bool has_weight_passes(const std::vector<std::vector<PipeAction>>& lists) {
  return !lists.empty() &&
         std::any_of(lists.front().begin(), lists.front().end(),
                     [](const PipeAction& a) { return a.op == PipeOp::weight_grad; });
}

SlotPlan plan_slots(const std::vector<PipeAction>& actions) {
  SlotPlan plan;
  plan.slot.assign(actions.size(), -1);
  // A micro-batch's chunk takes the lowest free slot at its receive (or forward) and frees it at
  // its backward (or its W, when the list has one); its gradient leaves afterwards from a tensor
  // the next forward writes (model.hpp), so a slot's next forward must wait for that send.
  std::map<std::pair<int, int>, int> held, sending;
  std::vector<bool> busy;
  std::vector<int> unsent(actions.size(), 0);  // per slot: gradient sends pending
  std::set<std::pair<int, int>> sends, weighed;
  for (const PipeAction& a : actions) {
    if (a.op == PipeOp::send_grad) sends.insert({a.chunk, a.micro_batch});
    if (a.op == PipeOp::weight_grad) weighed.insert({a.chunk, a.micro_batch});
  }
  for (size_t i = 0; i < actions.size(); ++i) {
    const PipeAction& a = actions[i];
    const std::pair<int, int> key{a.chunk, a.micro_batch};
    if (a.op == PipeOp::send_grad) {
      const auto it = sending.find(key);
      if (it == sending.end())
        throw std::logic_error("pipeline schedule: " + to_string(a) + " without its backward");
      plan.slot[i] = it->second;
      --unsent[static_cast<size_t>(it->second)];
      sending.erase(it);
      continue;
    }
    auto it = held.find(key);
    if (it == held.end()) {
      if (a.op != PipeOp::recv_activation && a.op != PipeOp::forward)
        throw std::logic_error("pipeline schedule: " + to_string(a) +
                               " comes before its micro-batch's forward");
      const auto free = std::find(busy.begin(), busy.end(), false);
      const int slot = static_cast<int>(free - busy.begin());
      if (free == busy.end())
        busy.push_back(true);
      else
        *free = true;
      it = held.emplace(key, slot).first;
    }
    const int slot = it->second;
    plan.slot[i] = slot;
    if (a.op == PipeOp::forward && unsent[static_cast<size_t>(slot)] > 0)
      throw std::logic_error("pipeline schedule: " + to_string(a) + " in slot " +
                             std::to_string(slot) + " before the slot's last gradient was sent");
    if (a.op == PipeOp::backward && sends.contains(key)) {
      sending[key] = slot;
      ++unsent[static_cast<size_t>(slot)];
    }
    // The slot is free after the backward, or with a split backward after its W.
    if (a.op == (weighed.contains(key) ? PipeOp::weight_grad : PipeOp::backward)) {
      busy[static_cast<size_t>(slot)] = false;
      held.erase(it);
    }
  }
  plan.slots = static_cast<int>(busy.size());
  return plan;
}

int pipeline_slots(const PipelineShape& shape, int stage) {
  if (stage < 0 || stage >= shape.stages)
    throw std::invalid_argument("pipeline_slots: stage " + std::to_string(stage) + " of " +
                                std::to_string(shape.stages));
  // 1F1B's closed form (what plan_slots gives its lists; the planner asks for many shapes).
  if (shape.schedule == PipeSchedule::one_f_one_b && shape.problem().empty())
    return pipeline_slots(shape.stages, stage, shape.micro_batches);
  return plan_slots(pipeline_lists(shape)[static_cast<size_t>(stage)]).slots;
}

uint32_t pipeline_tag(PipeOp op, int micro_batch) {
  const bool activation = op == PipeOp::send_activation || op == PipeOp::recv_activation;
  return static_cast<uint32_t>(micro_batch) * 2u + (activation ? 0u : 1u);
}

uint32_t pipeline_tag(const PipeAction& action, int stage, int virtual_stages) {
  // The message's boundary is named by the chunk on its lower side: a receive of an activation
  // or a send of a gradient on rank 0 talks to the previous chunk of the last rank.
  const bool upper = action.op == PipeOp::recv_activation || action.op == PipeOp::send_grad;
  const int lower_chunk = upper && stage == 0 ? action.chunk - 1 : action.chunk;
  return pipeline_tag(action.op, action.micro_batch * virtual_stages + lower_chunk);
}

std::string to_string(const PipeAction& action) {
  static const char* const names[] = {"recvA", "F", "sendA", "recvG", "B", "sendG", "W"};
  std::string out = names[static_cast<int>(action.op)];
  out += std::to_string(action.micro_batch);
  if (action.chunk) {
    out += '.';
    out += std::to_string(action.chunk);
  }
  return out;
}

const char* op_name(PipeOp op) {
  static const char* const names[] = {"recv_activation", "forward",  "send_activation",
                                      "recv_grad",       "backward", "send_grad",
                                      "weight_grad"};
  return names[static_cast<int>(op)];
}

}  // namespace trainctl
