// CheckpointWriter: saves on a background thread while training continues, and keeps only the
// newest checkpoints. The caller copies its state into a SaveRequest at the step boundary (that
// copy is the stall the training loop sees); save() hands the request to ONE background thread
// and returns. A second save() first waits for the one in flight, and an error of a background
// save is rethrown by the next save() or wait(). The destructor waits (and reports a pending
// error on stderr, since it cannot throw).
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/shard_writer.hpp"
#include "tensor/tensor.hpp"

namespace trainctl::ckpt {

// A checkpoint's content with its own host copy of every slice.
class SaveRequest {
 public:
  ManifestHeader header;

  // Copies the row-major bytes of box `index` (empty: the whole tensor) of a tensor of global
  // `shape` from host memory at `data`.
  void add(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<Range> index,
           const void* data);
  // Copies a whole host tensor.
  void add(std::string name, const tensor::Tensor& whole);

  std::span<const SliceData> slices() const { return slices_; }
  uint64_t bytes() const { return bytes_; }

 private:
  std::vector<tensor::Buffer> copies_;
  std::vector<SliceData> slices_;  // point into copies_
  uint64_t bytes_ = 0;
};

// Deletes old checkpoints after a commit: keeps the newest `keep_last` valid ones (by step; the
// manifest-level check of scan()) and removes every step_* directory older than the oldest kept
// one. Never removes the newest valid checkpoint, anything newer than it, or any .tmp-* directory.
// keep_last <= 0 keeps everything. Returns the removed directories.
std::vector<fs::path> apply_retention(const fs::path& checkpoints_dir, int keep_last);

class CheckpointWriter {
 public:
  struct Options {
    bool async = true;
    int keep_last = 0;  // <= 0: keep every checkpoint
  };

  CheckpointWriter(fs::path checkpoints_dir, Options options);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Waits for the previous save (rethrowing its error), then saves `request`: in the background
  // when async, else before returning.
  void save(SaveRequest request);
  // Blocks until no save is in flight; rethrows the error of the last background save, once.
  void wait();
  // Rethrows the error of a background save that has already failed, without waiting: the
  // training loop calls it every step so a failed save stops the run at once.
  void poll();
  // Statistics of the last successful save.
  std::optional<SaveStats> last_stats() const;
  const fs::path& dir() const { return dir_; }

 private:
  void run(SaveRequest& request);  // save, then retention and cleanup
  void worker_loop();

  fs::path dir_;
  Options options_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<SaveRequest> pending_;
  bool busy_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  std::optional<SaveStats> stats_;
  std::vector<fs::path> failed_tmp_dirs_;  // this writer's failed saves, removed later
  std::thread worker_;
};

}  // namespace trainctl::ckpt
