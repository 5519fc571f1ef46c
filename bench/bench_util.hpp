// What the CPU benchmarks share: the best-of-N wall time of a piece of work.
#pragma once

#include <algorithm>
#include <chrono>

namespace trainctl::bench {

// The shortest of `repeats` runs of body(), in seconds: the figure least disturbed by the rest
// of the machine.
template <typename F>
double best_seconds(F body, int repeats = 3) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    body();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace trainctl::bench
