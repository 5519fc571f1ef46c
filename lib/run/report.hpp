// The run report (telemetry/run_report.hpp) of a run directory: read from what the run wrote
// (metrics.jsonl, required; summary.json and the checkpoints when there) and written as
// report.html. A run writes it at its end (session.cpp); `trainctl report RUN_DIR` at any time,
// also while the run is training.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>

#include "telemetry/run_report.hpp"

namespace trainctl::run {

// The run directory cannot be drawn: no metrics.jsonl, or a line of it that is not a record. The
// message names the file (and line) and what to do: a bad input, exit 2.
struct ReportInputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Reads what `run_dir` holds. A last line without its newline is a record still being appended
// and is left out.
telemetry::RunReportData read_run_report(const std::filesystem::path& run_dir);

struct WrittenReport {
  std::filesystem::path path;
  size_t steps = 0, checkpoints = 0;
};

// Draws `run_dir` into `out` (empty: run_dir/report.html), replaced atomically. Throws
// ReportInputError, or files::FileError when the page cannot be written.
WrittenReport write_run_report(const std::filesystem::path& run_dir,
                               const std::filesystem::path& out = {});

}  // namespace trainctl::run
