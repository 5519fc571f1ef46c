#include "train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

namespace trainctl::train {

namespace {

// Metric sums of one step, in one vector so a single all-reduce carries them:
// [loss, aux_loss, z_loss, expert_load (moe layers x experts), dropped_tokens (moe layers)].
constexpr size_t kLoss = 0, kAux = 1, kZ = 2, kLoads = 3;

// Evaluation forwards pass activations on tags above every training tag of a step.
constexpr uint32_t kEvalTag = 0x20000000u;

std::string str(int64_t v) {
  return std::to_string(v);
}

bool contains(const std::vector<int64_t>& list, int64_t value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

// The step's pipeline: interleaved when the model holds several chunks per stage, ZB-H1 when it
// splits its backward.
PipelineShape pipeline_of(const model::ModelParallel& parallel, int micro_batches) {
  const int V = parallel.virtual_stages;
  const PipeSchedule schedule = V > 1                     ? PipeSchedule::interleaved
                                : parallel.split_backward ? PipeSchedule::zb_h1
                                                          : PipeSchedule::one_f_one_b;
  return {parallel.pp_size(), micro_batches, schedule, V};
}

void check_parallel(const TrainConfig& config, const model::Transformer& model,
                    const comm::Mesh* mesh) {
  const model::ModelParallel& parallel = model.parallel();
  if (config.zero < 0 || config.zero > 3)
    throw std::invalid_argument("zero stage " + str(config.zero) + ": use 0, 1, 2 or 3");
  const model::ParamStore& params = model.params();
  if ((config.zero >= 2) != params.grads_sharded() || (config.zero >= 3) != params.values_sharded())
    throw std::invalid_argument(
        "zero stage " + str(config.zero) + " but the model keeps its gradients " +
        (params.grads_sharded() ? "sharded" : "whole") + " and its values " +
        (params.values_sharded() ? "sharded" : "whole") +
        ": build the model with ModelParallel layout.zero = " + str(config.zero));
  if (config.bucket_bytes < 1)
    throw std::invalid_argument("bucket_bytes " + str(config.bucket_bytes) + ": must be positive");
  if (!mesh) {
    if (parallel.pp_size() != 1 || parallel.tp_size() != 1 || parallel.ep_size() != 1 ||
        parallel.virtual_stages != 1)
      throw std::invalid_argument(
          "the model is built for tp " + str(parallel.tp_size()) + ", ep " +
          str(parallel.ep_size()) + ", pp " + str(parallel.pp_size()) +
          " but the trainer has no mesh: pass the rank's comm::Mesh to the Trainer");
    return;
  }
  const int data_ranks = mesh->dp_ep().size();
  if (config.global_batch % (data_ranks * config.micro_batch) != 0)
    throw std::invalid_argument("global_batch " + str(config.global_batch) +
                                " is not a multiple of data ranks (dp*ep = " + str(data_ranks) +
                                ") * micro_batch " + str(config.micro_batch) + " = " +
                                str(int64_t{data_ranks} * config.micro_batch));
  if (parallel.tp_size() != mesh->tp().size() || parallel.ep_size() != mesh->ep().size() ||
      parallel.pp_size() != mesh->pp().size() || parallel.pp_rank() != mesh->pp().rank())
    throw std::invalid_argument(
        "the model is built for tp " + str(parallel.tp_size()) + ", ep " + str(parallel.ep_size()) +
        ", stage " + str(parallel.pp_rank()) + " of " + str(parallel.pp_size()) +
        " but the mesh has tp " + str(mesh->tp().size()) + ", ep " + str(mesh->ep().size()) +
        ", stage " + str(mesh->pp().rank()) + " of " + str(mesh->pp().size()) +
        ": build the model with this rank's ModelParallel");
  const PipelineShape shape = pipeline_of(parallel, config.accum_steps(data_ranks));
  if (const std::string problem = shape.problem(); !problem.empty())
    throw std::invalid_argument(problem);
  const int slots = pipeline_slots(shape, parallel.pp_rank());
  if (parallel.activation_slots < slots)
    throw std::invalid_argument(
        "pipeline stage " + str(parallel.pp_rank()) + " of " + str(parallel.pp_size()) + " holds " +
        str(parallel.activation_slots) + " activation slots; " + schedule_name(shape.schedule) +
        " over " + str(config.accum_steps(data_ranks)) + " micro-batches needs " + str(slots) +
        " (pipeline_slots)");
}

}  // namespace

Trainer::Trainer(const TrainConfig& config, model::Transformer& model, backend::Backend& backend,
                 data::Sampler& train_data, const data::ValidationSet* val, const comm::Mesh* mesh)
    : config_(config),
      model_(model),
      be_(backend),
      train_(train_data),
      val_(val),
      mesh_(mesh),
      lr_(LrSchedule::of(config.optimizer, config.schedule, config.steps)),
      scaler_(config.loss_scaling, model.config().storage == tensor::DType::f16),
      optimizer_(config.optimizer, backend, model.params(), model.config(),
                 model.parallel().zero_parts() > 1, mesh, config.seed),
      guard_(config.stability) {
  if (config.micro_batch != model.micro_batch())
    throw std::invalid_argument("trainer micro_batch " + std::to_string(config.micro_batch) +
                                " != model micro_batch " + std::to_string(model.micro_batch()));
  if (config.global_batch % config.micro_batch != 0)
    throw std::invalid_argument("global_batch % micro_batch != 0");
  check_parallel(config, model, mesh);
  if (mesh) {
    data_rank_ = mesh->dp_ep().rank();
    data_ranks_ = mesh->dp_ep().size();
    sync_ = std::make_unique<GradSync>(*mesh, backend, model, config.bucket_bytes, config.zero,
                                       config.overlap_grad_sync, config.reduce_dtype);
    // ZeRO-3: every forward gathers its blocks, evaluation's too, for the trainer's lifetime.
    model.set_block_value_source(sync_->param_gather());
  }
  const model::ModelParallel& parallel = model.parallel();
  const int accum = config.accum_steps(data_ranks_);
  pipeline_ = pipeline_of(parallel, accum);
  schedule_ = pipeline_lists(pipeline_)[static_cast<size_t>(parallel.pp_rank())];
  slots_ = plan_slots(schedule_);
  for (int layer = 0; layer < model.config().layers; ++layer)
    if (model.config().is_moe_layer(layer)) moe_layers_.push_back(layer);
  const size_t T = static_cast<size_t>(model.config().seq_len);
  const size_t rows = static_cast<size_t>(config.global_batch / data_ranks_);
  window_.resize(rows * (T + 1));
  inputs_.resize(rows * T);
  targets_.resize(rows * T);
}

Trainer::~Trainer() {
  model_.set_block_value_source(nullptr);
}

// A window row holds T + 1 tokens: inputs are the first T, targets the last T.
void Trainer::load_windows(const int32_t* window, int rows) {
  const size_t T = static_cast<size_t>(model_.config().seq_len);
  for (size_t b = 0; b < static_cast<size_t>(rows); ++b)
    for (size_t t = 0; t < T; ++t) {
      inputs_[b * T + t] = window[b * (T + 1) + t];
      targets_[b * T + t] = window[b * (T + 1) + t + 1];
    }
}

void Trainer::add_result(const model::ForwardResult& r, double weight,
                         std::vector<double>& sums) const {
  sums[kLoss] += r.loss * weight;
  sums[kAux] += r.aux_loss * weight;
  sums[kZ] += r.z_loss * weight;
  const size_t experts = static_cast<size_t>(model_.config().moe.experts);
  const size_t dropped = kLoads + moe_layers_.size() * experts;
  for (size_t i = 0; i < r.expert_load.size(); ++i) {
    // Without moe_layers the entries are the model's MoE layers in order (one stage).
    size_t index = i;
    if (i < r.moe_layers.size()) {
      const auto it = std::find(moe_layers_.begin(), moe_layers_.end(), r.moe_layers[i]);
      if (it == moe_layers_.end())
        throw std::logic_error("forward reported MoE layer " + str(r.moe_layers[i]) +
                               ", which the model config does not have");
      index = static_cast<size_t>(it - moe_layers_.begin());
    }
    for (size_t e = 0; e < r.expert_load[i].size() && e < experts; ++e)
      sums[kLoads + index * experts + e] += r.expert_load[i][e] * weight;
    sums[dropped + index] += static_cast<double>(r.dropped_tokens[i]);
  }
}

void Trainer::sum_over_job(std::vector<double>& values) const {
  if (!mesh_) return;
  // Stages hold different layers (sum them); data ranks different samples. Tensor-parallel ranks
  // compute the same values and are left out, so every rank ends with the same bits.
  for (comm::Communicator* group : {&mesh_->pp(), &mesh_->dp_ep()})
    if (group->size() > 1) group->all_reduce_sum(values.data(), values.size(), tensor::DType::f64);
}

namespace {

// One of the model's hooks (Set: its setter), armed for one call and disarmed on every exit: it
// must not outlive the call into the next step.
using RangesHook = std::function<void(const std::vector<model::IndexRange>&)>;
template <void (model::Transformer::*Set)(RangesHook)>
class ScopedHook {
 public:
  ScopedHook(model::Transformer& model, RangesHook hook) : model_(model) {
    (model_.*Set)(std::move(hook));
  }
  ~ScopedHook() { (model_.*Set)({}); }
  ScopedHook(const ScopedHook&) = delete;
  ScopedHook& operator=(const ScopedHook&) = delete;

