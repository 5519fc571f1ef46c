// TensorBoardWriter: scalars into a TensorBoard event file that the real reader
// (tensorboard's EventAccumulator) loads. See tfrecord.hpp for the bytes.
//
// File name: <dir>/events.out.tfevents.<unix_seconds>.<hostname>.<pid>.<n>, n = 0 unless a file of
// that name already exists (two writers in one process and second), then 1, 2, ...
// Not thread-safe: one writer per run, owned by the rank that reports (rank 0).
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace trainctl::telemetry {

class TensorBoardWriter {
 public:
  // Creates `dir` (and parents) if missing, opens a new event file in it and writes the
  // file_version record. Throws std::runtime_error naming the path when either fails.
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  ~TensorBoardWriter();  // flushes; never throws
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event with one scalar. TensorBoard stores float32, so `value` is rounded to float.
  // Tags may contain '/' (TensorBoard groups "train/loss" and "train/lr" under "train").
  void add_scalar(const std::string& tag, std::int64_t step, double value);

  // One event holding every (tag, value) of a step, e.g. add_scalars(step, {{"train/loss", l},
  // {"train/lr", lr}}). Cheaper to write and read than one event per scalar.
  void add_scalars(std::int64_t step, const std::vector<std::pair<std::string, double>>& scalars);

  // Pushes buffered records to the OS, so a live TensorBoard sees them. Throws on a write error.
  void flush();

  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& event);

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

}  // namespace trainctl::telemetry
