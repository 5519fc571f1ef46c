// trainctl::telemetry: what a run reports about itself.
//   Progress           the progress line on stderr (live on a terminal, plain lines in logs)
//   MetricsWriter      metrics.jsonl, one JSON object per step, flushed per line
//   TensorBoardWriter  events.out.tfevents.* readable by TensorBoard (hand-written
//   TFRecord/protobuf) MemoryReport       bytes per category (params, grads, optimizer,
//   activations, comm, other) format_bytes, format_duration, format_count, mfu
//   render_run_report  the run's picture: one HTML page of SVG charts (trainctl report)
// Depends only on the standard library, fmt and nlohmann-json.
#pragma once

#include "telemetry/format.hpp"
#include "telemetry/memory_report.hpp"
#include "telemetry/metrics_writer.hpp"
#include "telemetry/progress.hpp"
#include "telemetry/run_report.hpp"
#include "telemetry/tensorboard_writer.hpp"
#include "telemetry/tfrecord.hpp"
