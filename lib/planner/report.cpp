// What `trainctl plan` prints: the top-K table, the rank grid of the winner, why the runner-ups
// lost, and the rejections; and the same as a stable JSON document (docs/planner.md, "JSON").
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "planner/planner.hpp"
#include "planner/shape.hpp"

namespace trainctl::planner {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string degrees(const Variant& l) {
  std::string s = fmt::format("tp={} pp={} dp={}", l.tp, l.pp, l.dp);
  if (l.cp > 1) s += fmt::format(" cp={}", l.cp);
  if (l.ep > 1) s += fmt::format(" ep={}", l.ep);
  if (l.sequence_parallel) s += " sp";
  if (l.pp_virtual > 1) s += fmt::format(" v{}", l.pp_virtual);  // interleaved chunks per stage
  if (l.pp_schedule == PipeSchedule::zb_h1) s += " zb";          // ZB-H1: split backward
  return s;
}

std::string cell(const Variant& l, int rank) {
  const Coordinates c = coordinates_of(l, rank);
  std::string s = fmt::format("s{}.d{}.t{}", c.pp, c.dp, c.tp);
  if (l.cp > 1) s += fmt::format(".c{}", c.cp);
  if (l.ep > 1) s += fmt::format(".e{}", c.ep);
  return s;
}

}  // namespace

std::string seconds(double s) {
  if (s < 1e-3) return fmt::format("{:.1f} us", s * 1e6);
  return s < 1 ? fmt::format("{:.1f} ms", s * 1e3) : fmt::format("{:.2f} s", s);
}

std::string format_rank_grid(const Variant& layout, const topology::ClusterSpec& cluster,
                             int max_nodes) {
  const int gpn = std::max(1, cluster.gpus_per_node);
  const int nodes = std::max(1, layout.world_size() / gpn);
  std::string out = fmt::format(
      "GPU placement of {} (cell = s<pp stage>.d<dp replica>.t<tp rank>{}{}):\n", degrees(layout),
      layout.cp > 1 ? ".c<cp rank>" : "", layout.ep > 1 ? ".e<ep rank>" : "");
  std::vector<int> shown;
  for (int n = 0; n < nodes && n < max_nodes - 1; ++n)
    shown.push_back(n);
  if (nodes > 0 && (shown.empty() || shown.back() != nodes - 1)) shown.push_back(nodes - 1);
  int previous = -1;
  for (int node : shown) {
    if (node != previous + 1) out += fmt::format("  ... {} more nodes ...\n", node - previous - 1);
    out += fmt::format("  node {:>5}:", node);
    for (int g = 0; g < gpn; ++g)
      out += fmt::format(" {:<12}", cell(layout, node * gpn + g));
    while (!out.empty() && out.back() == ' ')
      out.pop_back();
    out += "\n";
    previous = node;
  }
  return out;
}

