// The subcommands of trainctl. main.cpp parses the command line with CLI11 into these plain
// structs and calls the matching run_* function; each lives in its own file and never sees CLI11.
// Every run_* returns the process exit code (see "Exit codes" in README.md).
#pragma once

#include <string>
#include <vector>

namespace trainctl::app {

// Exit codes shared by all subcommands (documented in README.md).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;   // a run failed (error message says why)
inline constexpr int kExitBadInput = 2;  // bad recipe, bad --set, bad CLI: nothing was created

struct ValidateOptions {
  std::string recipe_path;
  std::vector<std::string> overrides;  // "a.b=c" from --set
  bool explain = false;                // print the schema table instead of validating
};
int run_validate(const ValidateOptions& options);

struct RunOptions {
  std::string recipe_path;
  std::vector<std::string> overrides;
  std::string run_dir;     // empty: runs/<recipe name>
  bool overwrite = false;  // reuse a run directory that already holds a run
};
int run_run(const RunOptions& options);

struct VersionOptions {};
int run_version(const VersionOptions& options);

}  // namespace trainctl::app
