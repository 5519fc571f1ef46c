#include "train/trainer.hpp"

#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace trainctl::train {

Trainer::Trainer(const TrainConfig& config, model::Transformer& model, backend::Backend& backend,
                 data::Sampler& train_data, const data::ValidationSet* val)
    : config_(config),
      model_(model),
      be_(backend),
      train_(train_data),
      val_(val),
      scaler_(config.loss_scale),
      optimizer_(config.adamw) {
  if (config.micro_batch != model.micro_batch())
    throw std::invalid_argument("trainer micro_batch " + std::to_string(config.micro_batch) +
                                " != model micro_batch " + std::to_string(model.micro_batch()));
  if (config.global_batch % config.micro_batch != 0)
    throw std::invalid_argument("global_batch % micro_batch != 0");
  const size_t T = static_cast<size_t>(model.config().seq_len);
  const size_t B = static_cast<size_t>(config.micro_batch);
  window_.resize(B * (T + 1));
  inputs_.resize(B * T);
  targets_.resize(B * T);
}

// A window row holds T + 1 tokens: inputs are the first T, targets the last T.
void Trainer::load_micro_batch(const int32_t* window) {
  const size_t T = static_cast<size_t>(model_.config().seq_len);
  for (size_t b = 0; b < static_cast<size_t>(config_.micro_batch); ++b)
    for (size_t t = 0; t < T; ++t) {
      inputs_[b * T + t] = window[b * (T + 1) + t];
      targets_[b * T + t] = window[b * (T + 1) + t + 1];
    }
}

StepMetrics Trainer::step() {
  const auto start = std::chrono::steady_clock::now();
  const int accum = config_.accum_steps();
  StepMetrics m;
  model_.params().zero_grads();
  const double scale = scaler_.scale();
  for (int a = 0; a < accum; ++a) {
    train_.next_batch(config_.micro_batch, window_.data());
    load_micro_batch(window_.data());
    const model::ForwardResult r = model_.forward(inputs_.data(), targets_.data());
    // The step's objective is the mean over micro-batches; the loss scale rides along.
    model_.backward(scale / accum);
    m.loss += r.loss / accum;
    m.aux_loss += r.aux_loss / accum;
    m.z_loss += r.z_loss / accum;
    if (m.expert_load.empty()) {
      m.expert_load.assign(r.expert_load.size(), {});
      m.dropped_tokens.assign(r.dropped_tokens.size(), 0);
    }
    for (size_t l = 0; l < r.expert_load.size(); ++l) {
      m.expert_load[l].resize(r.expert_load[l].size());
      for (size_t e = 0; e < r.expert_load[l].size(); ++e)
        m.expert_load[l][e] += r.expert_load[l][e] / accum;
      m.dropped_tokens[l] += r.dropped_tokens[l];
    }
  }
  // One pass over the gradients: an f64 sum of squares of f32 values cannot overflow, so it is
  // finite exactly when every gradient is (inf and NaN propagate).
  const double sum_squares = be_.sum_squares(model_.params().grads());
  const bool finite = std::isfinite(sum_squares);
  m.grad_norm = finite ? std::sqrt(sum_squares) / scale : std::numeric_limits<double>::quiet_NaN();
  m.loss_scale = scale;
  m.lr = config_.schedule.lr(step_);
  m.skipped = !scaler_.update(finite);
  if (!m.skipped) {
    const double clip = config_.grad_clip > 0 && m.grad_norm > config_.grad_clip
                            ? config_.grad_clip / (m.grad_norm + 1e-6)
                            : 1.0;
    optimizer_.step(be_, model_.params(), m.lr, clip / scale);
  }
  ++step_;
  tokens_ += int64_t{config_.global_batch} * model_.config().seq_len;
  m.step = step_;
  m.tokens = tokens_;
  m.step_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  m.tokens_per_s =
      m.step_ms > 0 ? 1000.0 * config_.global_batch * model_.config().seq_len / m.step_ms : 0.0;
  return m;
}

double Trainer::evaluate() {
  if (!val_) throw std::logic_error("Trainer::evaluate without a validation set");
  const int64_t available = val_->num_batches(config_.micro_batch);
  if (available < 1)
    throw std::runtime_error("the validation data holds fewer than " +
                             std::to_string(config_.micro_batch) + " windows of " +
                             std::to_string(model_.config().seq_len + 1) +
                             " tokens: use a larger data.val_fraction or a longer data.val_path");
  const int64_t batches = std::min<int64_t>(config_.eval_batches, available);
  double total = 0;
  for (int64_t i = 0; i < batches; ++i) {
    val_->fill_batch(i, config_.micro_batch, window_.data());
    load_micro_batch(window_.data());
    total += model_.forward(inputs_.data(), targets_.data()).loss;
  }
  return total / static_cast<double>(batches);
}

void Trainer::run(const std::function<bool(const StepMetrics&)>& on_step) {
  while (step_ < config_.steps) {
    StepMetrics m = step();
    const bool last = step_ == config_.steps;
    const bool periodic = config_.eval_every_steps > 0 && step_ % config_.eval_every_steps == 0;
    if (val_ && (last || periodic)) m.val_loss = evaluate();
    if (!on_step(m)) return;
  }
}

TrainerState Trainer::state() const {
  return TrainerState{step_, tokens_, optimizer_.updates(), scaler_.state(), train_.state()};
}

void Trainer::restore(const TrainerState& state) {
  if (state.step < 0 || state.step > config_.steps)
    throw std::invalid_argument("cannot resume at step " + std::to_string(state.step) +
                                ": the run has " + std::to_string(config_.steps) + " steps");
  train_.restore(state.sampler);
  step_ = state.step;
  tokens_ = state.tokens;
  optimizer_.restore(state.optimizer_updates);
  scaler_.restore(state.loss_scaler);
}

}  // namespace trainctl::train