namespace {

std::string memory_line(const MemoryEstimate& m, double headroom) {
  return fmt::format(
      "memory per GPU (stage {}, {} activation set(s) in flight): params {:.2f} GiB, grads {:.2f}, "
      "optimizer {:.2f}, activations {:.2f}, comm buffers {:.2f}, overhead {:.2f} = {:.2f} GiB, "
      "headroom {:.2f} GiB",
      m.worst_stage, m.in_flight, m.params / kGiB, m.grads / kGiB, m.optimizer / kGiB,
      m.activations / kGiB, m.comm_buffers / kGiB, m.overhead / kGiB, m.total() / kGiB,
      headroom / kGiB);
}

std::string time_line(const TimeEstimate& t) {
  return fmt::format(
      "step {} (likely {} to {}): {} micro-batches; compute {}, tp comm {}, ep all-to-all {}, "
      "{}pipeline sends {}, bubble {}, gradient sync {} ({} exposed)",
      seconds(t.step_s), seconds(t.step_s * (1 - kStepError)), seconds(t.step_s * (1 + kStepError)),
      t.micro_batches, seconds(t.compute_s), seconds(t.tp_comm_s), seconds(t.ep_comm_s),
      t.cp_comm_s > 0 ? fmt::format("cp ring {}, ", seconds(t.cp_comm_s)) : std::string(),
      seconds(t.pp_p2p_s), seconds(t.bubble_s), seconds(t.dp_comm_s), seconds(t.dp_exposed_s));
}

// Above kTightMemoryShare of the GPU a layout may still not fit: the allocator's fragmentation,
// NCCL's buffers and the CUDA context vary by version and are modelled as one fixed overhead.
// Empty when `m` is below; else a line saying so and naming the fastest layout that stays below.
std::string tight_memory_note(const Plan& plan, const MemoryEstimate& m, std::string_view who) {
  const double capacity = plan.cluster.gpu.memory_gib * kGiB;
  if (capacity <= 0 || !tight_memory(m.total(), capacity)) return {};
  std::string out = fmt::format(
      "  note: {} uses {:.0f}% of the GPU's memory, above {:.0f}%: fragmentation and library "
      "buffers beyond the model's fixed overhead may not fit",
      who, 100.0 * m.total() / capacity, 100.0 * kTightMemoryShare);
  for (size_t i = 0; i < plan.ranked.size(); ++i)
    if (!tight_memory(plan.ranked[i].memory.total(), capacity))
      return out + fmt::format("; the fastest layout below is #{} ({}, {:.0f}%)\n", i + 1,
                               degrees(plan.ranked[i].layout),
                               100.0 * plan.ranked[i].memory.total() / capacity);
  return out + "; no ranked layout stays below\n";
}

// Why ranked[i] comes after the first: within a tie, the rule that ordered it; else the step.
std::string why_after(const Plan& plan, size_t i) {
  const Candidate &best = plan.ranked.front(), &k = plan.ranked[i];
  if (static_cast<int>(i) >= plan.tied) return explain_loss(best, k, plan.cluster);
  const double capacity = plan.cluster.gpu.memory_gib * kGiB;
  const bool tight = tight_memory(k.memory.total(), capacity);
  const bool best_tight = tight_memory(best.memory.total(), capacity);
  const int replica = k.layout.gpus_per_replica(), best_replica = best.layout.gpus_per_replica();
  const std::string rule =
      tight && !best_tight ? fmt::format("it uses {:.0f}% of the GPU's memory, above {:.0f}%",
                                         100 * k.memory.total() / capacity, 100 * kTightMemoryShare)
      : replica != best_replica
          ? fmt::format("{} GPUs per model replica against {}", replica, best_replica)
          : fmt::format("its step is longer by {:.1f}%",
                        100 * (k.time.step_s / best.time.step_s - 1));
  return fmt::format("a tie with #1 (step {:+.1f}%), ordered after it: {}",
                     100 * (k.time.step_s / best.time.step_s - 1), rule);
}

}  // namespace

std::string format_preview(const Plan& plan) {
  if (!plan.preview) return {};
  const Preview& p = *plan.preview;
  const topology::ClusterSpec& c = plan.cluster;
  std::string out = fmt::format("{}: {}\n", p.origin, p.layout.describe());
  if (!p.problem.empty()) {
    out += fmt::format("  does not run on {}: {}\n", c.name, p.problem);
  } else {
    out += fmt::format(
        "  runs: {:.1f} GiB per GPU ({:.0f}%), step {}, {:.0f} tokens/s/GPU, MFU {:.1f}%; #{} "
        "by step time among the {} ranked layouts below{}\n",
        p.memory.total() / kGiB, 100.0 * p.memory.total() / (c.gpu.memory_gib * kGiB),
        seconds(p.time.step_s), p.time.tokens_per_s_per_gpu, 100 * p.time.mfu, p.rank,
        plan.ranked.size(),
        plan.ranked.empty() || p.rank == 1
            ? std::string()
            : fmt::format(" (its step is {:.0f}% longer than the first's)",
                          100.0 * (p.time.step_s / plan.ranked.front().time.step_s - 1.0)));
  }
  if (p.estimated) {
    out += "  " + memory_line(p.memory, p.headroom_bytes) + "\n";
    out += "  " + time_line(p.time) + "\n";
    if (p.problem.empty()) out += tight_memory_note(plan, p.memory, "this layout");
  }
  if (!p.balanced_pp_layers.empty())
    out += fmt::format(
        "  stage balance: parallel.pp_layers: [{}] would take the step from {} to {} ({:.1f}% "
        "shorter): the first and last stages also hold the embedding and the head\n",
        fmt::join(p.balanced_pp_layers, ", "), seconds(p.time.step_s), seconds(p.balanced_step_s),
        100.0 * (1.0 - p.balanced_step_s / p.time.step_s));
  if (p.problem.empty()) out += format_rank_grid(p.layout, c);
  return out + "\n";
}

