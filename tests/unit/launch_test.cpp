// lib/launch: a stop signal is recorded (not acted on) and the first one wins; handlers are
// restored afterwards.
#include <catch2/catch.hpp>

#include <csignal>

#include "launch/signals.hpp"

using trainctl::launch::StopSignals;

TEST_CASE("stop signals: recorded, first wins, restored on destruction", "[launch]") {
  struct sigaction before {};
  sigaction(SIGTERM, nullptr, &before);  // Catch2's own handler
  {
    StopSignals stop;
    CHECK_FALSE(stop.requested());
    std::raise(SIGUSR1);
    CHECK(stop.requested());
    CHECK(stop.signal() == SIGUSR1);
    std::raise(SIGTERM);  // still alive: recorded, not acted on
    CHECK(stop.signal() == SIGUSR1);
    CHECK(std::string(stop.name()) == "SIGUSR1");
    CHECK_THROWS_AS(StopSignals(), std::logic_error);
  }
  struct sigaction now {};
  sigaction(SIGTERM, nullptr, &now);
  CHECK(now.sa_handler == before.sa_handler);
  StopSignals again;  // can be installed again
  CHECK_FALSE(again.requested());
}
