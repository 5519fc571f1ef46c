// The pipeline timeline: the engine's action lists run on a clock (layout/timeline.hpp). Its
// pictures: telemetry_timeline_test.cpp.
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "layout/timeline.hpp"

using namespace trainctl;

namespace {

Timeline run(int stages, int micro_batches, StageTimes each, double transfer = 0) {
  return simulate(pipeline_lists({stages, micro_batches}),
                  std::vector<StageTimes>(static_cast<size_t>(stages), each), transfer);
}

// Every stage's actions follow each other, none before the step starts.
void check_sequential(const Timeline& t) {
  for (size_t s = 0; s < t.stages.size(); ++s) {
    double previous = 0;
    for (const TimedAction& a : t.stages[s]) {
      INFO("stage " << s << " " << to_string(a.action));
      CHECK(a.start >= previous);
      CHECK(a.end >= a.start);
      previous = a.end;
    }
  }
}

}  // namespace

// Equal stages with free transfers: 1F1B takes (m + P - 1) stage times, and its bubble is the
// textbook (P - 1) / (m + P - 1), for any forward/backward split.
TEST_CASE("1F1B on a clock: (m + P - 1) stage times and the textbook bubble", "[pipeline]") {
  for (int P = 1; P <= 6; ++P)
    for (int m = 1; m <= 10; ++m) {
      INFO("P " << P << " m " << m);
      const Timeline t = run(P, m, {1.0, 2.0});
      CHECK(t.makespan == Approx(3.0 * (m + P - 1)));
      CHECK(t.bubble_share() == Approx(double(P - 1) / (m + P - 1)));
      CHECK(t.micro_batches() == m);
      REQUIRE(t.stages.size() == static_cast<size_t>(P));
      for (int s = 0; s < P; ++s) {
        CHECK(t.busy(s) == Approx(3.0 * m));
        CHECK(t.stages[static_cast<size_t>(s)].size() == one_f_one_b(P, s, m).size());
      }
      check_sequential(t);
    }
}

// One micro-batch crosses every stage twice: P forwards, P backwards and 2 (P - 1) transfers in
// a row. A slow last stage (the head) sets the pace of the steady state: f0 + m (f1 + b1) + b0.
TEST_CASE("1F1B on a clock: transfers and a slow last stage", "[pipeline]") {
  const Timeline one = run(4, 1, {1.0, 2.0}, 0.25);
  CHECK(one.makespan == Approx(4 * 3.0 + 2 * 3 * 0.25));
  check_sequential(one);
  const Timeline slow_head =
      simulate(pipeline_lists({2, 4}), {StageTimes{1.0, 2.0}, StageTimes{2.0, 4.0}}, 0.0);
  CHECK(slow_head.makespan == Approx(1.0 + 4 * 6.0 + 2.0));
  CHECK(slow_head.busy(1) == Approx(24.0));
  check_sequential(slow_head);
}

TEST_CASE("the timeline names the stuck actions of lists that deadlock", "[pipeline]") {
  std::vector<std::vector<PipeAction>> lists = pipeline_lists({2, 2});
  // Stage 1 waits for micro-batch 1's activation first; stage 0 sends micro-batch 0's.
  std::swap(lists[1][0], lists[1][3]);
  CHECK_THROWS_WITH(simulate(lists, {StageTimes{1, 1}, StageTimes{1, 1}}, 0),
                    Catch::Contains("deadlock") && Catch::Contains("stage 0 at sendA0") &&
                        Catch::Contains("stage 1 at recvA1"));
  CHECK_THROWS_AS(simulate(lists, {StageTimes{1, 1}}, 0), std::invalid_argument);
  CHECK_THROWS_AS(simulate(pipeline_lists({2, 2}), {StageTimes{1, -1}, StageTimes{1, 1}}, 0),
                  std::invalid_argument);
}

// ---- the interleaved schedule (virtual stages) ----

namespace {

PipelineShape interleaved(int P, int V, int M) {
  return {P, M, PipeSchedule::interleaved, V};
}

}  // namespace

