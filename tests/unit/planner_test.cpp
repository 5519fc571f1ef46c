// The layout search and its output: validity rules, rejections with reasons, rank order, the rank
// grid, explanations, the JSON document, the impossible requests, and the 16,384-GPU time limit.
#include <catch2/catch.hpp>

#include <fmt/core.h>
#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "planner/planner.hpp"
#include "planner/shape.hpp"
#include "planner_fixtures.hpp"

namespace {

using namespace trainctl;
using planner_fixtures::h100;
using planner_fixtures::llama_7b;

}  // namespace

TEST_CASE("check_divisibility names the broken rule as a formula") {
  const recipe::Recipe r = llama_7b();
  CHECK(planner::check_divisibility(r, {1, 1, 1, 1, 1, 0}).empty());
  CHECK(planner::check_divisibility(r, {3, 1, 1, 1, 1, 0}) == "model.heads % tp = 32 % 3 = 2 != 0");
  // Stages need not be equal, as in the engine (and validate): 32 layers on 3 stages are
  // 11 + 11 + 10; only a stage without a layer is refused.
  CHECK(planner::check_divisibility(r, {1, 3, 1, 1, 1, 0}).empty());
  CHECK(planner::check_divisibility(r, {1, 64, 1, 1, 1, 0}) ==
        "parallel.pp <= model.layers fails: 64 > 32 (each pipeline stage needs at least one "
        "layer)");
  CHECK(planner::check_divisibility(r, {1, 1, 3, 1, 1, 0}) ==
        "global_batch % (micro_batch * dp * ep) = 512 % (1 * 3 * 1) = 2 != 0");
  CHECK(planner::check_divisibility(r, {1, 1, 1, 2, 1, 0}) == "ep = 2 needs an MoE model");
}

TEST_CASE("rank coordinates: tp fastest, then ep, dp, pp") {
  const planner::Variant l{2, 3, 4, 2, 1, 0};
  const Coordinates c = coordinates_of(l, 1 + 2 * 1 + 4 * 3 + 16 * 2);
  CHECK(c.tp == 1);
  CHECK(c.ep == 1);
  CHECK(c.dp == 3);
  CHECK(c.pp == 2);
}

TEST_CASE("plan for llama 7B on 4 DGX H100 nodes") {
  recipe::Recipe r = llama_7b();
  r.model.kv_heads = 8;  // grouped-query attention: tp = 16, 32 do not divide the kv heads
  const planner::Plan plan = planner::make_plan(r, h100(4));
  REQUIRE(!plan.ranked.empty());
  CHECK(plan.world == 32);
  // Sorted by step time, every ranked layout fits and uses all 32 GPUs.
  for (size_t i = 0; i < plan.ranked.size(); ++i) {
    const planner::Candidate& k = plan.ranked[i];
    CHECK(k.layout.world_size() == 32);
    CHECK(k.headroom_bytes >= 0);
    CHECK(planner::check_divisibility(r, k.layout).empty());
    if (i > 0) CHECK(k.time.step_s >= plan.ranked[i - 1].time.step_s);
  }
  const planner::Candidate& best = plan.ranked.front();
  CHECK(best.layout.tp <= 8);
  // tp = 16 does not divide the 8 kv heads: rejected with the formula.
  bool saw_divide = false;
  for (const planner::Rejection& rej : plan.rejected)
    saw_divide |= rej.reason == "does not divide: model.kv_heads % tp = 8 % 16 = 8 != 0";
  CHECK(saw_divide);
  // With all 32 heads shardable, tp = 16 crosses nodes and the explanation says so.
  r.model.kv_heads = 32;
  const planner::Plan wide = planner::make_plan(r, h100(4));
  bool saw_cross = false;
  for (const planner::Candidate& k : wide.ranked)
    if (k.layout.tp == 16) {
      saw_cross = true;
      CHECK_THAT(planner::explain_loss(wide.ranked.front(), k, wide.cluster),
                 Catch::Contains("tp=16 crosses nodes"));
    }
  CHECK(saw_cross);
  // The text output holds the table, the grid and the runner-ups.
  const std::string text = planner::format_plan(plan, r, 5);
  CHECK_THAT(text, Catch::Contains("tokens/s/GPU"));
  CHECK_THAT(text, Catch::Contains("node     0:"));
  CHECK_THAT(text, Catch::Contains("why the runner-ups lost"));
  CHECK_THAT(text, Catch::Contains("step time"));
}

