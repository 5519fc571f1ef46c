// The step loop of one rank: gradient accumulation over micro-batches, loss scaling, global
// gradient-norm clipping, AdamW, LR schedule, periodic evaluation. What happens with the numbers
// (progress line, metrics.jsonl, TensorBoard) is the caller's business: it receives StepMetrics.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "comm/mesh.hpp"
#include "data/sampler.hpp"
#include "layout/pipeline.hpp"
#include "layout/timeline.hpp"
#include "model/model.hpp"
#include "train/config.hpp"
#include "train/grad_sync.hpp"
#include "train/loss_scaler.hpp"
#include "train/optimizer.hpp"
#include "train/schedule.hpp"
#include "train/stability.hpp"

namespace trainctl::train {

// The recipe's training, optimizer, schedule and precision (loss scaling) sections as they are
// (train/config.hpp), plus the few settings of other sections the step loop needs.
struct TrainConfig : TrainingConfig {
  OptimizerConfig optimizer;
  uint64_t seed = 0;  // determinism.seed: bf16 optimizer moments' stochastic rounding
  ScheduleConfig schedule;
  LossScalingConfig loss_scaling;  // applied only to a model that stores fp16
  int64_t eval_every_steps = 0;    // 0: only at the end
  int eval_batches = 1;
  // Multi-rank: gradient buckets of the data-parallel all-reduce, and the ZeRO stage 0 to 3 (the
  // model must then be built with ModelParallel layout.zero = zero; ZeRO-2 and 3 keep their
  // sharded buffers on one rank too).
  int64_t bucket_bytes = int64_t{25} << 20;
  int zero = 0;
  // ZeRO-2 and 3: the type the block gradients are summed in over dp (precision.reduce_dtype).
  ReduceDtype reduce_dtype = ReduceDtype::fp32;
  // Start each bucket's reduction as soon as the last micro-batch's backward has produced it,
  // with ZeRO-1 and 2 gather each bucket's updated parameters while the next forward runs, and
  // with ZeRO-3 the next block's while one computes (bit-identical to doing all of it blocking).
  bool overlap_grad_sync = true;
  // Record the pipeline timeline of this step (1-based; 0: none): every stage times its actions
  // (logging.timeline_step), and timeline() returns the whole pipeline's afterwards.
  int64_t timeline_step = 0;
  // Diagnostic (trainctl's --debug-slow-rank): sleep this long at the start of every step's
  // compute, making this rank a straggler. Zero (the default) is the production path.
  std::chrono::milliseconds debug_step_delay{0};
  // The stability guard (train/stability.hpp), and an in-memory snapshot every
  // snapshot_every_steps steps (checkpoint.memory_every_steps; 0: none), which a rollback returns
  // to and the run writes to its memory tier (lib/run/local_tier.hpp).
  StabilityConfig stability;
  int64_t snapshot_every_steps = 0;
  // Diagnostics (trainctl's --debug-nan-batch, --debug-spike-batch, --debug-drop-batch), by
  // 1-based index of the global batch in the data order: data rank 0 makes its gradients NaN;
  // every rank multiplies the batch's loss and gradients by kDebugSpikeFactor; the batch is
  // passed over as if the data did not hold it. Empty (the default) is the production path.
  static constexpr double kDebugSpikeFactor = 100.0;
  std::vector<int64_t> debug_nan_batches, debug_spike_batches, debug_drop_batches;