// Every virtual stage forwards and backwards each micro-batch once, in Megatron's order: a rank's
// forwards run micro-batch groups of P chunk by chunk, and it starts backwards after
// 2 (P - r - 1) + (V - 1) P of them.
TEST_CASE("interleaved: every chunk forwards then backwards each micro-batch exactly once",
          "[pipeline]") {
  for (int P = 2; P <= 5; ++P)
    for (int V = 2; V <= 4; ++V)
      for (int M = P; M <= 3 * P; M += P) {
        const auto lists = pipeline_lists(interleaved(P, V, M));
        REQUIRE(lists.size() == static_cast<size_t>(P));
        for (int r = 0; r < P; ++r) {
          INFO("P " << P << " V " << V << " M " << M << " rank " << r);
          std::vector<int> forwards(static_cast<size_t>(V * M), 0), backwards(forwards);
          int forwards_before_backward = -1, count = 0, k = 0;
          for (const PipeAction& a : lists[static_cast<size_t>(r)]) {
            REQUIRE((a.chunk >= 0 && a.chunk < V && a.micro_batch >= 0 && a.micro_batch < M));
            const size_t i = static_cast<size_t>(a.chunk * M + a.micro_batch);
            const int v = a.chunk * P + r;  // the virtual stage
            if (a.op == PipeOp::forward) {
              // Forward k: chunk (k mod PV) / P of micro-batch (k / PV) P + k mod P.
              CHECK(a.chunk == (k % (P * V)) / P);
              CHECK(a.micro_batch == (k / (P * V)) * P + k % P);
              ++k;
              ++forwards[i];
              ++count;
            }
            if (a.op == PipeOp::backward) {
              CHECK(forwards[i] == 1);
              ++backwards[i];
              if (forwards_before_backward < 0) forwards_before_backward = count - 1;
            }
            // Nothing arrives before the first virtual stage or leaves the last.
            if (v == 0) CHECK((a.op != PipeOp::recv_activation && a.op != PipeOp::send_grad));
            if (v == P * V - 1)
              CHECK((a.op != PipeOp::send_activation && a.op != PipeOp::recv_grad));
          }
          CHECK(forwards == std::vector<int>(static_cast<size_t>(V * M), 1));
          CHECK(backwards == forwards);
          CHECK(forwards_before_backward == std::min(V * M - 1, 2 * (P - r - 1) + (V - 1) * P));
        }
      }
}

// The transfers are placed so that the lists run with rendezvous sends whatever the stage times
// (simulate throws on a deadlock), and with buffered ones. A rank's slots: Megatron's count
// (the micro-batches forwarded and not yet backwarded, plus the one arriving) and at most two
// more, for activations that arrive before their forward (a receive is placed when its sender
// finishes; measured: 1 at pp2, 2 from pp3 to pp8, V 2 to 4).
TEST_CASE("interleaved: the lists run without buffering on any clock, in few slots", "[pipeline]") {
  for (int P = 2; P <= 5; ++P)
    for (int V = 2; V <= 4; ++V)
      for (int M = P; M <= 3 * P; M += P) {
        INFO("P " << P << " V " << V << " M " << M);
        const auto lists = pipeline_lists(interleaved(P, V, M));
        for (const std::vector<StageTimes>& times :
             {std::vector<StageTimes>(static_cast<size_t>(P * V), {1.0, 2.0}),
              std::vector<StageTimes>(static_cast<size_t>(P * V), {2.0, 1.0})}) {
          std::vector<StageTimes> skewed = times;
          skewed.back() = {5.0, 9.0};  // a heavy head
          for (const auto& t : {times, skewed}) {
            const Timeline timeline = simulate(lists, t, 0.5);
            CHECK(timeline.micro_batches() == M);
            CHECK(simulate(lists, t, 0.5, true).makespan <= timeline.makespan + 1e-9);
            for (int r = 0; r < P; ++r)
              CHECK(timeline.stages[static_cast<size_t>(r)].size() ==
                    lists[static_cast<size_t>(r)].size());
          }
        }
        for (int r = 0; r < P; ++r) {
          const SlotPlan plan = plan_slots(lists[static_cast<size_t>(r)]);
          const int megatron = std::min(V * M, 2 * (P - r - 1) + (V - 1) * P + 1);
          CHECK(plan.slots <= megatron + 2);
          CHECK(plan.slots >= megatron);
          CHECK(pipeline_slots(interleaved(P, V, M), r) == plan.slots);
          // Every action has a slot, and a micro-batch's chunk keeps its slot throughout.
          std::map<std::pair<int, int>, int> slot_of;
          for (size_t i = 0; i < plan.slot.size(); ++i) {
            const PipeAction& a = lists[static_cast<size_t>(r)][i];
            REQUIRE(plan.slot[i] >= 0);
            const auto [it, fresh] = slot_of.try_emplace({a.chunk, a.micro_batch}, plan.slot[i]);
            CHECK(it->second == plan.slot[i]);
          }
        }
      }
}

