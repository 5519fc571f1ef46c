// lib/run in C++: the step vote and save cadence, a whole session in this process, and the whole
// model's fingerprint on every layout.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "comm_test_util.hpp"
#include "run/context.hpp"
#include "run/peak.hpp"
#include "run/save_schedule.hpp"
#include "run/session.hpp"
#include "run/straggler.hpp"
#include "run/summary.hpp"

namespace fs = std::filesystem;
using namespace trainctl;

namespace {

const std::string kFixture =
    std::string(TRAINCTL_SOURCE_DIR) + "/tests/fixtures/recipes/llama_moe.yaml";

run::SessionInput session_input(const std::vector<std::string>& overrides, const fs::path& dir) {
  run::SessionInput input;
  input.loaded = recipe::load_recipe_with_origins(kFixture, overrides);
  input.recipe_label = kFixture;
  input.run_dir = dir;
  input.data = std::make_shared<run::SessionData>();
  if (run::Exit end = run::open_session_data(input, *input.data))
    throw std::runtime_error("the fixture's data did not open");
  return input;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE(
    "exchange_step without a group is the rank's own vote; the schedule saves on the cadence "
    "and on a stop, never when saves are off",
    "[run]") {
  const run::StepVote mine{.stop = true, .save = false};
  CHECK(run::exchange_step(mine, {}, nullptr).vote == mine);
  CHECK(run::exchange_step(mine, {}, nullptr).ranks.empty());

  const auto t0 = run::Clock::now();
  run::SaveSchedule every_2(train::CheckpointPolicy(2, 0, 10), true, t0);
  CHECK(every_2.vote(1, false, t0) == run::StepVote{false, false});
  CHECK(every_2.vote(2, false, t0) == run::StepVote{false, true});
  CHECK(every_2.vote(10, false, t0) == run::StepVote{false, true});  // the end
  CHECK(every_2.saves({.stop = true, .save = false}));
  CHECK_FALSE(every_2.saves({}));

  // every_minutes: due once the minutes have passed since the start or the last save.
  run::SaveSchedule minutes(train::CheckpointPolicy(0, 1.0, 100), true, t0);
  CHECK_FALSE(minutes.vote(3, false, t0 + std::chrono::seconds(59)).save);
  CHECK(minutes.vote(3, false, t0 + std::chrono::seconds(61)).save);
  minutes.saved(t0 + std::chrono::seconds(61));
  CHECK_FALSE(minutes.vote(4, false, t0 + std::chrono::seconds(62)).save);

  run::SaveSchedule off(train::CheckpointPolicy(2, 0, 10), false, t0);
  CHECK_FALSE(off.vote(2, false, t0).save);
  CHECK_FALSE(off.saves({.stop = true, .save = true}));
  CHECK(off.vote(2, true, t0).stop);  // a stop is still a stop
}

TEST_CASE(
    "a session runs in this process: metrics for every step, checkpoints on the cadence, "
    "a summary with the whole model's fingerprint",
    "[run]") {
  comm_test::TempDir temp;
  const fs::path dir = fs::path(temp.path) / "run";
  run::SessionInput input = session_input({"training.steps=4", "checkpoint.every_steps=2",
                                           "checkpoint.async=false", "logging.progress=none"},
                                          dir);
  REQUIRE(run::train_session(std::move(input), "run") == run::kExitOk);

  std::vector<int64_t> steps;
  std::istringstream lines(read_text(dir / "metrics.jsonl"));
  for (std::string line; std::getline(lines, line);)
    steps.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
  CHECK(steps == std::vector<int64_t>{1, 2, 3, 4});
  CHECK(fs::is_directory(dir / "checkpoints" / "step_00000002"));
  CHECK(fs::is_directory(dir / "checkpoints" / "step_00000004"));
  const nlohmann::json summary = nlohmann::json::parse(read_text(dir / "summary.json"));
  CHECK(summary.at("steps") == 4);
  const std::string fingerprint = summary.at("weights_fingerprint");
  CHECK(fingerprint.size() == 16);
  CHECK(read_text(dir / "logs" / "rank_0.log").find("weights " + fingerprint) != std::string::npos);

  // Resumed from step 2 to step 4 again: the same weights, bit for bit, so the same fingerprint.
  fs::remove_all(dir / "checkpoints" / "step_00000004");
  run::SessionInput again = session_input({"training.steps=4", "checkpoint.every_steps=2",
                                           "checkpoint.async=false", "logging.progress=none"},
                                          dir);
  again.resuming = true;
  again.resume_candidates = ckpt::scan(dir / "checkpoints").entries;
  REQUIRE(run::train_session(std::move(again), "resume") == run::kExitOk);
  const nlohmann::json resumed = nlohmann::json::parse(read_text(dir / "summary.json"));
  CHECK(resumed.at("resumed_from_step") == 2);
  CHECK(resumed.at("weights_fingerprint") == fingerprint);
}

TEST_CASE(
    "the weights fingerprint is the whole model's: equal on one rank and on tp, pp, ep and "
    "dp with ZeRO-1, and a changed value changes it",
    "[run]") {
  // The initial weights do not depend on the layout (Philox keyed by name and global index), so
  // every layout must report the one-rank fingerprint before any step.
  comm_test::TempDir temp;
  std::string one_rank;
  std::string changed;
  {
    run::SessionInput input = session_input({}, fs::path(temp.path) / "one");
    run::RankLog log("run", false, 0);
    run::RunContext run(input, log);
    one_rank = run::weights_fingerprint(run);
    // One element of one tensor, one bit: another fingerprint.
    const model::ParamStore& params = run.model().params();
    std::vector<float> host(static_cast<size_t>(params.table().numel()));
    run.backend().copy_to_host(host.data(), params.values());
    host[12345] = std::nextafter(host[12345], 1.0f);
    run.backend().copy_from_host(params.values(), host.data());
    changed = run::weights_fingerprint(run);
  }
  CHECK(one_rank.size() == 16);
  CHECK(changed != one_rank);

  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"tp2", {"parallel.tp=2"}},
      {"pp2", {"parallel.pp=2"}},
      {"ep2", {"parallel.ep=2"}},
      {"dp2 zero1", {"parallel.dp=2", "parallel.zero=1"}},
      {"dp2 zero2", {"parallel.dp=2", "parallel.zero=2"}},
      {"tp2 pp2", {"parallel.tp=2", "parallel.pp=2"}},
  };
  for (const auto& [name, overrides] : layouts) {
    const fs::path dir = fs::path(temp.path) / name;
    const int world = name == "tp2 pp2" ? 4 : 2;
    const std::vector<int> status = comm_test::run_ranks(world, [&](int rank) {
      run::SessionInput input = session_input(overrides, dir);
      input.rank.rank = rank;
      input.rank.world_size = world;
      input.rank.local_rank = rank;
      input.rank.local_world_size = world;
      input.rank.source = launch::RankSource::trainctl;
      run::RankLog log("run", true, rank);
      run::RunContext run(input, log);
      const std::string fingerprint = run::weights_fingerprint(run);
      comm_test::expect(fingerprint == one_rank, name + " rank " + std::to_string(rank) + ": " +
                                                     fingerprint + " != one rank's " + one_rank);
      return 0;
    });
    INFO(name);
    CHECK(status == std::vector<int>(static_cast<size_t>(world), 0));
  }
}

