// CheckpointWriter: async saves, error propagation, retention, and failures mid-save (file size
// limit as a stand-in for a full disk, SIGKILL during a slow write).
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>

#include "ckpt_test_util.hpp"

using namespace trainctl::ckpt;
using namespace ckpt_test;
using Clock = std::chrono::steady_clock;

namespace {

SaveRequest three_tensor_request(int64_t step) {
  SaveRequest r = simple_request(step);
  const auto values = iota_floats(10);
  r.add("adam_m/w", DType::f32, {10}, {}, values.data());
  r.add("adam_v/w", DType::f32, {10}, {}, values.data());
  return r;
}

bool has_tmp_dir(const fs::path& dir) {
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().starts_with(".tmp-")) return true;
  return false;
}

}  // namespace

TEST_CASE("async save returns before the write ends, wait() and the next save() wait", "[ckpt]") {
  TempDir tmp;
  CheckpointWriter writer(tmp.path, {.async = true, .keep_last = 0});
  writer.save(simple_request(1));
  writer.wait();
  Gate step2;  // holds the second writer's saves at their first slice until opened
  CheckpointWriter held(tmp.path, {.async = true, .keep_last = 0, .after_slice = step2.hook()});
  held.save(three_tensor_request(2));  // returns while its write is held
  REQUIRE(step2.wait_held());
  CHECK_FALSE(fs::exists(tmp.path / "step_00000002"));
  CHECK(read_text(tmp.path / "latest") == "step_00000001\n");  // latest moves only at commit
  auto third = std::async(std::launch::async, [&] { held.save(three_tensor_request(3)); });
  // The next save waits for step 2 (a broken writer would start step 3 or return at once; this
  // check cannot fail on a slow machine, only miss a broken writer).
  CHECK(third.wait_for(std::chrono::milliseconds(50)) == std::future_status::timeout);
  step2.open();
  third.get();
  CHECK(fs::exists(tmp.path / "step_00000002"));
  held.wait();
  CHECK(read_text(tmp.path / "latest") == "step_00000003\n");
  const auto stats = held.last_stats();
  REQUIRE(stats);
  CHECK(stats->step == 3);
  CHECK(stats->path == tmp.path / "step_00000003");
  CHECK(stats->bytes == fs::file_size(stats->path / "rank_0.bin"));
  CHECK(stats->write_seconds > 0);
  CHECK(stats->bandwidth > 0);
  CheckpointReader::open(stats->path).verify();
}

TEST_CASE("a background save's error is rethrown by wait(), then cleared", "[ckpt]") {
  TempDir tmp;
  CheckpointWriter writer(tmp.path, {.async = true, .keep_last = 0});
  writer.save(simple_request(5));
  writer.save(simple_request(5));  // returns: the failure happens in the background
  CHECK_THROWS_AS(writer.wait(), CheckpointError);
  writer.wait();  // the error was reported once
  writer.save(simple_request(6));
  writer.wait();
  CHECK(scan(tmp.path).newest_valid()->step == 6);
  // A synchronous writer throws from save() itself.
  CheckpointWriter sync_writer(tmp.path, {.async = false, .keep_last = 0});
  CHECK_THROWS_WITH(sync_writer.save(simple_request(6)), Catch::Contains("already exists"));
}

TEST_CASE("retention keeps the newest keep_last valid checkpoints", "[ckpt]") {
  TempDir tmp;
  {
    CheckpointWriter writer(tmp.path, {.async = true, .keep_last = 2});
    for (int64_t step = 1; step <= 5; ++step)
      writer.save(simple_request(step * 10));
  }  // the destructor waits for the last save
  const ScanReport report = scan(tmp.path);
  REQUIRE(report.entries.size() == 2);
  CHECK(report.entries[0].step == 50);
  CHECK(report.entries[1].step == 40);
}

