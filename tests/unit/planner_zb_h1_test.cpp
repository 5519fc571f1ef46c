// The planner's model of the ZB-H1 schedule (parallel.pp_schedule: zb-h1): its memory (every
// stage holds min(pp, M) slots, each with 1F1B's kept activations plus what the weight-gradient
// pass W needs), its time (the backward split into B and W, the W passes filling the bubble),
// what the engine refuses (named, never proposed), and the search and preview that offer it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "planner/planner.hpp"
#include "planner/shape.hpp"
#include "planner_fixtures.hpp"

namespace {

using namespace trainctl;
using planner_fixtures::h100;
using planner_fixtures::llama_7b;

// A small model of 4 layers (MoE: layers 1 and 3, top 2 of `experts`), as the memory tests use.
recipe::Recipe small(recipe::Arch arch, int experts, tensor::DType storage) {
  recipe::Recipe r = recipe::default_recipe(arch);
  r.name = "small";
  r.model.layers = 4;
  r.model.hidden = 64;
  r.model.heads = 4;
  r.model.kv_heads = arch == recipe::Arch::llama ? 2 : 4;
  r.model.ffn_hidden = 160;
  r.model.vocab = 320;
  r.model.seq_len = 48;
  r.model.moe.experts = experts;
  r.model.moe.top_k = 2;
  r.model.moe.every = 2;
  r.model.storage = storage;
  r.training.micro_batch = 2;
  r.training.global_batch = 8;
  return r;
}

double round64(double bytes) {
  return std::ceil(bytes / 64.0) * 64.0;
}

// W's stash of one slot on a stage of `layers` (the engine's, tensor by tensor): per layer the
// proj output gradient; a dense MLP's fc2 output gradient; an MoE layer's experts' fc2 output
// gradients (capacity rows each). The output gradients of qkv, fc1, the router and the experts'
// fc1 take the places of dead activations of their shape; with sequence parallelism W gathers
// its inputs again: nothing more is kept.
double stash_by_hand(const recipe::Recipe& r, const std::vector<int>& layers, int micro_batch) {
  const recipe::ModelConfig& m = r.model;
  const double S = m.storage == tensor::DType::f32 ? 4 : 2;
  const double N = micro_batch * m.seq_len, C = m.hidden;
  const double E = m.moe.experts;
  const double cap = m.moe.capacity_factor > 0
                         ? std::max(1.0, std::ceil(m.moe.capacity_factor * N * m.moe.top_k / E))
                         : N;
  auto tensor = [&](double rows, double columns) { return round64(rows * columns * S); };
  double bytes = 0;
  for (const int i : layers) {
    bytes += tensor(N, C);
    if (m.moe.experts > 0 && (i + 1) % m.moe.every == 0)
      bytes += tensor(E * cap, C);
    else
      bytes += tensor(N, C);
  }
  return bytes;
}

planner::Variant zb(planner::Variant v) {
  v.pp_schedule = PipeSchedule::zb_h1;
  return v;
}

}  // namespace

