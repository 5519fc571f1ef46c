#include "run/reporter.hpp"

#include <fmt/core.h>

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
  return j;
}

}  // namespace

StepReporter::StepReporter(const recipe::Recipe& r, const std::filesystem::path& run_dir,
                           RankLog& log, Options options)
    : options_(options) {
  if (options_.leader) {
    metrics_.emplace(run_dir / "metrics.jsonl");
    if (r.logging.tensorboard) tensorboard_.emplace(run_dir);
  }
  if (!log.is_open()) log.open(run_dir, options_.resuming);
  if (options_.leader)
    progress_.emplace(r.training.steps, r.logging.progress, stderr, r.logging.every_steps);
  log_.emplace(r.training.steps, telemetry::ProgressMode::plain, log.file(), r.logging.every_steps,
               false);
}

void StepReporter::say(const std::string& line) {
  if (progress_) progress_->message(line);
  log_->message(line);
}

void StepReporter::step(const train::StepMetrics& m, double loss_scale) {
  const bool fp16 = options_.fp16;
  const bool moe = options_.moe;
  if (metrics_) {
    nlohmann::json record = metrics_record(m, fp16, moe);
    if (options_.multi) record["comm_ms"] = m.comm_ms;
    if (options_.overlapping) record["comm_background_ms"] = m.comm_background_ms;
    metrics_->write(record);
  }
  telemetry::StepInfo info{m.step,         m.loss,    m.lr,
                           m.tokens_per_s, m.step_ms, {{"grad_norm", m.grad_norm}}};
  if (fp16) info.extras.push_back({"scale", m.loss_scale});
  if (m.val_loss) info.extras.push_back({"val_loss", *m.val_loss});
  if (progress_) progress_->update(info);
  log_->update(info);
  if (tensorboard_) {
    std::vector<std::pair<std::string, double>> scalars{{"train/loss", m.loss},
                                                        {"train/lr", m.lr},
                                                        {"train/grad_norm", m.grad_norm},
                                                        {"perf/tokens_per_s", m.tokens_per_s}};
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
  if (m.val_loss) totals_.last_val = m.val_loss;
  totals_.last = m;
}

void StepReporter::flush() {
  if (tensorboard_) tensorboard_->flush();
}

void StepReporter::finish() {
  if (progress_) progress_->finish();
}

}  // namespace trainctl::run
