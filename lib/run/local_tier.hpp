// Node-local checkpoint tiers. Each rank writes its whole state (train::RankSnapshot: its
// parameter buffers, optimizer state and trainer state) as one file per step into a folder of its
// own node, on a thread of its own:
//   memory tier  /dev/shm/trainctl-<uid>/<run key>/  (host memory: survives the process, not the
//                node), every checkpoint.memory_every_steps
//   local tier   <checkpoint.local_dir>/<run key>/   (node-local disk), every
//                checkpoint.local_every_steps
// beside the shared tier (the run directory's checkpoints/, which every layout can read). On a
// restart the newest step wins: a tier's step counts only when every rank's file of it verifies
// (identity, sizes, XXH3 checksums), and is tried only when it is newer than the shared tier's
// newest valid checkpoint; anything else falls back, saying why (lib/run/resume.cpp).
//
// A file: "TCSNAP01", the header's length (u64, little-endian), the header (JSON: format, step,
// rank, world_size, model, layout, the trainer state, and each buffer's name, bytes and
// XXH3-64), then the buffers. Written to a temporary name, fsynced and renamed; a tier keeps the
// newest two steps of each rank.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.hpp"
#include "recipe/recipe.hpp"
#include "train/trainer.hpp"

namespace trainctl::run {

namespace fs = std::filesystem;

// The folders of a run's tiers: a key made from the run directory's absolute path, so two runs
// never share one and a resumed run finds its own.
fs::path memory_tier_dir(const fs::path& run_dir);
fs::path local_tier_dir(const fs::path& local_dir, const fs::path& run_dir);

inline constexpr const char* kMemoryTier = "memory tier";
inline constexpr const char* kLocalTier = "local tier";

class LocalTier {
 public:
  // Who may read a file: the same rank of the same layout of the same model (a hash of its
  // description: train::describe_model).
  struct Identity {
    int rank = 0;
    int world_size = 1;
    std::string model;
    std::string layout;
  };
  static constexpr int kKeep = 2;

  // `name`: "memory tier" or "local tier", for messages. Nothing is created before the first
  // write.
  LocalTier(std::string name, fs::path dir, Identity identity);
  ~LocalTier();  // waits for the write in flight; its error is dropped
  LocalTier(const LocalTier&) = delete;
  LocalTier& operator=(const LocalTier&) = delete;

  const std::string& name() const { return name_; }
  const fs::path& dir() const { return dir_; }

  // Copies `snapshot` (the stall: one host copy) and writes it on the tier's thread, after the
  // write before it has ended. Rethrows that write's files::FileError.
  void submit(const train::RankSnapshot& snapshot);
  // Waits for the write in flight; rethrows its files::FileError.
  void wait();

  // The steps this rank has a file of, newest first.
  std::vector<int64_t> steps() const;
  // Reads this rank's file of `step` straight into `targets` (train::Trainer::snapshot_targets:
  // 8 MiB at a time through one staging buffer, checksummed as it goes) and its trainer state
  // into `state`. Returns why it cannot be used ("" when it can); the targets may then hold part
  // of it.
  std::string load(int64_t step, const train::SnapshotTargets& targets, backend::Backend& backend,
                   train::TrainerState& state) const;
  // The run is done: the tier's folder goes with every file in it, every rank's and any earlier
  // layout's (a resume onto another layout leaves the old one's). Call it on one rank of the node
  // once every rank of the node has wait()ed for its last write.
  void remove_all();

 private:
  fs::path file_of(int64_t step) const;
  void write(const train::RankSnapshot& snapshot) const;
  void prune() const;                    // all but the newest kKeep steps of this rank
  void remove_step(int64_t step) const;  // this rank's file of it
  void remove_stale_temporaries() const;
  void work();

  std::string name_;
  fs::path dir_;
  Identity identity_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<train::RankSnapshot> pending_;  // waiting for the thread
  bool busy_ = false, stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

// The tiers the recipe asks for (memory first), for global rank `rank`.
std::vector<std::unique_ptr<LocalTier>> open_tiers(const recipe::Recipe& recipe,
                                                   const fs::path& run_dir, int rank);

}  // namespace trainctl::run