 private:
  model::Transformer& model_;
};
using ParamsNeeded = ScopedHook<&model::Transformer::set_params_needed_hook>;
using GradsReady = ScopedHook<&model::Transformer::set_grads_ready_hook>;

// ZeRO-2: the gradient sync takes each block's gradients as its backward ends, for one schedule.
class ScopedSink {
 public:
  ScopedSink(model::Transformer& model, model::BlockGradSink* sink) : model_(model) {
    model_.set_block_grad_sink(sink);
  }
  ~ScopedSink() { model_.set_block_grad_sink(nullptr); }
  ScopedSink(const ScopedSink&) = delete;
  ScopedSink& operator=(const ScopedSink&) = delete;

 private:
  model::Transformer& model_;
};

}  // namespace

// Runs this stage's pipeline actions; with one stage that is forward, backward per micro-batch.
void Trainer::run_schedule(double grad_scale, std::vector<double>& sums,
                           std::vector<TimedAction>* recorded) {
  const model::ModelParallel& parallel = model_.parallel();
  const size_t tokens =
      static_cast<size_t>(config_.micro_batch) * static_cast<size_t>(model_.config().seq_len);
  const double weight = 1.0 / (config_.accum_steps(data_ranks_) * data_ranks_);
  // Only the step's last backward of a chunk completes its gradients: earlier ones still add to
  // the same buffer, so reporting them to the gradient sync would start reductions too early.
  // (The sync is armed once, before the first of them; a bucket starts when all of it is in.)
  // A split backward completes some in its last B (the head) and the rest in its last W.
  // Likewise each chunk's first forward is the first to read its parameters.
  const size_t none = schedule_.size();
  std::vector<size_t> last_backward(static_cast<size_t>(pipeline_.virtual_stages), none),
      last_weights(last_backward), first_forward(last_backward);
  for (size_t i = schedule_.size(); i-- > 0;) {
    const size_t c = static_cast<size_t>(schedule_[i].chunk);
    if (schedule_[i].op == PipeOp::backward && last_backward[c] == none) last_backward[c] = i;
    if (schedule_[i].op == PipeOp::weight_grad && last_weights[c] == none) last_weights[c] = i;
    if (schedule_[i].op == PipeOp::forward) first_forward[c] = i;
  }
  const size_t arm_at = *std::min_element(last_backward.begin(), last_backward.end());
  const bool split = splits_backward(pipeline_.schedule);
  const int P = parallel.pp_size(), rank = parallel.pp_rank();
  const int next = (rank + 1) % P, previous = (rank + P - 1) % P;
  // The interleaved and ZB-H1 schedules send without waiting for the peer (their lists also run
  // with blocking sends, only slower: timeline.hpp). A slot's activation send is waited for
  // before its output tensor is written again (the next forward, or the gradient received into
  // it), its gradient send before the next backward writes the gradient's tensor, or without
  // chunks the next forward (the tensor is then the slot's second residual: model.hpp), and all
  // of them before the step goes on.
  const bool buffered = pipeline_.schedule != PipeSchedule::one_f_one_b;
  const bool own_input_grad = pipeline_.virtual_stages > 1;
  using Pending = std::vector<std::unique_ptr<comm::PendingSend>>;
  std::vector<Pending> activation_sends(static_cast<size_t>(slots_.slots)),
      grad_sends(activation_sends.size());
  auto settle = [](Pending& sends) {
    for (auto& send : sends)
      send->wait();
    sends.clear();
  };
  auto send = [&](const tensor::Tensor& t, int peer, uint32_t tag, Pending& sends) {
    if (buffered)
      sends.push_back(mesh_->pp().isend(t.data, t.bytes(), peer, tag));
    else
      mesh_->pp().send(t.data, t.bytes(), peer, tag);
  };
  const ScopedSink sink(model_, model_.params().grads_sharded() ? sync_.get() : nullptr);
  const bool overlap = sync_ && sync_->overlaps();
  // ZeRO-1 with overlap: the last step's parameter gather may still run; the step's first forward
  // on this stage waits for each bucket just before reading it.
  const bool gathering = sync_ && sync_->gathering();
  const auto step_start = std::chrono::steady_clock::now();
  auto since_start = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
  };
  for (size_t i = 0; i < schedule_.size(); ++i) {
    const PipeAction& action = schedule_[i];
    const size_t chunk = static_cast<size_t>(action.chunk);
    const int slot = slots_.slot[i];
    // The slot's earlier sends must be done before its tensors are written again: a wait for the
    // peer, timed as idle rather than as the action's.
    if (buffered && (action.op == PipeOp::forward || action.op == PipeOp::recv_grad))
      settle(activation_sends[static_cast<size_t>(slot)]);
    if (buffered &&
        (action.op == PipeOp::backward || (action.op == PipeOp::forward && !own_input_grad)))
      settle(grad_sends[static_cast<size_t>(slot)]);
    const double action_start = recorded ? since_start() : 0.0;
    const uint32_t tag = pipeline_tag(action, rank, pipeline_.virtual_stages);
    switch (action.op) {
      case PipeOp::recv_activation: {
        const tensor::Tensor in = model_.stage_input(slot);
        mesh_->pp().recv(in.data, in.bytes(), previous, tag);
        break;
      }
      case PipeOp::forward: {
        const size_t first = static_cast<size_t>(action.micro_batch) * tokens;
        std::optional<ParamsNeeded> needed;
        if (gathering && i == first_forward[chunk])
          needed.emplace(model_, [this](const std::vector<model::IndexRange>& ranges) {
            sync_->params_needed(ranges);
          });
        add_result(
            model_.forward(inputs_.data() + first, targets_.data() + first, slot, action.chunk),
            weight, sums);
        break;
      }
      case PipeOp::send_activation:
        send(model_.stage_output(slot), next, tag, activation_sends[static_cast<size_t>(slot)]);
        break;
      case PipeOp::recv_grad: {
        const tensor::Tensor grad = model_.output_grad(slot);
        mesh_->pp().recv(grad.data, grad.bytes(), next, tag);
        break;
      }
      case PipeOp::backward:
      case PipeOp::weight_grad: {
        auto pass = [&] {
          if (action.op == PipeOp::weight_grad)
            model_.backward_weights(slot);
          else if (split)
            model_.backward_input(grad_scale, slot);
          else
            model_.backward(grad_scale, slot);
        };
        if (overlap && (i == last_backward[chunk] || i == last_weights[chunk])) {
          if (i == arm_at) sync_->arm();
          const GradsReady ready(model_, [this](const std::vector<model::IndexRange>& ranges) {
            sync_->grads_ready(ranges);
          });
          pass();
        } else {
          pass();
        }
        break;
      }
      case PipeOp::send_grad:
        send(model_.input_grad(slot), previous, tag, grad_sends[static_cast<size_t>(slot)]);
        break;
    }
    if (recorded) {
      // A compute action ends when its device work does (the CUDA backend's ops return early).
      if (computes(action.op)) be_.fence()->wait();
      recorded->push_back({action, action_start, since_start()});
    }
  }
  for (size_t slot = 0; slot < activation_sends.size(); ++slot) {
    settle(activation_sends[slot]);
    settle(grad_sends[slot]);
  }
}

Timeline Trainer::gather_timeline(const std::vector<TimedAction>& mine) const {
  const model::ModelParallel& parallel = model_.parallel();
  const int stages = parallel.pp_size();
  // Each stage's list has a known length: stage s fills rows [offset[s], offset[s + 1]) of a
  // zeroed table of (op, micro-batch, chunk, start, end) and the sum over pp gives every row.
  constexpr size_t kColumns = 5;
  std::vector<size_t> offset{0};
  for (const std::vector<PipeAction>& list : pipeline_lists(pipeline_))
    offset.push_back(offset.back() + list.size());
  std::vector<double> table(kColumns * offset.back(), 0.0);
  const size_t first = offset[static_cast<size_t>(parallel.pp_rank())];
  for (size_t i = 0; i < mine.size(); ++i) {
    double* row = &table[kColumns * (first + i)];
    row[0] = static_cast<double>(mine[i].action.op);
    row[1] = mine[i].action.micro_batch;
    row[2] = mine[i].action.chunk;
    row[3] = mine[i].start;
    row[4] = mine[i].end;
  }
  if (stages > 1) mesh_->pp().all_reduce_sum(table.data(), table.size(), tensor::DType::f64);
  Timeline t;
  t.schedule = schedule_name(pipeline_.schedule);
  t.stages.resize(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s)
    for (size_t i = offset[static_cast<size_t>(s)]; i < offset[static_cast<size_t>(s) + 1]; ++i) {
      const double* row = &table[kColumns * i];
      const TimedAction a{{static_cast<PipeOp>(static_cast<int>(row[0])), static_cast<int>(row[1]),
                           static_cast<int>(row[2])},
                          row[3],
                          row[4]};
      t.makespan = std::max(t.makespan, a.end);
      t.stages[static_cast<size_t>(s)].push_back(a);
    }
  return t;
}

double Trainer::tokens_per_s(double step_ms) const {
  return step_ms > 0 ? 1000.0 * config_.global_batch * model_.config().seq_len / step_ms : 0.0;
}

StepMetrics Trainer::step() {
  StepMetrics m = step_leaving_gather();
  if (!sync_ || !sync_->gathering()) return m;
  // The gather the step started, waited for here: communication the step waited for.
  const double before = sync_->wait_seconds();
  wait_parameters();
  const double waited_ms = 1000.0 * (sync_->wait_seconds() - before);
  m.comm_ms += waited_ms;
  if (!m.comm_ms_by_group.empty() && m.comm_ms_by_group.back().first == "bg_wait")
    m.comm_ms_by_group.back().second += waited_ms;
  m.step_ms += waited_ms;
  m.tokens_per_s = tokens_per_s(m.step_ms);
  return m;
}

void Trainer::wait_parameters() const {
  if (sync_) sync_->finish_gather();
}

StepMetrics Trainer::step_leaving_gather() {
  const auto start = std::chrono::steady_clock::now();
  if (config_.debug_step_delay.count() > 0) std::this_thread::sleep_for(config_.debug_step_delay);
  if (rolls_back() && !snapshot_) take_snapshot();
  const double comm_start = mesh_ ? mesh_->comm_seconds() : 0.0;
  const std::vector<std::pair<std::string, double>> groups_start =
      mesh_ ? mesh_->comm_seconds_by_group() : std::vector<std::pair<std::string, double>>{};
  const double wait_start = sync_ ? sync_->wait_seconds() : 0.0;
  const double background_start = mesh_ ? mesh_->background_comm_seconds() : 0.0;
  const double ring_start = model_.ring_wait_seconds();
  const ParamGather* gather = sync_ ? sync_->param_gather() : nullptr;
  const size_t gathers_start = gather ? gather->gathers() : 0;
  const size_t prefetched_start = gather ? gather->prefetched() : 0;
  const int64_t G = config_.global_batch;
  StepMetrics m;
  std::vector<StabilityEvent> events;
  for (;;) {
    // The batches a test asked to pass over, as if the data did not hold them.
    while (contains(config_.debug_drop_batches, train_.position() / G + 1))
      train_.skip(G);
    const int64_t batch = train_.position() / G + 1;
    m = StepMetrics{};
    const double scale = scaler_.scale();
    // One pass over the gradients: an f64 sum of squares of f32 values cannot overflow, so it is
    // finite exactly when every gradient is (inf and NaN propagate). Across ranks the partial
    // sums are all-reduced, so the decisions and the clip factor are the same everywhere.
    const double sum_squares = compute_batch(m, scale, batch);
    const bool finite = std::isfinite(sum_squares);
    m.grad_norm =
        finite ? std::sqrt(sum_squares) / scale : std::numeric_limits<double>::quiet_NaN();
    m.loss_scale = scale;
    m.lr = lr_.lr(step_) * guard_.lr_factor(step_);
    // fp16 with dynamic loss scaling: non-finite gradients are the scaler's (the scale backs
    // off and the step counts, as in Megatron and GradScaler); everything else is the guard's.
    const bool scaler_skip = !finite && scaler_.dynamic();
    if (!scaler_skip)
      if (std::optional<StabilityEvent> event = guard_.check(m.loss, m.grad_norm, finite)) {
        event->step = step_ + 1;
        event->batch = batch;
        try {
          act_on(*event);
        } catch (StabilityError& e) {  // too many in a row: this step's events were not reported
          e.set_unreported(events.size() + 1);
          throw;
        }
        events.push_back(*event);
        continue;
      }
    m.skipped = !scaler_.update(finite);
    if (!m.skipped) {
      const double clip =
          config_.optimizer.grad_clip > 0 && m.grad_norm > config_.optimizer.grad_clip
              ? config_.optimizer.grad_clip / (m.grad_norm + 1e-6)
              : 1.0;
      optimizer_.step(model_.params(), m.lr, clip / scale);
      refresh_parameters();
    }
    break;
  }
  ++step_;
  tokens_ += G * model_.config().seq_len;
  if (!m.skipped) guard_.applied(step_, m.loss, m.grad_norm);
  m.events = std::move(events);
  m.stability_events = guard_.state().events;
  m.step = step_;
  m.tokens = tokens_;
  if (mesh_) {
    // The training thread's blocking calls plus its waits for background reductions: what
    // communication cost the step. The background groups' own time overlaps compute.
    m.comm_ms = 1000.0 * (mesh_->comm_seconds() - comm_start + sync_->wait_seconds() - wait_start);
    const std::vector<std::pair<std::string, double>> groups = mesh_->comm_seconds_by_group();
    for (size_t g = 0; g < groups.size(); ++g)
      m.comm_ms_by_group.emplace_back(groups[g].first,
                                      1000.0 * (groups[g].second - groups_start[g].second));
    if (sync_->overlaps())
      m.comm_ms_by_group.emplace_back("bg_wait", 1000.0 * (sync_->wait_seconds() - wait_start));
    m.comm_background_ms = 1000.0 * (mesh_->background_comm_seconds() - background_start);
    m.cp_wait_ms = 1000.0 * (model_.ring_wait_seconds() - ring_start);
    if (model_.parallel().cp_background) {  // waits on the ring's worker
      m.comm_ms += m.cp_wait_ms;
      m.comm_ms_by_group.emplace_back("cp_ring_wait", m.cp_wait_ms);
    }
    m.buckets_started_during_backward = sync_->started_during_backward();
    m.buckets_gathered_during_forward = sync_->gathered_during_forward();
    if (gather) {
      m.block_gathers = gather->gathers() - gathers_start;
      m.blocks_prefetched = gather->prefetched() - prefetched_start;
    }
  }
  if (config_.snapshot_every_steps > 0 && step_ % config_.snapshot_every_steps == 0)
    take_snapshot();
  m.step_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  m.tokens_per_s = tokens_per_s(m.step_ms);
  return m;
}

double Trainer::compute_batch(StepMetrics& m, double scale, int64_t batch) {
  const int accum = config_.accum_steps(data_ranks_);
  const size_t experts = static_cast<size_t>(model_.config().moe.experts);
  model_.params().zero_grads();
  // Rank i of the data ranks takes sequences [i*G/D, (i+1)*G/D) of the step's global batch, so its
  // micro-batch a is micro-batch i*A + a of a one-rank run; the position advances by G everywhere.
  train_.next_batch_slice(config_.global_batch, data_rank_, data_ranks_, window_.data());
  load_windows(window_.data(), config_.global_batch / data_ranks_);
  std::vector<double> sums(kLoads + moe_layers_.size() * (experts + 1), 0.0);
  // The step's objective is the mean over the job's micro-batches; the loss scale rides along, so
  // the gradients summed over data ranks equal the one-rank gradient.
  double grad_scale = scale / (accum * data_ranks_);
  const bool spike = contains(config_.debug_spike_batches, batch);
  if (spike) grad_scale *= TrainConfig::kDebugSpikeFactor;
  if (data_rank_ == 0 && contains(config_.debug_nan_batches, batch))
    grad_scale = std::numeric_limits<double>::quiet_NaN();
  // The recorded step: the stages start it together, so their clocks share an origin.
  const bool record = step_ + 1 == config_.timeline_step;
  std::vector<TimedAction> recorded;
  if (record && mesh_ && mesh_->pp().size() > 1) mesh_->pp().barrier();
  run_schedule(grad_scale, sums, record ? &recorded : nullptr);
  if (record) timeline_ = gather_timeline(recorded);
  if (spike) sums[kLoss] *= TrainConfig::kDebugSpikeFactor;
  sum_over_job(sums);
  m.loss = sums[kLoss];
  m.aux_loss = sums[kAux];
  m.z_loss = sums[kZ];
  const size_t dropped = kLoads + moe_layers_.size() * experts;
  for (size_t l = 0; l < moe_layers_.size(); ++l) {
    m.expert_load.emplace_back(
        sums.begin() + static_cast<std::ptrdiff_t>(kLoads + l * experts),
        sums.begin() + static_cast<std::ptrdiff_t>(kLoads + (l + 1) * experts));
    m.dropped_tokens.push_back(static_cast<int64_t>(sums[dropped + l]));
  }
  if (sync_) {
    sync_->reduce_gradients();
    return sync_->global_sum_squares();
  }
  // One rank: the part is the whole buffer (ZeRO-2 folded each block into it; now the rest).
  if (model_.params().grads_sharded()) model_.params().fold_outer_grads();
  return be_.sum_squares(model_.params().grad_part());
}

void Trainer::refresh_parameters() {
  if (sync_)
    sync_->gather_parameters();
  else
    model_.params().refresh_from_part();  // ZeRO-3 on one rank: the outer regions, the slots
}

void Trainer::act_on(StabilityEvent& event) {
  const int64_t G = config_.global_batch;
  event.action = config_.stability.action;
  if (event.action == StabilityAction::rollback) {
    event.to_step = snapshot_->state.step;
    event.first_batch = snapshot_->state.sampler.position / G + 1;
  } else {
    event.to_step = step_;
    event.first_batch = event.batch;
  }
  guard_.record(event);
  event.in_a_row = static_cast<int>(guard_.state().in_a_row);
  if (event.action == StabilityAction::rollback) roll_back();
}

void Trainer::take_snapshot() {
  if (snapshot_ && snapshot_->state.step == step_) return;
  if (!snapshot_) snapshot_.emplace();
  const SnapshotTargets from = snapshot_targets();  // waits for ZeRO-1's gather
  std::vector<std::byte>* to[] = {&snapshot_->values, &snapshot_->master, &snapshot_->moment1,
                                  &snapshot_->moment2, &snapshot_->optimizer};
  for (size_t i = 0; i < from.size(); ++i) {
    to[i]->resize(from[i].data ? from[i].bytes() : 0);
    if (!to[i]->empty()) be_.copy_to_host(to[i]->data(), from[i]);
  }
  snapshot_->state = state();
}

SnapshotTargets Trainer::snapshot_targets() const {
  wait_parameters();
  const model::ParamStore& params = model_.params();
  return {params.values_sharded() ? params.value_part() : params.values(), params.master(),
          params.moment1(), params.moment2(), optimizer_.state()};
}

void Trainer::finish_restore(const TrainerState& state) {
  refresh_parameters();
  restore(state);
  wait_parameters();
}

void Trainer::roll_back() {
  const SnapshotTargets to = snapshot_targets();
  const std::vector<std::byte>* from[] = {&snapshot_->values, &snapshot_->master,
                                          &snapshot_->moment1, &snapshot_->moment2,
                                          &snapshot_->optimizer};
  for (size_t i = 0; i < to.size(); ++i)
    if (!from[i]->empty()) be_.copy_from_host(to[i], from[i]->data());
  refresh_parameters();
  // Everything but the data position: the batches since the snapshot are skipped.
  const TrainerState& saved = snapshot_->state;
  step_ = saved.step;
  tokens_ = saved.tokens;
  optimizer_.restore(saved.optimizer_updates);
  scaler_.restore(saved.loss_scaler);
  guard_.rolled_back(step_, saved.stability);
}

double Trainer::evaluate() {
  if (!val_) throw std::logic_error("Trainer::evaluate without a validation set");
  wait_parameters();
  const int64_t available = val_->num_batches(config_.micro_batch);
  if (available < 1)
    throw std::runtime_error("the validation data holds fewer than " +
                             std::to_string(config_.micro_batch) + " windows of " +
                             std::to_string(model_.config().seq_len + 1) +
                             " tokens: use a larger data.val_fraction or a longer data.val_path");
  const int64_t batches = std::min<int64_t>(config_.eval_batches, available);
  const model::ModelParallel& parallel = model_.parallel();
  // Data rank d evaluates batches d, d + D, ...: the same micro-batches as one rank, so the mean
  // is the same. Expert-parallel ranks exchange tokens in every forward, and ZeRO-3's dp ranks
  // gather every block's values, so there all data ranks run the same number of forwards (a rank
  // without a batch left repeats one and ignores it).
  const bool lockstep = mesh_ && (mesh_->ep().size() > 1 ||
                                  (model_.params().values_sharded() && mesh_->dp_cp().size() > 1));
  const int64_t rounds = lockstep ? (batches + data_ranks_ - 1) / data_ranks_ : batches;
  double total = 0;
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t batch = lockstep ? round * data_ranks_ + data_rank_ : round;
    if (!lockstep && batch % data_ranks_ != data_rank_) continue;
    val_->fill_batch(batch % batches, config_.micro_batch, window_.data());
    load_windows(window_.data(), config_.micro_batch);
    // The micro-batch goes through every chunk in turn (around the ranks V times).
    const int P = parallel.pp_size(), V = model_.chunks();
    double loss = 0;
    for (int c = 0; c < V; ++c) {
      const uint32_t tag = kEvalTag + static_cast<uint32_t>(round * V + c);
      if (c > 0 || !parallel.first_stage()) {
        const tensor::Tensor in = model_.stage_input(0);
        mesh_->pp().recv(in.data, in.bytes(), (parallel.pp_rank() + P - 1) % P, tag);
      }
      loss += model_.forward(inputs_.data(), targets_.data(), 0, c).loss;
      if (c < V - 1 || !parallel.last_stage()) {
        const tensor::Tensor out = model_.stage_output(0);
        mesh_->pp().send(out.data, out.bytes(), (parallel.pp_rank() + 1) % P,
                         c < V - 1 && parallel.last_stage() ? tag + 1 : tag);
      }
    }
    if (batch < batches) total += loss;
  }
  std::vector<double> sum{total};
  sum_over_job(sum);
  return sum[0] / static_cast<double>(batches);
}

