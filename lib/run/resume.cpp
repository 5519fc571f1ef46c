#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <stdexcept>

#include "files/files.hpp"
#include "run/context.hpp"
#include "run/local_tier.hpp"
#include "train/checkpointing.hpp"

namespace fs = std::filesystem;

namespace trainctl::run {

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
                                                  const comm::Mesh* mesh,
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

// The ranks whose `own` reason is not empty, with it (every rank gets all; 511 bytes each at most).
std::vector<std::pair<int, std::string>> gather_reasons(comm::Mesh* mesh, const std::string& own) {
  constexpr size_t kBytes = 512;
  const int ranks = mesh ? mesh->world().size() : 1;
  std::vector<char> mine(kBytes, '\0'), all(kBytes * static_cast<size_t>(ranks), '\0');
  own.copy(mine.data(), kBytes - 1);
  if (mesh)
    mesh->world().all_gather(mine.data(), all.data(), kBytes);
  else
    all = mine;
  std::vector<std::pair<int, std::string>> out;
  for (int rank = 0; rank < ranks; ++rank) {
    const char* text = all.data() + static_cast<size_t>(rank) * kBytes;
    if (*text != '\0') out.emplace_back(rank, std::string(text, strnlen(text, kBytes)));
  }
  return out;
}

// The node-local tiers' newest step that every rank holds, is newer than `shared_step` (the shared
// tier's newest valid checkpoint; -1: none) and loads on every rank: the trainer continues from it
// and the entry says where it came from. Each step passed over is a note saying why.
std::optional<ckpt::ScanEntry> load_from_tiers(SessionInput& input, RunContext& run,
                                               int64_t shared_step) {
  const std::vector<std::unique_ptr<LocalTier>> tiers =
      open_tiers(input.loaded.recipe, input.run_dir, input.rank.rank);
  comm::Mesh* mesh = run.mesh();
  constexpr size_t kListed = 8;  // steps of a tier each rank offers (it keeps 2)
  struct Candidate {
    int64_t step;
    LocalTier* tier;
  };
  std::vector<Candidate> candidates;
  for (const std::unique_ptr<LocalTier>& tier : tiers) {
    std::vector<int64_t> mine = tier->steps();
    mine.resize(kListed, -1);
    std::vector<int64_t> all = mine;
    if (mesh) {
      all.resize(kListed * static_cast<size_t>(mesh->world().size()));
      mesh->world().all_gather(mine.data(), all.data(), kListed * sizeof(int64_t));
    }
    const int ranks = mesh ? mesh->world().size() : 1;
    for (int64_t step : mine) {
      if (step <= shared_step) continue;
      int holders = 0;
      for (int rank = 0; rank < ranks; ++rank) {
        const auto first = all.begin() + static_cast<std::ptrdiff_t>(rank * kListed);
        holders += std::find(first, first + kListed, step) != first + kListed;
      }
      if (holders == ranks)
        candidates.push_back({step, tier.get()});
      else
        input.notes.push_back(fmt::format("the {}'s step {} was not used: {} of {} ranks hold it",
                                          tier->name(), step, holders, ranks));
    }
  }
  // Newest first; at one step the memory tier before the local one (the order of `tiers`).
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.step > b.step; });
  for (const Candidate& c : candidates) {
    train::TrainerState state;
    std::string why = c.tier->load(c.step, run.trainer().snapshot_targets(), run.backend(), state);
    if (why.empty()) try {
        run.trainer().finish_restore(state);
      } catch (const std::invalid_argument& e) {
        why = e.what();
      } catch (const data::DataError& e) {
        why = e.what();
      }
    std::string reasons;  // every rank's, so rank 0's note names the rank and the cause
    for (const auto& [rank, reason] : gather_reasons(mesh, why)) {
      if (!reasons.empty()) reasons += "; ";
      reasons += fmt::format("rank {}: {}", rank, reason);
    }
    if (reasons.empty()) {
      ckpt::ScanEntry entry;
      entry.name = fmt::format("step_{:08d} of the {}", c.step, c.tier->name());
      entry.path = c.tier->dir() / fmt::format("step_{:08d}", c.step);
      entry.step = c.step;
      entry.status = ckpt::Status::valid;
      return entry;
    }
    input.notes.push_back(
        fmt::format("the {}'s step {} was not used: {}", c.tier->name(), c.step, reasons));
  }
  return std::nullopt;
}

}  // namespace

