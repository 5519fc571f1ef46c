#include "run/session.hpp"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/error.hpp"
#include "comm/roll_call.hpp"
#include "files/files.hpp"
#include "launch/local.hpp"
#include "launch/signals.hpp"
#include "launch/store_address.hpp"
#include "run/context.hpp"
#include "run/local_tier.hpp"
#include "run/provenance.hpp"
#include "run/report.hpp"
#include "run/reporter.hpp"
#include "run/save_schedule.hpp"
#include "run/straggler.hpp"
#include "run/summary.hpp"
#include "run/timeline_file.hpp"
#include "train/checkpoint_policy.hpp"
#include "train/checkpointing.hpp"
#include "train/stability.hpp"

namespace fs = std::filesystem;

namespace trainctl::run {

namespace {

// data.json: what the run reads, each dataset with its weight, its tokens and, where the data
// records it (trainctl data prepare's sidecar), the tokenizer that made the ids: path, SHA-256,
// vocabulary and end-of-document token.
std::string data_record(const data::Dataset& dataset) {
  nlohmann::ordered_json parts = nlohmann::ordered_json::array();
  for (const data::DatasetPart& part : dataset.parts) {
    nlohmann::ordered_json j = {{"source", part.train->describe()},
                                {"weight", part.weight},
                                {"train_tokens", part.train->size()},
                                {"val_tokens", part.val ? part.val->size() : 0}};
    if (const data::TokenizerInfo* t = part.train->tokenizer())
      j["tokenizer"] = {{"path", t->path},     {"sha256", t->sha256},
                        {"kind", t->kind},     {"vocab_size", t->vocab_size},
                        {"eod_id", t->eod_id}, {"eod_token", t->eod_token}};
    parts.push_back(std::move(j));
  }
  return nlohmann::ordered_json{{"datasets", std::move(parts)}}.dump(2) + "\n";
}

// Rank 0 writes the resolved recipe (atomically: a full disk leaves the old recipe.yaml, the one
// resume needs, as it was) and what data it reads (data.json) and, resuming, drops the records of
// the steps it will repeat.
void prepare_run_dir(const SessionInput& input, RunContext& run) {
  fs::create_directories(input.run_dir / "logs");
  if (!run.leader()) return;
  files::write_file_atomically(input.run_dir / "recipe.yaml",
                               fmt::format("# resolved recipe (hash {})\n{}", run.recipe_hash(),
                                           recipe::dump_recipe(run.recipe())));
  if (input.data)
    files::write_file_atomically(input.run_dir / "data.json", data_record(input.data->dataset));
  if (input.resuming) truncate_metrics(input.run_dir / "metrics.jsonl", run.start_step());
}

// Each rank's pipeline stage, in rank order (empty for one rank): the straggler watch compares
// only ranks of one stage.
std::vector<int> pipeline_stages(RunContext& run) {
  std::vector<int> stages;
  if (comm::Mesh* mesh = run.mesh())
    for (int rank = 0; rank < mesh->world().size(); ++rank)
      stages.push_back(coordinates_of(mesh->layout(), rank).pp);
  return stages;
}

// "the newest good checkpoint is step_N; ...", or that there is none yet.
std::string where_to_continue(const fs::path& run_dir, const char* what) {
  const ckpt::ScanReport now = ckpt::scan(run_dir / "checkpoints");
  const ckpt::ScanEntry* good = now.newest_valid();
  return good ? fmt::format(fmt::runtime(what), good->name, run_dir.string())
              : std::string("no checkpoint of this run has been saved yet");
}

// The data changed under the run (data_file.hpp). A step reads its batch before it touches the
// model, so the state after the last finished step is whole: one rank saves it (no peer waits in
// a collective for it); several ranks stop, and the newest checkpoint stays.
int end_on_data_error(const SessionInput& input, RunContext& run, Saver& saver, RankLog& log,
                      const data::DataError& e) {
  std::string outcome;
  try {
    saver.wait();
    const int64_t saved = saver.last_saved_step().value_or(run.start_step());
    if (input.loaded.recipe.cluster.shared_fs && !run.mesh() &&
        run.trainer().steps_done() > saved) {
      saver.save();
      saver.wait();
      outcome = fmt::format("saved a checkpoint of step {}; ", run.trainer().steps_done());
    }
  } catch (const ckpt::CheckpointError& save_error) {
    outcome = fmt::format("saving a checkpoint failed too ({}); ", save_error.what());
  }
  return log.fail(fmt::format("{}\n{}{}", e.what(), outcome,
                              where_to_continue(input.run_dir,
                                                "after fixing the data, continue from {} "
                                                "with: trainctl resume {}")),
                  kExitFailure);
}

// A stop signal before the last step: exit 75 with the checkpoint saved, or 1 without one.
int end_on_stop(const SessionInput& input, StepReporter& report, const launch::StopSignals& stop,
                bool saved) {
  const int64_t step = report.totals().last.step;
  const std::string by = stop.requested() ? stop.name() : "a stop signal of another rank";
  if (!saved) {
    report.say(
        fmt::format("stopped by {} after step {} without a checkpoint (cluster.shared_fs: "
                    "false turns them off): the run cannot be continued",
                    by, step));
    return kExitFailure;
  }
  report.say(fmt::format(
      "stopped by {} after step {}, checkpoint saved; continue with: trainctl resume {}", by, step,
      input.run_dir.string()));
  return kExitSavedOnSignal;
}

// The run's picture (report.hpp), drawn by the leader once training has ended. It is drawn from
// files the run keeps, so failing to write it (a full disk) is a note, not the run's exit code:
// `trainctl report` draws it again.
void write_report(const SessionInput& input, RunContext& run, StepReporter& report) {
  if (!run.leader()) return;
  try {
    report.say(fmt::format("report: {}", write_run_report(input.run_dir).path.string()));
  } catch (const std::exception& e) {
    report.say(fmt::format("report: not written ({}); trainctl report {} draws it later", e.what(),
                           input.run_dir.string()));
  }
}

// How long a rank whose collective failed waits for the others to answer the roll call. The
// ranks that fail together do so within milliseconds of each other (they time out on the same
// silence, or see the first one's connections close), so a rank silent after this long cannot
// reach the store; capped by parallel.timeout_s.
constexpr std::chrono::milliseconds kRollCallWindow{2000};

// A collective failed in a job whose ranks talk over a network: add which ranks still answer
// through the store (comm/roll_call.hpp) before this one leaves. Within one address (trainctl's
// launcher, emulated nodes) the error names the peer from the process table already.
comm::CommError with_roll_call(const comm::CommError& e, RunContext& run,
                               const std::vector<comm::Member>& members) {
  comm::Store* store = run.store();
  if (store == nullptr || !comm::spans_network(members) || e.kind() == comm::CommError::Kind::usage)
    return e;
  const comm::Communicator& world = run.mesh()->world();
  const auto window = std::min(kRollCallWindow, world.timeout());
  const comm::RollCall call = comm::roll_call(*store, world.rank(), members, window);
  return comm::CommError(
      e.kind(),
      fmt::format("{}; {}", e.what(),
                  comm::describe_roll_call(call, members, store->describe(), window)),
      e.op(), e.peer());
}

}  // namespace

int start_session(SessionInput input, const std::string& command) {
  const recipe::Recipe& r = input.loaded.recipe;
  if (input.rank.launched() || r.world_size() == 1) return train_session(std::move(input), command);
  launch::LocalLaunch local;
  local.argv = launch::own_command_line();
  local.run_dir = input.run_dir;
  local.world_size = r.world_size();
  local.layout = r.parallel.degrees();
  local.command = command;  // the notes are rank 0's to print
  if (input.data) local.env.push_back({kEnvDataDigests, format_data_digests(input.data->digests)});
  // Without a shared file system the ranks meet through a TCP store, as a Slurm job's do; here
  // the launcher serves it on loopback for as long as the ranks run, with a secret of its own.
  std::unique_ptr<comm::TcpStoreServer> store;
  if (uses_tcp_store(r.cluster.shared_fs, input.rank)) {
    const comm::StoreSecret secret = comm::StoreSecret::generate();
    store = std::make_unique<comm::TcpStoreServer>("127.0.0.1", 0, secret, store_server_options());
    local.env.insert(local.env.end(), {{launch::kEnvStoreHost, "127.0.0.1"},
                                       {launch::kEnvStorePort, std::to_string(store->port())},
                                       {launch::kEnvStoreSecret, secret.hex()}});
  }
  return launch::launch_local(local);
}

int train_session(SessionInput input, const std::string& command) {
  const recipe::Recipe& r = input.loaded.recipe;
  // From the start: Slurm may signal a job (time limit, preemption) while it is still loading,
  // and an unhandled SIGUSR1 would kill the rank instead of saving after the first step.
  launch::StopSignals stop;
  if (!input.data) {  // check_session_input opened it; tests of the session may not have
    input.data = std::make_shared<SessionData>();
    if (Exit end = open_session_data(input, *input.data)) return *end;
  }
  RankLog log(command, input.rank.world_size > 1, input.rank.rank);
  try {
    RunContext run(input, log);  // backend, rendezvous, model, trainer
    if (input.resuming) {
      if (Exit end = resume_from_checkpoint(input, run, log)) return *end;
    } else if (const std::string& from = run.model_config().init_from; !from.empty()) {
      const auto start = Clock::now();
      const std::unique_ptr<ckpt::WeightSource> source = ckpt::WeightSource::open(from);
      source->bind(train::weights_wanted(run.model_config()));
      run.trainer().wait_parameters();
      train::load_initial_weights(*source, run.model().params(), run.backend());
      input.notes.push_back(fmt::format(
          "weights from {} (model.init_from), read in {:.2f} s; optimizer state fresh, step 0",
          source->where(), std::chrono::duration<double>(Clock::now() - start).count()));
    }
    if (input.data && run.mesh()) complete_data_digests(*input.data, run.mesh()->world());
    prepare_run_dir(input, run);
    Provenance provenance(input, run, command);
    const model::ModelConfig& mc = run.model_config();
    StepReporter report(
        r, input.run_dir, log,
        {.leader = run.leader(),
         .resuming = input.resuming,
         .fp16 = mc.storage == tensor::DType::f16,
         .moe = mc.moe.experts > 0,
         .multi = run.multi(),
         .overlapping = run.multi() && run.trainer().overlaps_grad_sync(),
         .context_parallel = r.parallel.cp > 1,
         .forward_flops_per_token = run.model().forward_flops_per_token(),
         .tokens_per_step = static_cast<double>(r.tokens_per_step()),
         .peak = run.peak(),
         .peak_devices = run.peak_devices(),
         .memory_bytes = memory_report(run).total(),
         .hosts = run.mesh() ? gather_hosts(run.mesh()->world()) : std::vector<std::string>{},
         .stages = pipeline_stages(run)});
    for (const std::string& line : run.describe(input))
      report.say(line);
    // Who the ranks are, gathered while the network works, for the roll call after a failure.
    const std::vector<comm::Member> members =
        run.mesh() ? comm::gather_members(run.mesh()->world()) : std::vector<comm::Member>{};

    // Train, saving on the recipe's cadence, at the end, and on a stop signal.
    const auto start = Clock::now();
    SaveSchedule schedule(train::CheckpointPolicy(r.checkpoint.every_steps,
                                                  r.checkpoint.every_minutes, r.training.steps),
                          r.cluster.shared_fs, start);
    Saver saver(input, run, nlohmann::json::parse(provenance.json().dump()));
    // The node-local tiers (local_tier.hpp), written after the steps of their cadences.
    const std::vector<std::unique_ptr<LocalTier>> tiers =
        open_tiers(r, input.run_dir, input.rank.rank);
    const auto write_tiers = [&](int64_t step) {
      for (const std::unique_ptr<LocalTier>& tier : tiers) {
        const bool memory = tier->name() == kMemoryTier;
        const int64_t every =
            memory ? r.checkpoint.memory_every_steps : r.checkpoint.local_every_steps;
        if (step % every != 0) continue;
        run.trainer().take_snapshot();  // at a memory step the trainer has taken it already
        tier->submit(*run.trainer().snapshot());
      }
    };
    comm::Communicator* world = run.mesh() ? &run.mesh()->world() : nullptr;
    StepVote job;  // agreed by every rank
    try {
      run.trainer().run([&](const train::StepMetrics& m) {
        // The job's vote, and every rank's time for the straggler watch, in one collective.
        const JobStep exchanged = exchange_step(
            schedule.vote(m.step, stop.requested(), Clock::now()), {m.step_ms, m.comm_ms}, world);
        job = exchanged.vote;
        report.step(m, run.trainer().loss_scaler().scale(), exchanged.ranks);
        write_tiers(m.step);
        if (m.step == r.logging.timeline_step && run.leader())
          if (const Timeline* timeline = run.trainer().timeline())
            write_timeline(input.run_dir, run, m.step, *timeline);
        saver.poll();  // a failed background save stops the run now, not at the next save
        if (auto line = saver.finished_save()) report.say(*line);
        if (schedule.saves(job)) {
          report.flush();
          // A rollback never returns to before a saved step.
          if (run.trainer().rolls_back()) run.trainer().take_snapshot();
          saver.save();
          schedule.saved(Clock::now());
        }
        return !job.stop;
      });
      saver.wait();
    } catch (const comm::CommError& e) {
      throw with_roll_call(e, run, members);
    } catch (const train::StabilityError& e) {
      // Every rank reached the same verdict from the same numbers: each stops here.
      const std::vector<train::StabilityEvent>& events = e.events();
      report.events(std::span(events).last(e.unreported()),
                    run.trainer().stability().state().events);
      report.finish();
      report.flush();
      saver.wait();
      provenance.finish(report.totals().last.step, "failed");
      return log.fail(fmt::format("{}\n{}", e.what(),
                                  where_to_continue(input.run_dir,
                                                    "the newest good checkpoint is {}; after "
                                                    "fixing the cause, continue with: trainctl "
                                                    "resume {}")),
                      kExitFailure);
    } catch (const data::DataError& e) {
      report.finish();
      provenance.finish(report.totals().last.step, "failed");
      return end_on_data_error(input, run, saver, log, e);
    } catch (const ckpt::CheckpointError& e) {
      report.finish();
      provenance.finish(report.totals().last.step, "failed");
      return log.fail(
          fmt::format("saving a checkpoint failed: {}\n{}", e.what(),
                      where_to_continue(input.run_dir,
                                        "the newest good checkpoint is {}; after fixing the "
                                        "cause, continue with: trainctl resume {}")),
          kExitFailure);
    }
    if (auto line = saver.finished_save()) report.say(*line);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    report.finish();
    report.flush();

    const bool stopped = job.stop && report.totals().last.step < r.training.steps;
    if (std::string note =
            provenance.finish(report.totals().last.step, stopped ? "stopped" : "done");
        !note.empty())
      report.say(note);
    if (stopped) {  // else: done anyway
      write_report(input, run, report);
      return end_on_stop(input, report, stop, schedule.enabled());
    }
    // Done: the shared tier holds the last step; the node-local copies are freed (the memory
    // tier is host memory), by one rank of each node once every rank's last write has ended.
    if (!tiers.empty()) {
      for (const std::unique_ptr<LocalTier>& tier : tiers)
        tier->wait();
      if (run.mesh()) run.mesh()->world().barrier();
      if (input.rank.local_rank == 0)
        for (const std::unique_ptr<LocalTier>& tier : tiers)
          tier->remove_all();
    }
    write_summary(input, run, report, seconds);
    write_report(input, run, report);
    return kExitOk;
  } catch (const BackendUnavailable& e) {
    return log.fail(e.what(), kExitFailure);
  } catch (const files::FileError& e) {
    // A file of the run could not be written (a full disk). Files are only ever replaced whole
    // (files::write_file_atomically), so the one it would have replaced is as it was.
    return log.fail(fmt::format("{}; no file of the run was replaced by a partial one", e.what()),
                    kExitFailure);
  } catch (const comm::CommError& e) {
    // A peer died or went silent, or the rendezvous failed: the message names the op, the group
    // and the peer. The launcher stops the other ranks.
    return log.fail(e.what(), kExitFailure);
  }
}

}  // namespace trainctl::run
