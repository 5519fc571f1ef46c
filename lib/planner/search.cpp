// The layout search: every (tp, pp, ep) whose product divides the world, dp the rest; for each,
// every micro-batch size, ZeRO stage and recompute mode allowed; rejected with a reason or
// estimated. The best variant of each degree tuple is ranked by predicted step time.
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "planner/planner.hpp"
#include "planner/shape.hpp"

namespace trainctl::planner {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::string not_divisible(std::string_view what, int64_t value, std::string_view degree,
                          int64_t by) {
  return fmt::format("{} % {} = {} % {} = {} != 0", what, degree, value, by, value % by);
}

}  // namespace

Variant::Variant(int tp_degree, int pp_degree, int dp_degree, int ep_degree, int micro,
                 int zero_stage, Recompute mode)
    : micro_batch(micro) {
  tp = tp_degree;
  pp = pp_degree;
  dp = dp_degree;
  ep = ep_degree;
  zero = zero_stage;
  recompute = mode;
}

std::string Variant::describe() const {
  return fmt::format("tp={} pp={} dp={} ep={} mb={} zero={} recompute={}{}{}{}", tp, pp, dp, ep,
                     micro_batch, zero, recipe::to_string(recompute),
                     cp > 1 ? fmt::format(" cp={}", cp) : std::string(),
                     sequence_parallel ? " sp=1" : "",
                     pp_virtual > 1 ? fmt::format(" interleaved={}", pp_virtual)
                     : pp_schedule == PipeSchedule::zb_h1 ? std::string(" schedule=zb-h1")
                                                          : std::string());
}

PipelineShape Variant::pipeline(const recipe::Recipe& r) const {
  return {pp, std::max(1, r.training.global_batch / (micro_batch * dp * ep)), pp_schedule,
          pp_virtual};
}

std::string check_divisibility(const recipe::Recipe& r, const Variant& l) {
  const recipe::ModelConfig& m = r.model;
  for (auto [key, value] : {std::pair<std::string_view, int>{"model.heads", m.heads},
                            {"model.kv_heads", m.kv_heads},
                            {"model.ffn_hidden", m.ffn_hidden},
                            {"model.vocab", m.vocab}})
    if (value % l.tp != 0) return not_divisible(key, value, "tp", l.tp);
  if (l.sequence_parallel && l.tp < 2)
    return fmt::format("sequence parallel needs tp >= 2 (tp = {})", l.tp);
  if (l.sequence_parallel && m.seq_len % l.tp != 0)
    return not_divisible("model.seq_len", m.seq_len, "tp", l.tp) +
           " (sequence parallel splits each sequence over tp)";
  // Stages need not be equal (the engine splits as evenly as it can, earlier stages taking the
  // remainder, or as parallel.pp_layers says): the recipe's own rule, one layer per stage.
  if (l.pp > m.layers)
    return fmt::format(
        "parallel.pp <= model.layers fails: {} > {} (each pipeline stage needs "
        "at least one layer)",
        l.pp, m.layers);
  if (l.pp * l.pp_virtual > m.layers)
    return fmt::format(
        "parallel.pp * parallel.pp_virtual <= model.layers fails: {} * {} > {} (each model chunk "
        "needs at least one layer)",
        l.pp, l.pp_virtual, m.layers);
  if (const std::string problem = l.pipeline(r).problem(); !problem.empty()) return problem;
  if (l.cp > 1 && m.seq_len % (2 * l.cp) != 0)
    return not_divisible("model.seq_len", m.seq_len, "(2 * cp)", 2 * l.cp) +
           " (each cp rank holds two of the 2 * cp chunks of a sequence)";
  if (l.ep > 1 && r.model.moe.experts == 0) return fmt::format("ep = {} needs an MoE model", l.ep);
  if (r.model.moe.experts > 0 && r.model.moe.experts % l.ep != 0)
    return not_divisible("moe.experts", r.model.moe.experts, "ep", l.ep);
  const int64_t per_pass = int64_t{l.micro_batch} * l.dp * l.ep;
  if (r.training.global_batch % per_pass != 0)
    return fmt::format("global_batch % (micro_batch * dp * ep) = {} % ({} * {} * {}) = {} != 0",
                       r.training.global_batch, l.micro_batch, l.dp, l.ep,
                       r.training.global_batch % per_pass);
  return {};
}

