// The straggler watch (lib/run/straggler.hpp): every rank's time travels with the step's vote,
// and rank 0 names the slowest rank when its compute time exceeds the median's by the threshold.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "comm/gloo_communicator.hpp"
#include "comm/store.hpp"
#include "comm_test_util.hpp"
#include "run/straggler.hpp"

using namespace trainctl;
using run::RankStepTime;

TEST_CASE("slowest_rank compares compute times (step time less the wait) with the median") {
  CHECK_FALSE(run::slowest_rank(std::vector<RankStepTime>{}).has_value());
  CHECK_FALSE(run::slowest_rank(std::vector<RankStepTime>{{50, 0}}).has_value());
  // Every step takes 100 ms; rank 1 computed 90 of them, the others 40 (they waited 60).
  const std::vector<RankStepTime> odd{{100, 60}, {100, 10}, {100, 60}};
  const auto s = run::slowest_rank(odd);
  REQUIRE(s);
  CHECK(s->rank == 1);
  CHECK(s->compute_ms == 90);
  CHECK(s->median_ms == 40);
  CHECK(s->ratio() == Approx(2.25));
  // An even count: the median is the mean of the middle two.
  const auto even =
      run::slowest_rank(std::vector<RankStepTime>{{10, 0}, {20, 0}, {30, 0}, {70, 0}});
  REQUIRE(even);
  CHECK(even->rank == 3);
  CHECK(even->median_ms == 25);
  // Pipeline stages do different work: only ranks of one stage are compared. Stage 1 (ranks 2
  // and 3: the LM head) computes longer than stage 0, and is no straggler for it; within stage
  // 0, rank 1 is.
  const std::vector<RankStepTime> pp{{100, 70}, {100, 55}, {100, 20}, {100, 20}};
  const std::vector<int> stages{0, 0, 1, 1};
  const auto staged = run::slowest_rank(pp, stages);
  REQUIRE(staged);
  CHECK(staged->rank == 1);
  CHECK(staged->compute_ms == 45);
  CHECK(staged->median_ms == Approx(37.5));
  // One rank per stage (pp only): nothing to compare.
  CHECK_FALSE(run::slowest_rank(pp, std::vector<int>{0, 1, 2, 3}).has_value());
  // A wait longer than the step (clock granularity) is no negative compute.
  CHECK(RankStepTime{5, 6}.compute_ms() == 0);
}

TEST_CASE("the watch names the rank most often slowest once per window, with host and ratio") {
  run::StragglerWatch watch({"node1", "node1", "node2"}, 0.2, 5);
  const std::vector<RankStepTime> slow2{{100, 60}, {100, 60}, {100, 10}};  // rank 2: 90 vs 40
  const std::vector<RankStepTime> even{{100, 50}, {100, 49}, {100, 51}};   // within 20%
  for (int64_t step = 1; step <= 4; ++step)
    CHECK_FALSE(watch.observe(step, run::slowest_rank(step == 3 ? even : slow2))
                    .has_value());  // not a window's end
  const auto line = watch.observe(5, run::slowest_rank(slow2));
  REQUIRE(line);
  CHECK(*line ==
        "straggler: rank 2 on node2 computed 90.0 ms a step, 2.25x the median rank's 40.0 ms (the "
        "slowest by more than 20% in 4 of the last 5 steps; the others waited for it)");
  // The next window has none: nothing is said.
  for (int64_t step = 6; step <= 10; ++step)
    CHECK_FALSE(watch.observe(step, run::slowest_rank(even)).has_value());
}

TEST_CASE("the watch ignores differences within the threshold, under 2 ms, or when off") {
  run::StragglerWatch watch({"a", "b"}, 0.2, 1);
  // 20% over the median of two (their mean) is not more than 20%.
  CHECK_FALSE(watch.observe(1, run::slowest_rank(std::vector<RankStepTime>{{10, 0}, {13.3, 0}}))
                  .has_value());
  // 3x the median, but 1 ms: timer noise on a millisecond step.
  CHECK_FALSE(watch.observe(2, run::slowest_rank(std::vector<RankStepTime>{{0.5, 0}, {1.5, 0}}))
                  .has_value());
  CHECK(
      watch.observe(3, run::slowest_rank(std::vector<RankStepTime>{{10, 0}, {20, 0}})).has_value());
  run::StragglerWatch off({"a", "b"}, 0, 1);
  CHECK_FALSE(
      off.observe(1, run::slowest_rank(std::vector<RankStepTime>{{10, 0}, {100, 0}})).has_value());
}

TEST_CASE("exchange_step gives every rank the job's vote and every rank's time, in rank order") {
  comm_test::TempDir temp;
  const std::vector<int> status = comm_test::run_ranks(3, [&](int rank) {
    comm::FileStore store(temp.path);
    comm::GroupOptions options;
    options.name = "world";
    options.rank = rank;
    options.size = 3;
    const auto world = comm::create_gloo_communicator(store, options);
    const run::StepVote mine{.stop = rank == 2, .save = false};
    const run::JobStep job = run::exchange_step(mine, {10.0 + rank, 1.0 * rank}, world.get());
    comm_test::expect(job.vote == run::StepVote{true, false}, "the stop of rank 2 reaches all");
    comm_test::expect(job.ranks.size() == 3, "three ranks' times");
    for (int r = 0; r < 3; ++r)
      comm_test::expect(job.ranks[static_cast<size_t>(r)].step_ms == 10.0 + r &&
                            job.ranks[static_cast<size_t>(r)].comm_ms == 1.0 * r,
                        "rank " + std::to_string(r) + "'s time");
    const std::vector<std::string> hosts = run::gather_hosts(*world);
    comm_test::expect(hosts.size() == 3 && !hosts[0].empty() && hosts[0] == hosts[2],
                      "every rank's host");
    return 0;
  });
  CHECK(status == std::vector<int>{0, 0, 0});
}
