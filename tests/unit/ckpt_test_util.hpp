// Helpers shared by the ckpt unit tests: a scratch directory and small tensors to save.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
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
