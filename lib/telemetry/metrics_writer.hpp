// MetricsWriter: metrics.jsonl, one JSON object per line, one line per reported step.
//
// Every line is flushed as soon as it is written, so a run that crashes keeps every finished
// step. The file is opened for appending: a resumed run continues the same file.
//
// JSON has no NaN or Infinity. A non-finite number (a diverged loss, an overflowing grad norm) is
// written as null, so every line stays valid JSON that any reader parses; readers must treat null
// as "not a finite number". Strings with invalid UTF-8 get U+FFFD replacement characters.
#pragma once

#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

namespace trainctl::telemetry {

class MetricsWriter {
 public:
  // Creates the parent directory if missing and opens `path` for appending. Throws
  // std::runtime_error naming the path when that fails.
  explicit MetricsWriter(const std::filesystem::path& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Appends `record` as one line and flushes it. Throws std::invalid_argument when `record` is
  // not a JSON object, std::runtime_error naming the path on a write error.
  void write(const nlohmann::json& record);

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

}  // namespace trainctl::telemetry
