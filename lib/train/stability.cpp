#include "train/stability.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace trainctl::train {

namespace {

// The z-score of `x` over `window` (population standard deviation, summed oldest first, so every
// rank computes the same bits); nullopt while the window is not full or has no spread.
std::optional<double> z_score(const std::vector<double>& window, size_t size, double x) {
  if (window.size() < size || size < 2) return std::nullopt;
  double sum = 0;
  for (double v : window)
    sum += v;
  const double mean = sum / static_cast<double>(window.size());
  double squares = 0;
  for (double v : window)
    squares += (v - mean) * (v - mean);
  const double sd = std::sqrt(squares / static_cast<double>(window.size()));
  if (!(sd > 0)) return std::nullopt;
  return (x - mean) / sd;
}

void push(std::vector<double>& window, size_t size, double x) {
  window.push_back(x);
  if (window.size() > size) window.erase(window.begin());
}

std::string what_happened(const StabilityEvent& e) {
  switch (e.kind) {
    case StabilityEventKind::nonfinite:
      return std::isfinite(e.loss) ? fmt::format("non-finite gradient (norm {})", e.grad_norm)
                                   : fmt::format("non-finite loss ({})", e.loss);
    case StabilityEventKind::loss_spike:
      return fmt::format("loss spike (loss {:.4g}, z {:.1f} > {:g} over the last {} steps)", e.loss,
                         e.z, e.threshold, e.window);
    case StabilityEventKind::grad_spike:
      return fmt::format(
          "gradient-norm spike (norm {:.4g}, z {:.1f} > {:g} over the last {} steps)", e.grad_norm,
          e.z, e.threshold, e.window);
  }
  return "event";
}

std::string batches(int64_t first, int64_t last) {
  return first == last ? fmt::format("batch {}", first) : fmt::format("batches {}-{}", first, last);
}

}  // namespace

const char* event_name(StabilityEventKind kind) {
  switch (kind) {
    case StabilityEventKind::nonfinite:
      return "non_finite";
    case StabilityEventKind::loss_spike:
      return "loss_spike";
    case StabilityEventKind::grad_spike:
      return "grad_spike";
  }
  return "event";
}

std::string describe(const StabilityEvent& e) {
  if (e.action == StabilityAction::skip)
    return fmt::format("step {}: {}: {} skipped, step {} retried with the next batch", e.step,
                       what_happened(e), batches(e.first_batch, e.batch), e.step);
  return fmt::format("step {}: {}: rolled back to the snapshot of step {}, {} skipped", e.step,
                     what_happened(e), e.to_step, batches(e.first_batch, e.batch));
}

StabilityError::StabilityError(const std::vector<StabilityEvent>& events)
    : std::runtime_error([&] {
        std::string text = fmt::format(
            "stability: {} events in a row without getting past step {}; the run stops:",
            events.size(), events.empty() ? 0 : events.front().step - 1);
        for (const StabilityEvent& e : events)
          text += "\n  " + describe(e);
        text +=
            "\nthe data or the learning rate is the likely cause: look at these batches, lower "
            "optimizer.lr or raise schedule.warmup_steps, or (spikes) raise stability.loss_z / "
            "stability.grad_z or stability.max_events";
        return text;
      }()),
      events_(events) {}

StabilityGuard::StabilityGuard(const StabilityConfig& config) : config_(config) {}

std::optional<StabilityEvent> StabilityGuard::check(double loss, double grad_norm,
                                                    bool finite) const {
  StabilityEvent event;
  event.loss = loss;
  event.grad_norm = grad_norm;
  event.action = config_.action;
  event.window = config_.window;
  if (!finite || !std::isfinite(loss) || !std::isfinite(grad_norm)) {
    event.kind = StabilityEventKind::nonfinite;
    event.window = 0;
    return event;
  }
  const size_t size = static_cast<size_t>(config_.window);
  if (config_.loss_z > 0)
    if (std::optional<double> z = z_score(state_.losses, size, loss); z && *z > config_.loss_z) {
      event.kind = StabilityEventKind::loss_spike;
      event.z = *z;
      event.threshold = config_.loss_z;
      return event;
    }
  if (config_.grad_z > 0)
    if (std::optional<double> z = z_score(state_.grad_norms, size, grad_norm);
        z && *z > config_.grad_z) {
      event.kind = StabilityEventKind::grad_spike;
      event.z = *z;
      event.threshold = config_.grad_z;
      return event;
    }
  return std::nullopt;
}

void StabilityGuard::record(const StabilityEvent& event) {
  ++state_.events;
  ++state_.in_a_row;
  recent_.push_back(event);
  recent_.back().in_a_row = static_cast<int>(state_.in_a_row);
  if (state_.in_a_row >= config_.max_events) throw StabilityError(recent_);
}

void StabilityGuard::applied(int64_t step, double loss, double grad_norm) {
  const size_t size = static_cast<size_t>(config_.window);
  push(state_.losses, size, loss);
  push(state_.grad_norms, size, grad_norm);
  if (step > state_.furthest) {
    state_.furthest = step;
    state_.in_a_row = 0;
    recent_.clear();
  }
}

void StabilityGuard::rolled_back(int64_t step, const State& windows) {
  state_.losses = windows.losses;
  state_.grad_norms = windows.grad_norms;
  if (config_.lr_steps > 0) state_.lr_factor_until = step + config_.lr_steps;
}

void StabilityGuard::restore(const State& state) {
  const size_t size = static_cast<size_t>(config_.window);
  if (state.losses.size() > size || state.grad_norms.size() > size)
    throw std::invalid_argument(
        fmt::format("the stability guard's windows hold {} steps but stability.window is {}",
                    std::max(state.losses.size(), state.grad_norms.size()), config_.window));
  state_ = state;
  recent_.clear();
}

}  // namespace trainctl::train
