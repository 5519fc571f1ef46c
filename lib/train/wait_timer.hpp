// Exposed communication: the time the training thread spends waiting for background work.
#pragma once

#include <chrono>

namespace trainctl::train {

// Runs `wait` and adds the seconds it took to `total`, also when it throws.
template <class Wait>
void timed_wait(double& total, Wait&& wait) {
  const auto begin = std::chrono::steady_clock::now();
  const auto add = [&] {
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  };
  try {
    wait();
  } catch (...) {
    add();
    throw;
  }
  add();
}

}  // namespace trainctl::train
