#include "run/convert.hpp"

namespace trainctl::run {

namespace {
tensor::DType storage_type(recipe::Compute compute) {
  switch (compute) {
    case recipe::Compute::fp32:
      return tensor::DType::f32;
    case recipe::Compute::bf16:
      return tensor::DType::bf16;
    case recipe::Compute::fp16:
      return tensor::DType::f16;
    case recipe::Compute::fp64:
      return tensor::DType::f64;
  }
  return tensor::DType::f32;
}
}  // namespace

model::ModelConfig to_model_config(const recipe::Recipe& r) {
  model::ModelConfig c;
  const recipe::ModelConfig& m = r.model;
  c.layers = m.layers;
  c.hidden = m.hidden;
  c.heads = m.heads;
  c.kv_heads = m.kv_heads;
  c.ffn_hidden = m.ffn_hidden;
  c.vocab = m.vocab;
  c.seq_len = m.seq_len;
  c.norm =
      m.norm == recipe::Norm::layernorm ? model::NormKind::layernorm : model::NormKind::rmsnorm;
  c.activation = m.activation == recipe::Activation::gelu ? model::ActivationKind::gelu
                                                          : model::ActivationKind::swiglu;
  c.position = m.position == recipe::Position::learned ? model::PositionKind::learned
                                                       : model::PositionKind::rope;
  c.rope_theta = m.rope_theta;
  c.tied_embeddings = m.tied_embeddings;
  c.bias = m.bias;
  c.norm_eps = m.norm_eps;
  c.init_std = m.init_std;
  c.moe = {r.moe.experts,     r.moe.top_k, r.moe.capacity_factor,  r.moe.aux_loss_coef,
           r.moe.z_loss_coef, r.moe.every, r.moe.expert_ffn_hidden};
  c.storage = storage_type(r.precision.compute);
  switch (r.precision.fp8) {
    case recipe::Fp8::none:
      c.fp8 = model::Fp8Mode::none;
      break;
    case recipe::Fp8::e4m3:
      c.fp8 = model::Fp8Mode::e4m3;
      break;
    case recipe::Fp8::hybrid:
      c.fp8 = model::Fp8Mode::hybrid;
      break;
  }
  c.recompute = r.parallel.recompute;
  return c;
}

data::DataConfig to_data_config(const recipe::Recipe& r) {
  data::DataConfig c;
  switch (r.data.source) {
    case recipe::DataSource::synthetic:
      c.kind = data::SourceKind::synthetic;
      break;
    case recipe::DataSource::text:
      c.kind = data::SourceKind::text;
      break;
    case recipe::DataSource::llmc:
      c.kind = data::SourceKind::llmc;
      break;
  }
  c.path = r.data.path;
  c.val_path = r.data.val_path;
  c.val_fraction = r.data.val_fraction;
  c.seed = static_cast<uint64_t>(r.determinism.seed);
  c.vocab_size = r.model.vocab;
  return c;
}

train::TrainConfig to_train_config(const recipe::Recipe& r) {
  train::TrainConfig c;
  c.steps = r.training.steps;
  c.global_batch = r.training.global_batch;
  c.micro_batch = r.training.micro_batch;
  c.schedule.peak_lr = r.optimizer.lr;
  c.schedule.min_lr = r.schedule.min_lr;
  c.schedule.warmup_steps = r.schedule.warmup_steps;
  c.schedule.total_steps = r.schedule.decay_steps > 0 ? r.schedule.decay_steps : r.training.steps;
  switch (r.schedule.decay) {
    case recipe::Decay::cosine:
      c.schedule.decay = train::DecayKind::cosine;
      break;
    case recipe::Decay::linear:
      c.schedule.decay = train::DecayKind::linear;
      break;
    case recipe::Decay::constant:
      c.schedule.decay = train::DecayKind::constant;
      break;
    case recipe::Decay::wsd:
      c.schedule.decay = train::DecayKind::wsd;
      break;
  }
  c.schedule.wsd_decay_fraction = r.schedule.wsd_decay_fraction;
  c.adamw = {r.optimizer.betas[0], r.optimizer.betas[1], r.optimizer.eps, r.optimizer.weight_decay};
  c.grad_clip = r.optimizer.grad_clip;
  // Loss scaling matters only where gradients can underflow: fp16. Other precisions run unscaled.
  train::LossScaler::Config& s = c.loss_scale;
  s.kind = train::LossScaleKind::none;
  if (r.precision.compute == recipe::Compute::fp16) {
    switch (r.precision.loss_scale.mode) {
      case recipe::LossScaleMode::dynamic:
        s.kind = train::LossScaleKind::dynamic;
        break;
      case recipe::LossScaleMode::fixed:
        s.kind = train::LossScaleKind::fixed;
        break;
      case recipe::LossScaleMode::none:
        s.kind = train::LossScaleKind::none;
        break;
    }
  }
  s.initial_scale = r.precision.loss_scale.mode == recipe::LossScaleMode::fixed
                        ? r.precision.loss_scale.value
                        : r.precision.initial_loss_scale;
  s.window = r.precision.loss_scale_window;
  s.min_scale = r.precision.min_loss_scale;
  c.eval_every_steps = r.logging.eval_every_steps;
  c.eval_batches = r.logging.eval_batches;
  c.zero = r.parallel.zero;
  c.overlap_grad_sync = r.parallel.overlap_grad_sync;
  return c;
}

}  // namespace trainctl::run