TEST_CASE("ZB-H1 memory: every stage holds min(pp, M) slots of 1F1B's activations plus W's stash") {
  const topology::ClusterSpec machine = planner::cpu_machine();
  struct Case {
    recipe::Arch arch;
    int experts;
    tensor::DType storage;
    int tp;
    bool sp;
  };
  for (const Case& k : {Case{recipe::Arch::gpt, 0, tensor::DType::f32, 1, false},
                        Case{recipe::Arch::llama, 0, tensor::DType::bf16, 2, true},
                        Case{recipe::Arch::gpt, 4, tensor::DType::f32, 1, false},
                        Case{recipe::Arch::llama, 4, tensor::DType::bf16, 2, true}}) {
    const recipe::Recipe r = small(k.arch, k.experts, k.storage);
    for (const int global_batch : {8, 2}) {  // 4 micro-batches, then 1: fewer than the stages
      recipe::Recipe rr = r;
      rr.training.global_batch = global_batch;
      planner::Variant one{k.tp, 2, 1, 1, 2, 0, Recompute::none};
      one.sequence_parallel = k.sp;
      const int M = global_batch / 2;
      for (int stage = 0; stage < 2; ++stage) {
        INFO("experts " << k.experts << " tp " << k.tp << " sp " << k.sp << " M " << M << " stage "
                        << stage);
        const Coordinates at{0, 0, 0, 0, stage};
        const planner::MemoryEstimate base = planner::estimate_rank_memory(rr, machine, one, at);
        const planner::MemoryEstimate split =
            planner::estimate_rank_memory(rr, machine, zb(one), at);
        CHECK(split.in_flight == std::min(2, M));
        CHECK(base.in_flight == std::min(2 - stage, M));
        const double slot = base.activations_kept / base.in_flight;
        const double stash = stash_by_hand(rr, {2 * stage, 2 * stage + 1}, 2);
        CHECK(split.activations_kept == (slot + stash) * split.in_flight);
        // The shared region and the scratch are the same; nothing else changes.
        CHECK(split.activations - split.activations_kept ==
              base.activations - base.activations_kept);
        CHECK(split.params == base.params);
        CHECK(split.grads == base.grads);
        CHECK(split.optimizer == base.optimizer);
        CHECK(split.comm_buffers == base.comm_buffers);
      }
    }
  }
}

// The memory model takes the slots' closed forms (schedule_slots) so that the search need not
// build every variant's lists: they must be what plan_slots counts on the engine's lists.
TEST_CASE("ZB-H1's slots: min(pp, M) on every stage, as plan_slots counts them on its lists") {
  for (int P = 2; P <= 8; ++P)
    for (int M = 1; M <= 2 * P + 1; ++M)
      for (const PipeSchedule schedule : {PipeSchedule::one_f_one_b, PipeSchedule::zb_h1}) {
        const PipelineShape shape{P, M, schedule, 1};
        const std::vector<std::vector<PipeAction>> lists = pipeline_lists(shape);
        for (int s = 0; s < P; ++s) {
          INFO(schedule_name(schedule) << " P " << P << " M " << M << " stage " << s);
          CHECK(planner::schedule_slots(shape, s) ==
                plan_slots(lists[static_cast<size_t>(s)]).slots);
          CHECK(planner::schedule_slots(shape, s) ==
                planner::schedule_of(shape).slots[static_cast<size_t>(s)]);
        }
      }
}

