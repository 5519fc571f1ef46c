#include "run/report.hpp"

#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <regex>

#include "ckpt/ckpt.hpp"
#include "files/files.hpp"
#include "telemetry/memory_report.hpp"

namespace fs = std::filesystem;

namespace trainctl::run {
namespace {

// The run's name: recipe.yaml's `name:` line (the resolved dump quotes it), else the folder's.
std::string run_name(const fs::path& run_dir) {
  std::ifstream recipe(run_dir / "recipe.yaml");
  const std::regex name_line(R"re(^name: "?([^"]*)"?$)re");
  std::smatch match;
  for (std::string line; std::getline(recipe, line);)
    if (std::regex_match(line, match, name_line)) return match[1];
  return fs::absolute(run_dir).lexically_normal().filename().string();
}

void read_metrics(const fs::path& metrics_path, telemetry::RunReportData& data) {
  std::error_code error;
  if (!fs::is_regular_file(metrics_path, error))
    throw ReportInputError(
        fmt::format("{}: no metrics.jsonl; give the run directory of a run "
                    "(trainctl run writes it after the first step)",
                    metrics_path.parent_path().string()));
  std::ifstream metrics(metrics_path);
  if (!metrics) throw ReportInputError(fmt::format("{}: cannot be read", metrics_path.string()));
  int line_number = 0;
  for (std::string line; std::getline(metrics, line);) {
    ++line_number;
    if (line.empty()) continue;
    // A run still training may be halfway through appending its newest line: not yet a record.
    if (metrics.eof()) break;
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("step") || !record["step"].is_number())
      throw ReportInputError(
          fmt::format("{}:{}: not a metrics record (a JSON object with a "
                      "step); was the file edited by hand?",
                      metrics_path.string(), line_number));
    if (record.contains("event")) continue;  // the stability guard's record, not a step's
    const double step = record["step"].get<double>();
    // A step at or before one already drawn: a rollback trained the steps after its snapshot
    // again, and the later records replace the earlier ones.
    auto add = [&](const char* key, std::vector<telemetry::ReportPoint>& to) {
      while (!to.empty() && to.back().step >= step)
        to.pop_back();
      if (record.contains(key) && record[key].is_number())
        to.push_back({step, record[key].get<double>()});
    };
    add("loss", data.loss);
    add("val_loss", data.val_loss);
    add("lr", data.lr);
    add("tokens_per_s", data.tokens_per_s);
    add("mfu", data.mfu);
  }
}

void read_summary(const fs::path& summary_path, telemetry::RunReportData& data) {
  std::error_code error;
  if (!fs::is_regular_file(summary_path, error)) return;
  nlohmann::json summary;
  try {
    summary = nlohmann::json::parse(
        files::read_regular_file(summary_path, uint64_t{1} << 20, "summary"), nullptr,
        /*allow_exceptions=*/false);
  } catch (const std::exception& e) {
    throw ReportInputError(e.what());
  }
  if (!summary.is_object()) return;
  // In the summary's own order of categories (telemetry::MemoryReport), not JSON's sorted one.
  const nlohmann::json& memory = summary.value("memory_bytes", nlohmann::json::object());
  for (const auto& [category, _] : telemetry::MemoryReport{}.categories())
    if (memory.is_object() && memory.contains(category) && memory[category].is_number_unsigned())
      data.memory.emplace_back(std::string(category), memory[category].get<uint64_t>());
  auto number = [&](const char* key, std::optional<double>& to) {
    if (summary.contains(key) && summary[key].is_number()) to = summary[key].get<double>();
  };
  number("final_loss", data.final_loss);
  number("final_val_loss", data.final_val_loss);
  number("seconds", data.seconds);
}

}  // namespace

telemetry::RunReportData read_run_report(const fs::path& run_dir) {
  telemetry::RunReportData data;
  data.name = run_name(run_dir);
  read_metrics(run_dir / "metrics.jsonl", data);
  read_summary(run_dir / "summary.json", data);
  for (const ckpt::ScanEntry& entry : ckpt::scan(run_dir / "checkpoints").entries)
    if (entry.status == ckpt::Status::valid) data.checkpoints.push_back(entry.step);
  return data;
}

WrittenReport write_run_report(const fs::path& run_dir, const fs::path& out) {
  const telemetry::RunReportData data = read_run_report(run_dir);
  WrittenReport written{out.empty() ? run_dir / "report.html" : out, data.loss.size(),
                        data.checkpoints.size()};
  files::write_file_atomically(written.path, telemetry::render_run_report(data));
  return written;
}

}  // namespace trainctl::run