TEST_CASE("retention never deletes the newest valid checkpoint nor another's tmp dir", "[ckpt]") {
  TempDir tmp;
  for (int64_t step : {10, 20}) {
    SaveRequest r = simple_request(step);
    save(tmp.path, r.header, r.slices());
  }
  fs::create_directory(tmp.path / "step_00000030");  // partial: newer than every valid one
  fs::create_directory(tmp.path / "step_00000040");
  write_text(tmp.path / "step_00000040" / "manifest.json", "[]");  // corrupt
  fs::create_directory(tmp.path / ".tmp-step_00000050.999999");    // someone's save in flight
  const auto removed = apply_retention(tmp.path, 1);
  REQUIRE(removed.size() == 1);
  CHECK(removed[0].filename() == "step_00000010");
  CHECK(fs::exists(tmp.path / "step_00000020"));
  CHECK(fs::exists(tmp.path / "step_00000030"));
  CHECK(fs::exists(tmp.path / "step_00000040"));
  CHECK(fs::exists(tmp.path / ".tmp-step_00000050.999999"));
  CHECK(apply_retention(tmp.path, 0).empty());
}

TEST_CASE("a file size limit (disk full) fails the save cleanly, earlier checkpoints intact",
          "[ckpt]") {
  TempDir tmp;
  SaveRequest first = simple_request(1);
  save(tmp.path, first.header, first.slices());
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ignore_file_size_signal();
    const rlimit limit{64 * 1024, 64 * 1024};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    SaveRequest big = simple_request(2, 256, 256);  // 256 KiB of f32
    try {
      save(tmp.path, big.header, big.slices());
      ::_exit(10);  // should have failed
    } catch (const CheckpointError& e) {
      const std::string message = e.what();
      const bool names_all = message.find("rank_0.bin") != std::string::npos &&
                             message.find("File too large") != std::string::npos &&
                             message.find("EFBIG") != std::string::npos;
      ::_exit(names_all ? 0 : 11);
    } catch (...) {
      ::_exit(12);
    }
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK_FALSE(has_tmp_dir(tmp.path));
  CHECK_FALSE(fs::exists(tmp.path / "step_00000002"));
  const ScanReport report = scan(tmp.path, Verify::full);
  REQUIRE(report.newest_valid());
  CHECK(report.newest_valid()->step == 1);
  CHECK(report.latest == "step_00000001");
}

TEST_CASE("an unwritable location is a CheckpointError naming the path", "[ckpt]") {
  TempDir tmp;
  write_text(tmp.path / "a-file", "x");
  SaveRequest r = simple_request(1);
  CHECK_THROWS_WITH(save(tmp.path / "a-file" / "checkpoints", r.header, r.slices()),
                    Catch::Contains("a-file/checkpoints") && Catch::Contains("Not a directory"));
}

TEST_CASE("SIGKILL during a save leaves a partial tmp dir and the previous checkpoint", "[ckpt]") {
  TempDir tmp;
  SaveRequest first = simple_request(1);
  save(tmp.path, first.header, first.slices());
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // After the first slice is on disk: tell the parent, then wait to be killed.
    const SliceHook hold = [&](size_t) {
      (void)!::write(ready[1], "x", 1);
      ::pause();
    };
    SaveRequest r = three_tensor_request(2);
    try {
      save(tmp.path, r.header, r.slices(), hold);
    } catch (...) {
    }
    ::_exit(0);
  }
  ::close(ready[1]);
  char byte = 0;
  REQUIRE(::read(ready[0], &byte, 1) == 1);  // the child is in the middle of its save
  ::close(ready[0]);
  const fs::path shard = tmp.path / (".tmp-step_00000002." + std::to_string(child)) / "rank_0.bin";
  CHECK(fs::file_size(shard) > 64);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status));
  const ScanReport report = scan(tmp.path, Verify::full);
  REQUIRE(report.entries.size() == 2);
  CHECK(report.entries[0].status == Status::partial);
  CHECK(report.entries[0].step == 2);
  CHECK(report.newest_valid()->step == 1);
  CHECK(report.latest == "step_00000001");
}
