// CheckpointWriter: saves on a background thread while training continues, and keeps only the
// newest checkpoints. The caller copies its state into a SaveRequest at the step boundary (that
// copy is the stall the training loop sees); save() hands the request to ONE background thread
// and returns. A second save() first waits for the one in flight, and an error of a background
// save is rethrown by the next save() or wait(). The destructor waits (and reports a pending
// error on stderr, since it cannot throw).
//
// Why new_request(): a fresh 1 GB host copy costs its page faults (the kernel zero-fills every
// page on first touch) on every save, which was most of the stall. A request taken from
// new_request() reuses the host memory of the writer's last finished save, so only the first
// save pays for the faults and every later one is a plain memcpy into warm pages. The writer
// keeps one set of host memory (the size of one checkpoint) between saves.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/shard_writer.hpp"
#include "tensor/tensor.hpp"

namespace trainctl::ckpt {

// Host memory for a SaveRequest: 64-byte aligned pieces bump-allocated from large blocks. The
// blocks are mapped without being zero-filled by us (MAP_POPULATE faults them in at once, which is
// cheaper than faulting page by page during the copy) and can be handed to the next request, so
// an identical sequence of allocations lands in the same, already mapped, pages.
class HostArena {
 public:
  HostArena() = default;
  HostArena(HostArena&& other) noexcept;
  HostArena& operator=(HostArena&& other) noexcept;  // releases this arena's blocks first
  ~HostArena();

  // `bytes` of uninitialised memory (never null; a zero-byte request gets a valid pointer).
  std::byte* allocate(size_t bytes);
  // True when [data, data + bytes) lies inside the allocated part of one block (pieces are
  // rounded up to 64 bytes, so a few bytes past a piece's end still count as inside).
  bool owns(const void* data, size_t bytes) const;
  // Total bytes mapped (used and spare).
  size_t mapped_bytes() const;
  // Moves this arena's blocks out (to seed the next request's arena); spare blocks that were
  // never used are released rather than kept.
  HostArena recycle();
  // Maps one block of at least `bytes` now, kept as a spare that the next allocate() calls take
  // first (an arena that already holds that much mapped memory maps nothing).
  void reserve(size_t bytes);

 private:
  struct Block {
    std::byte* data = nullptr;
    size_t bytes = 0;
    size_t used = 0;
  };
  static constexpr size_t kMaxBlockBytes = size_t{64} << 20;  // larger pieces get their own
  static Block map_block(size_t bytes);
  static void unmap(Block& block) noexcept;
  void release() noexcept;

  std::vector<Block> blocks_;  // in use, in allocation order; the last one is being filled
  std::vector<Block> spare_;   // from an earlier request, taken front first
  size_t next_spare_ = 0;
  size_t next_block_bytes_ = size_t{1} << 20;  // doubles up to kMaxBlockBytes
};

// A checkpoint's content with its own host copy of every slice.
class SaveRequest {
 public:
  // A request with fresh host memory. Prefer CheckpointWriter::new_request(), which reuses the
  // memory of the last finished save.
  SaveRequest() = default;

  ManifestHeader header;

  // Copies the row-major bytes of box `index` (empty: the whole tensor) of a tensor of global
  // `shape` from host memory at `data`. Large copies are split over a few threads.
  void add(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<Range> index,
           const void* data);
  // Copies a whole host tensor.
  void add(std::string name, const tensor::Tensor& whole);

  // Uninitialised host memory owned by the request, 64-byte aligned, for a caller that fills it
  // itself (one device-to-host copy of a whole parameter buffer), then describes the slices in
  // it with add_view(). Reused from the previous save when the request came from new_request().
  std::byte* allocate(size_t bytes);
  // Like add() but without a copy: `data` must point into memory from allocate() (the bytes of
  // the box must lie inside one allocation; otherwise a CheckpointError).
  void add_view(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<Range> index,
                const void* data);

  std::span<const SliceData> slices() const { return slices_; }
  uint64_t bytes() const { return bytes_; }

 private:
  friend class CheckpointWriter;
  // Checks the box and returns its byte count.
  static uint64_t box_bytes(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                            std::vector<Range>& index);