  // Micro-batches per optimizer step on one rank; with `data_ranks` ranks reading different data
  // (dp * ep) each takes global_batch / data_ranks sequences.
  int accum_steps(int data_ranks = 1) const { return global_batch / data_ranks / micro_batch; }
};

struct StepMetrics {
  int64_t step = 0;  // 1-based number of the step just finished
  double loss = 0;   // mean cross-entropy over the step's tokens (nats/token)
  double lr = 0;
  double grad_norm = 0;  // global L2 norm before clipping (unscaled); NaN/inf when skipped
  int64_t tokens = 0;    // tokens processed so far
  double tokens_per_s = 0;
  double step_ms = 0;
  double loss_scale = 1;
  bool skipped = false;  // fp16 dynamic loss scaling: non-finite gradients, the step counted
  // The stability guard's events before this step's update was applied (each dropped a batch,
  // or rolled back to a snapshot: then `step` is the snapshot's step + 1), and the run's total.
  std::vector<StabilityEvent> events;
  int64_t stability_events = 0;
  double aux_loss = 0, z_loss = 0;  // MoE, summed over layers, averaged over micro-batches
  std::vector<std::vector<double>> expert_load;  // per MoE layer, averaged over micro-batches
  std::vector<int64_t> dropped_tokens;           // per MoE layer, summed over micro-batches
  std::optional<double> val_loss;
  // Exposed communication: time the training thread spent inside collectives or waiting for the
  // background gradient reductions during the step.
  double comm_ms = 0;
  // comm_ms by where it was spent: each group's blocking calls ("tp", "pp", "dp", "dp_ep",
  // "world", ...: the groups of more than one rank), "bg_wait", the waits for the background
  // reductions and gathers (overlap_grad_sync), and "cp_ring_wait", the waits for the
  // context-parallel ring's worker (cp_background). Empty on one rank.
  std::vector<std::pair<std::string, double>> comm_ms_by_group;
  // Busy time of the background reductions (overlap_grad_sync), which runs beside compute.
  double comm_background_ms = 0;
  // Context parallel: how long attention's ring passes held up the training thread (a blocking
  // pass whole, an overlapped one as long as it outlasted the compute beside it). Overlapped,
  // it is part of comm_ms; blocking, comm_ms holds the passes already.
  double cp_wait_ms = 0;
  // What the overlap achieved (0 without it): gradient buckets whose reduction started during the
  // step's backward (ZeRO-2 and 3: block reduce-scatters), and (ZeRO-1 and 2) buckets of the
  // previous step's parameter gather that the step's first forward waited for as it reached them.
  size_t buckets_started_during_backward = 0;
  size_t buckets_gathered_during_forward = 0;
  // ZeRO-3: block gathers during the step, and those a block found already started (prefetched
  // while the block before computed).
  size_t block_gathers = 0, blocks_prefetched = 0;
};

// Everything besides the parameter buffers (values, master weights, Adam moments in the
// ParamStore) that a resumed run needs to continue bit for bit. The LR schedule is a pure
// function of `step`, so it needs no state of its own.
struct TrainerState {
  int64_t step = 0;    // optimizer steps done
  int64_t tokens = 0;  // tokens processed so far
  int64_t optimizer_updates =
      0;  // the optimizer's steps, Adam's t (skipped fp16 steps do not count)
  std::string optimizer = "adamw";  // optimizer.name of the run (its moments are in the store)
  LossScaler::State loss_scaler;
  data::SamplerState sampler;  // the global position in the sample order
  StabilityGuard::State stability;
};

// A rank's whole state in host memory: its parameter buffers (values, or its part of sharded
// values; master weights; AdamW moments) and the trainer state. The in-memory snapshot a rollback
// returns to, and what the node-local checkpoint tiers write (lib/run/local_tier.hpp). It belongs
// to one rank of one layout: another layout reads the shared tier, which reshards.
struct RankSnapshot {
  TrainerState state;
  std::vector<std::byte> values, master, moment1, moment2;
  std::vector<std::byte> optimizer;  // the optimizer's own state (Optimizer::state), if any
};

// The device tensors a RankSnapshot's buffers come from and go back to, in its order.
using SnapshotTargets = std::array<tensor::Tensor, 5>;

class Trainer {
 public:
  // `val` may be null (no evaluation). All references must outlive the trainer. `mesh` null: one
  // rank. With a mesh, every rank of the job constructs its trainer with the same config and
  // calls the same methods in the same order (they are collective); the model must have been
  // built with the ModelParallel of this rank of the mesh. Every rank returns the same
  // StepMetrics (losses and norms of the whole job) and state().
  Trainer(const TrainConfig& config, model::Transformer& model, backend::Backend& backend,
          data::Sampler& train_data, const data::ValidationSet* val,
          const comm::Mesh* mesh = nullptr);
  // The optimizer's own device buffers (Optimizer::bytes), beside the store's moments.
  size_t optimizer_bytes() const { return optimizer_.bytes(); }
  const Optimizer& optimizer() const { return optimizer_; }
  // optimizer.name, as the state records it.
  std::string optimizer_name() const { return train::optimizer_name(config_.optimizer.name); }
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  StepMetrics step();  // one optimizer step (accum_steps micro-batches)
  double evaluate();   // mean loss over eval_batches validation micro-batches
  // Runs until `steps`, calling `on_step` after each (with val_loss at evaluation steps). When
  // on_step returns false the loop stops after that step (preemption, a signal).
  // ZeRO-1 with overlap: during on_step the other dp ranks' parts of the parameters may still be
  // arriving (the gather overlaps the next forward). Whatever reads params().values() there calls
  // wait_parameters() first, as capture_checkpoint and evaluate() do; run() returns with them
  // complete, and step() always does.
  void run(const std::function<bool(const StepMetrics&)>& on_step);
  // Waits for the parameter gather still running (ZeRO-1 with overlap), if any: then every rank
  // holds all parameters. Cheap when there is none. Const: it completes state, changes none.
  void wait_parameters() const;

  TrainerState state() const;
  // Continues from `state` (the ParamStore must hold the matching parameters). Throws
  // data::DataError when the sampler state belongs to other data or another sequence length.
  void restore(const TrainerState& state);

