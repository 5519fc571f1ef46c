// Writing checkpoints: the steps of one save, usable by many ranks, and save() for one process.
//
// Multi-rank protocol (every rank sees the same checkpoints directory):
//   rank 0:      tmp = begin_save(checkpoints_dir, step)       -> broadcast tmp to all ranks
//   every rank:  index = write_shard(tmp, rank, my_slices)     -> gather indices on rank 0
//                (shard_index_to_json / shard_index_from_json carry them over the wire)
//   rank 0:      write_manifest(tmp, header, all_indices); commit(checkpoints_dir, tmp, step)
//   on failure:  abandon(tmp) on rank 0 (earlier checkpoints are never touched)
// The manifest is written last and the directory is renamed into place only after every file and
// the directory are fsynced, so a crash at any moment leaves either a complete step_<N> or a
// .tmp-step_<N>.<pid> directory that readers report as partial and never load.
//
// Test hook: TRAINCTL_TEST_CKPT_WRITE_DELAY_MS=<ms> sleeps after each slice is written, so a test
// can SIGKILL a process in the middle of a save.
#pragma once

#include <cstdint>
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
ShardIndex write_shard(const fs::path& dir, int rank, std::span<const SliceData> slices);
// Merges every rank's index, checks the result (coverage, no overlaps, consistent dtype/shape
// across ranks), writes dir/manifest.json (created = now, UTC) and fsyncs it.
void write_manifest(const fs::path& dir, const ManifestHeader& header,
                    std::vector<ShardIndex> all_ranks);
// fsync tmp_dir, rename it to step_<N> (refusing to replace one), fsync checkpoints_dir, then
// move checkpoints_dir/latest to it. Returns the step directory.
fs::path commit(const fs::path& checkpoints_dir, const fs::path& tmp_dir, int64_t step);
// Removes a failed save's tmp directory, best effort (never throws).
void abandon(const fs::path& tmp_dir) noexcept;

// The whole protocol for world size 1: begin_save, write_shard(rank 0), write_manifest, commit;
// on any error the tmp directory is removed and a CheckpointError names the path and OS error.
SaveStats save(const fs::path& checkpoints_dir, const ManifestHeader& header,
               std::span<const SliceData> slices);

// Sets SIGXFSZ to ignored so exceeding RLIMIT_FSIZE makes write() fail with EFBIG (reported as
// a CheckpointError) instead of killing the process. trainctl calls it at start-up.
void ignore_file_size_signal();

}  // namespace trainctl::ckpt
