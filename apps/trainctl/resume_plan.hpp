// Choosing the checkpoint to continue from, shared by `resume` and `run` with
// checkpoint.resume: auto.
#pragma once

#include <string>

#include "session.hpp"

namespace trainctl::app {

// The cheap checks of a resume, before the data is read (check_session_input) and before anything
// is created: the checkpoints `report` (a scan of input.run_dir/checkpoints) holds at least one
// entry, and training.steps is not below the newest valid one's step. Returns -1, or exit code 2
// after printing the problem.
int check_resume_input(const SessionInput& input, const std::string& command,
                       const ckpt::ScanReport& report);

// Takes the run directory's lock, scans input.run_dir/checkpoints again and trains from the newest
// checkpoint that loads intact (see SessionInput::resume_candidates). With no checkpoint at all, or
// none intact, it refuses (exit 2) listing what it found and changes nothing; a run that already
// reached training.steps is reported done (exit 0).
int resume_session(SessionInput input, const std::string& command);

}  // namespace trainctl::app