std::string format_plan(const Plan& plan, const recipe::Recipe& recipe, int top) {
  const topology::ClusterSpec& c = plan.cluster;
  std::string out = format_preview(plan);
  out += fmt::format(
      "plan for {} on {} ({} node(s) x {} {}, {:.0f} GiB each): {} layouts evaluated, {} "
      "fit, {} degree tuples ranked in {:.0f} ms\n\n",
      recipe.name, c.name, c.nodes, c.gpus_per_node,
      c.cpu_ranks ? std::string("CPU rank(s)") : c.gpu.name + " GPU(s)", c.gpu.memory_gib,
      plan.variants_evaluated, plan.variants_feasible, plan.ranked.size(),
      plan.search_seconds * 1e3);
  out += fmt::format("{:>3}  {:<26} {:>3} {:>4} {:>9}  {:>16} {:>10} {:>12} {:>6} {:>7} {:>6}\n",
                     "#", "layout", "mb", "zero", "recompute", "memory/GPU", "step", "tokens/s/GPU",
                     "MFU", "bubble", "comm");
  const int rows = std::min<int>(top, static_cast<int>(plan.ranked.size()));
  for (int i = 0; i < rows; ++i) {
    const Candidate& k = plan.ranked[static_cast<size_t>(i)];
    out += fmt::format(
        "{:>3}{} {:<26} {:>3} {:>4} {:>9}  {:>6.1f} GiB ({:>3.0f}%) {:>10} {:>12.0f} {:>5.1f}% "
        "{:>6.1f}% {:>5.1f}%\n",
        i + 1, i < plan.tied && plan.tied > 1 ? "=" : " ", degrees(k.layout), k.layout.micro_batch,
        k.layout.zero, recipe::to_string(k.layout.recompute), k.memory.total() / kGiB,
        100.0 * k.memory.total() / (c.gpu.memory_gib * kGiB), seconds(k.time.step_s),
        k.time.tokens_per_s_per_gpu, 100 * k.time.mfu, 100 * k.time.bubble_share(),
        100 * k.time.comm_share());
  }
  if (plan.tied > 1)
    out += fmt::format(
        "= #1 to #{} tie: their steps lie within {:.0f}% of the fastest, inside the model's error "
        "between layouts; they are ordered by memory headroom (not above {:.0f}% of the GPU "
        "first), then fewer GPUs per model replica (tp * pp * cp)\n",
        plan.tied, 100 * kTieBand, 100 * kTightMemoryShare);
  const Candidate& best = plan.ranked.front();
  out += fmt::format("\nbest: {}\n  {}\n  {}\n", best.layout.describe(),
                     memory_line(best.memory, best.headroom_bytes), time_line(best.time));
  out += tight_memory_note(plan, best.memory, "it") + "\n";
  out += format_rank_grid(best.layout, c);
  if (rows > 1) {
    out += "\nwhy the runner-ups lost:\n";
    for (int i = 1; i < rows; ++i) {
      const Candidate& k = plan.ranked[static_cast<size_t>(i)];
      out += fmt::format("  #{} {}: {}\n", i + 1, degrees(k.layout),
                         why_after(plan, static_cast<size_t>(i)));
    }
  }
  if (!plan.rejected.empty()) {
    out += fmt::format("\nrejected ({} degree tuples):\n", plan.rejected.size());
    size_t shown = 0;
    for (const Rejection& r : plan.rejected) {
      if (shown++ == 10) {
        out += fmt::format("  ... {} more (see --json)\n", plan.rejected.size() - 10);
        break;
      }
      out += fmt::format("  {}: {}\n", degrees(r.layout), r.reason);
    }
  }
  return out;
}