TEST_CASE("MFU: model FLOPs over the devices' peak, against a datasheet or a measured GEMM peak") {
  // 3 x forward FLOPs per token x tokens over the step time, against every device's peak.
  const run::Peak peak{100e12, "test"};
  CHECK(run::step_mfu(1e9, 1e4, 1.0, peak, 1) == Approx(0.3));
  CHECK(run::step_mfu(1e9, 1e4, 1.0, peak, 4) == Approx(0.075));
  CHECK(run::step_mfu(1e9, 1e4, 1.0, run::Peak{}, 1) == 0);  // peak unknown: no MFU
  // A GPU the table knows: its dense datasheet peak at the run's precision.
  backend::GpuInfo h100;
  h100.name = "NVIDIA H100 80GB HBM3";
  CHECK(run::gpu_peak(h100, tensor::DType::bf16).flops_per_s == Approx(989e12));
  CHECK(run::gpu_peak(h100, tensor::DType::f32).flops_per_s == Approx(67e12));
  backend::GpuInfo unknown;
  unknown.name = "NVIDIA Quadro P400";
  const run::Peak none = run::gpu_peak(unknown, tensor::DType::bf16);
  CHECK(none.flops_per_s == 0);
  CHECK(none.source.find("Quadro P400") != std::string::npos);
  // The CPU's GEMM peak is measured: positive, and no faster than a generous 10 TFLOP/s.
  auto cpu = backend::make_cpu_backend();
  const run::Peak measured = run::measure_gemm_peak(*cpu, tensor::DType::f32, 0.05);
  CHECK(measured.flops_per_s > 1e8);
  CHECK(measured.flops_per_s < 10e12);
}
