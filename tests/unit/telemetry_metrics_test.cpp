// MetricsWriter: metrics.jsonl lines parse back, non-finite numbers become null, lines are on
// disk as soon as write() returns, and a reopened file is appended to.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "telemetry/metrics_writer.hpp"

namespace fs = std::filesystem;
using trainctl::telemetry::MetricsWriter;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path dir =
      fs::path(TRAINCTL_BINARY_DIR) / "test-tmp" / (name + "." + std::to_string(getpid()));
  fs::remove_all(dir);
  return dir;
}

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

}  // namespace

TEST_CASE("metrics.jsonl holds one parseable object per line, flushed at once") {
  const fs::path dir = fresh_dir("metrics_lines");
  const fs::path path = dir / "run" / "metrics.jsonl";
  MetricsWriter writer(path);
  writer.write({{"step", 1}, {"loss", 3.25}, {"lr", 1e-3}});
  writer.write({{"step", 2}, {"loss", 3.0}, {"note", "line\nbreak"}});
  // Still open: every finished line must already be in the file.
  const std::vector<std::string> lines = read_lines(path);
  REQUIRE(lines.size() == 2);
  const auto first = nlohmann::json::parse(lines[0]);
  CHECK(first["step"] == 1);
  CHECK(first["loss"].get<double>() == 3.25);
  CHECK(first["lr"].get<double>() == 1e-3);
  CHECK(nlohmann::json::parse(lines[1])["note"] == "line\nbreak");
  fs::remove_all(dir);
}

TEST_CASE("metrics.jsonl writes NaN and infinities as null") {
  const fs::path dir = fresh_dir("metrics_nan");
  MetricsWriter writer(dir / "metrics.jsonl");
  writer.write({{"loss", std::nan("")},
                {"grad_norm", std::numeric_limits<double>::infinity()},
                {"scale", -std::numeric_limits<float>::infinity()},
                {"nested", {{"values", {1.0, std::nan("")}}}}});
  const std::vector<std::string> lines = read_lines(dir / "metrics.jsonl");
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("NaN") == std::string::npos);
  CHECK(lines[0].find("nan") == std::string::npos);
  CHECK(lines[0].find("inf") == std::string::npos);
  const auto parsed = nlohmann::json::parse(lines[0]);
  CHECK(parsed["loss"].is_null());
  CHECK(parsed["grad_norm"].is_null());
  CHECK(parsed["scale"].is_null());
  CHECK(parsed["nested"]["values"][0].get<double>() == 1.0);
  CHECK(parsed["nested"]["values"][1].is_null());
  fs::remove_all(dir);
}

TEST_CASE("metrics.jsonl is appended to when reopened (a resumed run)") {
  const fs::path dir = fresh_dir("metrics_append");
  { MetricsWriter(dir / "metrics.jsonl").write({{"step", 1}}); }
  { MetricsWriter(dir / "metrics.jsonl").write({{"step", 2}}); }
  const std::vector<std::string> lines = read_lines(dir / "metrics.jsonl");
  REQUIRE(lines.size() == 2);
  CHECK(nlohmann::json::parse(lines[1])["step"] == 2);
  fs::remove_all(dir);
}

TEST_CASE("metrics records must be objects; bad paths are named") {
  const fs::path dir = fresh_dir("metrics_errors");
  MetricsWriter writer(dir / "metrics.jsonl");
  CHECK_THROWS_WITH(writer.write(nlohmann::json::array({1, 2})), Catch::Contains("JSON object"));
  CHECK_THROWS_WITH(writer.write(3.5), Catch::Contains("JSON object"));
  // Invalid UTF-8 must not throw mid-run: it is replaced.
  writer.write({{"text", std::string("bad \xff byte")}});
  CHECK(read_lines(dir / "metrics.jsonl").size() == 1);

  const fs::path blocker = dir / "a_file";
  std::ofstream(blocker) << "x";
  CHECK_THROWS_WITH(MetricsWriter(blocker / "metrics.jsonl"), Catch::Contains(blocker.string()));
  fs::remove_all(dir);
}
