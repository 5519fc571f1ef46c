// `trainctl report RUN_DIR`: the picture of a run (lib/run/report.hpp) from what the run wrote, as
// RUN_DIR/report.html (or --out). A run writes the same page at its end; this redraws it at any
// time, also while the run is training.
#include <fmt/core.h>

#include "commands.hpp"
#include "files/files.hpp"
#include "run/report.hpp"

namespace trainctl::app {
namespace {

constexpr const char* kCommand = "report";

}  // namespace

int run_report(const ReportOptions& options) {
  try {
    const run::WrittenReport written = run::write_run_report(options.run_dir, options.out);
    fmt::print("report: {} ({} steps, {} checkpoints)\n", written.path.string(), written.steps,
               written.checkpoints);
    return kExitOk;
  } catch (const run::ReportInputError& e) {
    return bad_input(kCommand, e.what());
  } catch (const files::FileError& e) {
    fmt::print(stderr, "trainctl {}: error: {}\n", kCommand, e.what());
    return kExitFailure;
  }
}

}  // namespace trainctl::app
