#include "session.hpp"

#include <fmt/core.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>

#include "backend/backend.hpp"
#include "backend/cuda/device.hpp"
#include "ckpt/ckpt.hpp"
#include "commands.hpp"
#include "convert.hpp"
#include "data/data.hpp"
#include "data/sampler.hpp"
#include "dist/error.hpp"
#include "dist/mesh.hpp"
#include "dist/store.hpp"
#include "launch/local.hpp"
#include "launch/rank_env.hpp"
#include "launch/signals.hpp"
#include "launch/store_address.hpp"
#include "model/model.hpp"
#include "model/parallel.hpp"
#include "telemetry/telemetry.hpp"
#include "train/checkpoint_policy.hpp"
#include "train/checkpointing.hpp"
#include "train/trainer.hpp"

namespace fs = std::filesystem;

namespace trainctl::app {

int report_problems(const std::vector<recipe::Problem>& problems, const std::string& label) {
  std::fputs(recipe::format_report(problems, label).c_str(), stderr);
  return kExitBadInput;
}

int bad_input(const std::string& command, const std::string& message) {
  std::fprintf(stderr, "trainctl %s: error: %s\n", command.c_str(), message.c_str());
  return kExitBadInput;
}

std::vector<recipe::Problem> unsupported_in_this_build(const recipe::LoadedRecipe& loaded) {
  const recipe::Recipe& r = loaded.recipe;
  std::vector<recipe::Problem> problems;
  if (r.cluster.device == recipe::Device::cuda) {
    const backend::DeviceReport devices = backend::detect_gpus();
    if (!devices.cuda_compiled)
      problems.push_back(loaded.origins.problem(
          "cluster.device",
          "this build has no CUDA (no nvcc when it was configured); use cluster.device: auto or "
          "cpu, or rebuild where the CUDA toolkit is installed"));
    else if (devices.gpus.empty())
      problems.push_back(loaded.origins.problem(
          "cluster.device",
          "this machine has no usable GPU (`trainctl version` says why); use "
          "cluster.device: auto or cpu"));
  }
  return problems;
}

namespace {

// The key a data error is about: the validation file when the error names it, else data.path.
std::string_view data_error_key(const recipe::Recipe& r, const std::string& message) {
  const std::string& val = r.data.val_path;
  if (!val.empty() && val != r.data.path && message.starts_with(val + ":")) return "data.val_path";
  return "data.path";
}

telemetry::ProgressMode progress_mode(recipe::Progress p) {
  switch (p) {
    case recipe::Progress::automatic:
      return telemetry::ProgressMode::automatic;
    case recipe::Progress::plain:
      return telemetry::ProgressMode::plain;
    case recipe::Progress::none:
      return telemetry::ProgressMode::none;
  }
  return telemetry::ProgressMode::plain;
}

// FNV-1a over the bytes of the parameter values: a cheap fingerprint two runs can compare.
std::string weights_fingerprint(backend::Backend& be, const model::ParamStore& params) {
  const tensor::Tensor values = params.values();
  std::vector<unsigned char> host(values.bytes());
  be.copy_to_host(host.data(), values);
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : host)
    h = (h ^ c) * 0x100000001b3ull;
  return fmt::format("{:016x}", h);
}

nlohmann::json metrics_record(const train::StepMetrics& m, bool fp16, bool moe) {
  nlohmann::json j{{"step", m.step},      {"loss", m.loss},
                   {"lr", m.lr},          {"grad_norm", m.grad_norm},
                   {"tokens", m.tokens},  {"tokens_per_s", m.tokens_per_s},
                   {"step_ms", m.step_ms}};
  if (fp16) {
    j["loss_scale"] = m.loss_scale;
    j["skipped"] = m.skipped;
  }
  if (moe) {
    j["aux_loss"] = m.aux_loss;
    j["z_loss"] = m.z_loss;
    j["expert_load"] = m.expert_load;
    j["dropped_tokens"] = m.dropped_tokens;
  }
  if (m.val_loss) j["val_loss"] = *m.val_loss;
  return j;
}

// A resumed run repeats the steps after its checkpoint: drop their records (they were written by
// the run that died) so metrics.jsonl holds every step once. Written to a temporary file and
// renamed, so a crash here loses nothing.
void truncate_metrics(const fs::path& path, int64_t last_step) {
  std::ifstream in(path);
  if (!in) return;
  const fs::path tmp = path.string() + ".tmp";
  std::ofstream out(tmp, std::ios::trunc);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() <= last_step)
      out << line << '\n';
  }
  out.close();
  if (!out) throw std::runtime_error("cannot rewrite " + path.string());
  fs::rename(tmp, path);
}

