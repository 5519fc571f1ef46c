// The stability guard's verdicts (lib/train/stability.hpp): non-finite numbers always, spikes by
// z-score once the window is full and only upwards, events in a row counted until the run gets
// past its furthest step, and the rollback's windows and lowered learning rate. The trainer's use
// of it (skip, rollback, the same weights as a run without the batch) is tested by cli:stability.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "train/stability.hpp"

using namespace trainctl;
using train::StabilityEventKind;

namespace {

train::StabilityConfig spikes(double loss_z, double grad_z, int window) {
  train::StabilityConfig config;
  config.loss_z = loss_z;
  config.grad_z = grad_z;
  config.window = window;
  return config;
}

}  // namespace

TEST_CASE("stability guard: non-finite loss or gradient is always an event", "[train][stability]") {
  const train::StabilityGuard guard(train::StabilityConfig{});  // spike tests off
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  CHECK_FALSE(guard.check(3.0, 1.0, true));
  CHECK(guard.check(nan, 1.0, true)->kind == StabilityEventKind::nonfinite);
  CHECK(guard.check(3.0, inf, true)->kind == StabilityEventKind::nonfinite);
  CHECK(guard.check(3.0, 1.0, false)->kind == StabilityEventKind::nonfinite);
  CHECK_FALSE(guard.check(1e30, 1e30, true));  // huge but finite: only a z-score judges it
}

TEST_CASE("stability guard: a spike is judged by its z-score over a full window",
          "[train][stability]") {
  train::StabilityGuard guard(spikes(3.0, 0.0, 4));
  // Not full yet: nothing is a spike.
  guard.applied(1, 4.0, 1.0);
  guard.applied(2, 3.0, 1.0);
  guard.applied(3, 4.0, 1.0);
  CHECK_FALSE(guard.check(100.0, 1.0, true));
  guard.applied(4, 3.0, 1.0);
  // Window {4, 3, 4, 3}: mean 3.5, population sd 0.5. z(5.0) = 3 is not above 3; z(5.01) is.
  CHECK_FALSE(guard.check(5.0, 1.0, true));
  const auto event = guard.check(5.01, 1.0, true);
  REQUIRE(event);
  CHECK(event->kind == StabilityEventKind::loss_spike);
  CHECK(event->z == Approx(3.02));
  CHECK(event->threshold == 3.0);
  CHECK(event->window == 4);
  CHECK_FALSE(guard.check(-100.0, 1.0, true));  // a loss far below the mean is no spike
  CHECK_FALSE(guard.check(3.5, 1e9, true));     // grad_z 0: the gradient is not tested
  // The window slides: the oldest value leaves.
  guard.applied(5, 3.5, 1.0);  // {3, 4, 3, 3.5}
  CHECK(guard.state().losses == std::vector<double>{3.0, 4.0, 3.0, 3.5});
}

TEST_CASE("stability guard: a window without spread judges nothing; the gradient's own test",
          "[train][stability]") {
  train::StabilityGuard guard(spikes(0.0, 2.0, 3));
  for (int step = 1; step <= 3; ++step)
    guard.applied(step, 1.0, 2.0);
  CHECK_FALSE(guard.check(1.0, 50.0, true));  // sd 0: no z-score
  guard.applied(4, 1.0, 3.0);                 // grad window {2, 2, 3}
  const auto event = guard.check(1.0, 50.0, true);
  REQUIRE(event);
  CHECK(event->kind == StabilityEventKind::grad_spike);
  CHECK(event->threshold == 2.0);
}

TEST_CASE("stability guard: events in a row until the run gets past its furthest step",
          "[train][stability]") {
  train::StabilityConfig config;
  config.max_events = 3;
  train::StabilityGuard guard(config);
  guard.applied(5, 1.0, 1.0);
  train::StabilityEvent event;
  event.step = 6;
  guard.record(event);
  guard.record(event);
  CHECK(guard.state().in_a_row == 2);
  // A replayed step (a rollback went back to step 3) is not past step 5: the count stays.
  guard.applied(4, 1.0, 1.0);
  CHECK(guard.state().in_a_row == 2);
  try {
    guard.record(event);
    FAIL("the third event in a row must stop the run");
  } catch (const train::StabilityError& e) {
    CHECK(e.events().size() == 3);
    CHECK(std::string(e.what()).find("3 events in a row without getting past step 5") !=
          std::string::npos);
  }
  CHECK(guard.state().events == 3);
  // Getting past the furthest step ends the streak.
  train::StabilityGuard other(config);
  other.record(event);
  other.record(event);
  other.applied(6, 1.0, 1.0);
  CHECK(other.state().in_a_row == 0);
  CHECK_NOTHROW(other.record(event));
}

TEST_CASE("stability guard: a rollback restores the windows and lowers the learning rate",
          "[train][stability]") {
  train::StabilityConfig config = spikes(3.0, 0.0, 2);
  config.action = train::StabilityAction::rollback;
  config.lr_factor = 0.25;
  config.lr_steps = 2;
  train::StabilityGuard guard(config);
  guard.applied(1, 2.0, 1.0);
  const train::StabilityGuard::State at_snapshot = guard.state();
  guard.applied(2, 3.0, 1.0);
  guard.record(train::StabilityEvent{});
  guard.rolled_back(1, at_snapshot);
  CHECK(guard.state().losses == std::vector<double>{2.0});
  CHECK(guard.state().events == 1);  // the counters stay
  CHECK(guard.state().furthest == 2);
  CHECK(guard.lr_factor(1) == 0.25);  // steps 2 and 3 (0-based 1 and 2)
  CHECK(guard.lr_factor(2) == 0.25);
  CHECK(guard.lr_factor(3) == 1.0);
  train::StabilityGuard::State longer;
  longer.losses = {1.0, 2.0, 3.0};
  CHECK_THROWS_WITH(guard.restore(longer),
                    "the stability guard's windows hold 3 steps but stability.window is 2");
}

TEST_CASE("stability guard: events say what happened and what was done", "[train][stability]") {
  train::StabilityEvent e;
  e.kind = StabilityEventKind::loss_spike;
  e.step = 9;
  e.batch = 11;
  e.first_batch = 11;
  e.loss = 412.5;
  e.z = 38.21;
  e.threshold = 6;
  e.window = 8;
  CHECK(train::describe(e) ==
        "step 9: loss spike (loss 412.5, z 38.2 > 6 over the last 8 steps): batch 11 skipped, "
        "step 9 retried with the next batch");
  e.action = train::StabilityAction::rollback;
  e.to_step = 5;
  e.first_batch = 7;
  CHECK(train::describe(e) ==
        "step 9: loss spike (loss 412.5, z 38.2 > 6 over the last 8 steps): rolled back to the "
        "snapshot of step 5, batches 7-11 skipped");
  e.kind = StabilityEventKind::nonfinite;
  e.loss = std::numeric_limits<double>::quiet_NaN();
  CHECK(train::describe(e).rfind("step 9: non-finite loss (nan): rolled back", 0) == 0);
}
