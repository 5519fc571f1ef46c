// The multi-rank save protocol of CheckpointWriter: one forked process per rank, talking only
// through the checkpoints directory (as real ranks do). Each rank writes rows [2r, 2r+2) of
// model/w [2*world, 3] plus its own tensor; rank 0 assembles the manifest and commits.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "ckpt_test_util.hpp"
#include "comm_test_util.hpp"

using namespace trainctl::ckpt;
using namespace ckpt_test;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kRowsPerRank = 2, kCols = 3;

float value_at(int64_t row, int64_t col, int64_t step) {
  return static_cast<float>(step * 1000 + row * kCols + col) * 0.5f;
}

// Rank `rank`'s part of a step: its rows of model/w and the whole of model/own_<rank>.
SaveRequest rank_request(int rank, int world, int64_t step) {
  SaveRequest request;
  request.header.step = step;
  request.header.recipe_hash = "abc123";
  request.header.layout = {{"dp", world}, {"world_size", world}};
  std::vector<float> rows;
  for (int64_t r = rank * kRowsPerRank; r < (rank + 1) * kRowsPerRank; ++r)
    for (int64_t c = 0; c < kCols; ++c)
      rows.push_back(value_at(r, c, step));
  request.add("model/w", DType::f32, {world * kRowsPerRank, kCols},
              {{rank * kRowsPerRank, (rank + 1) * kRowsPerRank}, {0, kCols}}, rows.data());
  const std::vector<float> own(5, static_cast<float>(rank) + 0.25f);
  request.add("model/own_" + std::to_string(rank), DType::f32, {5}, {}, own.data());
  return request;
}

CheckpointWriter::Options options(int rank, int world, std::chrono::milliseconds timeout) {
  CheckpointWriter::Options o;
  o.async = true;
  o.keep_last = 0;
  o.rank = rank;
  o.world_size = world;
  o.save_id = "job7-0";
  o.timeout = timeout;
  return o;
}

// An after_slice hook that kills the process once its first slice is written: mid-save.
void die_mid_save(size_t) {
  ::raise(SIGKILL);
}