  HostArena memory_;
  std::vector<SliceData> slices_;  // point into memory_
  uint64_t bytes_ = 0;
};

// Copies `bytes` from src to dst, split over up to four threads (one per 8 MiB, at most one per
// core), with non-temporal stores on x86-64 for copies of 256 KiB and more: the destination is
// written out by another thread later, so it need not pass through this core's cache.
void copy_parallel(void* dst, const void* src, size_t bytes);

// Deletes old checkpoints after a commit: keeps the newest `keep_last` valid ones (by step; the
// manifest-level check of scan()) and removes every step_* directory older than the oldest kept
// one. Never removes the newest valid checkpoint, anything newer than it, or any .tmp-* directory.
// keep_last <= 0 keeps everything. Returns the removed directories.
std::vector<fs::path> apply_retention(const fs::path& checkpoints_dir, int keep_last);

// Multi-rank saves (world_size > 1): every rank constructs a writer with its own rank and the
// same save_id, and calls save() for the same steps. No rank talks to another: each rank's
// background thread creates (idempotently) checkpoints_dir/.tmp-step_<N>.<save_id>, writes its
// rank_<rank>.bin there and then its shard index rank_<rank>.index.json (atomically: tmp file,
// fsync, rename). Rank 0's thread then waits until every rank's index is there, writes the
// manifest, commits and applies retention. A rank that cannot write its shard leaves
// rank_<rank>.error with the reason, so rank 0 fails at once naming it; a rank that makes no
// progress (no new index, no shard file growing) for `timeout` makes rank 0's save fail naming
// the missing ranks. Either way rank 0 removes the tmp directory and committed checkpoints are
// untouched. Only rank 0 commits, so only its last_stats() means "committed"; on other ranks a
// successful save means the rank's shard and index are durable.
class CheckpointWriter {
 public:
  struct Options {
    bool async = true;
    int keep_last = 0;  // <= 0: keep every checkpoint
    int rank = 0;
    int world_size = 1;
    // Names the tmp directory of a multi-rank save; the same on every rank of one job attempt and
    // different for each restart (e.g. the launcher's job id and restart count), letters, digits,
    // '-' and '_' only. Unused (the process id is used) when world_size is 1.
    std::string save_id = {};
    // Rank 0: how long a multi-rank save may go without progress of the other ranks before it is
    // abandoned (pass the recipe's collective timeout).
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
    // Fault injection (write_shard's after_slice, run on the thread that writes): none in
    // production.
    SliceHook after_slice = {};
  };

  CheckpointWriter(fs::path checkpoints_dir, Options options);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // An empty request whose host memory is that of the last finished save (the pages are already
  // mapped, so copying the same state again costs no page faults). When a save is in flight its
  // memory is needed: waits for it (as save() would anyway); its error stays for save()/wait().
  SaveRequest new_request();
  // Waits for the previous save (rethrowing its error), then saves `request`: in the background
  // when async, else before returning. The request's memory goes back to the writer afterwards.
  void save(SaveRequest request);
  // Blocks until no save is in flight; rethrows the error of the last background save, once.
  void wait();
  // Rethrows the error of a background save that has already failed, without waiting: the
  // training loop calls it every step so a failed save stops the run at once.
  void poll();
  // Maps `bytes` of host memory now (faulting every page in), to be used by the first
  // new_request(), so the first save stalls training no longer than later ones. Pass what a
  // capture allocates (train::capture_bytes). Waits for a save in flight.
  void reserve(size_t bytes);
  // Statistics of the last successful save. With world_size > 1, on rank 0 `bytes` counts every
  // rank's shard file; on other ranks only its own.
  std::optional<SaveStats> last_stats() const;
  const fs::path& dir() const { return dir_; }

 private:
  void run(SaveRequest& request);  // save, then retention and cleanup
  SaveStats save_multi_rank(const SaveRequest& request);
  void keep_memory(SaveRequest& request);  // under mutex_
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
  HostArena spare_memory_;                 // of the last finished save, for new_request()
  std::vector<fs::path> failed_tmp_dirs_;  // this writer's failed saves, removed later
  std::thread worker_;
};

}  // namespace trainctl::ckpt