// ZeRO-1 with overlap: each step's parameter gather runs on through on_step into the next step's
// forward; it has ended when run() returns. (After a throw the GradSync's reducer still drains it
// when the trainer is destroyed, and any later reader waits for it: wait_parameters.)
void Trainer::run(const std::function<bool(const StepMetrics&)>& on_step) {
  while (step_ < config_.steps) {
    StepMetrics m = step_leaving_gather();
    const bool last = step_ == config_.steps;
    const bool periodic = config_.eval_every_steps > 0 && step_ % config_.eval_every_steps == 0;
    if (val_ && (last || periodic)) m.val_loss = evaluate();
    if (!on_step(m)) break;
  }
  wait_parameters();
}

TrainerState Trainer::state() const {
  return TrainerState{step_,           tokens_,        optimizer_.updates(), optimizer_name(),
                      scaler_.state(), train_.state(), guard_.state()};
}

void Trainer::restore(const TrainerState& state) {
  if (state.step < 0 || state.step > config_.steps)
    throw std::invalid_argument("cannot resume at step " + std::to_string(state.step) +
                                ": the run has " + std::to_string(config_.steps) + " steps");
  if (state.optimizer != optimizer_name())
    throw std::invalid_argument("cannot resume a state of optimizer " + state.optimizer +
                                " with optimizer " + optimizer_name());
  wait_parameters();
  train_.restore(state.sampler);
  step_ = state.step;
  tokens_ = state.tokens;
  optimizer_.restore(state.optimizer_updates);
  scaler_.restore(state.loss_scaler);
  guard_.restore(state.stability);
  snapshot_.reset();  // the next step takes one of the restored state
}

}  // namespace trainctl::train