std::string schedule_problem(const recipe::Recipe& r, const Variant& l) {
  if (l.pp_schedule != PipeSchedule::zb_h1) return {};
  if (const std::string problem = l.pipeline(r).problem(); !problem.empty()) return problem;
  if (l.zero >= 2)
    return fmt::format(
        "parallel.pp_schedule zb-h1 needs parallel.zero <= 1 (got {}); use zero 0 or 1, or "
        "another pp_schedule",
        l.zero);
  if (l.recompute != trainctl::Recompute::none)
    return fmt::format(
        "parallel.pp_schedule zb-h1 needs parallel.recompute: none (got {}); drop the recompute, "
        "or use another pp_schedule",
        recipe::to_string(l.recompute));
  return {};
}

topology::ClusterSpec cpu_machine(int ranks_per_node, int nodes) {
  topology::ClusterSpec c;
  c.name = "this machine (CPU)";
  c.source = "detected";
  c.gpu.name = "CPU";
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const double memory = pages > 0 && page > 0 ? static_cast<double>(pages) * page / kGiB : 4.0;
  // Order of magnitude of an OpenBLAS core; only relative times matter on one machine.
  c.gpu.peak_tflops_fp32 = 0.1;
  c.gpu.peak_tflops_bf16 = c.gpu.peak_tflops_fp16 = 0.05;
  c.nodes = 1;
  c.gpus_per_node = 0;
  c.gpu.memory_gib = memory;
  if (ranks_per_node <= 1 && nodes <= 1) return c;
  // Several CPU ranks: each a device with its share of the host's memory, talking through Gloo
  // (TCP over loopback inside a node, the network between nodes). Assumed figures: a loopback
  // TCP stream of a few GB/s, 10 Gb Ethernet between nodes.
  c.name = nodes > 1 ? "CPU ranks (one per Slurm or launcher task)" : "this machine (CPU ranks)";
  c.cpu_ranks = true;
  c.nodes = std::max(nodes, 1);
  c.gpus_per_node = std::max(ranks_per_node, 1);
  c.gpu.memory_gib = memory / c.gpus_per_node;
  c.nvlink_domain = 1;
  c.intra_node_gbps = kCpuLoopbackGbps;
  c.inter_node_gbps = kCpuNetworkGbps;
  c.nvlink_latency_us = 20;
  c.inter_node_latency_us = 50;
  return c;
}

