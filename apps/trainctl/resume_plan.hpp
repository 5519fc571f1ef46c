// Choosing the checkpoint to continue from, shared by `resume` and `run` with
// checkpoint.resume: auto.
#pragma once

#include <string>

#include "session.hpp"

namespace trainctl::app {

// Scans input.run_dir/checkpoints, picks the newest valid checkpoint, says which and why newer
// ones were skipped (those are moved to checkpoints/rejected/ so a later save of the same step
// cannot collide with them, and are never read), and trains from it. With no valid checkpoint it
// refuses (exit 2) listing what it found; a run that already reached training.steps is reported
// done (exit 0).
int resume_session(SessionInput input, const std::string& command);

}  // namespace trainctl::app
