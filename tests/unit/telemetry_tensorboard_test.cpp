// TensorBoardWriter: the file it writes parses back record by record, and the real TensorBoard
// reader (EventAccumulator, via tests/python/read_tensorboard.py) loads every scalar exactly.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "telemetry/tensorboard_writer.hpp"
#include "telemetry/tfrecord.hpp"

namespace fs = std::filesystem;
using namespace trainctl::telemetry;

namespace {

// A fresh empty directory under the build tree, removed at the end of the test.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::path(TRAINCTL_BINARY_DIR) / "test-tmp" / (name + "." + std::to_string(getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::uint64_t little_endian(const std::string& bytes, std::size_t offset, std::size_t size) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < size; ++i) {
    value |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
  }
  return value;
}

// Splits a TFRecord file into payloads, checking both CRCs of every record.
std::vector<std::string> read_records(const std::string& file) {
  std::vector<std::string> payloads;
  std::size_t offset = 0;
  while (offset < file.size()) {
    REQUIRE(offset + 12 <= file.size());
    const std::uint64_t length = little_endian(file, offset, 8);
    CHECK(little_endian(file, offset + 8, 4) == masked_crc32c(file.substr(offset, 8)));
    REQUIRE(offset + 16 + length <= file.size());
    const std::string payload = file.substr(offset + 12, length);
    CHECK(little_endian(file, offset + 12 + length, 4) == masked_crc32c(payload));
    payloads.push_back(payload);
    offset += 16 + length;
  }
  return payloads;
}

std::string shell_quote(const std::string& text) {
  std::string out = "'";
  for (const char c : text)
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

TEST_CASE("TensorBoardWriter names the file events.out.tfevents.<secs>.<host>.<pid>.0") {
  TempDir dir("tb_name");
  fs::path first_path;
  {
    TensorBoardWriter writer(dir.path / "nested");
    first_path = writer.path();
    // A second writer in the same process and second must not clobber the first file.
    TensorBoardWriter second(dir.path / "nested");
    CHECK(second.path() != first_path);
  }
  const std::string name = first_path.filename().string();
  const std::regex pattern(R"(events\.out\.tfevents\.(\d+)\.([^.].*)\.(\d+)\.0)");
  std::smatch match;
  REQUIRE(std::regex_match(name, match, pattern));
  CHECK(match[3].str() == std::to_string(getpid()));
  CHECK(fs::exists(first_path));
}

TEST_CASE("TensorBoardWriter writes file_version first, then one event per add call") {
  TempDir dir("tb_records");
  fs::path path;
  {
    TensorBoardWriter writer(dir.path);
    path = writer.path();
    writer.add_scalar("loss", 1, 2.5);
    writer.add_scalars(2, {{"loss", 2.0}, {"lr", 1e-3}});
    writer.flush();
    // Flushed: the records are on disk before the writer is destroyed.
    CHECK(read_records(read_file(path)).size() == 3);
  }
  const std::vector<std::string> records = read_records(read_file(path));
  REQUIRE(records.size() == 3);
  CHECK(records[0].substr(9) == std::string("\x1a\x0d") + "brain.Event:2");
  CHECK(records[1].find("loss") != std::string::npos);
  CHECK(records[2].find("lr") != std::string::npos);
}

TEST_CASE("TensorBoardWriter names the path it cannot create") {
  TempDir dir("tb_error");
  const fs::path blocker = dir.path / "a_file";
  std::ofstream(blocker) << "not a directory";
  CHECK_THROWS_WITH(TensorBoardWriter(blocker / "logs"), Catch::Contains(blocker.string()));
}

TEST_CASE("TensorBoard's own reader loads every scalar and step exactly") {
  const std::string python = TRAINCTL_TEST_PYTHON;
  const fs::path script = fs::path(TRAINCTL_SOURCE_DIR) / "tests/python/read_tensorboard.py";
  if (python.empty() || !fs::exists(python)) {
    FAIL("no test Python at '" << python
                               << "' (TRAINCTL_TEST_PYTHON): run scripts/setup --tests to create "
                                  ".venv with tensorboard, then reconfigure");
  }
  TempDir dir("tb_reader");
  struct Expected {
    std::string tag;
    std::int64_t step;
    double value;
  };
  std::vector<Expected> expected;
  {
    TensorBoardWriter writer(dir.path);
    for (std::int64_t step = 1; step <= 5; ++step) {
      const double loss = 3.0 / static_cast<double>(step) + 0.1234567;
      const double lr = 1e-3 * static_cast<double>(step) / 3.0;
      const double tokens_per_s = 12345.678 * static_cast<double>(step);
      writer.add_scalars(step, {{"train/loss", loss}, {"train/lr", lr}});
      writer.add_scalar("throughput/tokens_per_s", step, tokens_per_s);
      expected.push_back({"train/loss", step, static_cast<float>(loss)});
      expected.push_back({"train/lr", step, static_cast<float>(lr)});
      expected.push_back({"throughput/tokens_per_s", step, static_cast<float>(tokens_per_s)});
    }
    writer.add_scalar("eval_loss", 100, -0.1);
    expected.push_back({"eval_loss", 100, static_cast<float>(-0.1)});
  }

  const std::string stderr_path = (dir.path.parent_path() / "tb_reader.stderr").string();
  const std::string command = shell_quote(python) + " " + shell_quote(script.string()) + " " +
                              shell_quote(dir.path.string()) + " 2>" + shell_quote(stderr_path);
  std::FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;)
    output.append(buffer, n);
  const int status = pclose(pipe);
  const std::string errors = read_file(stderr_path);
  fs::remove(stderr_path);
  if (status != 0) {
    FAIL("read_tensorboard.py failed (exit code " << WEXITSTATUS(status) << "): " << errors
                                                  << "\nIf tensorboard is missing, run "
                                                     "scripts/setup --tests");
  }

  const nlohmann::json scalars = nlohmann::json::parse(output);
  std::size_t found = 0;
  for (const auto& [tag, events] : scalars.items())
    found += events.size();
  CHECK(found == expected.size());
  for (const Expected& want : expected) {
    INFO("tag " << want.tag << " step " << want.step);
    REQUIRE(scalars.contains(want.tag));
    bool seen = false;
    for (const auto& event : scalars[want.tag]) {
      if (event[0].get<std::int64_t>() != want.step) continue;
      seen = true;
      CHECK(event[1].get<double>() == want.value);  // float32-exact
    }
    CHECK(seen);
  }
}