TEST_CASE("a model too big for the cluster is rejected with how much it misses by") {
  recipe::Recipe r = llama_7b();
  r.model.layers = 320;  // ~65B parameters on 8 GPUs of 80 GiB: 18 bytes/param does not fit
  try {
    planner::make_plan(r, h100(1));
    FAIL("expected PlanError");
  } catch (const planner::PlanError& e) {
    CHECK_THAT(e.what(), Catch::Contains("does not fit:"));
    CHECK_THAT(e.what(), Catch::Contains("GiB > 80.0 GiB"));
    CHECK_THAT(e.what(), Catch::Contains("use more GPUs"));
  }
}

TEST_CASE("more GPUs than the batch can feed is an error that says so") {
  recipe::Recipe r = llama_7b();
  r.training.global_batch = 2;
  try {
    planner::make_plan(r, h100(512));  // 4096 GPUs; tp*pp at most 8*32 = 256 -> dp >= 16 > 2
    FAIL("expected PlanError");
  } catch (const planner::PlanError& e) {
    CHECK_THAT(e.what(), Catch::Contains("more GPUs than the batch can feed"));
    CHECK_THAT(e.what(), Catch::Contains("training.global_batch = 2"));
  }
}

TEST_CASE("recompute is chosen only when memory needs it") {
  recipe::Recipe r = llama_7b();
  r.model.layers = 4;  // small: everything fits without recompute, which is fastest
  const planner::Plan plan = planner::make_plan(r, h100(1));
  CHECK(plan.ranked.front().layout.recompute == trainctl::Recompute::none);
  // Full recompute costs a forward: its compute time is 4/3 of the plain one.
  planner::Variant l = plan.ranked.front().layout;
  const double plain = planner::estimate_time(r, plan.cluster, l).compute_s;
  l.recompute = trainctl::Recompute::full;
  const double full = planner::estimate_time(r, plan.cluster, l).compute_s;
  CHECK(full > plain * 1.25);
}

TEST_CASE("MoE: expert parallelism divides the experts and is searched") {
  recipe::Recipe r = llama_7b();
  r.model.layers = 8;
  r.model.moe.experts = 8;
  r.model.moe.top_k = 2;
  r.model.moe.every = 1;
  const planner::Plan plan = planner::make_plan(r, h100(2));
  bool saw_ep = false;
  for (const planner::Candidate& k : plan.ranked) {
    CHECK(8 % k.layout.ep == 0);
    saw_ep |= k.layout.ep > 1;
  }
  CHECK(saw_ep);
  const planner::MemoryEstimate one =
      planner::estimate_memory(r, plan.cluster, {1, 1, 16, 1, 1, 0});
  const planner::MemoryEstimate eight =
      planner::estimate_memory(r, plan.cluster, {1, 1, 2, 8, 1, 0});
  CHECK(eight.params < one.params / 3);  // the experts dominate and are split 8 ways
}

