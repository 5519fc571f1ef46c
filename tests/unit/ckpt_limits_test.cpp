// Inputs that would cost too much: an oversized manifest is refused before it is parsed, the
// tiling check stays O(n log n) on layouts that made the old sweep quadratic, and a failed
// atomic rewrite leaves the old file and no temporary file behind.
#include <csignal>

#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <string_view>

#include "ckpt/file_io.hpp"
#include "ckpt_test_child.hpp"
#include "ckpt_test_util.hpp"

using namespace trainctl::ckpt;
using namespace ckpt_test;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

#if defined(__SANITIZE_ADDRESS__)
constexpr double kFastSeconds = 5.0;  // the sanitized build (tests/asan) is several times slower
#else
constexpr double kFastSeconds = 1.0;
#endif

// JSON of `bytes` bytes (more than kMaxManifestBytes) that would cost ~37 bytes of memory per
// byte as an nlohmann::json tree: an array of empty objects.
std::string expensive_json(size_t bytes) {
  std::string text = "{\"format\":\"trainctl-checkpoint\",\"version\":1,\"state\":[{}";
  text.reserve(bytes + 8);
  while (text.size() < bytes)
    text += ",{}";
  return text + "]}";
}

// The staircase tiling of an [n, n] f32 tensor: row strips [i,i+1) x [i,n) and column strips
// [j+1,n) x [j,j+1), 2n - 1 slices. Valid, and quadratic for a sweep along either dimension:
// every column strip stays active to the last row.
Manifest staircase(int64_t n) {
  Manifest m;
  TensorEntry t{"model/w", DType::f32, {n, n}, {}};
  uint64_t offset = kShardHeaderBytes;
  auto add = [&](Range rows, Range cols) {
    const uint64_t length = static_cast<uint64_t>(rows.size() * cols.size()) * 4;
    t.slices.push_back(SliceRecord{"rank_0.bin", offset, length, {rows, cols}, 0});
    offset += length;
  };
  for (int64_t i = 0; i < n; ++i)
    add({i, i + 1}, {i, n});
  for (int64_t j = 0; j + 1 < n; ++j)
    add({j + 1, n}, {j, j + 1});
  m.tensors.push_back(std::move(t));
  m.files["rank_0.bin"] = FileEntry{offset, 0};
  return m;
}

// Appends a slice of `m`'s only tensor at the end of its file.
void add_slice(Manifest& m, Range rows, Range cols) {
  FileEntry& file = m.files["rank_0.bin"];
  const uint64_t length = static_cast<uint64_t>(rows.size() * cols.size()) * 4;
  m.tensors[0].slices.push_back(SliceRecord{"rank_0.bin", file.bytes, length, {rows, cols}, 0});
  file.bytes += length;
}