  int64_t steps_done() const { return step_; }
  const LossScaler& loss_scaler() const { return scaler_; }
  const StabilityGuard& stability() const { return guard_; }
  // Copies the parameters, optimizer state and trainer state into host memory (the newest
  // snapshot replaces the one before). The trainer takes one every snapshot_every_steps (and, for
  // stability.action rollback, at the start); the run takes one whenever it saves a checkpoint,
  // so a rollback never returns to before a saved step. Collective only in waiting for ZeRO-1's
  // gather.
  void take_snapshot();
  bool rolls_back() const { return config_.stability.action == StabilityAction::rollback; }
  // The newest snapshot (null before the first).
  const RankSnapshot* snapshot() const { return snapshot_ ? &*snapshot_ : nullptr; }
  // Continuing from a snapshot of this rank that a reader fills in place (a node-local tier's:
  // no second host copy): the buffers of a RankSnapshot, in its order (values, or the part of
  // sharded values; master; moment1; moment2), empty where the rank keeps none; then
  // finish_restore with the snapshot's trainer state (it throws data::DataError as restore()
  // does).
  SnapshotTargets snapshot_targets() const;
  void finish_restore(const TrainerState& state);
  const comm::Mesh* mesh() const { return mesh_; }  // null on one rank
  // Whether gradient reductions (all-reduce, or ZeRO-1's reduce-scatter) overlap backward, and
  // ZeRO-1's parameter gather the next forward: asked for (overlap_grad_sync) and the mesh was
  // created with MeshOptions::background_groups.
  bool overlaps_grad_sync() const { return sync_ && sync_->overlaps(); }
  // The gradient sync's buffers for its collectives (GradSync::buffer_bytes); 0 on one rank.
  size_t comm_buffer_bytes() const { return sync_ ? sync_->buffer_bytes() : 0; }
  // The measured pipeline timeline of config.timeline_step once that step ran (every stage's
  // actions, on every rank), else null. Times are seconds from the step's start: the stages
  // start it together (a barrier over pp), and each compute action ends with its device work.
  const Timeline* timeline() const { return timeline_ ? &*timeline_ : nullptr; }

 private:
  // Splits `rows` window rows into inputs_ and targets_ (T tokens each).
  void load_windows(const int32_t* window, int rows);
  // `record`: this stage's actions with their times, into `recorded`.
  void run_schedule(double grad_scale, std::vector<double>& sums,
                    std::vector<TimedAction>* recorded = nullptr);
  // Every stage's recorded actions, exchanged over pp, as one Timeline.
  Timeline gather_timeline(const std::vector<TimedAction>& mine) const;
  // step() without waiting for the parameter gather at its end (run() lets it overlap).
  StepMetrics step_leaving_gather();
  // One batch through forward and backward, its numbers summed over the job into `m`; returns
  // the gradients' sum of squares (scaled) for the guard and the update.
  double compute_batch(StepMetrics& m, double scale, int64_t batch);
  // The guard's event: the batch (rollback: every batch since the snapshot) is dropped, and the
  // event says so (action, to_step, first_batch, in_a_row); throws StabilityError when it is one
  // too many in a row.
  void act_on(StabilityEvent& event);
  void roll_back();  // to snapshot_
  // After the update or a rollback: the parameters everybody reads made whole again.
  void refresh_parameters();
  double tokens_per_s(double step_ms) const;  // the step's global batch over step_ms
  void add_result(const model::ForwardResult& r, double weight, std::vector<double>& sums) const;
  // Sums `values` over the pipeline stages, then over the data ranks (every rank gets the total).
  void sum_over_job(std::vector<double>& values) const;

  TrainConfig config_;
  model::Transformer& model_;
  backend::Backend& be_;
  data::Sampler& train_;
  const data::ValidationSet* val_;
  const comm::Mesh* mesh_;
  LrSchedule lr_;
  LossScaler scaler_;
  Optimizer optimizer_;
  std::unique_ptr<GradSync> sync_;  // null on one rank
  int data_rank_ = 0, data_ranks_ = 1;
  PipelineShape pipeline_;            // the step's pipeline (1F1B, or interleaved with chunks)
  std::vector<PipeAction> schedule_;  // this stage's actions for one step
  SlotPlan slots_;                    // the activation slot of each action
  std::vector<int> moe_layers_;       // global indices of the model's MoE layers
  int64_t step_ = 0;
  int64_t tokens_ = 0;
  // The step's windows of this data rank (all its micro-batches: a pipeline stage holds several in
  // flight) and their inputs and targets.
  std::vector<int32_t> window_, inputs_, targets_;
  std::optional<Timeline> timeline_;
  StabilityGuard guard_;
  std::optional<RankSnapshot> snapshot_;
};

}  // namespace trainctl::train