TEST_CASE("ZeRO-1, 2 and 3 are searched where dp > 1, with expert parallelism too") {
  recipe::Recipe r = llama_7b();
  r.model.layers = 8;
  r.model.moe.experts = 8;
  r.model.moe.top_k = 2;
  r.model.moe.every = 1;
  planner::SearchOptions only_zero;
  only_zero.zero = {1, 2, 3};
  const planner::Plan plan = planner::make_plan(r, h100(1), only_zero);  // 8 GPUs
  bool with_ep = false;
  for (const planner::Candidate& k : plan.ranked) {
    CHECK(k.layout.zero >= 1);
    CHECK(k.layout.dp > 1);
    with_ep = with_ep || k.layout.ep > 1;
  }
  CHECK(with_ep);
  only_zero.zero = {3};
  const planner::Plan three = planner::make_plan(r, h100(1), only_zero);
  REQUIRE_FALSE(three.ranked.empty());
  for (const planner::Candidate& k : three.ranked)
    CHECK(k.layout.zero == 3);
  bool saw_reason = false;
  for (const planner::Rejection& rej : plan.rejected)
    if (rej.layout.dp == 1) {
      CHECK_THAT(rej.reason, Catch::Contains("ZeRO needs dp > 1"));
      saw_reason = true;
    }
  CHECK(saw_reason);
}

TEST_CASE("JSON document: stable keys, same content as the table") {
  const recipe::Recipe r = llama_7b();
  const planner::Plan plan = planner::make_plan(r, h100(2));
  const nlohmann::json doc = nlohmann::json::parse(planner::plan_json(plan, r, 3));
  CHECK(doc["schema"] == "trainctl.plan/1");
  CHECK(doc["world"] == 16);
  REQUIRE(doc["ranked"].size() == 3);
  const nlohmann::json& first = doc["ranked"][0];
  CHECK(first["layout"]["tp"] == plan.ranked[0].layout.tp);
  CHECK(first["time_seconds"]["step"].get<double>() == Approx(plan.ranked[0].time.step_s));
  CHECK(first["memory_bytes"]["total"].get<double>() == Approx(plan.ranked[0].memory.total()));
  CHECK(doc["ranked"][1].contains("why_slower"));
  CHECK(doc["placement"]["ranks"].size() == 16);
  CHECK(doc["placement"]["columns"][0] == "node");
  CHECK(doc["rejected"].is_array());
}

TEST_CASE("16,384 GPUs are planned in under 2 s") {
  recipe::Recipe r = llama_7b();
  r.model.layers = 128;
  r.model.hidden = 16384;
  r.model.heads = 128;
  r.model.kv_heads = 8;
  r.model.ffn_hidden = 53248;
  r.model.vocab = 128000;
  r.training.global_batch = 16384;
  const auto start = std::chrono::steady_clock::now();
  const planner::Plan plan = planner::make_plan(r, h100(2048));
  const std::string text = planner::format_plan(plan, r, 5);
  const std::string json = planner::plan_json(plan, r, 5);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  WARN("16,384 GPUs: " << plan.variants_evaluated << " variants in " << seconds << " s");
  CHECK(plan.world == 16384);
  CHECK(!plan.ranked.empty());
  CHECK(seconds < 2.0);
}

TEST_CASE("a CPU machine plans a world of 1") {
  recipe::Recipe r = recipe::default_recipe(recipe::Arch::gpt);
  const planner::Plan plan = planner::make_plan(r, planner::cpu_machine());
  CHECK(plan.world == 1);
  REQUIRE(plan.ranked.size() == 1);
  const planner::Variant& l = plan.ranked.front().layout;
  CHECK(l.tp == 1);
  CHECK(l.pp == 1);
  CHECK(l.dp == 1);
  CHECK(l.ep == 1);
  CHECK(l.zero == 0);
  CHECK(r.training.global_batch % l.micro_batch == 0);
}

