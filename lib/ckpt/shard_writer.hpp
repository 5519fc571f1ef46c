// Writing checkpoints: the steps of one save, usable by many ranks, and save() for one process.
//
// Multi-rank protocol (every rank sees the same checkpoints directory; ranks talk through files
// only, so no collective runs on a writer thread; CheckpointWriter runs it):
//   every rank:  tmp = join_save(checkpoints_dir, step, save_id)   (same name on every rank)
//                index = write_shard(tmp, rank, my_slices)
//                publish_shard_index(tmp, step, index)   (or publish_shard_error on failure)
//   rank 0:      all = collect_shard_indices(tmp, step, world_size, timeout)
//                write_manifest(tmp, header, all); remove_shard_indices(tmp, world_size);
//                commit(checkpoints_dir, tmp, step)
//   on failure:  abandon(tmp) on rank 0 (earlier checkpoints are never touched)
// The manifest is written last and the directory is renamed into place only after every file and
// the directory are fsynced, so a crash at any moment leaves either a complete step_<N> or a
// .tmp-step_<N>.<pid or save id> directory that readers report as partial and never load.
//
// Fault injection: an `after_slice` hook is called after each slice is written and flushed to the
// file, so a test (or `trainctl run --debug-save-delay-ms`, which sleeps in it) can hold, signal
// or kill a process in the middle of a save. No hook, the default, is the production path: no
// extra flush, no call.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/format.hpp"

namespace trainctl::ckpt {

// One box of a logical tensor in host memory (not owned): row-major bytes of the region `index`
// of a tensor of global shape `shape`. An empty `index` means the whole tensor.
struct SliceData {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<Range> index;
  const void* data = nullptr;
};

// What one rank wrote: its file and where each of its slices landed.
struct ShardSlice {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  SliceRecord record;
};
struct ShardIndex {
  int rank = 0;
  std::string file;  // "rank_<N>.bin"
  uint64_t bytes = 0;
  uint32_t crc32c = 0;  // of the whole file
  std::vector<ShardSlice> slices;
};
nlohmann::json shard_index_to_json(const ShardIndex& index);
ShardIndex shard_index_from_json(const nlohmann::json& json);  // throws CheckpointError

// Called with the slice's position in the caller's list after it was written and flushed.
using SliceHook = std::function<void(size_t slice)>;

struct SaveStats {
  int64_t step = 0;
  fs::path path;  // the committed step directory
  uint64_t bytes = 0;
  double write_seconds = 0;
  double bandwidth = 0;  // bytes per second
};

// Creates checkpoints_dir if needed and an empty checkpoints_dir/.tmp-step_<N>.<pid>; refuses
// when step_<N> exists already (a checkpoint is never overwritten).
fs::path begin_save(const fs::path& checkpoints_dir, int64_t step);
// Writes dir/rank_<rank>.bin (header, then each slice 64-byte aligned), fsyncs it.
ShardIndex write_shard(const fs::path& dir, int rank, std::span<const SliceData> slices,
                       const SliceHook& after_slice = {});
// Merges every rank's index, checks the result (coverage, no overlaps, consistent dtype/shape
// across ranks), writes dir/manifest.json (created = now, UTC) and fsyncs it.
void write_manifest(const fs::path& dir, const ManifestHeader& header,
                    std::vector<ShardIndex> all_ranks);
// The tmp directory of a multi-rank save, checkpoints_dir/.tmp-step_<N>.<save_id>: every rank
// computes the same name without talking. Throws CheckpointError for an empty save_id or one with
// characters other than letters, digits, '-' and '_'.
fs::path shared_tmp_dir(const fs::path& checkpoints_dir, int64_t step, const std::string& save_id);
// Creates checkpoints_dir and shared_tmp_dir(...) when missing (any rank may come first, and
// none removes what another already wrote); refuses when step_<N> exists already.
fs::path join_save(const fs::path& checkpoints_dir, int64_t step, const std::string& save_id);
// dir/rank_<N>.index.json: the rank's ShardIndex and the step, written atomically (tmp file,
// fsync, rename, fsync dir) after its shard file is durable, so its presence means "done".
void publish_shard_index(const fs::path& dir, int64_t step, const ShardIndex& index);
// dir/rank_<N>.error: why this rank could not write its shard (best effort, never throws), so
// rank 0 fails at once with the reason instead of waiting for the timeout.
void publish_shard_error(const fs::path& dir, int rank, const std::string& message) noexcept;
// Rank 0: waits until every rank in [0, world_size) has published its index for `step` and
// returns them in rank order. Fails with a CheckpointError naming the rank when one published an
// error, an index of another step or a malformed one, and naming every missing rank when `timeout`
// passes without progress (no new index, no shard file growing).
std::vector<ShardIndex> collect_shard_indices(const fs::path& dir, int64_t step, int world_size,
                                              std::chrono::milliseconds timeout);
// Removes the published indices (after write_manifest, before commit: the step directory then
// holds only the manifest and the shard files).
void remove_shard_indices(const fs::path& dir, int world_size);
// fsync tmp_dir, rename it to step_<N> (refusing to replace one), fsync checkpoints_dir, then
// move checkpoints_dir/latest to it. Returns the step directory.
fs::path commit(const fs::path& checkpoints_dir, const fs::path& tmp_dir, int64_t step);
// Removes a failed save's tmp directory, best effort (never throws).
void abandon(const fs::path& tmp_dir) noexcept;

// The whole protocol for world size 1: begin_save, write_shard(rank 0), write_manifest, commit;
// on any error the tmp directory is removed and a CheckpointError names the path and OS error.
SaveStats save(const fs::path& checkpoints_dir, const ManifestHeader& header,
               std::span<const SliceData> slices, const SliceHook& after_slice = {});

// Sets SIGXFSZ to ignored so exceeding RLIMIT_FSIZE makes write() fail with EFBIG (reported as
// a CheckpointError) instead of killing the process. trainctl calls it at start-up.
void ignore_file_size_signal();

}  // namespace trainctl::ckpt