// pp4 over 8 micro-batches: on the clock with F = B = W the bubble is (P - 1) / (3M + P - 1), a
// third of 1F1B's (P - 1) / (M + P - 1); the planner's own stage times (W the blocks' weight
// GEMMs) give ZB-H1 a smaller bubble and a shorter step than 1F1B, the same compute, and the same
// 1F1B step as before the split (B + W is the whole backward).
TEST_CASE("ZB-H1's predicted bubble is below 1F1B's for the same layout") {
  const std::vector<StageTimes> equal(4, StageTimes{1.0, 1.0, 1.0});
  const Timeline clock = simulate(pipeline_lists({4, 8, PipeSchedule::zb_h1, 1}), equal, 0, true);
  CHECK(clock.bubble_share() == Approx(3.0 / (3 * 8 + 3)));
  const Timeline one_f_one_b = simulate(pipeline_lists({4, 8}), equal, 0);
  CHECK(one_f_one_b.bubble_share() == Approx(3.0 / (8 + 3)));

  recipe::Recipe r = llama_7b();
  r.training.global_batch = 64;  // dp 8, mb 1: 8 micro-batches
  const topology::ClusterSpec cluster = h100(4);
  const planner::Variant v{1, 4, 8, 1, 1, 1, Recompute::none};
  const planner::TimeEstimate base = planner::estimate_time(r, cluster, v);
  const planner::TimeEstimate split = planner::estimate_time(r, cluster, zb(v));
  REQUIRE(split.micro_batches == 8);
  CHECK(split.pipeline.schedule == PipeSchedule::zb_h1);
  REQUIRE(split.stage_times.size() == 4);
  for (size_t s = 0; s < 4; ++s) {
    const StageTimes &a = base.stage_times[s], &b = split.stage_times[s];
    INFO("stage " << s);
    CHECK(b.weight > 0);
    CHECK(b.weight <= b.forward);  // the forward's GEMMs again, without attention's T^2 part
    CHECK(b.weight < b.backward);
    CHECK(a.forward == b.forward);
    CHECK(a.backward + a.weight == Approx(b.backward + b.weight).epsilon(1e-12));
  }
  CHECK(split.compute_s == base.compute_s);
  CHECK(split.bubble_s < 0.6 * base.bubble_s);
  CHECK(split.step_s < base.step_s);
  const Timeline drawn = planner::planned_timeline(split);
  CHECK(drawn.schedule == "zb-h1");
  CHECK(split.step_s == Approx(drawn.makespan + split.dp_exposed_s));
  for (const std::vector<TimedAction>& stage : drawn.stages)
    CHECK(std::count_if(stage.begin(), stage.end(), [](const TimedAction& a) {
            return a.action.op == PipeOp::weight_grad;
          }) == 8);
  // 1F1B's figures on the split times are its figures on the whole backward: the sum is what a
  // non-split list charges (stage 0's backward of micro-batch 0 takes B + W).
  const Timeline whole = planner::planned_timeline(base);
  CHECK(whole.makespan == Approx(base.step_s - base.dp_exposed_s));
  for (const TimedAction& a : whole.stages[0])
    if (a.action.op == PipeOp::backward)
      CHECK(a.end - a.start ==
            Approx(base.stage_times[0].backward + base.stage_times[0].weight).epsilon(1e-12));
}

TEST_CASE("ZB-H1 with ZeRO-2, recompute or one stage is refused with the rule, never proposed") {
  const recipe::Recipe r = llama_7b();
  const topology::ClusterSpec cluster = h100(4);
  planner::Plan plan = planner::make_plan(r, cluster);
  const planner::Variant runs = zb(planner::Variant{1, 4, 8, 1, 1, 1, Recompute::none});
  CHECK(planner::schedule_problem(r, runs).empty());
  struct Refused {
    planner::Variant layout;
    const char* rule;
  };
  for (const Refused& k : {
           Refused{zb({1, 4, 8, 1, 1, 2, Recompute::none}), "needs parallel.zero <= 1 (got 2)"},
           Refused{zb({1, 4, 8, 1, 1, 3, Recompute::none}), "needs parallel.zero <= 1 (got 3)"},
           Refused{zb({1, 4, 8, 1, 1, 1, Recompute::selective}),
                   "needs parallel.recompute: none (got selective)"},
           Refused{zb({1, 4, 8, 1, 1, 1, Recompute::full}),
                   "needs parallel.recompute: none (got full)"},
           Refused{zb({8, 1, 4, 1, 1, 1, Recompute::none}), "needs parallel.pp >= 2 (got 1)"},
       }) {
    INFO(k.layout.describe());
    CHECK_THAT(planner::schedule_problem(r, k.layout),
               Catch::StartsWith("parallel.pp_schedule zb-h1") && Catch::Contains(k.rule));
    plan.preview = planner::preview_layout(r, plan, k.layout, "test");
    CHECK(plan.preview->problem == "not allowed: " + planner::schedule_problem(r, k.layout));
    CHECK(plan.preview->rank == 0);
    CHECK_THAT(planner::format_preview(plan), Catch::Contains(k.rule));
    const nlohmann::json doc = nlohmann::json::parse(planner::plan_json(plan, r, 3));
    CHECK(doc["preview"]["runs"] == false);
    CHECK_THAT(doc["preview"]["problem"].get<std::string>(), Catch::Contains(k.rule));
    CHECK(doc["preview"]["layout"]["pp_schedule"] == "zb-h1");
  }
  plan.preview = planner::preview_layout(r, plan, runs, "test");
  CHECK(plan.preview->problem.empty());
  CHECK(plan.preview->rank > 0);
  CHECK_THAT(planner::format_preview(plan), Catch::Contains("schedule=zb-h1"));
  // The search's ZB-H1 layouts are only ever ones the engine runs.
  for (const planner::Candidate& k : plan.ranked)
    if (k.layout.pp_schedule == PipeSchedule::zb_h1) {
      INFO(k.layout.describe());
      CHECK(planner::schedule_problem(r, k.layout).empty());
    }
}