Exit resume_from_checkpoint(SessionInput& input, RunContext& run, RankLog& log) {
  const recipe::Recipe& r = input.loaded.recipe;
  const bool leader = input.rank.rank == 0;
  const fs::path checkpoints_dir = input.run_dir / "checkpoints";
  comm::Mesh* mesh = run.mesh();
  std::optional<ckpt::ScanEntry>& resumed = run.resumed;
  std::vector<Skipped> skipped;
  const auto started = std::chrono::steady_clock::now();
  const auto read_time = [&] {
    if (mesh) mesh->world().barrier();  // every rank has read its part
    run.resume_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };
  // A node-local tier's step when it is newer than every valid shared checkpoint (rank 0's scan
  // decides, as it decides the order below).
  int64_t shared_step = -1;
  for (const ckpt::ScanEntry& e : input.resume_candidates)
    if (e.status == ckpt::Status::valid) shared_step = std::max(shared_step, e.step);
  if (mesh) mesh->world().broadcast(&shared_step, sizeof shared_step, 0);
  if (r.checkpoint.memory_every_steps > 0 || r.checkpoint.local_every_steps > 0) {
    if ((resumed = load_from_tiers(input, run, shared_step))) {
      read_time();
      run.checkpoint_recipe_hash = run.recipe_hash();
      if (shared_step >= 0)
        input.notes.push_back(fmt::format("resumed from {}, newer than the shared tier's step {}",
                                          resumed->name, shared_step));
      return std::nullopt;
    }
  }
  try {
    resumed = load_newest_intact(input.resume_candidates, run.model(), run.trainer(), run.backend(),
                                 mesh, skipped, run.checkpoint_recipe_hash);
  } catch (const train::CheckpointMismatch& e) {
    return log.fail(e.what(), kExitBadInput);
  }
  read_time();
  if (!resumed) {
    std::string found;
    for (const Skipped& k : skipped)
      found += fmt::format("\n  {}: {}", k.entry.name, k.reason);
    const std::string message = fmt::format(
        "{} holds no valid checkpoint to resume from:{}\n"
        "start the run again with trainctl run --overwrite",
        checkpoints_dir.string(), found);
    return log.fail(message, kExitBadInput);
  }
  if (resumed->step >= r.training.steps) {
    if (leader)
      std::fprintf(stderr,
                   "trainctl %s: %s is at step %lld of training.steps %lld: the run is "
                   "complete (extend it with --set training.steps=N)\n",
                   log.command().c_str(), resumed->path.string().c_str(),
                   static_cast<long long>(resumed->step), static_cast<long long>(r.training.steps));
    return kExitOk;
  }
  // Only now that a checkpoint has loaded: move the newer broken ones out of the way, so a
  // later save of the same step cannot collide with them. They are kept, never read. One
  // rank moves them (rank 0), the others only report.
  for (const Skipped& k : skipped) {
    // Never onto an earlier rejected one of the same name: that gets a suffix (.1, .2, ...).
    fs::path rejected = checkpoints_dir / "rejected" / k.entry.name;
    if (leader) rejected = files::move_aside(k.entry.path, checkpoints_dir / "rejected");
    input.notes.push_back(fmt::format("skipped {} ({}): moved to {}, never read", k.entry.name,
                                      k.reason, rejected.string()));
  }
  // No rank may save into checkpoints/ before the rejected ones are out of the way.
  if (mesh) mesh->world().barrier();
  return std::nullopt;
}

Exit check_resume_input(const SessionInput& input, const std::string& command,
                        const ckpt::ScanReport& report) {
  const fs::path dir = input.run_dir / "checkpoints";
  // A run whose shared tier is empty may still have a node-local tier to resume from.
  bool tiers_hold_steps = false;
  for (const std::unique_ptr<LocalTier>& tier :
       open_tiers(input.loaded.recipe, input.run_dir, input.rank.rank))
    tiers_hold_steps = tiers_hold_steps || !tier->steps().empty();
  if (report.entries.empty() && !tiers_hold_steps)
    return bad_input(command, fmt::format("{} holds no checkpoint to resume from", dir.string()));
  // training.steps below the checkpoint's step cannot be met.
  const int64_t steps = input.loaded.recipe.training.steps;
  if (const ckpt::ScanEntry* newest = report.newest_valid(); newest && newest->step > steps)
    return report_problems(
        {input.loaded.origins.problem(
            "training.steps",
            fmt::format("training.steps {} is below step {} of the checkpoint to resume from "
                        "({}); a run cannot go back: set training.steps to {} or more (e.g. "
                        "--set training.steps={}), or start again with trainctl run --overwrite",
                        steps, newest->step, newest->path.string(), newest->step, newest->step))},
        input.recipe_label);
  return std::nullopt;
}

int resume_session(SessionInput input, const std::string& command) {
  // The lock first, then the scan it will train from: a save that another trainctl had in
  // progress when the checks ran must not be seen half done.
  files::RunDirLock lock;
  if (Exit end = lock_run_dir(input, command, lock)) return *end;
  ckpt::ScanReport report = ckpt::scan(input.run_dir / "checkpoints");
  if (Exit end = check_resume_input(input, command, report)) return *end;
  input.resuming = true;
  input.resume_candidates = std::move(report.entries);
  return start_session(std::move(input), command);
}

void truncate_metrics(const fs::path& path, int64_t last_step) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  const std::string text =
      files::read_regular_file(path, std::numeric_limits<uint64_t>::max(), "metrics file");
  std::string kept;
  kept.reserve(text.size());
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + start, end - start);
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() <= last_step) {
      kept.append(line);
      kept.push_back('\n');
    }
    start = end + 1;
  }
  files::write_file_atomically(path, kept);
}

}  // namespace trainctl::run