Plan make_plan(const recipe::Recipe& r, const topology::ClusterSpec& cluster,
               const SearchOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  Plan plan;
  plan.cluster = cluster;
  plan.world = std::max(1, cluster.world_size());
  if (cluster.nodes < 1 || cluster.gpus_per_node < 0)
    throw PlanError(fmt::format("cluster '{}': nodes = {} and gpus_per_node = {} describe no GPUs",
                                cluster.name, cluster.nodes, cluster.gpus_per_node));
  if (cluster.gpu.memory_gib <= 0)
    throw PlanError(fmt::format("cluster '{}': gpu memory_gib = {} must be positive", cluster.name,
                                cluster.gpu.memory_gib));
  if (r.model.fp8 != recipe::Fp8::none && cluster.gpu.peak_tflops_fp8 <= 0)
    throw PlanError(fmt::format(
        "cluster '{}': its GPU has no fp8 tensor cores (peak_tflops_fp8 = 0) but the recipe asks "
        "for precision.fp8: {}; use precision.fp8: none, or a cluster of Hopper GPUs",
        cluster.name, recipe::to_string(r.model.fp8)));
  const double capacity = cluster.gpu.memory_gib * kGiB;
  const int world = plan.world;
  const std::vector<int> ep_choices =
      r.model.moe.experts > 0 ? divisors(r.model.moe.experts) : std::vector<int>{1};

  // The pipeline schedules tried where pp > 1, 1F1B first (the others are pruned by its bubble).
  struct ScheduleChoice {
    PipeSchedule schedule;
    int chunks;
  };
  std::vector<ScheduleChoice> schedules;
  for (const int chunks : options.pp_virtual)
    schedules.push_back(
        {chunks > 1 ? PipeSchedule::interleaved : PipeSchedule::one_f_one_b, chunks});
  if (options.zb_h1) schedules.push_back({PipeSchedule::zb_h1, 1});
  std::stable_partition(schedules.begin(), schedules.end(), [](const ScheduleChoice& c) {
    return c.schedule == PipeSchedule::one_f_one_b;
  });

  int smallest_replicas = std::numeric_limits<int>::max();
  for (int tp : divisors(world)) {
    for (int pp : divisors(world / tp)) {
      for (int ep : ep_choices)
        for (const int cp : {1, 2, 4, 8, 16}) {
          if ((world / tp / pp) % ep != 0 || (world / tp / pp / ep) % cp != 0) continue;
          // Context parallel where it can pay: sequences that split into 2 * cp chunks of a
          // rank's at least kMinContextTokens tokens (--layout previews any cp).
          if (cp > 1 &&
              (r.model.seq_len % (2 * cp) != 0 || r.model.seq_len / cp < kMinContextTokens))
            continue;
          const int dp = world / tp / pp / ep / cp;
          Variant degrees{tp, pp, dp, ep, 1, 0, trainctl::Recompute::none};
          degrees.cp = cp;
          // Degree-level rules first (one rejection per tuple).
          const std::string degree_rule = check_divisibility(r, degrees);
          // Tuples the model divides into, whatever the batch: how few replicas the GPUs allow.
          if (degree_rule.empty() || degree_rule.starts_with("global_batch"))
            smallest_replicas = std::min(smallest_replicas, dp * ep);
          if (!degree_rule.empty()) {
            plan.rejected.push_back({degrees, "does not divide: " + degree_rule});
            continue;
          }
          const int per_replica = r.training.global_batch / (dp * ep);
          bool found = false;
          Candidate best;
          double closest = std::numeric_limits<double>::max();
          Variant closest_layout = degrees;
          int tried = 0;
          for (int mb : divisors(per_replica)) {
            if (mb > options.max_micro_batch) break;
            for (int zero : options.zero) {
              if (zero && dp * cp == 1) continue;  // ZeRO shards over dp x cp: nothing to shard
              for (trainctl::Recompute mode : options.recompute)
                for (const bool sp : options.sequence_parallel) {
                  // Sequence parallel splits the tokens over tp: only with tp > 1 and whole
                  // shares.
                  if (sp && (tp == 1 || r.model.seq_len % tp != 0)) continue;
                  // The bubble of the variant's 1F1B schedule, of its step (-1: not simulated),
                  // and whether 1F1B did not fit or could not beat the tuple's best: then
                  // neither can ZB-H1, whose memory is at least 1F1B's on every stage (more
                  // slots, each larger) and whose lower bound (the same stage times) is the same.
                  double one_f_one_b_bubble = -1;
                  bool one_f_one_b_lost = false;
                  for (const ScheduleChoice& choice : schedules) {
                    const int chunks = choice.chunks;
                    if (chunks > 1 &&
                        (pp == 1 || per_replica / mb % pp != 0 || pp * chunks > r.model.layers))
                      continue;
                    const bool zb = choice.schedule == PipeSchedule::zb_h1;
                    if (zb && (pp == 1 || zero >= 2 || mode != trainctl::Recompute::none))
                      continue;  // what the engine refuses (schedule_problem)
                    if (zb && one_f_one_b_lost) continue;
                    // Chunks shrink the bubble by at most (1 - 1 / chunks), ZB-H1 by at most
                    // kZbH1MaxBubbleCut; where 1F1B's was simulated and that is under
                    // kMinBubbleGain of its step, they cannot matter.
                    const double cut = zb ? kZbH1MaxBubbleCut : 1.0 - 1.0 / chunks;
                    if (choice.schedule != PipeSchedule::one_f_one_b && one_f_one_b_bubble >= 0 &&
                        one_f_one_b_bubble * cut < kMinBubbleGain)
                      continue;
                    Variant l{tp, pp, dp, ep, mb, zero, mode};
                    l.cp = cp;
                    l.sequence_parallel = sp;
                    l.pp_schedule = choice.schedule;
                    l.pp_virtual = chunks;
                    ++plan.variants_evaluated;
                    ++tried;
                    const MemoryEstimate mem = estimate_memory(r, cluster, l, options.memory);
                    if (mem.total() > capacity) {
                      one_f_one_b_lost |= choice.schedule == PipeSchedule::one_f_one_b;
                      if (mem.total() < closest) {
                        closest = mem.total();
                        closest_layout = l;
                      }
                      continue;
                    }
                    ++plan.variants_feasible;
                    TimeOptions time_options = options.time;
                    if (found) time_options.skip_above_s = best.time.step_s;  // cannot win
                    const TimeEstimate time = estimate_time(r, cluster, l, time_options);
                    if (choice.schedule == PipeSchedule::one_f_one_b) {
                      if (time.bound_only)
                        one_f_one_b_lost = true;
                      else
                        one_f_one_b_bubble = time.bubble_share();
                    }
                    if (time.bound_only) continue;
                    if (!found || time.step_s < best.time.step_s) {
                      best = Candidate{l, mem, time, capacity - mem.total()};
                      found = true;
                    }
                  }
                }
            }
          }
          if (found)
            plan.ranked.push_back(best);
          else if (tried == 0)
            plan.rejected.push_back(
                {degrees, fmt::format("no variant allowed: ZeRO needs dp > 1 (dp = {}) and the "
                                      "search options allow only zero > 0",
                                      dp)});
          else
            plan.rejected.push_back(
                {closest_layout,
                 fmt::format("does not fit: {:.1f} GiB > {:.1f} GiB (best variant: "
                             "{})",
                             closest / kGiB, cluster.gpu.memory_gib, closest_layout.describe())});
        }
    }
  }
  std::sort(plan.ranked.begin(), plan.ranked.end(), [](const Candidate& a, const Candidate& b) {
    return std::tie(a.time.step_s, a.layout.tp, a.layout.pp) <
           std::tie(b.time.step_s, b.layout.tp, b.layout.pp);
  });
  if (!plan.ranked.empty()) {
    // Within the model's error of the fastest: memory headroom first (a layout that is not tight
    // before one that is), then fewer GPUs per model replica, then the step.
    const double fastest = plan.ranked.front().time.step_s;
    const auto tie_end = std::partition_point(
        plan.ranked.begin(), plan.ranked.end(),
        [&](const Candidate& k) { return k.time.step_s <= fastest * (1 + kTieBand); });
    auto tight = [&](const Candidate& k) { return tight_memory(k.memory.total(), capacity); };
    std::stable_sort(plan.ranked.begin(), tie_end, [&](const Candidate& a, const Candidate& b) {
      if (tight(a) != tight(b)) return !tight(a);
      const int ga = a.layout.gpus_per_replica(), gb = b.layout.gpus_per_replica();
      if (ga != gb) return ga < gb;
      return a.time.step_s < b.time.step_s;
    });
    plan.tied = static_cast<int>(tie_end - plan.ranked.begin());
  }
  plan.search_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!plan.ranked.empty()) return plan;

  // Nothing runs: say the most useful reason.
  if (smallest_replicas > r.training.global_batch)
    throw PlanError(fmt::format(
        "more GPUs than the batch can feed: {} GPUs need at least {} data-parallel replicas even "
        "with the largest tp * pp * ep the model divides into, but training.global_batch = {}; "
        "raise training.global_batch or plan for fewer GPUs (--nodes/--gpus-per-node)",
        world, smallest_replicas, r.training.global_batch));
  const Rejection* closest = nullptr;
  for (const Rejection& rej : plan.rejected)
    if (rej.reason.starts_with("does not fit") && !closest) closest = &rej;
  std::string message = fmt::format("no layout of {} fits {} GPUs of {:.1f} GiB ({}):", r.name,
                                    world, cluster.gpu.memory_gib, cluster.name);
  size_t shown = 0;
  for (const Rejection& rej : plan.rejected) {
    if (shown++ == 8) {
      message += fmt::format("\n  ... and {} more", plan.rejected.size() - 8);
      break;
    }
    message += fmt::format("\n  tp={} pp={} dp={} ep={}: {}", rej.layout.tp, rej.layout.pp,
                           rej.layout.dp, rej.layout.ep, rej.reason);
  }
  message += closest ? "\nuse more GPUs (--nodes), GPUs with more memory, a smaller model, or "
                       "parallel.recompute: full"
                     : "\nchange the model's dimensions or training.global_batch so that a layout "
                       "divides them";
  throw PlanError(message);
}

