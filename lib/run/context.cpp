#include "run/context.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include "comm/error.hpp"
#include "comm/gloo_communicator.hpp"
#include "launch/store_address.hpp"
#include "telemetry/telemetry.hpp"

namespace fs = std::filesystem;

namespace trainctl::run {

namespace {

// This rank's GPU: launch::device_for_rank, or its local rank where that finds none (the CUDA
// backend then says the device does not exist).
int rank_gpu(const launch::RankInfo& rank, const backend::DeviceReport& devices) {
  const int gpu = launch::device_for_rank(rank, static_cast<int>(devices.gpus.size()));
  return gpu >= 0 ? gpu : rank.local_rank;
}

Rendezvous open_rendezvous(const launch::RankInfo& rank, const fs::path& run_dir, bool shared_fs,
                           const std::optional<comm::StoreSecret>& store_secret,
                           std::chrono::milliseconds timeout) {
  Rendezvous rv;
  if (uses_tcp_store(shared_fs, rank)) {
    if (!store_secret)  // check_rank_environment reads it for every rank that gets here
      throw std::logic_error("open_rendezvous: a TCP store rendezvous without the job's secret");
    const auto getenv = [](const char* name) { return std::getenv(name); };
    const bool slurm = rank.source == launch::RankSource::slurm;
    const bool external = rank.source == launch::RankSource::torchrun;
    const launch::StoreAddress address = slurm      ? launch::tcp_store_address(rank, getenv)
                                         : external ? launch::external_store_address(getenv)
                                                    : launch::launcher_store_address(getenv);
    const comm::StoreSecret& secret = *store_secret;
    if ((slurm || external) && rank.rank == 0)  // our launcher serves its ranks' store itself
      rv.server =
          std::make_unique<comm::TcpStoreServer>("", address.port, secret, store_server_options());
    rv.base = std::make_unique<comm::TcpStore>(address.host, address.port, secret, timeout);
    rv.how = fmt::format("{} ({})", rv.base->describe(), address.how);
  } else {
    const fs::path dir =
        rank.rendezvous.empty() ? run_dir / "rendezvous" / rank.job_id : fs::path(rank.rendezvous);
    rv.base = std::make_unique<comm::FileStore>(dir.string());
    rv.how = rv.base->describe();
  }
  std::string job = rank.job_id;
  std::replace(job.begin(), job.end(), '/', '_');
  rv.store = std::make_unique<comm::PrefixStore>(
      comm::job_store(*rv.base, job.empty() ? "job" : job, rank.restart_count));
  return rv;
}

// Every rank trains the same recipe: the layout builds the groups, and `parallel: auto` is
// planned on each rank (a pure function of the recipe, the world and the machine description).
// Each rank posts its recipe hash and degrees; every other rank compares with rank 0's before
// a group forms, so ranks that disagree (different overrides, or an auto plan on different
// machines) stop with both recipes named instead of building mismatched groups.
void agree_on_recipe(comm::Store& store, int rank, const std::string& hash,
                     const std::string& degrees, std::chrono::milliseconds timeout) {
  const std::string mine = hash + " " + degrees;
  store.set("recipe/" + std::to_string(rank), mine);
  if (rank == 0) return;
  const std::string first = store.get("recipe/0", timeout);
  if (first != mine)
    throw std::runtime_error(fmt::format(
        "rank {} runs the recipe {} (hash, degrees) and rank 0 the recipe {}: every rank of a "
        "job must run the same recipe (the same file and --set values; with parallel: auto, the "
        "same world and machine)",
        rank, mine, first));
}

// A token id the model cannot embed, found by reading the tokens once (data::scan_vocab). With an

}  // namespace

RunContext::RunContext(const SessionInput& input, RankLog& log)
    : recipe_(input.loaded.recipe),
      rank_(input.rank),
      data_(input.data),
      devices_(backend::detect_gpus()),
      recipe_hash_(recipe::recipe_hash(input.loaded.recipe)) {
  const recipe::Recipe& r = recipe_;
  // The trainer's config is the recipe's own sections (train/config.hpp) and a few settings.
  train::TrainConfig train_config;
  static_cast<train::TrainingConfig&>(train_config) = r.training;
  train_config.optimizer = r.optimizer;
  train_config.schedule = r.schedule;
  train_config.loss_scaling = r.precision;
  train_config.eval_every_steps = r.logging.eval_every_steps;
  train_config.eval_batches = r.logging.eval_batches;
  train_config.timeline_step = r.logging.timeline_step;
  train_config.zero = r.parallel.zero;
  train_config.reduce_dtype = r.precision.reduce_dtype;
  train_config.seed = static_cast<uint64_t>(r.determinism.seed);
  train_config.overlap_grad_sync = r.parallel.overlap_grad_sync;
  if (input.debug_slow_rank.rank == input.rank.rank)
    train_config.debug_step_delay = input.debug_slow_rank.delay;
  train_config.stability = r.stability;
  train_config.snapshot_every_steps = r.checkpoint.memory_every_steps;
  train_config.debug_nan_batches = input.debug_batches.nan;
  train_config.debug_spike_batches = input.debug_batches.spike;
  train_config.debug_drop_batches = input.debug_batches.drop;
  // cluster.device: cuda runs the CUDA backend on this rank's GPU (its local rank); auto stays
  // on the CPU until tests/gpu has passed on a GPU (docs/cuda.md). The backend comes first: the
  // mesh of a CUDA rank is NCCL's, on the backend's GPU and ordered after its stream.
  on_cuda_ = r.cluster.device == recipe::Device::cuda;
  if (on_cuda_) {
    try {
      backend_ = backend::make_cuda_backend(rank_gpu(rank_, devices_), r.determinism.deterministic);
    } catch (const std::exception& e) {
      throw BackendUnavailable(
          fmt::format("cluster.device: cuda: {} ({})", e.what(), devices_.status));
    }
  } else {
    backend_ = backend::make_cpu_backend();
  }
  const launch::RankInfo& rank_info = rank_;
  const int rank = rank_info.rank;
  if (leader()) {
    // Before the rendezvous, so the CPU is quiet: the other ranks wait there.
    if (on_cuda_) {
      const int index = rank_gpu(rank_info, devices_);
      for (const backend::GpuInfo& gpu : devices_.gpus)
        if (gpu.index == index) peak_ = gpu_peak(gpu, r.model.storage);
      peak_devices_ = rank_info.world_size;
    } else {
      peak_ = measure_gemm_peak(*backend_, r.model.storage);
      peak_devices_ = std::max(1, rank_info.world_size / std::max(1, rank_info.local_world_size));
    }
  }
  parallel_.layout = r.parallel;  // one rank: recompute is all the layout says
  if (rank_info.world_size > 1) {
    // Meet the others, build the mesh (Gloo groups on the CPU backend, NCCL groups on the GPU of
    // a CUDA backend, ordered after its stream), open the rank's log and fill the model's parallel
    // layout.
    rendezvous_ = open_rendezvous(
        rank_info, input.run_dir, r.cluster.shared_fs, input.store_secret,
        std::chrono::milliseconds(static_cast<int64_t>(r.parallel.timeout_s * 1000.0)));
    comm::MeshOptions mesh_options;
    mesh_options.timeout =
        std::chrono::milliseconds(static_cast<int64_t>(r.parallel.timeout_s * 1000.0));
    // The gradient reduction's second contexts (GradSync), with and without ZeRO-1.
    mesh_options.background_groups = r.parallel.overlap_grad_sync;
    if (backend_->device() == backend::Device::cuda) {
      // The model hands the groups device buffers: NCCL on this rank's GPU, each call ordered
      // after the backend's stream. Host values (the loss, the norm, MoE counts, the session's
      // votes) go through the same groups, staged by the NCCL communicator.
      mesh_options.backend = comm::CommBackend::nccl;
      mesh_options.cuda_device = rank_gpu(rank_info, devices_);
      mesh_options.cuda_stream = backend_->stream();
      mesh_options.deterministic = r.determinism.deterministic;
    }
    agree_on_recipe(*rendezvous_.store, rank, recipe_hash_, r.parallel.degrees(),
                    mesh_options.timeout);
    mesh_.emplace(comm::Mesh::create(*rendezvous_.store, rank_info.world_size, rank, r.parallel,
                                     mesh_options));
    log.open(input.run_dir, true);
    parallel_ = model::ModelParallel::from_mesh(*mesh_, r.parallel.zero);
    parallel_.stage_layers = r.parallel.pp_layers;
    parallel_.virtual_stages = r.parallel.pp_virtual;
    parallel_.split_backward = splits_backward(r.parallel.pp_schedule);
    parallel_.activation_slots =
        pipeline_slots({r.parallel.pp, train_config.accum_steps(r.parallel.dp * r.parallel.ep),
                        r.parallel.pp_schedule, r.parallel.pp_virtual},
                       parallel_.pp_rank());
  }
  parallel_.optimizer_moments = train::moment_names(r.optimizer);
  model_ =
      std::make_unique<model::Transformer>(r.model, *backend_, r.training.micro_batch, parallel_);
  model_->params().initialize(static_cast<uint64_t>(r.determinism.seed));
  SessionData& corpus = *data_;
  trainer_ = std::make_unique<train::Trainer>(train_config, *model_, *backend_, *corpus.sampler,
                                              corpus.val ? &*corpus.val : nullptr, mesh());
}

std::vector<std::string> RunContext::describe(const SessionInput& input) const {
  const recipe::Recipe& r = recipe_;
  const bool multi = rank_.world_size > 1;
  std::vector<std::string> lines = input.notes;
  if (multi || rank_.launched()) lines.push_back(launch::describe_rank(rank_));
  if (multi) {
    const comm::Coordinates& at = mesh_->groups().coordinates;
    // Gloo's address says which network the collectives take (TRAINCTL_GLOO_IFACE).
    lines.push_back(
        fmt::format("{} (tp rank {}, ep rank {}, dp rank {}, pp stage {}), rendezvous {}{}",
                    mesh_->layout().to_string(), at.tp, at.ep, at.dp, at.pp, rendezvous_.how,
                    on_cuda_ ? std::string() : ", gloo on " + comm::gloo_address()));
  }
  // The GPU follows the local rank (one rank per GPU of the node); the CUDA backend takes it.
  const int gpu_count = static_cast<int>(devices_.gpus.size());
  const int gpu = launch::device_for_rank(rank_, gpu_count);
  lines.push_back(
      devices_.gpus.empty()
          ? fmt::format("device: cpu ({})", devices_.summary)
          : fmt::format(
                "device: {}; this rank's GPU: {}; {}", devices_.status,
                gpu >= 0 ? fmt::format("index {} (local rank {})", gpu, rank_.local_rank)
                         : fmt::format("none: local rank {} but {} GPU{} visible", rank_.local_rank,
                                       gpu_count, gpu_count == 1 ? "" : "s"),
                on_cuda_ ? "using the CUDA backend"
                         : "using CPU (the CUDA backend is opt-in, cluster.device: cuda, until "
                           "tests/gpu has passed on a GPU)"));
  if (leader() && !peak_.source.empty()) lines.push_back("MFU against: " + peak_.source);
  lines.push_back(
      fmt::format("model: {} ({} parameters{}, {})", model::describe(r.model),
                  telemetry::format_count(static_cast<uint64_t>(model_->params().table().numel())),
                  multi ? " on this rank" : "", tensor::dtype_name(r.model.storage)));
  const data::Dataset& dataset = data_->dataset;
  lines.push_back(fmt::format(
      "data: {} train tokens ({}), {} validation tokens",
      telemetry::format_count(static_cast<uint64_t>(dataset.train_tokens())), dataset.describe(),
      telemetry::format_count(static_cast<uint64_t>(dataset.val_tokens()))));
  lines.push_back(fmt::format("run directory: {}", input.run_dir.string()));
  if (resumed) {
    lines.push_back(fmt::format(
        "resuming from {} (the newest valid checkpoint) at step {} of {}, read in {:.2f} s",
        resumed->name, start_step(), r.training.steps, resume_seconds));
    if (checkpoint_recipe_hash != recipe_hash_)
      lines.push_back(
          fmt::format("note: the recipe (hash {}) differs from the checkpoint's (hash {}); the "
                      "model is the same, so training continues with the new settings",
                      recipe_hash_, checkpoint_recipe_hash));
  }
  return lines;
}

}  // namespace trainctl::run
