#include "run/reporter.hpp"

#include <fmt/core.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

namespace trainctl::run {

namespace {

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
  if (m.stability_events > 0) j["stability_events"] = m.stability_events;
  return j;
}

// The stability guard's event as its own metrics.jsonl record: the step it happened at, what
// happened and what was done. A rollback's record is followed by the records of the steps after
// the snapshot again (readers keep a step's last record).
nlohmann::json event_record(const train::StabilityEvent& e) {
  nlohmann::json j{{"step", e.step},
                   {"event", train::event_name(e.kind)},
                   {"action", e.action == train::StabilityAction::skip ? "skip" : "rollback"},
                   {"batch", e.batch},
                   {"first_batch", e.first_batch},
                   {"to_step", e.to_step},
                   {"in_a_row", e.in_a_row}};
  // JSON has no NaN or infinity: a non-finite number is written as null.
  const auto number = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nullptr; };
  j["loss"] = number(e.loss);
  j["grad_norm"] = number(e.grad_norm);
  if (e.kind != train::StabilityEventKind::nonfinite) {
    j["z"] = e.z;
    j["threshold"] = e.threshold;
    j["window"] = e.window;
  }
  return j;
}

}  // namespace

StepReporter::StepReporter(const recipe::Recipe& r, const std::filesystem::path& run_dir,
                           RankLog& log, Options options)
    : options_(std::move(options)), start_(std::chrono::steady_clock::now()) {
  if (options_.leader) {
    metrics_.emplace(run_dir / "metrics.jsonl");
    if (r.logging.tensorboard) tensorboard_.emplace(run_dir);
  }
  if (!log.is_open()) log.open(run_dir, options_.resuming);
  if (options_.leader && options_.hosts.size() > 1)
    stragglers_.emplace(options_.hosts, r.logging.straggler_threshold, r.logging.every_steps);
  if (options_.leader)
    progress_.emplace(r.training.steps, r.logging.progress, stderr, r.logging.every_steps);
  log_.emplace(r.training.steps, telemetry::ProgressMode::plain, log.file(), r.logging.every_steps,
               false);
}

void StepReporter::say(const std::string& line) {
  if (progress_) progress_->message(line);
  log_->message(line);
}

void StepReporter::step(const train::StepMetrics& m, double loss_scale,
                        std::span<const RankStepTime> ranks) {
  const bool fp16 = options_.fp16;
  const bool moe = options_.moe;
  const double elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const std::optional<Straggler> slowest = slowest_rank(ranks, options_.stages);
  std::optional<double> mfu;
  if (options_.peak.flops_per_s > 0)
    mfu = step_mfu(options_.forward_flops_per_token, options_.tokens_per_step, m.step_ms / 1000.0,
                   options_.peak, options_.peak_devices);
  for (const train::StabilityEvent& event : m.events)
    say(train::describe(event));
  events(m.events, m.stability_events);
  if (metrics_) {
    nlohmann::json record = metrics_record(m, fp16, moe);
    if (options_.multi) {
      record["comm_ms"] = m.comm_ms;
      nlohmann::json by_group = nlohmann::json::object();
      for (const auto& [group, ms] : m.comm_ms_by_group)
        by_group[group] = ms;
      record["comm_ms_by_group"] = by_group;
    }
    if (options_.multi && m.step_ms > 0) record["comm_share"] = m.comm_ms / m.step_ms;
    if (slowest) {
      record["slowest_rank"] = slowest->rank;
      record["slowest_compute_ms"] = slowest->compute_ms;
      record["median_compute_ms"] = slowest->median_ms;
    }
    if (options_.overlapping) record["comm_background_ms"] = m.comm_background_ms;
    if (options_.context_parallel) record["cp_wait_ms"] = m.cp_wait_ms;
    if (mfu) record["mfu"] = *mfu;
    if (options_.memory_bytes > 0) record["memory_bytes"] = options_.memory_bytes;
    record["elapsed_s"] = elapsed_s;
    metrics_->write(record);
  }
  telemetry::StepInfo info;
  info.step = m.step;
  info.loss = m.loss;
  info.lr = m.lr;
  info.tokens_per_s = m.tokens_per_s;
  info.step_ms = m.step_ms;
  info.extras = {{"grad_norm", m.grad_norm}};
  info.mfu = mfu;
  if (options_.memory_bytes > 0) info.memory_bytes = options_.memory_bytes;
  info.elapsed_s = elapsed_s;
  if (fp16) info.extras.push_back({"scale", m.loss_scale});
  if (m.val_loss) info.extras.push_back({"val_loss", *m.val_loss});
  if (progress_) progress_->update(info);
  log_->update(info);
  if (tensorboard_) {
    std::vector<std::pair<std::string, double>> scalars{{"train/loss", m.loss},
                                                        {"train/lr", m.lr},
                                                        {"train/grad_norm", m.grad_norm},
                                                        {"perf/tokens_per_s", m.tokens_per_s},
                                                        {"perf/step_ms", m.step_ms}};
    if (mfu) scalars.push_back({"perf/mfu", *mfu});
    if (options_.multi && m.step_ms > 0)
      scalars.push_back({"perf/comm_share", m.comm_ms / m.step_ms});
    if (slowest) scalars.push_back({"perf/slowest_over_median", slowest->ratio()});
    for (const auto& [group, ms] : m.comm_ms_by_group)
      scalars.push_back({"comm/" + group + "_ms", ms});
    if (options_.memory_bytes > 0)
      scalars.push_back({"memory/bytes", static_cast<double>(options_.memory_bytes)});
    if (fp16) scalars.push_back({"train/loss_scale", m.loss_scale});
    if (moe) {
      scalars.push_back({"moe/aux_loss", m.aux_loss});
      scalars.push_back({"moe/z_loss", m.z_loss});
    }
    if (m.val_loss) scalars.push_back({"val/loss", *m.val_loss});
    tensorboard_->add_scalars(m.step, scalars);
  }
  if (m.skipped) {
    ++totals_.skipped;
    say(fmt::format("step {}: non-finite gradients, step skipped, loss scale now {}", m.step,
                    loss_scale));
  }
  if (stragglers_)
    if (std::optional<std::string> line = stragglers_->observe(m.step, slowest)) say(*line);
  if (m.val_loss) totals_.last_val = m.val_loss;
  totals_.last = m;
}

void StepReporter::events(std::span<const train::StabilityEvent> events, int64_t total) {
  for (size_t i = 0; i < events.size(); ++i) {
    const train::StabilityEvent& event = events[i];
    if (metrics_) metrics_->write(event_record(event));
    const auto count = total - static_cast<int64_t>(events.size() - 1 - i);
    if (tensorboard_)
      tensorboard_->add_scalars(event.step, {{"stability/events", static_cast<double>(count)}});
  }
  totals_.stability_events = total;
}

void StepReporter::flush() {
  if (tensorboard_) tensorboard_->flush();
}

void StepReporter::finish() {
  if (progress_) progress_->finish();
}

}  // namespace trainctl::run