TEST_CASE(
    "fp8: the linear layers run at the fp8 peak, tp pays its amax reduces, a GPU without "
    "fp8 says so") {
  recipe::Recipe r = llama_7b();
  topology::ClusterSpec c = h100(1);
  c.gpu.peak_tflops_fp8 = 1979;
  const planner::Variant l{1, 1, 8, 1, 1, 1, trainctl::Recompute::none};
  const planner::TimeEstimate bf16 = planner::estimate_time(r, c, l);
  r.model.fp8 = recipe::Fp8::hybrid;
  const planner::TimeEstimate fp8 = planner::estimate_time(r, c, l);
  // Linear layers are most of a 7B model's FLOPs: the fp8 peak for them, attention's T^2 part and
  // the head at the bf16 peak, so the compute time falls by less than half.
  const planner::ModelShape s = planner::shape_of(r);
  const double linear = s.layers * (s.attention_linear_flops + s.dense_mlp_flops);
  const double all = s.layers * (s.attention_flops + s.dense_mlp_flops) + s.head_flops;
  const double speedup = c.gpu.peak_tflops_fp8 / c.gpu.peak_tflops_bf16;  // 2.0
  const double expected = (all - linear + linear / speedup) / all;        // 3 passes of each
  CHECK(fp8.compute_s / bf16.compute_s == Approx(expected).epsilon(1e-9));
  CHECK(expected < 0.6);
  CHECK(fp8.model_flops == bf16.model_flops);

  // Under tp 2 every sharded Linear (4 per dense layer) all-reduces 12 bytes of amaxes in forward
  // and in backward: 8 latency-bound all-reduces per layer and micro-batch on top of bf16's.
  const planner::Variant tp2{2, 1, 4, 1, 1, 1, trainctl::Recompute::none};
  const planner::TimeEstimate fp8_tp2 = planner::estimate_time(r, c, tp2);
  r.model.fp8 = recipe::Fp8::none;
  const planner::TimeEstimate bf16_tp2 = planner::estimate_time(r, c, tp2);
  r.model.fp8 = recipe::Fp8::hybrid;
  const double all_reduce_s = 2.0 * c.nvlink_latency_us * 1e-6;  // ring of 2: 2 steps
  CHECK((fp8_tp2.tp_comm_s - bf16_tp2.tp_comm_s) ==
        Approx(fp8_tp2.micro_batches * 8.0 * r.model.layers * all_reduce_s).epsilon(1e-4));

  const planner::Plan plan = planner::make_plan(r, c);
  REQUIRE_FALSE(plan.ranked.empty());
  for (const planner::Rejection& rejection : plan.rejected)
    CHECK_THAT(rejection.reason, !Catch::Contains("fp8"));
  CHECK(std::any_of(plan.ranked.begin(), plan.ranked.end(),
                    [](const planner::Candidate& candidate) { return candidate.layout.tp > 1; }));

  c.gpu.peak_tflops_fp8 = 0;  // an A100
  CHECK_THROWS_WITH(planner::make_plan(r, c), Catch::Contains("has no fp8 tensor cores"));
}

TEST_CASE("gradient reduction hides behind backward only when the engine overlaps it") {
  recipe::Recipe r = llama_7b();
  const topology::ClusterSpec c = h100(4);
  const planner::Variant plain{1, 1, 32, 1, 1, 0, trainctl::Recompute::none};
  const planner::TimeEstimate on = planner::estimate_time(r, c, plain);
  REQUIRE(on.dp_comm_s > 0);
  CHECK(on.dp_exposed_s < on.dp_comm_s);
  r.parallel.overlap_grad_sync = false;
  CHECK(planner::estimate_time(r, c, plain).dp_exposed_s == on.dp_comm_s);
  // ZeRO-1: the reduce-scatter (f32 gradients) overlaps backward like the all-reduce, and the
  // all-gather of the updated bf16 parameters (a third of the traffic) the next forward.
  const planner::Variant zero{1, 1, 32, 1, 1, 1, trainctl::Recompute::none};
  const planner::TimeEstimate z_plain = planner::estimate_time(r, c, zero);
  CHECK(z_plain.dp_exposed_s == z_plain.dp_comm_s);
  r.parallel.overlap_grad_sync = true;
  const planner::TimeEstimate z = planner::estimate_time(r, c, zero);
  REQUIRE(z.dp_comm_s == z_plain.dp_comm_s);
  CHECK(z.dp_exposed_s < z.dp_comm_s);
  // What hides is at most one backward and one forward of the first micro-batch: compute_s holds
  // all micro-batches' three passes.
  CHECK(z.dp_comm_s - z.dp_exposed_s <= z.compute_s / z.micro_batches + 1e-12);
}