// With equal virtual stages and free transfers the bubble shrinks by V: (P - 1) / (V M + P - 1)
// of the stages' time, against 1F1B's (P - 1) / (M + P - 1).
TEST_CASE("interleaved on a clock: the bubble shrinks by the chunks per rank", "[pipeline]") {
  for (int P = 2; P <= 4; ++P)
    for (int V = 2; V <= 4; ++V)
      for (int M = P; M <= 4 * P; M += P) {
        INFO("P " << P << " V " << V << " M " << M);
        const Timeline t =
            simulate(pipeline_lists(interleaved(P, V, M)),
                     std::vector<StageTimes>(static_cast<size_t>(P * V), {1.0, 2.0}), 0.0, true);
        CHECK(t.bubble_share() == Approx(double(P - 1) / (V * M + P - 1)));
        CHECK(t.makespan == Approx(3.0 * (V * M + P - 1)));
      }
}

// ZB-H1: every stage runs F, B and W of each micro-batch once, in that order, B_k then W_(k - s);
// the lists run with rendezvous sends on any clock; a micro-batch holds its slot until its W, so
// every stage needs min(P, M); with F = B = W, free transfers and M >= P the bubble is
// (P - 1) / (3M + P - 1), a third of 1F1B's (P - 1) / (M + P - 1) in the same units.
TEST_CASE("zb-h1: F, B, W once each, deadlock-free, min(P, M) slots, a third of 1F1B's bubble",
          "[pipeline]") {
  for (int P = 2; P <= 6; ++P)
    for (int M = 1; M <= 3 * P; ++M) {
      INFO("P " << P << " M " << M);
      const PipelineShape shape{P, M, PipeSchedule::zb_h1, 1};
      REQUIRE(shape.problem().empty());
      const auto lists = pipeline_lists(shape);
      for (int s = 0; s < P; ++s) {
        INFO("stage " << s);
        const std::vector<PipeAction>& list = lists[static_cast<size_t>(s)];
        std::vector<int> forwards(static_cast<size_t>(M), 0), backwards(forwards),
            weights(forwards);
        std::vector<int> b_order, w_order;
        for (const PipeAction& a : list) {
          const size_t m = static_cast<size_t>(a.micro_batch);
          if (a.op == PipeOp::forward) ++forwards[m];
          if (a.op == PipeOp::backward) {
            CHECK(forwards[m] == 1);
            ++backwards[m];
            b_order.push_back(a.micro_batch);
          }
          if (a.op == PipeOp::weight_grad) {
            CHECK(backwards[m] == 1);
            ++weights[m];
            w_order.push_back(a.micro_batch);
          }
        }
        CHECK(forwards == std::vector<int>(static_cast<size_t>(M), 1));
        CHECK(backwards == forwards);
        CHECK(weights == forwards);
        CHECK(w_order == b_order);  // W in micro-batch order: each gradient adds up as in 1F1B
        const SlotPlan plan = plan_slots(list);
        CHECK(plan.slots == std::min(P, M));
        CHECK(pipeline_slots(shape, s) == plan.slots);
      }
      for (const StageTimes t : {StageTimes{1, 1, 1}, StageTimes{1, 2, 0.5}, StageTimes{2, 1, 3}}) {
        std::vector<StageTimes> times(static_cast<size_t>(P), t), skewed = times;
        skewed.back() = {3, 5, 1};  // a heavy head
        for (const auto& x : {times, skewed}) {
          const Timeline timeline = simulate(lists, x, 0.5);  // throws on a deadlock
          CHECK(simulate(lists, x, 0.5, true).makespan <= timeline.makespan + 1e-9);
        }
      }
      const std::vector<StageTimes> equal(static_cast<size_t>(P), {1, 1, 1});
      const double zb = simulate(lists, equal, 0, true).bubble_share();
      // (With M < P the first stage runs out of forwards before its first gradient arrives.)
      if (M >= P) CHECK(zb == Approx(double(P - 1) / (3 * M + P - 1)));
      // 1F1B's lists on the same clock (its backward takes B + W).
      const double one_f_one_b = simulate(pipeline_lists({P, M}), equal, 0).bubble_share();
      CHECK(one_f_one_b == Approx(double(P - 1) / (M + P - 1)));
      CHECK(zb < one_f_one_b);
    }
  CHECK_THAT((PipelineShape{1, 4, PipeSchedule::zb_h1, 1}.problem()),
             Catch::Contains("zb-h1 needs parallel.pp >= 2"));
  CHECK_THAT((PipelineShape{2, 4, PipeSchedule::zb_h1, 2}.problem()),
             Catch::Contains("zb-h1 runs one chunk per stage"));
  CHECK(parse_schedule("zb-h1") == PipeSchedule::zb_h1);
  CHECK(splits_backward(PipeSchedule::zb_h1));
  CHECK(!splits_backward(PipeSchedule::interleaved));
  CHECK(to_string(PipeAction{PipeOp::weight_grad, 3}) == "W3");
}

