// The end of a run: summary.json (rank 0), the closing lines, and the whole model's fingerprint.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/backend.hpp"
#include "comm/mesh.hpp"
#include "recipe/recipe.hpp"
#include "run/context.hpp"
#include "run/reporter.hpp"
#include "telemetry/memory_report.hpp"

namespace trainctl::run {

// The recipe's layout as it goes into checkpoints and summary.json.
nlohmann::json layout_json(const recipe::Recipe& recipe);

// A fingerprint of the whole model's parameter values, the same whatever the layout that holds
// them: the sum (mod 2^64) over every element of every logical tensor of a 64-bit mix of the
// tensor's name, the element's global index and its stored bits. Every rank adds the elements it
// is the designated writer of in a checkpoint (train::SaveRole: each element once across the
// job), and the ranks add their sums (a collective: every rank calls it). Two runs with the same
// weights give the same 16 hex digits, on one rank or any layout; a changed bit changes it.
std::string weights_fingerprint(RunContext& run);

// The rank's memory by category: its parameter store (values, gradients, optimizer state) and
// its activation arena, planned up front, so the peak from the first step on.
telemetry::MemoryReport memory_report(RunContext& run);
// What `trainctl plan`'s memory model predicts for this rank of this layout (planner::
// estimate_rank_memory), in the same categories.
telemetry::MemoryReport planned_memory(RunContext& run);

// What a finished run reports: summary.json (rank 0, atomically), the "done: ..." line and the
// memory by category, through `report`. `seconds` is the training time.
void write_summary(const SessionInput& input, RunContext& run, StepReporter& report,
                   double seconds);

}  // namespace trainctl::run