std::string validation_error(const Manifest& m) {
  try {
    validate_manifest(m, "manifest.json");
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

namespace {

// In the child: 0 when `action` throws a CheckpointError containing `expected` within
// kFastSeconds and with under 32 MiB of peak-memory growth; 1 no error, 2 another message, 3 too
// slow, 4 too much memory.
int refused_cheaply(const std::function<void()>& action, std::string_view expected) {
  const long rss_before = peak_rss_bytes();
  const auto start = std::chrono::steady_clock::now();
  try {
    action();
    return 1;
  } catch (const CheckpointError& e) {
    if (std::string(e.what()).find(expected) == std::string::npos) return 2;
  }
  if (seconds_since(start) > kFastSeconds) return 3;
  return peak_rss_bytes() - rss_before < (long{32} << 20) ? 0 : 4;
}

}  // namespace

TEST_CASE("open refuses a manifest over the size limit before reading it", "[ckpt][limits]") {
  TempDir tmp;
  SaveRequest r = simple_request(1);
  const fs::path step = save(tmp.path, r.header, r.slices()).path;
  write_text(step / "manifest.json", expensive_json(kMaxManifestBytes + 4096));
  CHECK(child_status([&] {
          return refused_cheaply([&] { CheckpointReader::open(step); }, "more than the 16777216");
        }) == 0);
}

TEST_CASE("parse_manifest refuses text over the size limit before parsing it", "[ckpt][limits]") {
  CHECK(child_status([&] {
          const std::string text = expensive_json(kMaxManifestBytes + 4096);
          return refused_cheaply([&] { parse_manifest(text, "manifest.json"); },
                                 "a manifest may have");
        }) == 0);
}

TEST_CASE("a staircase tiling of 200k slices validates in well under a second", "[ckpt][limits]") {
  const Manifest m = staircase(100000);
  REQUIRE(m.tensors[0].slices.size() == 199999);
  const auto start = std::chrono::steady_clock::now();
  CHECK(validation_error(m) == "accepted");
  CHECK(seconds_since(start) < kFastSeconds);
}

TEST_CASE("one element covered twice among 200k slices is refused quickly, naming both",
          "[ckpt][limits]") {
  Manifest m = staircase(100000);
  add_slice(m, {50000, 50001}, {50000, 50001});
  const auto start = std::chrono::steady_clock::now();
  const std::string error = validation_error(m);
  CHECK(seconds_since(start) < kFastSeconds);
  CHECK_THAT(error, Catch::Contains("tensor 'model/w'") &&
                        Catch::Contains("[[50000,50001),[50000,100000)]") &&
                        Catch::Contains("[[50000,50001),[50000,50001)]") &&
                        Catch::Contains("overlap"));
}

TEST_CASE("a hole before an overlap of equal volume still names the overlapping slices",
          "[ckpt][limits]") {
  Manifest m;
  m.tensors.push_back(TensorEntry{"model/w", DType::f32, {8, 6}, {}});
  m.files["rank_0.bin"] = FileEntry{kShardHeaderBytes, 0};
  add_slice(m, {1, 8}, {0, 6});  // row 0 is missing...
  add_slice(m, {3, 4}, {0, 6});  // ...and row 3 is there twice
  CHECK_THAT(validation_error(m), Catch::Contains("tensor 'model/w': slices [[1,8),[0,6)] and "
                                                  "[[3,4),[0,6)] overlap"));
}

TEST_CASE("a hole is refused with the count of elements covered", "[ckpt][limits]") {
  Manifest m;
  m.tensors.push_back(TensorEntry{"model/w", DType::f32, {8, 6}, {}});
  m.files["rank_0.bin"] = FileEntry{kShardHeaderBytes, 0};
  add_slice(m, {0, 4}, {0, 6});
  add_slice(m, {4, 8}, {0, 5});
  CHECK_THAT(validation_error(m), Catch::Contains("slices cover 44 of its 48 elements"));
}

TEST_CASE("slices split along more dimensions than the tiling check handles are refused",
          "[ckpt][limits]") {
  Manifest m;
  m.tensors.push_back(TensorEntry{"model/w", DType::f32, {2, 2, 2, 2, 2}, {}});
  m.files["rank_0.bin"] = FileEntry{kShardHeaderBytes, 0};
  for (int bits = 0; bits < 32; ++bits) {
    std::vector<Range> index;
    for (int d = 0; d < 5; ++d)
      index.push_back({(bits >> d) & 1, ((bits >> d) & 1) + 1});
    FileEntry& file = m.files["rank_0.bin"];
    m.tensors[0].slices.push_back(SliceRecord{"rank_0.bin", file.bytes, 4, index, 0});
    file.bytes += 4;
  }
  CHECK_THAT(validation_error(m), Catch::Contains("split it along 5 dimensions (at most 4)"));
}

TEST_CASE("a failed atomic rewrite leaves the old file intact and no temporary file",
          "[ckpt][limits]") {
  TempDir tmp;
  const fs::path latest = tmp.path / "latest";
  write_text(latest, "step_00000001\n");
  CHECK(child_status([&] {
          std::signal(SIGXFSZ, SIG_IGN);
          const rlimit limit{4096, 4096};
          ::setrlimit(RLIMIT_FSIZE, &limit);
          try {
            io::write_file_atomically(latest, std::string(64 * 1024, 'x'));
            return 1;
          } catch (const CheckpointError& e) {
            const std::string message = e.what();
            return message.find("EFBIG") != std::string::npos &&
                           message.find("ulimit -f") != std::string::npos
                       ? 0
                       : 2;
          }
        }) == 0);
  CHECK(read_text(latest) == "step_00000001\n");
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(tmp.path))
    names.push_back(entry.path().filename().string());
  CHECK(names == std::vector<std::string>{"latest"});
}
