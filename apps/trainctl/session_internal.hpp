// Internal to apps/trainctl: the phases of train_session (session.cpp) that live in other files.
//   session_setup.cpp   the checks before a session, the data, the rank's log, rendezvous and
//                       mesh, the backend
//   session_resume.cpp  loading the newest intact checkpoint, moving the rejected ones aside,
//                       trimming metrics.jsonl
// Functions returning int return -1 to go on, else the exit code the session ends with (the
// problem has been reported).
#pragma once

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cuda/device.hpp"
#include "ckpt/ckpt.hpp"
#include "comm/mesh.hpp"
#include "comm/store.hpp"
#include "data/data.hpp"
#include "data/sampler.hpp"
#include "launch/rank_env.hpp"
#include "model/model.hpp"
#include "model/parallel.hpp"
#include "recipe/recipe.hpp"
#include "session.hpp"
#include "train/trainer.hpp"

namespace trainctl::app {

// The training data of the recipe; filled in place (the sampler refers to the dataset).
struct SessionData {
  data::Dataset dataset;
  std::optional<data::Sampler> sampler;
  std::optional<data::ValidationSet> val;
};
// Opens the recipe's data. A data error is reported at its recipe key: exit code 2.
int open_session_data(const SessionInput& input, SessionData& out);

// The rank's own log. With several ranks every rank has one from the start (the launcher has
// already written its header there), so it is appended to; one rank keeps the old behaviour.
// Opened once the ranks have met: with an external launcher rank 0 may still be clearing the
// run directory (--overwrite) until then. Errors before that go to stderr, which our launcher
// sends to the log anyway.
struct RankLog {
  std::string command;
  bool multi = false;
  int rank = 0;
  std::FILE* file = nullptr;

  void open(const std::filesystem::path& run_dir);
  // An error of this rank: to its log and to stderr (once when stderr is the log). Closes the
  // log; returns `code`.
  int fail(const std::string& message, int code);
};

// The rendezvous store of a multi-rank job: a FileStore in the folder the launcher named, else in
// the run directory; without a shared file system under Slurm, a TCP store that rank 0 serves on
// the first node (launch/store_address.hpp). Namespaced by the job attempt.
struct Rendezvous {
  std::unique_ptr<comm::TcpStoreServer> server;  // rank 0's, when the store is TCP
  std::unique_ptr<comm::Store> base;
  std::unique_ptr<comm::PrefixStore> store;
  std::string how;  // for the log
};

// This rank's place among the others; filled in place (`parallel` points into `mesh`).
struct RankGroups {
  Rendezvous rendezvous;
  std::optional<comm::Mesh> mesh;
  model::ModelParallel parallel;
};
// With several ranks: meets the others, builds the mesh (Gloo groups on the CPU backend, NCCL
// groups on the GPU of a CUDA backend, ordered after its stream), opens the rank's log and fills
// the model's parallel layout. Throws comm::CommError when the rendezvous fails.
void join_ranks(const SessionInput& input, const train::TrainConfig& train_config,
                const backend::Backend& be, const backend::DeviceReport& devices, RankLog& log,
                RankGroups& out);

// The backend this rank computes on: the CUDA one on its GPU when `on_cuda`, else the CPU one.
// A CUDA backend that cannot start fails the rank (exit code 1).
int make_session_backend(const SessionInput& input, bool on_cuda,
                         const backend::DeviceReport& devices, RankLog& log,
                         std::unique_ptr<backend::Backend>& be);

// Resuming: loads the newest candidate that every rank reads back intact into model and trainer
// (`resumed`, `checkpoint_recipe_hash`), moves the newer broken ones to checkpoints/rejected/ and
// adds a note for each to input.notes. Exit code 2 when none loads or the checkpoint belongs to
// another model; kExitOk when the checkpoint is already at training.steps.
int resume_from_checkpoint(SessionInput& input, model::Transformer& model, train::Trainer& trainer,
                           backend::Backend& be, const comm::Mesh* mesh,
                           const std::filesystem::path& checkpoints_dir, RankLog& log,
                           std::optional<ckpt::ScanEntry>& resumed,
                           std::string& checkpoint_recipe_hash);

// A resumed run repeats the steps after its checkpoint: drop their records (they were written by
// the run that died) so metrics.jsonl holds every step once. Written to a temporary file and
// renamed, so a crash here loses nothing.
void truncate_metrics(const std::filesystem::path& path, int64_t last_step);

}  // namespace trainctl::app
