// What `trainctl ckpt` and `trainctl lineage` accept as a checkpoint: a step directory (or its
// manifest.json), a checkpoints directory or a run directory (then the newest valid checkpoint of
// its checkpoints/).
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <stdexcept>
#include <string>

namespace trainctl::app {

// A problem with what the user typed: exit code 2.
class BadInput : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr const char* kCheckpointPathHelp =
    "give a step directory (run/checkpoints/step_00000050), a checkpoints directory or a run "
    "directory";

struct CheckpointTarget {
  bool single_step = false;  // dir is one step directory; else a checkpoints directory
  std::filesystem::path dir;
};

// What `path` names; BadInput when it does not exist, is not a directory or holds no checkpoint.
CheckpointTarget resolve_checkpoint_path(const std::string& path);

// The step directory to read: the given one, or the newest valid one (printing to stderr which,
// and why newer ones were skipped; `why`, when given, receives the same as JSON).
// ckpt::CheckpointError when a checkpoints directory holds no valid checkpoint.
std::filesystem::path select_step(const CheckpointTarget& target, nlohmann::json* why = nullptr);

}  // namespace trainctl::app