// Every rank saves `steps`; returns the ranks' exit codes.
std::vector<int> save_steps(const fs::path& dir, int world, std::vector<int64_t> steps,
                            int keep_last = 0) {
  return comm_test::run_ranks(world, [&](int rank) {
    auto o = options(rank, world, std::chrono::seconds(20));
    o.keep_last = keep_last;
    CheckpointWriter writer(dir, o);
    for (int64_t step : steps)
      writer.save(rank_request(rank, world, step));
    writer.wait();
    return 0;
  });
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("4 ranks save one checkpoint: every tensor covered once, only rank 0 commits", "[ckpt]") {
  TempDir tmp;
  constexpr int world = 4;
  REQUIRE(save_steps(tmp.path, world, {3, 4}) == std::vector<int>(world, 0));
  CHECK(names_in(tmp.path) == std::vector<std::string>{"latest", "step_00000003", "step_00000004"});
  CHECK(read_text(tmp.path / "latest") == "step_00000004\n");
  const fs::path step = tmp.path / "step_00000004";
  CHECK(names_in(step) == std::vector<std::string>{"manifest.json", "rank_0.bin", "rank_1.bin",
                                                   "rank_2.bin", "rank_3.bin"});
  const CheckpointReader reader = CheckpointReader::open(step);
  reader.verify();
  CHECK(reader.manifest().tensors.size() == 1 + world);
  CHECK(reader.manifest().header.layout["world_size"] == world);
  const TensorEntry& w = reader.tensor("model/w");
  CHECK(w.shape == std::vector<int64_t>{world * kRowsPerRank, kCols});
  REQUIRE(w.slices.size() == world);
  for (const SliceRecord& s : w.slices)  // each rank's rows live in its own file
    CHECK(s.file == shard_file_name(static_cast<int>(s.index[0].begin / kRowsPerRank)));
  std::vector<float> all(world * kRowsPerRank * kCols);
  reader.read("model/w", DType::f32, all.data());
  for (int64_t r = 0; r < world * kRowsPerRank; ++r)
    for (int64_t c = 0; c < kCols; ++c)
      CHECK(all[static_cast<size_t>(r * kCols + c)] == value_at(r, c, 4));
  for (int rank = 0; rank < world; ++rank) {
    std::vector<float> own(5);
    reader.read("model/own_" + std::to_string(rank), DType::f32, own.data());
    CHECK(own == std::vector<float>(5, static_cast<float>(rank) + 0.25f));
  }
}

TEST_CASE("multi-rank retention runs on rank 0 only and keeps keep_last steps", "[ckpt]") {
  TempDir tmp;
  REQUIRE(save_steps(tmp.path, 2, {1, 2, 3}, 2) == std::vector<int>(2, 0));
  CHECK(names_in(tmp.path) == std::vector<std::string>{"latest", "step_00000002", "step_00000003"});
}

TEST_CASE("a rank that never saves makes rank 0's save fail naming it, nothing committed",
          "[ckpt]") {
  TempDir tmp;
  constexpr int world = 3;
  REQUIRE(save_steps(tmp.path, world, {1}) == std::vector<int>(world, 0));
  const auto status = comm_test::run_ranks(world, [&](int rank) {
    if (rank == 2) return 0;  // rank 2 never joins the save of step 2
    CheckpointWriter writer(tmp.path, options(rank, world, std::chrono::milliseconds(400)));
    writer.save(rank_request(rank, world, 2));
    if (rank != 0) {
      writer.wait();  // its own part succeeds
      return 0;
    }
    try {
      writer.wait();
    } catch (const CheckpointError& e) {
      const std::string what = e.what();
      comm_test::expect(what.find("rank 2 ") != std::string::npos, "names rank 2: " + what);
      comm_test::expect(what.find("step 2") != std::string::npos, "names the step: " + what);
      return 0;
    }
    return 3;  // the save must not succeed
  });
  CHECK(status == std::vector<int>(world, 0));
  CHECK(names_in(tmp.path) == std::vector<std::string>{"latest", "step_00000001"});
  CHECK(read_text(tmp.path / "latest") == "step_00000001\n");
  CHECK(scan(tmp.path).newest_valid()->step == 1);
}

TEST_CASE("a rank whose shard write fails makes rank 0 fail at once with its reason", "[ckpt]") {
  TempDir tmp;
  constexpr int world = 2;
  const auto status = comm_test::run_ranks(world, [&](int rank) {
    CheckpointWriter writer(tmp.path, options(rank, world, std::chrono::seconds(20)));
    SaveRequest request = rank_request(rank, world, 5);
    if (rank == 1) {  // a box outside its tensor: write_shard refuses it
      const std::vector<float> bad(4, 1.0f);
      request.add("model/bad", DType::f32, {6}, {{4, 8}}, bad.data());
    }
    const auto start = Clock::now();
    writer.save(std::move(request));
    try {
      writer.wait();
    } catch (const CheckpointError& e) {
      const std::string what = e.what();
      if (rank == 1) return what.find("outside its shape") != std::string::npos ? 0 : 4;
      comm_test::expect(what.find("rank 1 could not write its shard") != std::string::npos &&
                            what.find("outside its shape") != std::string::npos,
                        "rank 0 names rank 1 and its reason: " + what);
      comm_test::expect(Clock::now() - start < std::chrono::seconds(5), "fails without waiting");
      return 0;
    }
    return 3;
  });
  CHECK(status == std::vector<int>(world, 0));
  CHECK(names_in(tmp.path).empty());  // rank 0 removed the tmp directory
}

TEST_CASE(
    "a rank killed mid-save fails rank 0's save; a job killed mid-save leaves a partial "
    "tmp dir",
    "[ckpt]") {
  TempDir tmp;
  constexpr int world = 2;
  REQUIRE(save_steps(tmp.path, world, {1}) == std::vector<int>(world, 0));
  SECTION("one rank killed") {
    const auto status = comm_test::run_ranks(world, [&](int rank) {
      auto o = options(rank, world, std::chrono::milliseconds(500));
      if (rank == 1) o.after_slice = die_mid_save;
      CheckpointWriter writer(tmp.path, o);
      writer.save(rank_request(rank, world, 2));
      try {
        writer.wait();
      } catch (const CheckpointError& e) {
        const std::string what = e.what();
        return what.find("rank 1 made no progress") != std::string::npos ? 0 : 4;
      }
      return 3;
    });
    CHECK(status == std::vector<int>{0, 128 + SIGKILL});
    CHECK(names_in(tmp.path) == std::vector<std::string>{"latest", "step_00000001"});
  }
  SECTION("every rank killed") {
    const auto status = comm_test::run_ranks(world, [&](int rank) {
      auto o = options(rank, world, std::chrono::seconds(20));
      o.after_slice = die_mid_save;
      CheckpointWriter writer(tmp.path, o);
      writer.save(rank_request(rank, world, 2));
      writer.wait();
      return 3;
    });
    CHECK(status == std::vector<int>(world, 128 + SIGKILL));
    const ScanReport report = scan(tmp.path);
    REQUIRE(report.entries.size() == 2);
    CHECK(report.entries[0].name == ".tmp-step_00000002.job7-0");
    CHECK(report.entries[0].status == Status::partial);
    CHECK(report.newest_valid()->step == 1);
    CHECK(read_text(tmp.path / "latest") == "step_00000001\n");
  }
}

TEST_CASE("a multi-rank writer refuses a save id that cannot name a directory", "[ckpt]") {
  TempDir tmp;
  auto o = options(0, 2, std::chrono::seconds(1));
  o.save_id = "job.1/x";
  CHECK_THROWS_WITH(CheckpointWriter(tmp.path, o), Catch::Contains("save id \"job.1/x\""));
  o.save_id = "job-1";
  o.rank = 2;
  CHECK_THROWS_WITH(CheckpointWriter(tmp.path, o),
                    Catch::Contains("rank 2 is outside world size 2"));
}

TEST_CASE("reserve() maps the host memory the first request then uses", "[ckpt]") {
  TempDir tmp;
  CheckpointWriter writer(tmp.path, {.async = false, .keep_last = 0});
  writer.reserve(size_t{3} << 20);
  SaveRequest request = writer.new_request();
  std::byte* first = request.allocate(size_t{1} << 20);
  std::byte* second = request.allocate(size_t{2} << 20);
  CHECK(second == first + (size_t{1} << 20));  // both inside the one reserved block
  request.header.step = 1;
  writer.save(std::move(request));
  SaveRequest again = writer.new_request();
  CHECK(again.allocate(size_t{1} << 20) == first);  // recycled, as before
}
