// The picture of a run: one self-contained HTML page (inline SVG, no script, no external file)
// with the loss and validation-loss curves, the learning rate, the throughput (and MFU), the memory
// by category and the checkpoints, drawn from what the run wrote (metrics.jsonl, summary.json,
// checkpoints/). `trainctl report RUN_DIR` writes it as RUN_DIR/report.html.
//
// Every chart's <svg> carries its data ranges as attributes (data-x-min, data-x-max, data-y-min,
// data-y-max: the axes' ends after rounding to readable ticks), so a test can check the axes
// without reading pixels.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace trainctl::telemetry {

struct ReportPoint {
  double step = 0, value = 0;
};

struct RunReportData {
  std::string name;                         // the run's name (the recipe's `name`)
  std::vector<ReportPoint> loss, val_loss;  // per step; val_loss at evaluations only
  std::vector<ReportPoint> lr, tokens_per_s, mfu;
  std::vector<int64_t> checkpoints;                           // steps that have a checkpoint
  std::vector<std::pair<std::string, uint64_t>> memory;       // category, bytes (summary.json)
  std::optional<double> final_loss, final_val_loss, seconds;  // summary.json
};

// Readable axis ends for values in [low, high]: the multiples of a 1/2/5 x 10^k step (the one
// nearest to (high - low) / ticks) just outside them. A flat range is widened so the axis has a
// length.
struct Axis {
  double low = 0, high = 1, step = 1;
};
Axis nice_axis(double low, double high, int ticks = 5);

// The whole page. Charts without data are left out (no val_loss without evaluations, no MFU
// without a known peak, no memory without summary.json).
std::string render_run_report(const RunReportData& data);

}  // namespace trainctl::telemetry
