#include "telemetry/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "telemetry/format.hpp"

namespace trainctl::telemetry {
namespace {

constexpr double kMinRedrawSeconds = 0.1;  // at most 10 redraws per second
constexpr double kAverageAlpha = 0.1;      // weight of the newest step in the step-time average
constexpr int kBarWidth = 20;
constexpr std::string_view kClearToEnd = "\x1b[K";

double monotonic_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string format_tokens_per_s(double tokens_per_s) {
  if (!std::isfinite(tokens_per_s) || tokens_per_s < 0) return "? tok/s";
  return format_count(static_cast<std::uint64_t>(std::llround(tokens_per_s))) + " tok/s";
}

std::string format_extras(const StepInfo& info) {
  std::string out;
  if (info.mfu) out += fmt::format(" | MFU {:.1f}%", 100 * *info.mfu);
  if (info.memory_bytes) out += " | mem " + format_bytes(*info.memory_bytes);
  if (info.elapsed_s) out += " | elapsed " + format_duration(*info.elapsed_s);
  for (const auto& [name, value] : info.extras)
    out += fmt::format(" | {} {:.4g}", name, value);
  return out;
}

}  // namespace

Progress::Progress(std::int64_t total_steps, ProgressMode mode, std::FILE* out,
                   std::int64_t every_steps, std::optional<bool> terminal)
    : total_steps_(total_steps),
      mode_(mode),
      out_(out),
      every_steps_(every_steps),
      clock_(monotonic_seconds) {
  if (total_steps < 1) {
    throw std::invalid_argument(
        fmt::format("progress: total_steps must be at least 1, got {}", total_steps));
  }
  if (every_steps < 1) {
    throw std::invalid_argument(
        fmt::format("progress: every_steps must be at least 1, got {}", every_steps));
  }
  if (out == nullptr) throw std::invalid_argument("progress: output stream is null");
  const bool is_terminal = terminal.value_or(isatty(fileno(out)) == 1);
  live_ = mode == ProgressMode::automatic && is_terminal;
}

Progress::~Progress() {
  try {
    finish();
  } catch (...) {  // a destructor must not throw; the output stream is gone or broken
  }
}

void Progress::update(const StepInfo& info) {
  if (info.step < 1 || info.step > total_steps_) {
    throw std::invalid_argument(
        fmt::format("progress: step {} is outside 1..{}", info.step, total_steps_));
  }
  if (std::isfinite(info.step_ms) && info.step_ms >= 0) {
    step_ms_average_ = step_ms_average_
                           ? kAverageAlpha * info.step_ms + (1 - kAverageAlpha) * *step_ms_average_
                           : info.step_ms;
  }
  latest_ = info;
  latest_drawn_ = false;
  if (mode_ == ProgressMode::none) return;
  if (!live_) {
    if (info.step % every_steps_ == 0 || info.step == total_steps_) {
      write(plain_line(info) + "\n");
    }
    return;
  }
  const double now = clock_();
  const bool due = !last_draw_s_ || now - *last_draw_s_ >= kMinRedrawSeconds;
  if (due || info.step == total_steps_) {
    draw_live();
    last_draw_s_ = now;
  }
}

void Progress::message(std::string_view text) {
  if (line_open_) {
    write(fmt::format("\r{}{}\n", text, kClearToEnd));
    line_open_ = false;
    draw_live();
  } else {
    write(fmt::format("{}\n", text));
  }
}

void Progress::finish() {
  if (!live_ || !latest_) return;
  if (!latest_drawn_) draw_live();
  if (line_open_) write("\n");
  line_open_ = false;
}

std::string Progress::plain_line(const StepInfo& info) const {
  return fmt::format("step {}/{} | loss {:.4f} | lr {:.2e} | {} | {:.1f} ms/step | ETA {}{}",
                     info.step, total_steps_, info.loss, info.lr,
                     format_tokens_per_s(info.tokens_per_s), info.step_ms,
                     format_duration(eta_seconds(info.step)), format_extras(info));
}

std::string Progress::live_line(const StepInfo& info) const {
  const double fraction = static_cast<double>(info.step) / static_cast<double>(total_steps_);
  const int filled = std::clamp(static_cast<int>(fraction * kBarWidth), 0, kBarWidth);
  std::string bar(static_cast<std::size_t>(filled), '=');
  if (filled < kBarWidth) bar += '>';
  bar.resize(kBarWidth, ' ');
  return fmt::format("[{}] {:3.0f}% {}", bar, 100 * fraction, plain_line(info));
}

double Progress::eta_seconds(std::int64_t step) const {
  if (!step_ms_average_) return -1;  // unknown: format_duration prints ?:??:??
  return *step_ms_average_ * static_cast<double>(total_steps_ - step) / 1000.0;
}

void Progress::draw_live() {
  if (!latest_) return;
  write(fmt::format("\r{}{}", live_line(*latest_), kClearToEnd));
  line_open_ = true;
  latest_drawn_ = true;
}

void Progress::write(std::string_view text) {
  // Progress output is best effort: a closed stderr must not stop training, so errors are ignored.
  std::fwrite(text.data(), 1, text.size(), out_);
  std::fflush(out_);
}

}  // namespace trainctl::telemetry