// Llama 7B on 4 nodes with 8 micro-batches per replica: the pipelined layouts' bubble is large,
// the search tries ZB-H1 beside 1F1B and keeps it where the time model finds it faster; the
// table shows `zb`, the JSON pp_schedule "zb-h1". Without it (SearchOptions::zb_h1 false) no
// ZB-H1 layout appears.
TEST_CASE("the search tries ZB-H1 where pp > 1 and shows it as zb") {
  recipe::Recipe r = llama_7b();
  r.training.global_batch = 64;
  const topology::ClusterSpec cluster = h100(4);
  const planner::Plan plan = planner::make_plan(r, cluster);
  const auto is_zb = [](const planner::Candidate& k) {
    return k.layout.pp_schedule == PipeSchedule::zb_h1;
  };
  const auto zb_row = std::find_if(plan.ranked.begin(), plan.ranked.end(), is_zb);
  REQUIRE(zb_row != plan.ranked.end());
  CHECK(zb_row->layout.pp > 1);
  CHECK(zb_row->layout.pp_virtual == 1);
  const int top = static_cast<int>(zb_row - plan.ranked.begin()) + 1;
  CHECK_THAT(planner::format_plan(plan, r, top), Catch::Contains(" zb "));
  const nlohmann::json doc = nlohmann::json::parse(planner::plan_json(plan, r, top));
  CHECK(doc["ranked"][static_cast<size_t>(top - 1)]["layout"]["pp_schedule"] == "zb-h1");
  // The same degrees under 1F1B are slower (that is why ZB-H1 was kept).
  planner::Variant plain = zb_row->layout;
  plain.pp_schedule = PipeSchedule::one_f_one_b;
  CHECK(planner::estimate_time(r, cluster, plain).step_s > zb_row->time.step_s);

  planner::SearchOptions without;
  without.zb_h1 = false;
  const planner::Plan old = planner::make_plan(r, cluster, without);
  CHECK(std::none_of(old.ranked.begin(), old.ranked.end(), is_zb));
  CHECK(plan.variants_evaluated > old.variants_evaluated);
}

// The recipe's own parallel.pp_schedule: zb-h1 is what the preview scores (recipe_layout).
TEST_CASE("the recipe's zb-h1 schedule is previewed as such") {
  recipe::Recipe r = llama_7b();
  r.training.global_batch = 64;
  r.parallel.tp = 1;
  r.parallel.pp = 4;
  r.parallel.dp = 8;
  r.parallel.zero = 1;
  r.parallel.pp_schedule = PipeSchedule::zb_h1;
  const planner::Variant v = planner::recipe_layout(r);
  CHECK(v.pp_schedule == PipeSchedule::zb_h1);
  CHECK(v.pp_virtual == 1);
  planner::Plan plan = planner::make_plan(r, h100(4));
  plan.preview = planner::preview_layout(r, plan, v, "the recipe's layout");
  CHECK(plan.preview->problem.empty());
  CHECK(plan.preview->time.pipeline.schedule == PipeSchedule::zb_h1);
  CHECK(plan.preview->memory.in_flight == 4);
}