Variant recipe_layout(const recipe::Recipe& r) {
  Variant v;
  static_cast<Layout&>(v) = r.parallel;
  v.micro_batch = r.training.micro_batch;
  v.pp_schedule = r.parallel.pp_schedule;
  v.pp_virtual = r.parallel.pp_virtual;
  return v;
}

Preview preview_layout(const recipe::Recipe& r, const Plan& plan, const Variant& layout,
                       std::string origin, const SearchOptions& options) {
  Preview p;
  p.layout = layout;
  p.origin = std::move(origin);
  const topology::ClusterSpec& cluster = plan.cluster;
  if (const std::vector<std::string> problems = layout.problems(); !problems.empty()) {
    p.problem = problems.front();
    return p;
  }
  if (const std::string why = schedule_problem(r, layout); !why.empty()) {
    p.problem = "not allowed: " + why;
    return p;
  }
  const std::string rule = check_divisibility(r, layout);
  if (!rule.empty()) {
    p.problem = "does not divide: " + rule;
    return p;
  }
  p.memory = estimate_memory(r, cluster, layout, options.memory);
  p.time = estimate_time(r, cluster, layout, options.time);
  p.estimated = true;
  const double capacity = cluster.gpu.memory_gib * kGiB;
  p.headroom_bytes = capacity - p.memory.total();
  if (layout.world_size() != plan.world)
    p.problem = fmt::format(
        "uses tp * {}pp * dp * ep = {} GPUs; the cluster has {} ({} node(s) x {}): plan for its "
        "world with --nodes/--gpus-per-node, or change the degrees",
        layout.cp > 1 ? "cp * " : "", layout.world_size(), plan.world, cluster.nodes,
        cluster.gpus_per_node);
  if (p.memory.total() > capacity)
    p.problem += fmt::format("{}does not fit: {:.1f} GiB > {:.1f} GiB per GPU",
                             p.problem.empty() ? "" : "; and it ", p.memory.total() / kGiB,
                             cluster.gpu.memory_gib);
  if (p.problem.empty()) {
    p.rank = 1;
    for (const Candidate& k : plan.ranked)
      p.rank += k.time.step_s < p.time.step_s ? 1 : 0;
  }
  if (p.problem.empty() && layout.pp > 1) {
    const StageBalance b = balance_stages(r, cluster, layout, options.time, options.memory);
    if (b.time.step_s < p.time.step_s * (1 - 1e-9)) {
      p.balanced_pp_layers = b.pp_layers;
      p.balanced_step_s = b.time.step_s;
    }
  }
  return p;
}

