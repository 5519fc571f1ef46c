// Graceful stop on SIGTERM, SIGUSR1 (Slurm's preemption and time-limit warnings) and SIGINT
// (Ctrl-C): the handler only records the signal; the training loop finishes its step, saves a
// checkpoint and exits with kExitSavedOnSignal. A second SIGINT stops at once (the default
// action), for a user who does not want to wait for the save.
#pragma once

namespace trainctl::launch {

class StopSignals {
 public:
  // Installs the handlers; the destructor restores the previous ones. One instance at a time.
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  bool requested() const;
  int signal() const;        // the first signal received, 0 if none
  const char* name() const;  // "SIGTERM", ... or "" if none
};

}  // namespace trainctl::launch
