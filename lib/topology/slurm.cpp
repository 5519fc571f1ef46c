// Nodes and GPUs per node from the environment Slurm gives a job's processes.
#include <charconv>

#include <fmt/format.h>

#include "topology/probes.hpp"

namespace trainctl::topology {
namespace {

std::optional<int> parse_count(std::string_view text) {
  int x = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), x);
  if (ec != std::errc{} || ptr != text.data() + text.size() || x < 0) return std::nullopt;
  return x;
}

}  // namespace

SlurmReport probe_slurm(const std::function<const char*(const char*)>& getenv) {
  SlurmReport report;
  auto value = [&](const char* name) -> std::string_view {
    const char* v = getenv(name);
    return v ? std::string_view(v) : std::string_view{};
  };
  report.in_job = !value("SLURM_JOB_ID").empty() || !value("SLURM_JOB_NUM_NODES").empty();
  if (!report.in_job) return report;

  // Reads NAME as a count; `text` is what to parse (a suffix of the value for "h100:8").
  auto read = [&](const char* name, std::string_view text, int& out) {
    if (text.empty()) return false;
    if (auto x = parse_count(text)) {
      out = *x;
      return true;
    }
    report.problems.push_back(
        fmt::format("{}='{}' is not a count (ignored)", name, std::string(value(name))));
    return false;
  };
  read("SLURM_JOB_NUM_NODES", value("SLURM_JOB_NUM_NODES"), report.nodes);
  if (!read("SLURM_GPUS_ON_NODE", value("SLURM_GPUS_ON_NODE"), report.gpus_per_node)) {
    // "8", "h100:8" or "gpu:h100:8": the count is after the last colon.
    std::string_view per_node = value("SLURM_GPUS_PER_NODE");
    if (auto colon = per_node.rfind(':'); colon != std::string_view::npos)
      per_node = per_node.substr(colon + 1);
    read("SLURM_GPUS_PER_NODE", per_node, report.gpus_per_node);
  }
  // "8" or, when the count differs between nodes, "8(x2)": the leading number.
  std::string_view tasks = value("SLURM_NTASKS_PER_NODE");
  tasks = tasks.substr(0, tasks.find('('));
  read("SLURM_NTASKS_PER_NODE", tasks, report.tasks_per_node);
  return report;
}

}  // namespace trainctl::topology