nlohmann::json layout_json(const recipe::Recipe& r) {
  return {{"tp", r.parallel.tp}, {"ep", r.parallel.ep},     {"dp", r.parallel.dp},
          {"pp", r.parallel.pp}, {"zero", r.parallel.zero}, {"world_size", r.world_size()}};
}

}  // namespace

namespace {

// Loads the newest candidate that is valid and reads back intact (every slice's checksum is
// checked as it is read). Returns the loaded entry, or nullopt after printing why none could be
// loaded; `skipped` collects the newer entries passed over, with the reason.
// With a mesh, rank 0's list decides the order and every rank must load the same step: after each
// attempt the ranks agree (a sum over the world), and one rank's failure makes all of them move
// on to the next candidate. A checkpoint of another model (CheckpointMismatch) is rethrown on
// every rank.
struct Skipped {
  ckpt::ScanEntry entry;
  std::string reason;
};
std::optional<ckpt::ScanEntry> load_newest_intact(const std::vector<ckpt::ScanEntry>& candidates,
                                                  model::Transformer& model,
                                                  train::Trainer& trainer, backend::Backend& be,
                                                  const dist::Mesh* mesh,
                                                  std::vector<Skipped>& skipped,
                                                  std::string& recipe_hash) {
  std::vector<int64_t> steps;
  for (const ckpt::ScanEntry& e : candidates)
    steps.push_back(e.step);
  if (mesh) {
    int64_t count = static_cast<int64_t>(steps.size());
    mesh->world().broadcast(&count, sizeof count, 0);
    steps.resize(static_cast<size_t>(count));
    if (count > 0) mesh->world().broadcast(steps.data(), steps.size() * sizeof(int64_t), 0);
  }
  constexpr double kMismatch = 1e6;  // outweighs any number of plain failures in the sum
  for (int64_t step : steps) {
    const auto it = std::find_if(candidates.begin(), candidates.end(),
                                 [&](const ckpt::ScanEntry& e) { return e.step == step; });
    std::string reason;
    std::string mismatch;
    if (it == candidates.end()) {
      reason = "not found by this rank";
    } else if (it->status != ckpt::Status::valid) {
      reason = it->reason.empty() ? "not valid" : it->reason;
    } else {
      try {
        const ckpt::CheckpointReader reader = ckpt::CheckpointReader::open(it->path);
        train::restore_checkpoint(reader, model, trainer, be);
        recipe_hash = reader.manifest().header.recipe_hash;
      } catch (const ckpt::CheckpointError& error) {
        reason = error.what();
      } catch (const train::CheckpointMismatch& error) {
        mismatch = error.what();
      }
    }
    double failures = !mismatch.empty() ? kMismatch : reason.empty() ? 0.0 : 1.0;
    if (mesh) mesh->world().all_reduce_sum(std::span<double>(&failures, 1));
    if (failures >= kMismatch)
      throw train::CheckpointMismatch(
          mismatch.empty() ? fmt::format("step {}: another rank found the checkpoint belongs to "
                                         "another run (see its log)",
                                         step)
                           : mismatch);
    if (failures == 0 && it != candidates.end()) return *it;
    if (it != candidates.end())
      skipped.push_back({*it, reason.empty()
                                  ? std::string("another rank could not load it (see its log)")
                                  : reason});
  }
  return std::nullopt;
}

// The rendezvous store of a multi-rank job: a FileStore in the folder the launcher named, else in
// the run directory; without a shared file system under Slurm, a TCP store that rank 0 serves on
// the first node (launch/store_address.hpp). Namespaced by the job attempt.
struct Rendezvous {
  std::unique_ptr<dist::TcpStoreServer> server;  // rank 0's, when the store is TCP
  std::unique_ptr<dist::Store> base;
  std::unique_ptr<dist::PrefixStore> store;
  std::string how;  // for the log
};
Rendezvous open_rendezvous(const launch::RankInfo& rank, const fs::path& run_dir, bool shared_fs,
                           std::chrono::milliseconds timeout) {
  Rendezvous rv;
  if (!shared_fs && rank.source == launch::RankSource::slurm) {
    const launch::StoreAddress address =
        launch::tcp_store_address(rank, [](const char* name) { return std::getenv(name); });
    if (rank.rank == 0) rv.server = std::make_unique<dist::TcpStoreServer>("", address.port);
    rv.base = std::make_unique<dist::TcpStore>(address.host, address.port, timeout);
    rv.how = fmt::format("{} ({})", rv.base->describe(), address.how);
  } else {
    const fs::path dir =
        rank.rendezvous.empty() ? run_dir / "rendezvous" / rank.job_id : fs::path(rank.rendezvous);
    rv.base = std::make_unique<dist::FileStore>(dir.string());
    rv.how = rv.base->describe();
  }
  std::string job = rank.job_id;
  std::replace(job.begin(), job.end(), '/', '_');
  rv.store = std::make_unique<dist::PrefixStore>(
      dist::job_store(*rv.base, job.empty() ? "job" : job, rank.restart_count));
  return rv;
}

// Letters, digits, '-' and '_' only: the checkpoint writer's save_id.
std::string save_id_of(const launch::RankInfo& rank) {
  std::string id = rank.job_id + "-" + std::to_string(rank.restart_count);
  for (char& c : id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  return id;
}

// Whether two FILE streams write to the same file (a rank whose stderr the launcher sends to its
// log): then a message goes to one of them only.
bool same_file(std::FILE* a, std::FILE* b) {
  struct stat sa {
  }, sb{};
  if (::fstat(::fileno(a), &sa) != 0 || ::fstat(::fileno(b), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace

int train_session(SessionInput input, const std::string& command) {
  const recipe::Recipe& r = input.loaded.recipe;
  const bool resuming = input.resuming;
  const launch::RankInfo& rank_info = input.rank;
  const bool multi = rank_info.world_size > 1;
  const int rank = rank_info.rank;
  const bool leader = rank == 0;  // writes the run's files and shows progress
  // From the start: Slurm may signal a job (time limit, preemption) while it is still loading,
  // and an unhandled SIGUSR1 would kill the rank instead of saving after the first step.
  launch::StopSignals stop;

  // ---- 1. input that depends on the environment: the data ----
  const backend::DeviceReport devices = backend::detect_gpus();
  data::Dataset dataset;
  std::optional<data::Sampler> sampler;
  std::optional<data::ValidationSet> val;
  try {
    dataset = data::open_dataset(to_data_config(r));
    sampler.emplace(*dataset.train, r.model.seq_len, static_cast<uint64_t>(r.determinism.seed),
                    true, r.model.vocab);
    if (dataset.val && dataset.val->size() > r.model.seq_len) {
      val.emplace(*dataset.val, r.model.seq_len, r.model.vocab);
      if (val->num_batches(r.training.micro_batch) < 1) val.reset();
    }
  } catch (const data::DataError& e) {
    return report_problems({input.loaded.origins.problem(data_error_key(r, e.what()), e.what())},
                           input.recipe_label);
  }

  const fs::path& run_dir = input.run_dir;
  // The rank's own log. With several ranks every rank has one from the start (the launcher has
  // already written its header there), so it is appended to; one rank keeps the old behaviour.
  // Opened once the ranks have met: with an external launcher rank 0 may still be clearing the
  // run directory (--overwrite) until then. Errors before that go to stderr, which our launcher
  // sends to the log anyway.
  std::FILE* log_file = nullptr;
  auto open_rank_log = [&] {
    fs::create_directories(run_dir / "logs");
    const fs::path path = run_dir / "logs" / fmt::format("rank_{}.log", rank);
    log_file = std::fopen(path.c_str(), "a");
    if (!log_file) throw std::runtime_error("cannot write " + path.string());
  };
  // An error of this rank: to its log and to stderr (once when stderr is the log).
  auto fail = [&](const std::string& message, int code) {
    const std::string line = fmt::format("trainctl {}: error: {}{}\n", command,
                                         multi ? fmt::format("rank {}: ", rank) : "", message);
    if (log_file) {
      std::fputs(line.c_str(), log_file);
      std::fflush(log_file);
    }
    if (!log_file || !same_file(log_file, stderr)) std::fputs(line.c_str(), stderr);
    if (log_file) std::fclose(log_file);
    log_file = nullptr;
    return code;
  };

  try {
    // ---- 2. rendezvous (several ranks), build, and load the checkpoint ----
    Rendezvous rendezvous;
    std::optional<dist::Mesh> mesh;
    model::ModelParallel parallel;
    const train::TrainConfig train_config = to_train_config(r);
    if (multi) {
      rendezvous = open_rendezvous(
          rank_info, run_dir, r.cluster.shared_fs,
          std::chrono::milliseconds(static_cast<int64_t>(r.parallel.timeout_s * 1000.0)));
      dist::Layout layout;
      layout.tp = r.parallel.tp;
      layout.ep = r.parallel.ep;
      layout.dp = r.parallel.dp;
      layout.pp = r.parallel.pp;
      dist::MeshOptions mesh_options;
      mesh_options.timeout =
          std::chrono::milliseconds(static_cast<int64_t>(r.parallel.timeout_s * 1000.0));
      mesh.emplace(
          dist::Mesh::create(*rendezvous.store, rank_info.world_size, rank, layout, mesh_options));
      open_rank_log();
      const dist::Coordinates& at = mesh->groups().coordinates;
      if (r.parallel.tp > 1) parallel.tp = &mesh->tp();
      if (r.parallel.ep > 1) parallel.ep = &mesh->ep();
      parallel.pp_rank = at.pp;
      parallel.pp_size = r.parallel.pp;
      parallel.stage_layers = r.parallel.pp_layers;
      parallel.activation_slots = std::max(
          1,
          std::min(r.parallel.pp - at.pp, train_config.accum_steps(r.parallel.dp * r.parallel.ep)));
      if (r.parallel.zero == 1) {
        parallel.zero_parts = r.parallel.dp;
        parallel.zero_rank = at.dp;
      }
    }
    // cluster.device: cuda runs the CUDA backend on this rank's GPU (its local rank); auto stays
    // on the CPU until tests/gpu has passed on a GPU (docs/cuda.md).
    const bool on_cuda = r.cluster.device == recipe::Device::cuda;
    std::unique_ptr<backend::Backend> be;
    if (on_cuda) {
      const int rank_gpu =
          launch::device_for_rank(rank_info, static_cast<int>(devices.gpus.size()));
      try {
        be = backend::make_cuda_backend(rank_gpu >= 0 ? rank_gpu : rank_info.local_rank,
                                        r.determinism.deterministic);
      } catch (const std::exception& e) {
        return fail(fmt::format("cluster.device: cuda: {} ({})", e.what(), devices.status),
                    kExitFailure);
      }
    } else {
      be = backend::make_cpu_backend();
    }
    const model::ModelConfig model_config = to_model_config(r);
    model::Transformer model(model_config, *be, r.training.micro_batch, parallel);
    model.params().initialize(static_cast<uint64_t>(r.determinism.seed));
    train::Trainer trainer(train_config, model, *be, *sampler, val ? &*val : nullptr,
                           mesh ? &*mesh : nullptr);
    std::string checkpoint_recipe_hash;
    std::optional<ckpt::ScanEntry> resumed;
    const fs::path checkpoints_dir = run_dir / "checkpoints";
    if (resuming) {
      std::vector<Skipped> skipped;
      try {
        resumed = load_newest_intact(input.resume_candidates, model, trainer, *be,
                                     mesh ? &*mesh : nullptr, skipped, checkpoint_recipe_hash);
      } catch (const train::CheckpointMismatch& e) {
        return fail(e.what(), kExitBadInput);
      }
      if (!resumed) {
        std::string found;
        for (const Skipped& k : skipped)
          found += fmt::format("\n  {}: {}", k.entry.name, k.reason);
        const std::string message = fmt::format(
            "{} holds no valid checkpoint to resume from:{}\n"
            "start the run again with trainctl run --overwrite",
            checkpoints_dir.string(), found);
        return fail(message, kExitBadInput);
      }
      if (resumed->step >= r.training.steps) {
        if (leader)
          std::fprintf(stderr,
                       "trainctl %s: %s is at step %lld of training.steps %lld: the run is "
                       "complete (extend it with --set training.steps=N)\n",
                       command.c_str(), resumed->path.string().c_str(),
                       static_cast<long long>(resumed->step),
                       static_cast<long long>(r.training.steps));
        if (log_file) std::fclose(log_file);
        return kExitOk;
      }
      // Only now that a checkpoint has loaded: move the newer broken ones out of the way, so a
      // later save of the same step cannot collide with them. They are kept, never read. One
      // rank moves them (rank 0), the others only report.
      for (const Skipped& k : skipped) {
        const fs::path rejected = checkpoints_dir / "rejected" / k.entry.name;
        if (leader) {
          fs::create_directories(rejected.parent_path());
          fs::remove_all(rejected);
          fs::rename(k.entry.path, rejected);
        }
        input.notes.push_back(fmt::format("skipped {} ({}): moved to {}, never read", k.entry.name,
                                          k.reason, rejected.string()));
      }
      // No rank may save into checkpoints/ before the rejected ones are out of the way.
      if (mesh) mesh->world().barrier();
    }
    const int64_t start_step = trainer.steps_done();

    // ---- 3. run directory (rank 0 writes the run's files) ----
    fs::create_directories(run_dir / "logs");
    const std::string hash = recipe::recipe_hash(r);
    if (leader) {
      std::ofstream out(run_dir / "recipe.yaml.tmp");
      out << "# resolved recipe (hash " << hash << ")\n" << recipe::dump_recipe(r);
      out.close();
      fs::rename(run_dir / "recipe.yaml.tmp", run_dir / "recipe.yaml");
      if (resuming) truncate_metrics(run_dir / "metrics.jsonl", start_step);
    }
    std::optional<telemetry::MetricsWriter> metrics;
    std::optional<telemetry::TensorBoardWriter> tensorboard;
    if (leader) {
      metrics.emplace(run_dir / "metrics.jsonl");
      if (r.logging.tensorboard) tensorboard.emplace(run_dir);
    }
    if (!log_file) {
      log_file = std::fopen((run_dir / "logs" / "rank_0.log").c_str(), resuming ? "a" : "w");
      if (!log_file)
        throw std::runtime_error("cannot write " + (run_dir / "logs/rank_0.log").string());
    }
    std::optional<telemetry::Progress> progress;
    if (leader)
      progress.emplace(r.training.steps, progress_mode(r.logging.progress), stderr,
                       r.logging.every_steps);
    telemetry::Progress log(r.training.steps, telemetry::ProgressMode::plain, log_file,
                            r.logging.every_steps, false);
    auto say = [&](const std::string& line) {
      if (progress) progress->message(line);
      log.message(line);
    };
    for (const std::string& note : input.notes)
      say(note);
    if (multi || rank_info.launched()) say(launch::describe_rank(rank_info));
    if (multi)
      say(fmt::format("{} ({}), rendezvous {}", mesh->layout().to_string(),
                      fmt::format("tp rank {}, ep rank {}, dp rank {}, pp stage {}",
                                  mesh->groups().coordinates.tp, mesh->groups().coordinates.ep,
                                  mesh->groups().coordinates.dp, mesh->groups().coordinates.pp),
                      rendezvous.how));
    // The GPU follows the local rank (one rank per GPU of the node); the CUDA backend takes it.
    const int gpu_count = static_cast<int>(devices.gpus.size());
    const int gpu = launch::device_for_rank(rank_info, gpu_count);
    say(devices.gpus.empty()
            ? fmt::format("device: {}, using CPU", devices.status)
            : fmt::format(
                  "device: {}; this rank's GPU: {}; {}", devices.status,
                  gpu >= 0
                      ? fmt::format("index {} (local rank {})", gpu, rank_info.local_rank)
                      : fmt::format("none: local rank {} but {} GPU{} visible",
                                    rank_info.local_rank, gpu_count, gpu_count == 1 ? "" : "s"),
                  on_cuda ? "using the CUDA backend"
                          : "using CPU (the CUDA backend is opt-in, cluster.device: cuda, until "
                            "tests/gpu has passed on a GPU)"));
    say(fmt::format("model: {} ({} parameters{}, {})", model::describe(model_config),
                    telemetry::format_count(static_cast<uint64_t>(model.params().table().numel())),
                    multi ? " on this rank" : "", tensor::dtype_name(model_config.storage)));
    say(fmt::format(
        "data: {} train tokens ({}), {} validation tokens",
        telemetry::format_count(static_cast<uint64_t>(dataset.train->size())),
        dataset.train->describe(),
        telemetry::format_count(static_cast<uint64_t>(dataset.val ? dataset.val->size() : 0))));
    say(fmt::format("run directory: {}", run_dir.string()));
    if (resuming) {
      say(fmt::format("resuming from {} (the newest valid checkpoint) at step {} of {}",
                      resumed->name, start_step, r.training.steps));
      if (checkpoint_recipe_hash != hash)
        say(
            fmt::format("note: the recipe (hash {}) differs from the checkpoint's (hash {}); "
                        "the model is the same, so training continues with the new settings",
                        hash, checkpoint_recipe_hash));
    }

    // ---- 4. train, saving on the recipe's cadence, at the end, and on a stop signal ----
    const bool fp16 = model_config.storage == tensor::DType::f16;
    const bool moe = model_config.moe.experts > 0;
    const train::CheckpointPolicy policy(r.checkpoint.every_steps, r.checkpoint.every_minutes,
                                         r.training.steps);
    ckpt::CheckpointWriter::Options writer_options{r.checkpoint.async, r.checkpoint.keep_last};
    writer_options.rank = rank;
    writer_options.world_size = rank_info.world_size;
    writer_options.save_id = save_id_of(rank_info);
    writer_options.timeout =
        std::chrono::milliseconds(static_cast<int64_t>(r.parallel.timeout_s * 1000.0));
    ckpt::CheckpointWriter writer(checkpoints_dir, writer_options);
    // cluster.shared_fs: false: rank 0 could not see the other ranks' shards to commit them.
    const bool saves = r.cluster.shared_fs;
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    auto last_save = start;
    int64_t reported_save = -1;
    double stall_ms = 0;
    std::optional<double> last_val;
    train::StepMetrics last;
    int64_t skipped = 0;
    bool stopping = false;  // agreed by every rank
    // A finished background save is reported once: bytes, bandwidth and the stall it cost.
    auto report_saves = [&] {
      const auto stats = writer.last_stats();
      if (!stats || stats->step == reported_save) return;
      reported_save = stats->step;
      say(fmt::format("checkpoint {}: {} in {:.2f} s ({}/s), training stalled {:.1f} ms",
                      stats->path.filename().string(), telemetry::format_bytes(stats->bytes),
                      stats->write_seconds,
                      telemetry::format_bytes(static_cast<uint64_t>(stats->bandwidth)), stall_ms));
    };
    try {
      trainer.run([&](const train::StepMetrics& m) {
        if (metrics) {
          nlohmann::json record = metrics_record(m, fp16, moe);
          if (multi) record["comm_ms"] = m.comm_ms;
          metrics->write(record);
        }
        telemetry::StepInfo info{m.step,         m.loss,    m.lr,
                                 m.tokens_per_s, m.step_ms, {{"grad_norm", m.grad_norm}}};
        if (fp16) info.extras.push_back({"scale", m.loss_scale});
        if (m.val_loss) info.extras.push_back({"val_loss", *m.val_loss});
        if (progress) progress->update(info);
        log.update(info);
        if (tensorboard) {
          std::vector<std::pair<std::string, double>> scalars{
              {"train/loss", m.loss},
              {"train/lr", m.lr},
              {"train/grad_norm", m.grad_norm},
              {"perf/tokens_per_s", m.tokens_per_s}};
          if (fp16) scalars.push_back({"train/loss_scale", m.loss_scale});
          if (moe) {
            scalars.push_back({"moe/aux_loss", m.aux_loss});
            scalars.push_back({"moe/z_loss", m.z_loss});
          }
          if (m.val_loss) scalars.push_back({"val/loss", *m.val_loss});
          tensorboard->add_scalars(m.step, scalars);
        }
        if (m.skipped) {
          ++skipped;
          say(fmt::format("step {}: non-finite gradients, step skipped, loss scale now {}", m.step,
                          trainer.loss_scaler().scale()));
        }
        if (m.val_loss) last_val = m.val_loss;
        last = m;
        writer.poll();  // a failed background save stops the run now, not at the next save
        report_saves();
        const double since_save = std::chrono::duration<double>(Clock::now() - last_save).count();
        // Every rank must stop after, and save, the same step: a signal may reach one rank
        // first, and a time-based cadence is measured by each rank's own clock.
        double votes[2] = {stop.requested() ? 1.0 : 0.0,
                           saves && policy.due(m.step, since_save, false) ? 1.0 : 0.0};
        if (mesh) mesh->world().all_reduce_sum(std::span<double>(votes, 2));
        stopping = votes[0] > 0;
        if (saves && (votes[1] > 0 || stopping)) {
          if (tensorboard) tensorboard->flush();
          const auto before = Clock::now();
          ckpt::SaveRequest request = train::capture_checkpoint(
              writer.new_request(), model, trainer, *be, hash, layout_json(r));  // reused memory
          writer.save(std::move(request));  // waits for the previous save first
          last_save = Clock::now();
          stall_ms = std::chrono::duration<double, std::milli>(last_save - before).count();
        }
        return !stopping;
      });
      writer.wait();
    } catch (const ckpt::CheckpointError& e) {
      if (progress) progress->finish();
      const ckpt::ScanReport now = ckpt::scan(checkpoints_dir);
      const ckpt::ScanEntry* good = now.newest_valid();
      const std::string message = fmt::format(
          "saving a checkpoint failed: {}\n{}", e.what(),
          good ? fmt::format("the newest good checkpoint is {}; after fixing the cause, continue "
                             "with: trainctl resume {}",
                             good->name, run_dir.string())
               : std::string("no checkpoint of this run has been saved yet"));
      return fail(message, kExitFailure);
    }
    report_saves();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (progress) progress->finish();
    if (tensorboard) tensorboard->flush();

    // ---- 5. summary ----
    if (stopping && last.step < r.training.steps && !saves) {
      say(
          fmt::format("stopped by {} after step {} without a checkpoint (cluster.shared_fs: false "
                      "turns them off): the run cannot be continued",
                      stop.requested() ? stop.name() : "a stop signal of another rank", last.step));
      std::fclose(log_file);
      return kExitFailure;
    }
    if (stopping && last.step < r.training.steps) {  // a signal after the last step: done
      say(fmt::format(
          "stopped by {} after step {}, checkpoint saved; continue with: trainctl resume {}",
          stop.requested() ? stop.name() : "a stop signal of another rank", last.step,
          run_dir.string()));
      std::fclose(log_file);
      return kExitSavedOnSignal;
    }
    const model::ParamStore::Bytes pb = model.params().bytes();
    telemetry::MemoryReport memory;
    memory.params = pb.params;
    memory.grads = pb.grads;
    memory.optimizer = pb.optimizer;
    memory.activations = model.activation_bytes().total();
    const double tokens_per_s = static_cast<double>(int64_t{r.training.global_batch} *
                                                    r.model.seq_len * (last.step - start_step)) /
                                seconds;
    // With several ranks: rank 0's parameters (its shard under tp/pp/ep).
    const std::string fingerprint = weights_fingerprint(*be, model.params());
    if (leader) {
      nlohmann::json summary{{"steps", last.step},
                             {"final_loss", last.loss},
                             {"tokens", last.tokens},
                             {"seconds", seconds},
                             {"tokens_per_s", tokens_per_s},
                             {"skipped_steps", skipped},
                             {"resumed_from_step", start_step},
                             {"weights_fnv1a64", fingerprint},
                             {"memory_bytes", memory.to_json()},
                             {"forward_flops_per_token", model.forward_flops_per_token()}};
      if (multi) summary["layout"] = layout_json(r);
      if (last_val) summary["final_val_loss"] = *last_val;
      std::ofstream(run_dir / "summary.json") << summary.dump(2) << "\n";
    }
    say(fmt::format("done: {} steps in {} | loss {:.4f}{} | {} tokens/s | weights {}", last.step,
                    telemetry::format_duration(seconds), last.loss,
                    last_val ? fmt::format(" | val_loss {:.4f}", *last_val) : std::string(),
                    telemetry::format_count(static_cast<uint64_t>(tokens_per_s)), fingerprint));
    say(std::string(multi ? "peak memory of this rank by category:\n"
                          : "peak memory by category:\n") +
        memory.to_string());
    std::fclose(log_file);
    return kExitOk;
  } catch (const dist::DistError& e) {
    // A peer died or went silent, or the rendezvous failed: the message names the op, the group
    // and the peer. The launcher stops the other ranks.
    return fail(e.what(), kExitFailure);
  }
}

int check_rank_environment(SessionInput& input, const std::string& command) {
  try {
    input.rank = launch::rank_info_from_environment();
  } catch (const launch::RankEnvError& e) {
    return bad_input(command, e.what());
  }
  const recipe::Recipe& r = input.loaded.recipe;
  if (input.rank.launched() && input.rank.world_size != r.world_size())
    return bad_input(
        command,
        fmt::format("{} started {} rank{} but the recipe's layout needs tp*ep*dp*pp = "
                    "{}*{}*{}*{} = {}; start {} ranks, or change the parallel degrees (or run "
                    "without a launcher: trainctl starts the ranks itself)",
                    launch::rank_source_name(input.rank.source), input.rank.world_size,
                    input.rank.world_size == 1 ? "" : "s", r.parallel.tp, r.parallel.ep,
                    r.parallel.dp, r.parallel.pp, r.world_size(), r.world_size()));
  return -1;
}

int start_session(SessionInput input, const std::string& command) {
  const recipe::Recipe& r = input.loaded.recipe;
  if (input.rank.launched() || r.world_size() == 1) return train_session(std::move(input), command);
  launch::LocalLaunch local;
  local.argv = launch::own_command_line();
  local.run_dir = input.run_dir;
  local.world_size = r.world_size();
  local.layout = fmt::format("tp{} ep{} dp{} pp{}", r.parallel.tp, r.parallel.ep, r.parallel.dp,
                             r.parallel.pp);
  local.command = command;  // the notes are rank 0's to print
  return launch::launch_local(local);
}

}  // namespace trainctl::app