TEST_CASE(
    "ZeRO-3 adds a gather per block before its forward and backward, hidden when prefetched") {
  recipe::Recipe r = llama_7b();
  const topology::ClusterSpec c = h100(4);
  const planner::Variant two{1, 1, 32, 1, 1, 2, trainctl::Recompute::none};
  const planner::Variant three{1, 1, 32, 1, 1, 3, trainctl::Recompute::none};
  const planner::TimeEstimate z2 = planner::estimate_time(r, c, two);
  const planner::TimeEstimate z3 = planner::estimate_time(r, c, three);
  // The same reduce-scatters; instead of one gather of all parameters after the step, about
  // 2m(B - 2) + 2 gathers of a block (m micro-batches, B = 32 blocks) and one of the embedding
  // and head: more traffic as soon as m > 1.
  REQUIRE(z3.micro_batches > 1);
  CHECK(z3.dp_comm_s > z2.dp_comm_s);
  CHECK(z3.compute_s == z2.compute_s);
  // Prefetched, each gather hides behind the block before it, as far as that block's compute
  // lasts: less is exposed than without overlap, where everything is.
  CHECK(z3.dp_exposed_s < z3.dp_comm_s);
  r.parallel.overlap_grad_sync = false;
  const planner::TimeEstimate blocking = planner::estimate_time(r, c, three);
  CHECK(blocking.dp_comm_s == z3.dp_comm_s);
  CHECK(blocking.dp_exposed_s == blocking.dp_comm_s);
  // ZeRO-3's memory: the parameters are the rank's part, the embedding and head, two blocks.
  const planner::MemoryEstimate m2 = planner::estimate_memory(r, c, two);
  const planner::MemoryEstimate m3 = planner::estimate_memory(r, c, three);
  CHECK(m3.params < m2.params / 5);
  CHECK(m3.grads == Approx(m2.grads).epsilon(1e-3));
}

// The step is the engine's 1F1B action lists run on the planner's stage times: the last stage
// (with the 32K-token head) is the slowest, and it sets the steady state, but the fill and drain
// cost the other stages' own times, so the step lies between m and (m + pp - 1) slowest-stage
// times, strictly below the latter.
TEST_CASE("the planner's step is its pipeline timeline's") {
  const recipe::Recipe r = llama_7b();
  const planner::Variant v{1, 4, 8, 1, 1, 0, trainctl::Recompute::full};  // 64 micro-batches
  const planner::TimeEstimate t = planner::estimate_time(r, h100(4), v);
  const Timeline timeline = planner::planned_timeline(t);
  REQUIRE(timeline.stages.size() == 4);
  REQUIRE(t.stage_times.size() == 4);
  CHECK(t.micro_batches == 64);
  CHECK(t.step_s == Approx(timeline.makespan + t.dp_exposed_s));
  double slowest = 0;
  for (const StageTimes& s : t.stage_times)
    slowest = std::max(slowest, s.forward + s.backward + s.weight + 2 * t.pp_transfer_s);
  auto total = [&](size_t s) {
    return t.stage_times[s].forward + t.stage_times[s].backward + t.stage_times[s].weight;
  };
  CHECK(total(3) > 1.05 * total(1));  // the head: about one more layer on 8
  CHECK(timeline.makespan >= 64 * slowest * (1 - 1e-9));
  CHECK(timeline.makespan < (64 + 4 - 1) * slowest);
  CHECK(t.bubble_s == Approx(timeline.makespan - 64 * slowest).margin(1e-12));
  // One stage: no bubble, the step is m stage times.
  const planner::TimeEstimate one =
      planner::estimate_time(r, h100(4), planner::Variant{1, 1, 32, 1, 1, 0, Recompute::full});
  CHECK(one.bubble_s == Approx(0).margin(1e-12));
  CHECK(planner::planned_timeline(one).bubble_share() == Approx(0).margin(1e-12));
}

