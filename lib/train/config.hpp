// What the trainer is told: the recipe's training, optimizer, schedule and precision (loss scaling)
// sections, as the trainer's own structs. The recipe's schema fills them directly (lib/recipe), and
// tests and benchmarks build them by hand. No dependencies beyond the standard library, so the
// recipe can hold them without linking lib/train.
#pragma once

#include <array>
#include <cstdint>

namespace trainctl::train {

// training.*
struct TrainingConfig {
  int64_t steps = 1;
  int global_batch = 1;  // sequences per optimizer step
  int micro_batch = 1;   // sequences per forward/backward
  bool operator==(const TrainingConfig&) const = default;
};

// optimizer.name (train/optimizer.hpp has each one's update):
//   adamw  Loshchilov & Hutter, decoupled weight decay
//   sgd    PyTorch's SGD: momentum, optional Nesterov, weight decay added to the gradient
//   lion   Chen et al. 2023: the sign of an interpolated momentum, decoupled weight decay
//   muon   Jordan et al. 2024 in Moonlight's form (Liu et al. 2025): Newton-Schulz-orthogonalised
//          momentum for the 2-D hidden weights, AdamW for embeddings, head, norms, biases, router
//   adafactor  Shazeer & Stern 2018 as PyTorch's Adafactor: factored second moments (a row and a
//          column vector per matrix), relative step size, update clipping, no momentum
enum class OptimizerName { adamw, sgd, lion, muon, adafactor };

// optimizer.state_dtype: the type of the per-element moments (m, v, momentum). bf16 halves them
// and stores each update stochastically rounded (tensor/stochastic_round.hpp), keyed by the seed
// and the element's global index, so every layout rounds alike.
enum class StateDtype { fp32, bf16 };

// optimizer.*: the update rule and the global gradient-norm clip.
struct OptimizerConfig {
  OptimizerName name = OptimizerName::adamw;
  double lr = 1e-3;                        // the peak learning rate of the schedule
  std::array<double, 2> betas{0.9, 0.95};  // adamw (and muon's adamw group); lion's beta1, beta2
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;       // 0: off
  double momentum = 0.95;       // sgd and muon
  bool nesterov = true;         // sgd and muon
  int ns_steps = 5;             // muon: Newton-Schulz iterations
  double beta2_decay = -0.8;    // adafactor: 1 - beta2 at step t is t^beta2_decay
  double clip_threshold = 1.0;  // adafactor: d, the update's RMS is clipped to it
  StateDtype state_dtype = StateDtype::fp32;
  bool operator==(const OptimizerConfig&) const = default;
};

// The per-element state buffers the optimizer keeps beside each parameter (m, v): adamw and muon
// (m for all, Adam's v kept for the whole part) 2, lion 1, sgd 1 with momentum and 0 without,
// adafactor 0.
// train::moment_names names them; the planner counts them.
inline int optimizer_moments(const OptimizerConfig& config) {
  switch (config.name) {
    case OptimizerName::adamw:
    case OptimizerName::muon:
      return 2;
    case OptimizerName::lion:
      return 1;
    case OptimizerName::adafactor:  // its factored state is its own (Optimizer::state)
      return 0;
    case OptimizerName::sgd:
      return config.momentum == 0 ? 0 : 1;
  }
  return 2;
}

// schedule.decay: what the learning rate does after warm-up (train/schedule.hpp).
enum class DecayKind { cosine, linear, constant, wsd };

// schedule.*: linear warm-up to optimizer.lr, then the decay down to min_lr at decay_steps.
struct ScheduleConfig {
  int64_t warmup_steps = 0;
  DecayKind decay = DecayKind::cosine;
  double min_lr = 0.0;
  double wsd_decay_fraction = 0.2;  // wsd: share of the post-warmup steps spent decaying
  int64_t decay_steps = 0;  // 0: training.steps (fixed, so that a run extended later keeps it)
  bool operator==(const ScheduleConfig&) const = default;
};

// precision.loss_scale: dynamic (grows and backs off), fixed (a static scale) or none.
enum class LossScaleKind { none, fixed, dynamic };

struct LossScale {
  LossScaleKind mode = LossScaleKind::dynamic;
  double value = 0;  // the static scale when mode == fixed, else 0
  bool operator==(const LossScale&) const = default;
};

// precision.loss_scale and its settings. Loss scaling matters only where gradients can underflow,
// so the trainer applies it only to a model that stores fp16 (train/loss_scaler.hpp).
struct LossScalingConfig {
  LossScale loss_scale;
  double initial_loss_scale = 65536.0;  // the first dynamic scale
  int loss_scale_window = 1000;         // grow the dynamic scale after this many finite steps
  double min_loss_scale = 1.0;          // the dynamic scale never drops below this
  bool operator==(const LossScalingConfig&) const = default;
};

// precision.reduce_dtype: the type in which the block gradients of ZeRO-2 and 3 are summed over
// the data-parallel ranks (FSDP2's reduce_dtype). bf16 halves their traffic; the sums are added
// into the f32 part (the optimizer's gradients stay f32).
enum class ReduceDtype { fp32, bf16 };

// precision.* but compute and fp8 (the model's): loss scaling and the reduction type.
struct PrecisionConfig : LossScalingConfig {
  ReduceDtype reduce_dtype = ReduceDtype::fp32;
  bool operator==(const PrecisionConfig&) const = default;
};

// stability.action: what the guard does when a step's loss or gradient is non-finite or spikes.
//   skip      the step's update is dropped and the step is tried again with the next batch
//   rollback  the parameters, optimizer and schedule go back to the newest in-memory snapshot
//             (checkpoint.memory_every_steps), and every batch since it is skipped (as PaLM did)
enum class StabilityAction { skip, rollback };

// stability.*: the guard of train/stability.hpp.
struct StabilityConfig {
  // A step is a spike when its loss (gradient norm) lies more than this many standard deviations
  // above the mean of the last `window` applied steps (llm.c's outlier test); 0: not tested.
  double loss_z = 0;
  double grad_z = 0;
  int window = 100;  // the z-scores need this many applied steps before they apply
  StabilityAction action = StabilityAction::skip;
  // This many events in a row without the run getting past the furthest step it had reached:
  // the run stops (exit 1) with the events in its report.
  int max_events = 5;
  // After a rollback: the learning rate is multiplied by lr_factor for the next lr_steps steps.
  double lr_factor = 1.0;
  int64_t lr_steps = 0;
  bool operator==(const StabilityConfig&) const = default;
};

}  // namespace trainctl::train
