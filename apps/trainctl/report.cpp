// `trainctl report RUN_DIR`: the picture of a run (lib/telemetry/run_report.hpp) from what the run
// wrote, as RUN_DIR/report.html (or --out). Reads metrics.jsonl (required), summary.json and the
// checkpoints (when there), so it works on a finished run and on one still training.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "ckpt/ckpt.hpp"
#include "commands.hpp"
#include "files/files.hpp"
#include "telemetry/memory_report.hpp"
#include "telemetry/run_report.hpp"

namespace fs = std::filesystem;

namespace trainctl::app {
namespace {

constexpr const char* kCommand = "report";

// The run's name: recipe.yaml's `name:` line (the resolved dump quotes it), else the folder's.
std::string run_name(const fs::path& run_dir) {
  std::ifstream recipe(run_dir / "recipe.yaml");
  const std::regex name_line(R"re(^name: "?([^"]*)"?$)re");
  std::smatch match;
  for (std::string line; std::getline(recipe, line);)
    if (std::regex_match(line, match, name_line)) return match[1];
  return fs::absolute(run_dir).lexically_normal().filename().string();
}

}  // namespace

int run_report(const ReportOptions& options) {
  const fs::path run_dir = options.run_dir;
  const fs::path metrics_path = run_dir / "metrics.jsonl";
  std::error_code error;
  if (!fs::is_regular_file(metrics_path, error))
    return bad_input(kCommand, fmt::format("{}: no metrics.jsonl; give the run directory of a "
                                           "run (trainctl run writes it after the first step)",
                                           run_dir.string()));
  telemetry::RunReportData data;
  data.name = run_name(run_dir);
  std::ifstream metrics(metrics_path);
  if (!metrics)
    return bad_input(kCommand, fmt::format("{}: cannot be read", metrics_path.string()));
  int line_number = 0;
  for (std::string line; std::getline(metrics, line);) {
    ++line_number;
    if (line.empty()) continue;
    // A run still training may be halfway through appending its newest line: not yet a record.
    if (metrics.eof()) break;
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("step") || !record["step"].is_number())
      return bad_input(kCommand, fmt::format("{}:{}: not a metrics record (a JSON object with a "
                                             "step); was the file edited by hand?",
                                             metrics_path.string(), line_number));
    const double step = record["step"].get<double>();
    auto add = [&](const char* key, std::vector<telemetry::ReportPoint>& to) {
      if (record.contains(key) && record[key].is_number())
        to.push_back({step, record[key].get<double>()});
    };
    add("loss", data.loss);
    add("val_loss", data.val_loss);
    add("lr", data.lr);
    add("tokens_per_s", data.tokens_per_s);
    add("mfu", data.mfu);
  }
  nlohmann::json summary;
  if (fs::is_regular_file(run_dir / "summary.json", error)) {
    try {
      summary = nlohmann::json::parse(
          files::read_regular_file(run_dir / "summary.json", uint64_t{1} << 20, "summary"), nullptr,
          /*allow_exceptions=*/false);
    } catch (const std::exception& e) {
      return bad_input(kCommand, e.what());
    }
  }
  if (summary.is_object()) {
    // In the summary's own order of categories (telemetry::MemoryReport), not JSON's sorted one.
    const nlohmann::json& memory = summary.value("memory_bytes", nlohmann::json::object());
    for (const auto& [category, _] : telemetry::MemoryReport{}.categories())
      if (memory.is_object() && memory.contains(category) && memory[category].is_number_unsigned())
        data.memory.emplace_back(std::string(category), memory[category].get<uint64_t>());
    if (summary.contains("final_loss") && summary["final_loss"].is_number())
      data.final_loss = summary["final_loss"].get<double>();
    if (summary.contains("final_val_loss") && summary["final_val_loss"].is_number())
      data.final_val_loss = summary["final_val_loss"].get<double>();
    if (summary.contains("seconds") && summary["seconds"].is_number())
      data.seconds = summary["seconds"].get<double>();
  }
  for (const ckpt::ScanEntry& entry : ckpt::scan(run_dir / "checkpoints").entries)
    if (entry.status == ckpt::Status::valid) data.checkpoints.push_back(entry.step);

  const fs::path out = options.out.empty() ? run_dir / "report.html" : fs::path(options.out);
  try {
    files::write_file_atomically(out, telemetry::render_run_report(data));
  } catch (const std::exception& e) {
    fmt::print(stderr, "trainctl {}: error: {}\n", kCommand, e.what());
    return kExitFailure;
  }
  fmt::print("report: {} ({} steps, {} checkpoints)\n", out.string(), data.loss.size(),
             data.checkpoints.size());
  return kExitOk;
}

}  // namespace trainctl::app
