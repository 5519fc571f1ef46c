#include "session.hpp"

#include <fmt/core.h>

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
#include <thread>

#include "backend/backend.hpp"
#include "backend/cuda/device.hpp"
#include "ckpt/ckpt.hpp"
#include "comm/error.hpp"
#include "comm/mesh.hpp"
#include "commands.hpp"
#include "convert.hpp"
#include "data/data.hpp"
#include "data/sampler.hpp"
#include "files/files.hpp"
#include "launch/rank_env.hpp"
#include "launch/signals.hpp"
#include "model/model.hpp"
#include "model/parallel.hpp"
#include "session_internal.hpp"
#include "telemetry/telemetry.hpp"
#include "train/checkpoint_policy.hpp"
#include "train/checkpointing.hpp"
#include "train/trainer.hpp"

namespace fs = std::filesystem;

namespace trainctl::app {

namespace {

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

nlohmann::json layout_json(const recipe::Recipe& r) {
  return {{"tp", r.parallel.tp}, {"ep", r.parallel.ep},     {"dp", r.parallel.dp},
          {"pp", r.parallel.pp}, {"zero", r.parallel.zero}, {"world_size", r.world_size()}};
}

// Letters, digits, '-' and '_' only: the checkpoint writer's save_id.
std::string save_id_of(const launch::RankInfo& rank) {
  std::string id = rank.job_id + "-" + std::to_string(rank.restart_count);
  for (char& c : id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  return id;
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
  // Opened by check_session_input before anything was created; opened here for callers that
  // skip it (tests of the session).
  std::shared_ptr<SessionData> corpus_data = input.data;
  if (!corpus_data) {
    corpus_data = std::make_shared<SessionData>();
    if (const int code = open_session_data(input, *corpus_data); code >= 0) return code;
  }
  SessionData& corpus = *corpus_data;

  const fs::path& run_dir = input.run_dir;
  RankLog rank_log{command, multi, rank};

  try {
    // ---- 2. rendezvous (several ranks), build, and load the checkpoint ----
    RankGroups groups;
    std::optional<comm::Mesh>& mesh = groups.mesh;
    const train::TrainConfig train_config = to_train_config(r);
    // cluster.device: cuda runs the CUDA backend on this rank's GPU (its local rank); auto stays
    // on the CPU until tests/gpu has passed on a GPU (docs/cuda.md). The backend comes first: the
    // mesh of a CUDA rank is NCCL's, on the backend's GPU and ordered after its stream.
    const bool on_cuda = r.cluster.device == recipe::Device::cuda;
    std::unique_ptr<backend::Backend> be;
    if (const int code = make_session_backend(input, on_cuda, devices, rank_log, be); code >= 0)
      return code;
    join_ranks(input, train_config, *be, devices, rank_log, groups);
    const model::ModelConfig model_config = to_model_config(r);
    model::Transformer model(model_config, *be, r.training.micro_batch, groups.parallel);
    model.params().initialize(static_cast<uint64_t>(r.determinism.seed));
    train::Trainer trainer(train_config, model, *be, *corpus.sampler,
                           corpus.val ? &*corpus.val : nullptr, mesh ? &*mesh : nullptr);
    std::string checkpoint_recipe_hash;
    std::optional<ckpt::ScanEntry> resumed;
    const fs::path checkpoints_dir = run_dir / "checkpoints";
    if (resuming) {
      const int code =
          resume_from_checkpoint(input, model, trainer, *be, mesh ? &*mesh : nullptr,
                                 checkpoints_dir, rank_log, resumed, checkpoint_recipe_hash);
      if (code >= 0) return code;
    }
    const int64_t start_step = trainer.steps_done();

    // ---- 3. run directory (rank 0 writes the run's files) ----
    fs::create_directories(run_dir / "logs");
    const std::string hash = recipe::recipe_hash(r);
    if (leader) {
      // Atomic: a full disk leaves the old recipe.yaml (the one resume needs) as it was.
      files::write_file_atomically(
          run_dir / "recipe.yaml",
          fmt::format("# resolved recipe (hash {})\n{}", hash, recipe::dump_recipe(r)));
      if (resuming) truncate_metrics(run_dir / "metrics.jsonl", start_step);
    }
    std::optional<telemetry::MetricsWriter> metrics;
    std::optional<telemetry::TensorBoardWriter> tensorboard;
    if (leader) {
      metrics.emplace(run_dir / "metrics.jsonl");
      if (r.logging.tensorboard) tensorboard.emplace(run_dir);
    }
    if (!rank_log.file) {
      rank_log.file = std::fopen((run_dir / "logs" / "rank_0.log").c_str(), resuming ? "a" : "w");
      if (!rank_log.file)
        throw std::runtime_error("cannot write " + (run_dir / "logs/rank_0.log").string());
    }
    std::optional<telemetry::Progress> progress;
    if (leader)
      progress.emplace(r.training.steps, progress_mode(r.logging.progress), stderr,
                       r.logging.every_steps);
    telemetry::Progress log(r.training.steps, telemetry::ProgressMode::plain, rank_log.file,
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
                      groups.rendezvous.how));
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
    say(fmt::format("data: {} train tokens ({}), {} validation tokens",
                    telemetry::format_count(static_cast<uint64_t>(corpus.dataset.train->size())),
                    corpus.dataset.train->describe(),
                    telemetry::format_count(static_cast<uint64_t>(
                        corpus.dataset.val ? corpus.dataset.val->size() : 0))));
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
    if (const auto delay = input.debug_save_delay; delay.count() > 0)
      writer_options.after_slice = [delay](size_t) { std::this_thread::sleep_for(delay); };
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
    // The gradient reduction's busy time beside backward; comm_ms holds only what it exposed.
    const bool overlapping = multi && trainer.overlaps_grad_sync();
    try {
      trainer.run([&](const train::StepMetrics& m) {
        if (metrics) {
          nlohmann::json record = metrics_record(m, fp16, moe);
          if (multi) record["comm_ms"] = m.comm_ms;
          if (overlapping) record["comm_background_ms"] = m.comm_background_ms;
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
    } catch (const data::DataError& e) {
      // The data changed under the run (data_file.hpp). A step reads its batch before it touches
      // the model, so the state after the last finished step is whole: one rank saves it (no
      // peer waits in a collective for it); several ranks stop, and the newest checkpoint stays.
      if (progress) progress->finish();
      std::string outcome;
      try {
        writer.wait();
        const auto saved = writer.last_stats();  // the newest step this run has saved, if any
        if (saves && !mesh && trainer.steps_done() > (saved ? saved->step : start_step)) {
          writer.save(train::capture_checkpoint(writer.new_request(), model, trainer, *be, hash,
                                                layout_json(r)));
          writer.wait();
          outcome = fmt::format("saved a checkpoint of step {}; ", trainer.steps_done());
        }
      } catch (const ckpt::CheckpointError& save_error) {
        outcome = fmt::format("saving a checkpoint failed too ({}); ", save_error.what());
      }
      const ckpt::ScanReport now = ckpt::scan(checkpoints_dir);
      const ckpt::ScanEntry* good = now.newest_valid();
      return rank_log.fail(
          fmt::format("{}\n{}{}", e.what(), outcome,
                      good ? fmt::format("after fixing the data, continue from {} with: trainctl "
                                         "resume {}",
                                         good->name, run_dir.string())
                           : std::string("no checkpoint of this run has been saved yet")),
          kExitFailure);
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
      return rank_log.fail(message, kExitFailure);
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
      std::fclose(rank_log.file);
      return kExitFailure;
    }
    if (stopping && last.step < r.training.steps) {  // a signal after the last step: done
      say(fmt::format(
          "stopped by {} after step {}, checkpoint saved; continue with: trainctl resume {}",
          stop.requested() ? stop.name() : "a stop signal of another rank", last.step,
          run_dir.string()));
      std::fclose(rank_log.file);
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
      files::write_file_atomically(run_dir / "summary.json", summary.dump(2) + "\n");
    }
    say(fmt::format("done: {} steps in {} | loss {:.4f}{} | {} tokens/s | weights {}", last.step,
                    telemetry::format_duration(seconds), last.loss,
                    last_val ? fmt::format(" | val_loss {:.4f}", *last_val) : std::string(),
                    telemetry::format_count(static_cast<uint64_t>(tokens_per_s)), fingerprint));
    say(std::string(multi ? "peak memory of this rank by category:\n"
                          : "peak memory by category:\n") +
        memory.to_string());
    std::fclose(rank_log.file);
    return kExitOk;
  } catch (const files::FileError& e) {
    // A file of the run could not be written (a full disk). Files are only ever replaced whole
    // (files::write_file_atomically), so the one it would have replaced is as it was.
    return rank_log.fail(
        fmt::format("{}; no file of the run was replaced by a partial one", e.what()),
        kExitFailure);
  } catch (const comm::CommError& e) {
    // A peer died or went silent, or the rendezvous failed: the message names the op, the group
    // and the peer. The launcher stops the other ranks.
    return rank_log.fail(e.what(), kExitFailure);
  }
}

}  // namespace trainctl::app
