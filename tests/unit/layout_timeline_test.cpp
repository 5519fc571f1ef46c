// The pipeline timeline: the engine's action lists run on a clock (layout/timeline.hpp). Its
// pictures: telemetry_timeline_test.cpp.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>
#include <vector>

#include "layout/timeline.hpp"

using namespace trainctl;

namespace {

Timeline run(int stages, int micro_batches, StageTimes each, double transfer = 0) {
  return simulate(one_f_one_b_lists(stages, micro_batches),
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
      simulate(one_f_one_b_lists(2, 4), {StageTimes{1.0, 2.0}, StageTimes{2.0, 4.0}}, 0.0);
  CHECK(slow_head.makespan == Approx(1.0 + 4 * 6.0 + 2.0));
  CHECK(slow_head.busy(1) == Approx(24.0));
  check_sequential(slow_head);
}

TEST_CASE("the timeline names the stuck actions of lists that deadlock", "[pipeline]") {
  std::vector<std::vector<PipeAction>> lists = one_f_one_b_lists(2, 2);
  // Stage 1 waits for micro-batch 1's activation first; stage 0 sends micro-batch 0's.
  std::swap(lists[1][0], lists[1][3]);
  CHECK_THROWS_WITH(simulate(lists, {StageTimes{1, 1}, StageTimes{1, 1}}, 0),
                    Catch::Contains("deadlock") && Catch::Contains("stage 0 at sendA0") &&
                        Catch::Contains("stage 1 at recvA1"));
  CHECK_THROWS_AS(simulate(lists, {StageTimes{1, 1}}, 0), std::invalid_argument);
  CHECK_THROWS_AS(simulate(one_f_one_b_lists(2, 2), {StageTimes{1, -1}, StageTimes{1, 1}}, 0),
                  std::invalid_argument);
}
