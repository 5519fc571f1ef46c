// Internal to lib/run: one rank of a session, built once (RunContext), and what it is built from.
//   checks.cpp   the checks before a session, the data
//   context.cpp  the rendezvous and mesh, the backend, the model and trainer, the run's description
//   resume.cpp   loading the newest intact checkpoint, moving the rejected ones aside, trimming
//                metrics.jsonl
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
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
#include "run/peak.hpp"
#include "run/rank_log.hpp"
#include "run/session.hpp"
#include "train/trainer.hpp"

namespace trainctl::run {

// The content digests (data::token_digest) of one dataset part's training and validation
// tokens; nullopt for data without files (synthetic) or no validation part.
struct PartDigests {
  std::optional<uint64_t> train;
  std::optional<uint64_t> val;
};

// The training data of the recipe; filled in place (the sampler refers to the dataset).
struct SessionData {
  data::Dataset dataset;
  std::optional<data::Sampler> sampler;
  std::optional<data::ValidationSet> val;
  // One per dataset part, made by the vocabulary check's read (never a second pass). Whole where
  // this process read all the data; the ranks of our own launcher take the launcher's from
  // kEnvDataDigests; under srun or torchrun each rank holds the digest of the part it checked
  // (`partial`) until complete_data_digests adds them up.
  std::vector<PartDigests> digests;
  bool partial_digests = false;
};

// The launcher's digests, for its ranks: "TRAIN:VAL,TRAIN:VAL" (hex, "-" for none).
inline constexpr const char* kEnvDataDigests = "TRAINCTL_DATA_DIGESTS";
std::string format_data_digests(const std::vector<PartDigests>& digests);
// Opens the recipe's data. A data error is reported at its recipe key: exit code 2.
Exit open_session_data(const SessionInput& input, SessionData& out);

// Whether the ranks meet through a TCP store (else a file store in the run directory): without a
// shared file system, under Slurm (rank 0 serves it) and under trainctl's own launcher (which
// serves it; `rank` is then the launcher's own, not launched); an external launcher's ranks when
// it names the store's port (RankInfo::external_tcp_store; rank 0 serves it), whatever shared_fs
// says, so a run whose nodes share the run directory keeps its checkpoints.
bool uses_tcp_store(bool shared_fs, const launch::RankInfo& rank);
// A TCP store server's options: refused connections go to this process's stderr (rank 0's or the
// launcher's: the job log).
comm::TcpStoreServerOptions store_server_options();

// The rendezvous store of a multi-rank job: a FileStore in the folder the launcher named, else in
// the run directory; without a shared file system under Slurm, a TCP store that rank 0 serves on
// the first node (launch/store_address.hpp). Namespaced by the job attempt.
struct Rendezvous {
  std::unique_ptr<comm::TcpStoreServer> server;  // rank 0's, when the store is TCP
  std::unique_ptr<comm::Store> base;
  std::unique_ptr<comm::PrefixStore> store;
  std::string how;  // for the log
};

// The CUDA backend could not start on this rank's GPU: the rank fails (exit code 1).
struct BackendUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One rank of the session, built once, in order: the backend (the mesh of a CUDA rank is NCCL's,
// on the backend's GPU and ordered after its stream), the rendezvous and mesh (several ranks; the
// rank's log opens once they have met), the model (initialised from the seed) and its trainer.
// Throws BackendUnavailable, comm::CommError (the rendezvous failed).
class RunContext {
 public:
  RunContext(const SessionInput& input, RankLog& log);
  RunContext(const RunContext&) = delete;
  RunContext& operator=(const RunContext&) = delete;

  const recipe::Recipe& recipe() const { return recipe_; }
  backend::Backend& backend() { return *backend_; }
  model::Transformer& model() { return *model_; }
  train::Trainer& trainer() { return *trainer_; }
  const model::ModelConfig& model_config() const { return recipe_.model; }
  comm::Mesh* mesh() { return mesh_ ? &*mesh_ : nullptr; }
  // The job's rendezvous store (several ranks; else null), for the roll call after a failure.
  comm::Store* store() { return rendezvous_.store.get(); }
  bool leader() const { return rank_.rank == 0; }  // writes the run's files, shows progress
  bool multi() const { return rank_.world_size > 1; }
  const std::string& recipe_hash() const { return recipe_hash_; }
  // What the leader's MFU is measured against (the leader only; elsewhere flops_per_s is 0): the
  // peak of one device, and how many such devices the job has (GPUs: the world; CPU backend: one
  // per node, its ranks share the node's cores).
  const Peak& peak() const { return peak_; }
  int peak_devices() const { return peak_devices_; }
  bool on_cuda() const { return on_cuda_; }
  int local_world_size() const { return rank_.local_world_size; }
  // The step training starts after: 0, or the step of the checkpoint it resumed from.
  int64_t start_step() const { return resumed ? resumed->step : 0; }

  // What a resume loaded (resume.cpp sets it).
  std::optional<ckpt::ScanEntry> resumed;
  double resume_seconds = 0;  // finding and reading it, every rank done
  std::string checkpoint_recipe_hash;

  // The lines that open the run's log: the notes, the rank's place, the device, model, data and
  // run directory, and what a resume continues from.
  std::vector<std::string> describe(const SessionInput& input) const;

 private:
  const recipe::Recipe& recipe_;
  launch::RankInfo rank_;
  std::shared_ptr<SessionData> data_;
  backend::DeviceReport devices_;
  bool on_cuda_ = false;
  std::unique_ptr<backend::Backend> backend_;
  Rendezvous rendezvous_;
  std::optional<comm::Mesh> mesh_;
  model::ModelParallel parallel_;  // points into mesh_
  Peak peak_;
  int peak_devices_ = 1;
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<train::Trainer> trainer_;
  std::string recipe_hash_;
};

// Resuming: loads the newest candidate that every rank reads back intact into the model and
// trainer (run.resumed, run.checkpoint_recipe_hash), moves the newer broken ones to
// checkpoints/rejected/ and adds a note for each to input.notes. Exit code 2 when none loads or
// the checkpoint belongs to another model; kExitOk when the checkpoint is already at
// training.steps.
Exit resume_from_checkpoint(SessionInput& input, RunContext& run, RankLog& log);

// A resumed run repeats the steps after its checkpoint: drop their records (they were written by
// the run that died) so metrics.jsonl holds every step once. Written to a temporary file and
// renamed, so a crash here loses nothing.
void truncate_metrics(const std::filesystem::path& path, int64_t last_step);

}  // namespace trainctl::run