// Stage balance: Llama 3 8B at pp4 has a 128K-token head on its last stage (about 2.4 layers of
// work), so the even 8/8/8/8 split leaves the last stage slowest; the planner moves layers off
// it while the modelled step shrinks, and says so in the preview. A model without a large head
// keeps its even split. With the interleaved schedule the split is over the virtual stages.
TEST_CASE("the planner balances pipeline stages around the head and the embedding") {
  recipe::Recipe r = llama_7b();
  r.model.kv_heads = 8;
  r.model.ffn_hidden = 14336;
  r.model.vocab = 128256;
  r.training.global_batch = 64;
  const planner::Variant v{1, 4, 8, 1, 1, 1, Recompute::selective};  // 8 micro-batches
  const topology::ClusterSpec cluster = h100(4);
  const planner::StageBalance b = planner::balance_stages(r, cluster, v);
  REQUIRE(b.pp_layers.size() == 4);
  int total = 0;
  for (const int n : b.pp_layers)
    total += n;
  CHECK(total == 32);
  CHECK(b.pp_layers.back() < 8);
  const double even = planner::estimate_time(r, cluster, v).step_s;
  CHECK(b.time.step_s < 0.97 * even);
  CHECK(b.memory.total() <= cluster.gpu.memory_gib * 1024.0 * 1024.0 * 1024.0);
  // The preview reports it; the recipe then asking for that split is already balanced.
  planner::Plan plan;
  plan.cluster = cluster;
  plan.world = cluster.world_size();
  const planner::Preview p = planner::preview_layout(r, plan, v, "test");
  CHECK(p.balanced_pp_layers == b.pp_layers);
  CHECK(p.balanced_step_s == Approx(b.time.step_s));
  recipe::Recipe balanced = r;
  balanced.parallel.pp_layers = b.pp_layers;
  CHECK(planner::preview_layout(balanced, plan, v, "test").balanced_pp_layers.empty());
  // A 32K vocabulary's head is small next to 8 layers: nothing to gain.
  recipe::Recipe small_head = r;
  small_head.model.vocab = 32000;
  small_head.model.tied_embeddings = true;
  CHECK(planner::balance_stages(small_head, cluster, v).pp_layers == std::vector<int>{8, 8, 8, 8});
  // Interleaved with two chunks: the split is over the 8 virtual stages, the last (rank 3's
  // second chunk, with the head) lightened.
  planner::Variant chunks = v;
  chunks.pp_schedule = PipeSchedule::interleaved;
  chunks.pp_virtual = 2;
  const planner::StageBalance c = planner::balance_stages(r, cluster, chunks);
  REQUIRE(c.pp_layers.size() == 8);
  CHECK(c.pp_layers.back() < 4);
  CHECK(c.time.step_s < planner::estimate_time(r, cluster, chunks).step_s);
}

// Above 90% of the GPU's memory a layout is reported as tight: fragmentation and library buffers
// beyond the model's fixed overhead may not fit. The note names the fastest layout below 90%.
TEST_CASE("a layout above 90% of the GPU's memory is called tight, naming the fastest below") {
  const recipe::Recipe r = llama_7b();
  topology::ClusterSpec cluster = h100(4);
  const planner::Variant v{8, 1, 4, 1, 1, 0, Recompute::none};
  const double bytes = planner::estimate_memory(r, cluster, v).total();
  cluster.gpu.memory_gib = bytes / 0.95 / (1024.0 * 1024.0 * 1024.0);
  planner::Plan plan = planner::make_plan(r, cluster);
  plan.preview = planner::preview_layout(r, plan, v, "test");
  const std::string text = planner::format_plan(plan, r, 5);
  INFO(text);
  CHECK_THAT(text, Catch::Contains("note: this layout uses 95% of the GPU's memory, above 90%") &&
                       Catch::Contains("the fastest layout below is #"));
  const nlohmann::json doc = nlohmann::json::parse(planner::plan_json(plan, r, 5));
  CHECK(doc["preview"]["memory_bytes"]["tight"] == true);
  for (const auto& row : doc["ranked"])
    CHECK(row["memory_bytes"]["tight"] ==
          (row["memory_bytes"]["total"].get<double>() > 0.9 * bytes / 0.95));
}