StageBalance balance_stages(const recipe::Recipe& recipe, const topology::ClusterSpec& cluster,
                            const Variant& layout, const TimeOptions& time_options,
                            const MemoryOptions& memory_options) {
  recipe::Recipe r = recipe;
  // The virtual stages: pp, or pp * chunks with the interleaved schedule (pp_layers' entries).
  const int pp = layout.pp * layout.pp_virtual;
  std::vector<int> split;
  for (int s = 0; s < pp; ++s)
    split.push_back(stage_layers(r, s, pp).count);
  r.parallel.pp_layers = split;
  const double capacity = cluster.gpu.memory_gib * kGiB;
  StageBalance best{split, estimate_time(r, cluster, layout, time_options),
                    estimate_memory(r, cluster, layout, memory_options)};
  // First improvement, one layer between neighbours at a time; each move shortens the step, so
  // it ends (at most layers^2 / 2 moves in theory; a few per stage in practice).
  for (bool moved = true; moved && pp > 1;) {
    moved = false;
    for (int s = 0; s + 1 < pp && !moved; ++s)
      for (const int direction : {+1, -1}) {  // +1: a layer from stage s to s + 1
        std::vector<int> candidate = best.pp_layers;
        const size_t from = static_cast<size_t>(direction > 0 ? s : s + 1);
        const size_t to = static_cast<size_t>(direction > 0 ? s + 1 : s);
        if (candidate[from] <= 1) continue;
        --candidate[from];
        ++candidate[to];
        r.parallel.pp_layers = candidate;
        const TimeEstimate t = estimate_time(r, cluster, layout, time_options);
        if (t.step_s >= best.time.step_s * (1 - 1e-9)) continue;
        const MemoryEstimate m = estimate_memory(r, cluster, layout, memory_options);
        if (m.total() > capacity) continue;  // faster, but no longer fits
        best = {candidate, t, m};
        moved = true;
        break;
      }
  }
  return best;
}

