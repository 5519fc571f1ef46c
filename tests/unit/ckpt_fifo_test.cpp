// A FIFO (or anything else that is not a regular file) where lib/ckpt expects a file: every read
// fails at once with a CheckpointError naming it, never waits for a writer that never comes. Each
// case runs in a child under a watchdog (ckpt_test_child.hpp), so a regression fails instead of
// hanging the suite.
#include <sys/stat.h>

#include <catch2/catch.hpp>

#include <chrono>

#include "ckpt_test_child.hpp"
#include "ckpt_test_util.hpp"

using namespace trainctl::ckpt;
using namespace ckpt_test;

namespace {

fs::path save_step(const fs::path& dir, int64_t step) {
  SaveRequest r = simple_request(step);
  return save(dir, r.header, r.slices()).path;
}

void replace_with_fifo(const fs::path& path) {
  fs::remove(path);
  REQUIRE(::mkfifo(path.c_str(), 0644) == 0);
}

// 0 when `body` throws a CheckpointError whose message contains every one of `words`.
template <class Body>
int refused_naming(Body body, std::initializer_list<const char*> words) {
  try {
    body();
  } catch (const CheckpointError& e) {
    const std::string message = e.what();
    for (const char* word : words)
      if (message.find(word) == std::string::npos) {
        std::fprintf(stderr, "message lacks \"%s\": %s\n", word, message.c_str());
        return 2;
      }
    return 0;
  }
  return 1;
}

}  // namespace

TEST_CASE("open refuses a FIFO manifest.json at once, naming it", "[ckpt][fifo]") {
  TempDir tmp;
  const fs::path step = save_step(tmp.path, 1);
  replace_with_fifo(step / "manifest.json");
  CHECK(child_status([&] {
          return refused_naming([&] { CheckpointReader::open(step); }, {"manifest.json", "FIFO"});
        }) == 0);
}

TEST_CASE("scan reports a FIFO manifest.json as corrupt and the older step as newest valid",
          "[ckpt][fifo]") {
  TempDir tmp;
  save_step(tmp.path, 1);
  const fs::path newer = save_step(tmp.path, 2);
  replace_with_fifo(newer / "manifest.json");
  CHECK(child_status([&] {
          const ScanReport report = scan(tmp.path, Verify::full);
          if (report.entries.size() != 2 || report.entries[0].status != Status::corrupt ||
              report.entries[0].reason.find("FIFO") == std::string::npos)
            return 1;
          return report.newest_valid() && report.newest_valid()->step == 1 ? 0 : 2;
        }) == 0);
}

TEST_CASE("scan ignores a FIFO latest pointer", "[ckpt][fifo]") {
  TempDir tmp;
  save_step(tmp.path, 1);
  replace_with_fifo(tmp.path / "latest");
  CHECK(child_status([&] {
          const ScanReport report = scan(tmp.path);
          return report.latest.empty() && report.newest_valid() && report.newest_valid()->step == 1
                     ? 0
                     : 1;
        }) == 0);
}

TEST_CASE("open names a shard that is a FIFO as not a regular file", "[ckpt][fifo]") {
  TempDir tmp;
  const fs::path step = save_step(tmp.path, 1);
  replace_with_fifo(step / "rank_0.bin");
  CHECK(child_status([&] {
          return refused_naming([&] { CheckpointReader::open(step); },
                                {"rank_0.bin", "FIFO", "not a regular file"});
        }) == 0);
}

TEST_CASE("a shard replaced by a FIFO after open makes verify and read fail at once",
          "[ckpt][fifo]") {
  TempDir tmp;
  const fs::path step = save_step(tmp.path, 1);
  CHECK(child_status([&] {
          const CheckpointReader reader = CheckpointReader::open(step);
          replace_with_fifo(step / "rank_0.bin");
          std::vector<float> values(48);
          const int read = refused_naming(
              [&] { reader.read("model/w", DType::f32, values.data()); }, {"rank_0.bin", "FIFO"});
          const int verify = refused_naming([&] { reader.verify(); }, {"rank_0.bin", "FIFO"});
          return read * 10 + verify;
        }) == 0);
}

TEST_CASE("a FIFO shard index makes rank 0's collect fail at once, naming it", "[ckpt][fifo]") {
  TempDir tmp;
  REQUIRE(::mkfifo((tmp.path / "rank_0.index.json").c_str(), 0644) == 0);
  CHECK(child_status([&] {
          return refused_naming(
              [&] { collect_shard_indices(tmp.path, 1, 1, std::chrono::milliseconds(60000)); },
              {"rank_0.index.json", "FIFO"});
        }) == 0);
}

TEST_CASE("a FIFO shard error report makes rank 0's collect fail at once", "[ckpt][fifo]") {
  TempDir tmp;
  REQUIRE(::mkfifo((tmp.path / "rank_0.error").c_str(), 0644) == 0);
  CHECK(child_status([&] {
          return refused_naming(
              [&] { collect_shard_indices(tmp.path, 1, 1, std::chrono::milliseconds(60000)); },
              {"rank 0 could not write its shard", "FIFO"});
        }) == 0);
}