// Layouts within 5% of the fastest step tie (the model's error between layouts): among them a
// layout within 90% of the GPU's memory comes before one above, then fewer GPUs per model
// replica, then the shorter step; the text marks and explains the tie.
TEST_CASE("layouts within the model's error of the fastest tie, ordered by headroom and size") {
  recipe::Recipe r = llama_7b();  // at Llama 3 70B's shape on 512 H100s
  r.model.layers = 80;
  r.model.hidden = 8192;
  r.model.heads = 64;
  r.model.kv_heads = 8;
  r.model.ffn_hidden = 28672;
  r.model.vocab = 128256;
  r.model.seq_len = 8192;
  r.model.tied_embeddings = false;
  r.training.global_batch = 2048;
  r.training.micro_batch = 2;
  const topology::ClusterSpec cluster = h100(64);
  const planner::Plan plan = planner::make_plan(r, cluster);
  REQUIRE(plan.tied >= 2);
  double fastest = plan.ranked.front().time.step_s;
  for (int i = 0; i < plan.tied; ++i)
    fastest = std::min(fastest, plan.ranked[static_cast<size_t>(i)].time.step_s);
  const double capacity = cluster.gpu.memory_gib * 1024.0 * 1024.0 * 1024.0;
  for (int i = 0; i < plan.tied; ++i) {
    const planner::Candidate& k = plan.ranked[static_cast<size_t>(i)];
    INFO("#" << i + 1 << " " << k.layout.describe());
    CHECK(k.time.step_s <= fastest * (1 + planner::kTieBand));
    if (i == 0) continue;
    const planner::Candidate& before = plan.ranked[static_cast<size_t>(i) - 1];
    const bool tight = k.memory.total() > planner::kTightMemoryShare * capacity;
    const bool tight_before = before.memory.total() > planner::kTightMemoryShare * capacity;
    CHECK((tight || !tight_before));  // not tight first
    if (tight == tight_before) {
      const int gpus = k.layout.tp * k.layout.pp * k.layout.cp;
      const int gpus_before = before.layout.tp * before.layout.pp * before.layout.cp;
      CHECK(gpus >= gpus_before);
      if (gpus == gpus_before) CHECK(k.time.step_s >= before.time.step_s);
    }
  }
  if (static_cast<size_t>(plan.tied) < plan.ranked.size())
    CHECK(plan.ranked[static_cast<size_t>(plan.tied)].time.step_s >
          fastest * (1 + planner::kTieBand));
  const std::string text = planner::format_plan(plan, r, plan.tied + 1);
  CHECK_THAT(text, Catch::Contains(fmt::format("= #1 to #{} tie: their steps lie within 5% of the "
                                               "fastest",
                                               plan.tied)) &&
                       Catch::Contains("a tie with #1 (step ") && Catch::Contains(" (likely "));
  const nlohmann::json doc = nlohmann::json::parse(planner::plan_json(plan, r, plan.tied + 1));
  CHECK(doc["tied"] == plan.tied);
  CHECK(doc["ranked"][0]["tie"] == true);
  CHECK(doc["ranked"][0]["step_range_s"][1].get<double>() ==
        Approx(plan.ranked.front().time.step_s * 1.2));
}
