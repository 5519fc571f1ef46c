// Choosing the checkpoint to continue from, shared by `resume` and `run` with
// checkpoint.resume: auto.
#pragma once

#include <string>

#include "session.hpp"

namespace trainctl::app {

// Scans input.run_dir/checkpoints and trains from the newest checkpoint that loads intact (see
// SessionInput::resume_candidates). With no checkpoint at all, or none intact, it refuses (exit
// 2) listing what it found and changes nothing; a run that already reached training.steps is
// reported done (exit 0).
int resume_session(SessionInput input, const std::string& command);

}  // namespace trainctl::app
