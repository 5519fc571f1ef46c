// provenance.json: what made a run, one segment per attempt (`trainctl run`, then each `trainctl
// resume`), so a run made by several attempts says which binary made which steps. Each segment
// records what changes the bits of a run: the binary (version, source commit, dirty tree,
// compiler, build type), the libraries that compute (OpenBLAS, glibc's libm; CUDA, cuBLASLt,
// NCCL on GPUs), the host and device (CPU model and threads, GPUs), the BLAS thread count and
// the environment variables that change results, the recipe hash, the seed, the layout, and the
// data's identity (each file's path and size, and a digest of the tokens made by the vocabulary
// check's read: data::token_digest). Rank 0 describes its own process; every rank runs the same
// binary from the same command line.
//
// The leader writes the file when the attempt starts and rewrites it (atomically) when it ends
// with the last step it made and how it ended; an attempt that was killed has no end: its steps
// end where the next attempt starts. Every checkpoint's manifest carries the segments as they were
// at the save (ckpt::ManifestHeader::provenance). `trainctl diff` reads them.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "run/context.hpp"
#include "run/session.hpp"

namespace trainctl::run {

inline constexpr const char* kProvenanceFile = "provenance.json";
inline constexpr int kProvenanceVersion = 1;

// The environment variables that change a run's numbers: BLAS and OpenMP threading, NCCL's
// algorithm and protocol choices, cuBLAS's workspace (determinism), TF32 overrides.
inline constexpr const char* kResultEnvironment[] = {
    "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",   "OMP_NUM_THREADS",
    "GOTO_NUM_THREADS",     "NCCL_ALGO",           "NCCL_PROTO",
    "NCCL_MIN_NCHANNELS",   "NCCL_MAX_NCHANNELS",  "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE", "CUDA_VISIBLE_DEVICES"};

// Under srun or torchrun each rank digested the part of the data it checked: adds the parts up
// (a collective over the world: every rank calls it) so every rank holds the whole's digests.
void complete_data_digests(SessionData& data, comm::Communicator& world);

// This attempt's segment (without its end).
nlohmann::ordered_json provenance_segment(const SessionInput& input, RunContext& run,
                                          const std::string& command);

// The run directory's provenance.json, kept by the leader (other ranks hold an empty one).
class Provenance {
 public:
  // Leader: appends this attempt's segment to the earlier attempts' (resuming; a missing or
  // unreadable file starts over, and the segment says so) and writes the file.
  Provenance(const SessionInput& input, RunContext& run, const std::string& command);

  // Rewrites the file with this attempt's end: the last step made, and "done" or "stopped".
  // A failure to write is not the run's failure: the message is returned for a note.
  std::string finish(int64_t last_step, std::string_view outcome);

  // {"format", "version", "segments"}: what checkpoint manifests carry. Empty off the leader.
  const nlohmann::ordered_json& json() const { return json_; }

 private:
  void write() const;

  std::filesystem::path path_;
  nlohmann::ordered_json json_;
};

}  // namespace trainctl::run
