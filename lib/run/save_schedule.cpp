#include "run/save_schedule.hpp"

#include <fmt/core.h>

#include <cctype>
#include <thread>

#include "run/summary.hpp"
#include "telemetry/telemetry.hpp"
#include "train/checkpointing.hpp"

namespace trainctl::run {

namespace {

// Letters, digits, '-' and '_' only: the checkpoint writer's save_id.
std::string save_id_of(const launch::RankInfo& rank) {
  std::string id = rank.job_id + "-" + std::to_string(rank.restart_count);
  for (char& c : id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  return id;
}

ckpt::CheckpointWriter::Options writer_options(const SessionInput& input) {
  const recipe::Recipe& r = input.loaded.recipe;
  ckpt::CheckpointWriter::Options options{r.checkpoint.async, r.checkpoint.keep_last};
  options.rank = input.rank.rank;
  options.world_size = input.rank.world_size;
  options.save_id = save_id_of(input.rank);
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(r.parallel.timeout_s * 1000.0));
  if (const auto delay = input.debug_save_delay; delay.count() > 0)
    options.after_slice = [delay](size_t) { std::this_thread::sleep_for(delay); };
  return options;
}

}  // namespace

StepVote SaveSchedule::vote(int64_t step, bool stop_requested, Clock::time_point now) const {
  const double since_save = std::chrono::duration<double>(now - last_save_).count();
  return {stop_requested, enabled_ && policy_.due(step, since_save, false)};
}

Saver::Saver(const SessionInput& input, RunContext& run, nlohmann::json provenance)
    : run_(run),
      layout_(layout_json(input.loaded.recipe)),
      provenance_(std::move(provenance)),
      writer_(input.run_dir / "checkpoints", writer_options(input)) {}

void Saver::save() {
  const auto before = Clock::now();
  ckpt::SaveRequest request =
      train::capture_checkpoint(writer_.new_request(), run_.model(), run_.trainer(), run_.backend(),
                                run_.recipe_hash(), layout_);  // reused memory
  request.header.provenance = provenance_;
  writer_.save(std::move(request));  // waits for the previous save first
  stall_ms_ = std::chrono::duration<double, std::milli>(Clock::now() - before).count();
}

std::optional<std::string> Saver::finished_save() {
  const auto stats = writer_.last_stats();
  if (!stats || stats->step == reported_) return std::nullopt;
  reported_ = stats->step;
  return fmt::format("checkpoint {}: {} in {:.2f} s ({}/s), training stalled {:.1f} ms",
                     stats->path.filename().string(), telemetry::format_bytes(stats->bytes),
                     stats->write_seconds,
                     telemetry::format_bytes(static_cast<uint64_t>(stats->bandwidth)), stall_ms_);
}

std::optional<int64_t> Saver::last_saved_step() const {
  const auto stats = writer_.last_stats();
  if (!stats) return std::nullopt;
  return stats->step;
}

}  // namespace trainctl::run