std::string explain_loss(const Candidate& best, const Candidate& other,
                         const topology::ClusterSpec& cluster) {
  const TimeEstimate &a = best.time, &b = other.time;
  const double slower = (b.step_s / a.step_s - 1.0) * 100.0;
  struct Cause {
    double delta;
    std::string text;
  };
  const Variant &x = best.layout, &y = other.layout;
  const int gpn = std::max(1, cluster.gpus_per_node), domain = std::max(1, cluster.nvlink_domain);
  std::string tp_where = y.tp > gpn ? fmt::format("tp={} crosses nodes", y.tp)
                         : y.tp > domain && cluster.cpu_ranks
                             ? fmt::format("tp={} talks between processes (Gloo)", y.tp)
                         : y.tp > domain ? fmt::format("tp={} leaves the NVLink domain", y.tp)
                         : y.tp > x.tp   ? fmt::format("tp={} vs {}", y.tp, x.tp)
                                         : fmt::format("tp={}", y.tp);
  std::vector<Cause> causes{
      {b.tp_comm_s - a.tp_comm_s,
       fmt::format("{} (tp comm {} vs {})", tp_where, seconds(b.tp_comm_s), seconds(a.tp_comm_s))},
      {b.bubble_s - a.bubble_s,
       fmt::format("pipeline bubble {:.0f}% vs {:.0f}% (pp={}, {} micro-batches)",
                   100 * b.bubble_share(), 100 * a.bubble_share(), y.pp, b.micro_batches)},
      {b.dp_exposed_s - a.dp_exposed_s,
       fmt::format("exposed gradient sync {} vs {} (dp={}{})", seconds(b.dp_exposed_s),
                   seconds(a.dp_exposed_s), y.dp,
                   y.zero ? fmt::format(", ZeRO-{}", y.zero) : std::string())},
      {b.compute_s - a.compute_s,
       fmt::format("compute {} vs {}{}", seconds(b.compute_s), seconds(a.compute_s),
                   y.recompute == trainctl::Recompute::full && x.recompute != y.recompute
                       ? " (full recompute reruns the forward)"
                       : "")},
      {b.pp_p2p_s - a.pp_p2p_s,
       fmt::format("pipeline sends {} vs {}", seconds(b.pp_p2p_s), seconds(a.pp_p2p_s))},
      {b.ep_comm_s - a.ep_comm_s, fmt::format("expert all-to-all {} vs {} (ep={})",
                                              seconds(b.ep_comm_s), seconds(a.ep_comm_s), y.ep)},
  };
  std::sort(causes.begin(), causes.end(),
            [](const Cause& p, const Cause& q) { return p.delta > q.delta; });
  std::string text = fmt::format("+{:.0f}% step time: {}", slower, causes[0].text);
  if (causes[1].delta > 0.25 * causes[0].delta && causes[1].delta > 0)
    text += "; " + causes[1].text;
  return text;
}

}  // namespace trainctl::planner