namespace {

nlohmann::json layout_json(const Variant& l) {
  return {{"tp", l.tp},
          {"pp", l.pp},
          {"dp", l.dp},
          {"ep", l.ep},
          {"cp", l.cp},
          {"micro_batch", l.micro_batch},
          {"zero", l.zero},
          {"sequence_parallel", l.sequence_parallel},
          {"recompute", std::string(recipe::to_string(l.recompute))},
          {"pp_schedule", schedule_name(l.pp_schedule)},
          {"pp_virtual", l.pp_virtual}};
}

nlohmann::json memory_json(const MemoryEstimate& m, double headroom) {
  return {{"params", m.params},
          {"grads", m.grads},
          {"optimizer", m.optimizer},
          {"activations", m.activations},
          {"comm_buffers", m.comm_buffers},
          {"overhead", m.overhead},
          {"total", m.total()},
          {"headroom", headroom},
          {"worst_stage", m.worst_stage},
          {"in_flight", m.in_flight},
          {"tight", tight_memory(m.total(), m.total() + headroom)}};
}

nlohmann::json time_json(const TimeEstimate& t) {
  return {{"step", t.step_s},       {"compute", t.compute_s}, {"tp_comm", t.tp_comm_s},
          {"ep_comm", t.ep_comm_s}, {"cp_comm", t.cp_comm_s}, {"pp_p2p", t.pp_p2p_s},
          {"bubble", t.bubble_s},   {"dp_comm", t.dp_comm_s}, {"dp_exposed", t.dp_exposed_s}};
}

nlohmann::json preview_json(const Plan& plan) {
  using nlohmann::json;
  if (!plan.preview) return nullptr;
  const Preview& p = *plan.preview;
  json doc{{"origin", p.origin},
           {"layout", layout_json(p.layout)},
           {"runs", p.problem.empty()},
           {"problem", p.problem.empty() ? json(nullptr) : json(p.problem)},
           {"rank", p.rank > 0 ? json(p.rank) : json(nullptr)}};
  if (p.estimated) {
    doc["memory_bytes"] = memory_json(p.memory, p.headroom_bytes);
    doc["time_seconds"] = time_json(p.time);
    doc["tokens_per_s_per_gpu"] = p.time.tokens_per_s_per_gpu;
    doc["mfu"] = p.time.mfu;
  }
  doc["balanced_pp_layers"] =
      p.balanced_pp_layers.empty() ? json(nullptr) : json(p.balanced_pp_layers);
  doc["balanced_step_s"] = p.balanced_pp_layers.empty() ? json(nullptr) : json(p.balanced_step_s);
  return doc;
}

}  // namespace

std::string plan_json(const Plan& plan, const recipe::Recipe& recipe, int top,
                      const std::string& error) {
  using nlohmann::json;
  const topology::ClusterSpec& c = plan.cluster;
  json doc{{"schema", "trainctl.plan/1"},
           {"recipe", recipe.name},
           {"cluster",
            {{"name", c.name},
             {"source", c.source},
             {"nodes", c.nodes},
             {"gpus_per_node", c.gpus_per_node},
             {"gpu", c.gpu.name},
             {"gpu_memory_gib", c.gpu.memory_gib}}},
           {"world", plan.world},
           {"variants_evaluated", plan.variants_evaluated},
           {"variants_feasible", plan.variants_feasible},
           {"search_seconds", plan.search_seconds},
           {"tied", plan.tied},
           {"preview", preview_json(plan)},
           {"error", error.empty() ? nlohmann::json(nullptr) : nlohmann::json(error)}};
  json ranked = json::array();
  const int rows = std::min<int>(top, static_cast<int>(plan.ranked.size()));
  for (int i = 0; i < rows; ++i) {
    const Candidate& k = plan.ranked[static_cast<size_t>(i)];
    const MemoryEstimate& m = k.memory;
    const TimeEstimate& t = k.time;
    json row{{"rank", i + 1},
             {"layout", layout_json(k.layout)},
             {"memory_bytes", memory_json(m, k.headroom_bytes)},
             {"time_seconds", time_json(t)},
             {"micro_batches", t.micro_batches},
             {"tokens_per_s_per_gpu", t.tokens_per_s_per_gpu},
             {"mfu", t.mfu},
             {"bubble_share", t.bubble_share()},
             {"comm_share", t.comm_share()}};
    row["tie"] = i < plan.tied && plan.tied > 1;
    row["step_range_s"] = {t.step_s * (1 - kStepError), t.step_s * (1 + kStepError)};
    if (i > 0) row["why_slower"] = why_after(plan, static_cast<size_t>(i));
    ranked.push_back(std::move(row));
  }
  doc["ranked"] = std::move(ranked);
  json rejected = json::array();
  for (const Rejection& r : plan.rejected)
    rejected.push_back(json{{"layout", layout_json(r.layout)}, {"reason", r.reason}});
  doc["rejected"] = std::move(rejected);
  if (plan.ranked.empty()) {
    doc["placement"] = nullptr;
    return doc.dump(2);
  }
  // Placement of the best layout: global rank -> node, local GPU and coordinates.
  const Variant& best = plan.ranked.front().layout;
  const int gpn = std::max(1, c.gpus_per_node);
  json placement = json::array();
  const int listed = std::min(best.world_size(), 4096);  // huge clusters: the rule is tp fastest
  for (int rank = 0; rank < listed; ++rank) {
    const Coordinates co = coordinates_of(best, rank);
    placement.push_back(json::array({rank / gpn, rank % gpn, co.pp, co.dp, co.tp, co.ep}));
  }
  doc["placement"] = {{"columns", json::array({"node", "gpu", "pp", "dp", "tp", "ep"})},
                      {"ranks", std::move(placement)},
                      {"truncated", listed < best.world_size()}};
  return doc.dump(2);
}

}  // namespace trainctl::planner