// 1F1B's closed form is what its lists need; the shapes the schedules cannot run are named.
TEST_CASE("pipeline shapes: 1F1B's slots in closed form, and the shapes refused", "[pipeline]") {
  for (int P = 1; P <= 6; ++P)
    for (int M = 1; M <= 10; ++M)
      for (int s = 0; s < P; ++s) {
        const PipelineShape shape{P, M};
        CHECK(plan_slots(pipeline_lists(shape)[static_cast<size_t>(s)]).slots ==
              std::min(P - s, M));
        CHECK(pipeline_slots(shape, s) == std::min(P - s, M));
      }
  CHECK(interleaved(2, 2, 4).problem().empty());
  CHECK_THAT(interleaved(2, 2, 3).problem(),
             Catch::Contains("3 micro-batches per step % pp 2 = 1"));
  CHECK_THAT(interleaved(1, 2, 4).problem(), Catch::Contains("parallel.pp >= 2"));
  CHECK_THAT(interleaved(2, 1, 4).problem(), Catch::Contains("pp_virtual >= 2"));
  CHECK_THAT((PipelineShape{2, 4, PipeSchedule::one_f_one_b, 2}.problem()),
             Catch::Contains("needs parallel.pp_schedule: interleaved"));
  CHECK_THROWS_WITH(pipeline_lists(interleaved(2, 2, 3)), Catch::Contains("groups of pp"));
  CHECK(parse_schedule("interleaved") == PipeSchedule::interleaved);
  CHECK(parse_schedule("1f1b") == PipeSchedule::one_f_one_b);
  CHECK(!parse_schedule("zb"));
}

// Tags: every message between two ranks in a step has its own, the same on both sides.
TEST_CASE("interleaved: message tags match across each pair and never repeat", "[pipeline]") {
  for (int P = 2; P <= 4; ++P)
    for (int V = 2; V <= 3; ++V) {
      const int M = 2 * P;
      const auto lists = pipeline_lists(interleaved(P, V, M));
      // (from rank, to rank, tag) of every send, and of every receive.
      std::multiset<std::tuple<int, int, uint32_t>> sends, receives;
      for (int r = 0; r < P; ++r)
        for (const PipeAction& a : lists[static_cast<size_t>(r)]) {
          const uint32_t tag = pipeline_tag(a, r, V);
          const int next = (r + 1) % P, previous = (r + P - 1) % P;
          if (a.op == PipeOp::send_activation) sends.insert({r, next, tag});
          if (a.op == PipeOp::send_grad) sends.insert({r, previous, tag});
          if (a.op == PipeOp::recv_activation) receives.insert({previous, r, tag});
          if (a.op == PipeOp::recv_grad) receives.insert({next, r, tag});
        }
      INFO("P " << P << " V " << V);
      CHECK(sends == receives);
      CHECK(std::set<std::tuple<int, int, uint32_t>>(sends.begin(), sends.end()).size() ==
            sends.size());
      CHECK(sends.size() == static_cast<size_t>(2 * (P * V - 1) * M));
    }
}
