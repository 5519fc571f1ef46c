// Helpers shared by the ckpt unit tests: a scratch directory and small tensors to save.
#pragma once

#include <stdlib.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "ckpt/ckpt.hpp"

namespace ckpt_test {

namespace fs = std::filesystem;

// A fresh directory under /tmp, removed with everything in it at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "trainctl-ckpt-XXXXXX").string();
    path = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
};

// A writer's after_slice hook that holds the save at its first slice until the test opens the
// gate: tests order events with it instead of sleeping. `hook()` is the SliceHook to install;
// `wait_held()` returns once the writer is held there (false after 60 s: the save never got
// there). The hold gives up after 60 s too, so a broken writer fails the test instead of hanging.
class Gate {
 public:
  trainctl::ckpt::SliceHook hook() {
    return [this](size_t) {
      std::unique_lock lock(mutex_);
      held_ = true;
      changed_.notify_all();
      changed_.wait_for(lock, std::chrono::seconds(60), [this] { return open_; });
    };
  }
  bool wait_held() {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, std::chrono::seconds(60), [this] { return held_; });
  }
  bool held() {
    std::lock_guard lock(mutex_);
    return held_;
  }
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool held_ = false, open_ = false;
};

inline std::vector<float> iota_floats(size_t n, float start = 0.5f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = start + static_cast<float>(i) * 0.25f;
  return v;
}

// A request holding one f32 tensor "model/w" of shape [rows, cols] filled with iota from `start`.
inline trainctl::ckpt::SaveRequest simple_request(int64_t step, int64_t rows = 8, int64_t cols = 6,
                                                  float start = 0.5f) {
  trainctl::ckpt::SaveRequest request;
  request.header.step = step;
  request.header.recipe_hash = "abc123";
  const auto values = iota_floats(static_cast<size_t>(rows * cols), start);
  request.add("model/w", trainctl::ckpt::DType::f32, {rows, cols}, {}, values.data());
  return request;
}

inline std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

}  // namespace ckpt_test
