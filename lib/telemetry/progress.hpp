// Progress: the one-line training progress report on stderr.
//
// On a terminal (mode automatic, out is a tty) it is a live line redrawn in place with '\r',
// at most 10 redraws per second (a fast CPU run would otherwise spend its time printing), with a
// short bar, step/total, loss, lr, tokens/s, ms/step and ETA; finish() ends it with a newline.
// Elsewhere (a log file, Slurm output, mode plain) it prints one plain line every `every_steps`
// steps and for the last step, e.g.
//   step 10/200 | loss 3.1234 | lr 1.00e-03 | 12,345 tok/s | 45.6 ms/step | ETA 0:00:09
// followed by " | name value" for each extra. ETA = remaining steps x an exponential moving
// average of step_ms (alpha 0.1), so one slow step (a checkpoint save) does not swing it.
// Not thread-safe; owned by the reporting rank.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace trainctl::telemetry {

enum class ProgressMode {
  automatic,  // live line on a terminal, plain lines elsewhere
  plain,      // plain lines always
  none,       // no progress lines (message() still prints)
};

struct StepInfo {
  std::int64_t step = 0;    // 1-based: the step that just finished
  double loss = 0;          // printed with 4 decimals
  double lr = 0;            // printed as 1.00e-03
  double tokens_per_s = 0;  // printed rounded with thousands separators
  double step_ms = 0;       // wall time of this step; feeds the ETA
  // Printed after the ETA when known: " | MFU 41.2% | mem 36.2 MiB | elapsed 0:01:05".
  std::optional<double> mfu;                  // model FLOPs utilisation, a fraction
  std::optional<std::uint64_t> memory_bytes;  // the rank's peak memory
  std::optional<double> elapsed_s;            // wall time since the run (this attempt) started
  std::vector<std::pair<std::string, double>>
      extras;  // e.g. {"grad_norm", 0.98}: " | grad_norm 0.98"
};

class Progress {
 public:
  // Seconds on a monotonic clock; injectable so tests can drive the redraw rate limit.
  using Clock = std::function<double()>;

  // total_steps >= 1 and every_steps >= 1, else std::invalid_argument. `terminal` overrides the
  // isatty(out) check (tests force it on or off; nullopt asks the OS). `out` is not owned.
  Progress(std::int64_t total_steps, ProgressMode mode, std::FILE* out = stderr,
           std::int64_t every_steps = 10, std::optional<bool> terminal = std::nullopt);
  ~Progress();  // calls finish()
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void set_clock(Clock clock) { clock_ = std::move(clock); }

  // Reports a finished step. Throws std::invalid_argument if step is outside 1..total_steps.
  void update(const StepInfo& info);

  // Prints `text` on a line of its own; a live line is cleared first and redrawn after it.
  void message(std::string_view text);

  // Ends a live line with a newline, drawing the latest state if the rate limit skipped it.
  // Idempotent; later update() calls start a new live line.
  void finish();

  bool live() const { return live_; }  // true when drawing the live '\r' line

  // The plain-line text for `info` (no newline), exposed for tests and logs.
  std::string plain_line(const StepInfo& info) const;

 private:
  std::string live_line(const StepInfo& info) const;
  double eta_seconds(std::int64_t step) const;
  void draw_live();
  void write(std::string_view text);

  std::int64_t total_steps_;
  ProgressMode mode_;
  std::FILE* out_;
  std::int64_t every_steps_;
  bool live_ = false;
  Clock clock_;
  std::optional<double> step_ms_average_;  // exponential moving average of step_ms
  std::optional<StepInfo> latest_;         // last update(), for redraws
  bool line_open_ = false;                 // a live line is on screen without its newline
  bool latest_drawn_ = false;
  std::optional<double> last_draw_s_;
};

}  // namespace trainctl::telemetry
