// The schema table and the model.arch presets: the only places a recipe default is written.
#include "recipe/schema.hpp"

#include <algorithm>
#include <limits>
#include <type_traits>

#include <fmt/format.h>

namespace trainctl::recipe {
namespace {

// ---- binding a row to its struct member ------------------------------------------------------
template <class T>
constexpr Kind kind_of() {
  if constexpr (std::is_same_v<T, bool>)
    return Kind::boolean;
  else if constexpr (std::is_integral_v<T>)
    return Kind::integer;
  else if constexpr (std::is_floating_point_v<T>)
    return Kind::number;
  else if constexpr (std::is_enum_v<T>)
    return Kind::choice;
  else if constexpr (std::is_same_v<T, std::string>)
    return Kind::string;
  else if constexpr (std::is_same_v<T, std::array<double, 2>>)
    return Kind::number_pair;
  else if constexpr (std::is_same_v<T, std::vector<int>>)
    return Kind::integer_list;
  else if constexpr (std::is_same_v<T, std::vector<data::BlendItem>>)
    return Kind::blend_list;
  else {
    static_assert(std::is_same_v<T, LossScale>, "no schema Kind for this member type");
    return Kind::loss_scale;
  }
}

template <class T>
Value to_value(const T& v) {
  if constexpr (std::is_same_v<T, bool>)
    return v;
  else if constexpr (std::is_enum_v<T>)
    return static_cast<int64_t>(choice_index(v));
  else if constexpr (std::is_integral_v<T>)
    return static_cast<int64_t>(v);
  else if constexpr (std::is_same_v<T, std::vector<int>>)
    return std::vector<int64_t>(v.begin(), v.end());
  else
    return v;
}

template <class T>
T from_value(const Value& v) {
  if constexpr (std::is_same_v<T, bool>)
    return std::get<bool>(v);
  else if constexpr (std::is_enum_v<T>)
    return choice_value<T>(static_cast<size_t>(std::get<int64_t>(v)));
  else if constexpr (std::is_integral_v<T>)
    return static_cast<T>(std::get<int64_t>(v));
  else if constexpr (std::is_same_v<T, std::vector<int>>) {
    const auto& list = std::get<std::vector<int64_t>>(v);
    std::vector<int> out;
    for (int64_t x : list)
      out.push_back(static_cast<int>(x));
    return out;
  } else
    return std::get<T>(v);
}

// A row's member: the chain of member pointers from the Recipe to it, e.g.
// Bind<&Recipe::model, &model::ModelConfig::moe, &model::MoeConfig::top_k> for moe.top_k.
template <auto... Path>
struct Bind {
  static auto& at(Recipe& r) { return (r.*....*Path); }
  static const auto& at(const Recipe& r) { return (r.*....*Path); }
  using T = std::remove_cvref_t<decltype(at(std::declval<Recipe&>()))>;
  static void store(Recipe& r, const Value& v) { at(r) = from_value<T>(v); }
  static Value fetch(const Recipe& r) { return to_value(at(r)); }
};

template <class B>
KeySpec row(std::string_view path, typename B::T default_value, Range range,
            std::string_view help) {
  using T = typename B::T;
  KeySpec k;
  k.path = path;
  k.kind = kind_of<T>();
  k.default_value = to_value(default_value);
  k.range = range;
  k.help = help;
  k.store = &B::store;
  k.fetch = &B::fetch;
  if constexpr (std::is_enum_v<T>) k.choices = EnumNames<T>::names;
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
    k.integer_max = std::numeric_limits<T>::max();
  if constexpr (std::is_same_v<T, std::vector<int>>)
    k.integer_max = std::numeric_limits<int>::max();
  return k;
}
template <class B>
KeySpec preset_row(std::string_view path, Range range, std::string_view help) {
  KeySpec k = row<B>(path, typename B::T{}, range, help);
  k.preset = true;
  return k;
}

Range none() {
  return {};
}
Range interval(std::optional<double> low, std::optional<double> high, bool low_open,
               bool high_open) {
  Range r;
  r.low = low;
  r.high = high;
  r.low_open = low_open;
  r.high_open = high_open;
  return r;
}
Range at_least(double x) {
  return interval(x, {}, false, false);
}
Range above(double x) {
  return interval(x, {}, true, false);
}
Range closed(double a, double b) {
  return interval(a, b, false, false);
}

std::string check_name(const Value& v) {
  const auto& s = std::get<std::string>(v);
  if (s.empty()) return "must not be empty (it names the run directory)";
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok)
      return fmt::format(
          "'{}' may only use letters, digits, '.', '_' and '-' (it names the run "
          "directory)",
          s);
  }
  if (s == "." || s == "..") return fmt::format("'{}' is not a usable directory name", s);
  return "";
}

#define B(section, member) Bind<&Recipe::section, &decltype(Recipe::section)::member>
#define MOE(member) Bind<&Recipe::model, &model::ModelConfig::moe, &model::MoeConfig::member>

std::vector<KeySpec> build_schema() {
  std::vector<KeySpec> t;
  KeySpec name =
      row<Bind<&Recipe::name>>("name", "", none(), "run name; used as the run directory name");
  name.required = true;
  name.check = &check_name;
  name.allowed_doc = "[A-Za-z0-9._-]+";
  t.push_back(name);

  // model
  t.push_back(row<B(model, arch)>("model.arch", Arch::gpt, none(),
                                  "architecture preset: fills the (preset) keys"));
  t.push_back(row<B(model, layers)>("model.layers", 4, at_least(1), "transformer blocks"));
  t.push_back(row<B(model, hidden)>("model.hidden", 128, at_least(1), "model width (channels)"));
  t.push_back(row<B(model, heads)>("model.heads", 4, at_least(1), "attention (query) heads"));
  t.push_back(preset_row<B(model, kv_heads)>(
      "model.kv_heads", at_least(1),
      "key/value heads; fewer than heads = grouped-query attention"));
  t.push_back(preset_row<B(model, ffn_hidden)>("model.ffn_hidden", at_least(1), "MLP inner width"));
  t.push_back(row<B(model, vocab)>("model.vocab", 256, at_least(2), "vocabulary size"));
  t.push_back(row<B(model, seq_len)>("model.seq_len", 128, at_least(1),
                                     "tokens per sequence (context length)"));
  t.push_back(preset_row<B(model, norm)>("model.norm", none(), "normalisation layer"));
  t.push_back(preset_row<B(model, activation)>("model.activation", none(), "MLP activation"));
  t.push_back(preset_row<B(model, position)>("model.position", none(), "position encoding"));
  t.push_back(
      row<B(model, rope_theta)>("model.rope_theta", 10000.0, above(0), "RoPE base frequency"));
  t.push_back(preset_row<B(model, tied_embeddings)>("model.tied_embeddings", none(),
                                                    "output head shares the token embedding"));
  t.push_back(
      preset_row<B(model, bias)>("model.bias", none(), "biases in linear layers and norms"));
  t.push_back(
      row<B(model, norm_eps)>("model.norm_eps", 1.0e-5, above(0), "epsilon inside the norm"));
  t.push_back(row<B(model, init_std)>("model.init_std", 0.02, above(0),
                                      "standard deviation of the initial weights"));
  t.push_back(row<B(model, init_from)>(
      "model.init_from", "", none(),
      "start from these weights: a Hugging Face folder (config.json, *.safetensors: GPT-2, "
      "Llama, Mixtral) or a trainctl checkpoint; the model keys it fixes are taken from it"));
  // moe
  t.push_back(
      row<MOE(experts)>("moe.experts", 0, at_least(0), "experts per MoE layer; 0 = dense model"));
  t.push_back(row<MOE(top_k)>("moe.top_k", 2, at_least(1), "experts each token is routed to"));
  t.push_back(row<MOE(router)>(
      "moe.router", Router::softmax, none(),
      "gates of the chosen experts: softmax (their probabilities over all experts, "
      "GShard/Switch) or softmax_topk_renorm (divided by their sum, as Mixtral; with "
      "capacity_factor 0 the model is Mixtral's)"));
  t.push_back(row<MOE(capacity_factor)>(
      "moe.capacity_factor", 1.25, at_least(0),
      "expert capacity = factor * tokens * top_k / experts; 0 = no limit, no dropping"));
  t.push_back(row<MOE(aux_loss_coef)>("moe.aux_loss_coef", 0.01, at_least(0),
                                      "Switch/GShard load-balancing loss weight"));
  t.push_back(
      row<MOE(z_loss_coef)>("moe.z_loss_coef", 0.001, at_least(0), "ST-MoE router z-loss weight"));
  t.push_back(row<MOE(every)>("moe.every", 2, at_least(1),
                              "layer i (0-based) is MoE when (i+1) % every == 0"));
  t.push_back(row<MOE(expert_ffn_hidden)>("moe.expert_ffn_hidden", 0, at_least(0),
                                          "expert MLP inner width; 0 = model.ffn_hidden"));
  // parallel
  t.push_back(row<B(parallel, dp)>("parallel.dp", 1, at_least(1), "data-parallel degree"));
  t.push_back(row<B(parallel, tp)>("parallel.tp", 1, at_least(1), "tensor-parallel degree"));
  t.push_back(row<B(parallel, pp)>("parallel.pp", 1, at_least(1), "pipeline-parallel degree"));
  t.push_back(row<B(parallel, cp)>(
      "parallel.cp", 1, at_least(1),
      "context-parallel degree: each sequence split over cp ranks, attention passing keys and "
      "values around a ring"));
  t.push_back(row<B(parallel, ep)>("parallel.ep", 1, at_least(1), "expert-parallel degree"));
  t.push_back(
      row<B(parallel, zero)>("parallel.zero", 0, closed(0, 3),
                             "ZeRO stage: 1 shards optimizer state over data-parallel ranks, 2 "
                             "gradients too, 3 parameters too (gathered per block as it runs)"));
  t.push_back(row<B(parallel, sequence_parallel)>(
      "parallel.sequence_parallel", false, none(),
      "with tp >= 2, split the tokens of the norms and residual adds over the tp ranks "
      "(Megatron's sequence parallelism): their activations shrink by tp"));
  t.push_back(row<B(parallel, recompute)>("parallel.recompute", Recompute::none, none(),
                                          "activation recomputation"));
  t.push_back(row<B(parallel, pp_layers)>(
      "parallel.pp_layers", std::vector<int>{}, at_least(1),
      "layers of each pipeline stage, e.g. [3, 2]; [] = even split (earlier stages take more); "
      "interleaved: pp * pp_virtual entries, virtual stage c * pp + r being chunk c of rank r"));
  t.push_back(row<B(parallel, pp_schedule)>(
      "parallel.pp_schedule", PipeSchedule::one_f_one_b, none(),
      "pipeline schedule: 1f1b, interleaved (Megatron's virtual pipeline: pp_virtual model "
      "chunks per rank, a bubble pp_virtual times smaller for more activations in flight), or "
      "zb-h1 (zero bubble: the backward split into input- and weight-gradient passes, a bubble "
      "about a third of 1f1b's; pp >= 2, recompute none, zero <= 1)"));
  t.push_back(row<B(parallel, pp_virtual)>(
      "parallel.pp_virtual", 1, at_least(1),
      "model chunks per pipeline rank with pp_schedule: interleaved (>= 2); 1 otherwise"));
  t.push_back(row<B(parallel, timeout_s)>(
      "parallel.timeout_s", 60.0, above(0),
      "seconds a collective or the rendezvous waits for a peer before the job fails"));
  t.push_back(row<B(parallel, overlap_grad_sync)>(
      "parallel.overlap_grad_sync", true, none(),
      "reduce each gradient bucket (zero 2 and 3: each block) while backward still runs, with "
      "zero 1 or 2 gather the updated parameters while the next forward runs, and with zero 3 "
      "gather the next block's parameters while a block computes, and with cp pass the ring's "
      "next key/value block while attention computes (results are identical)"));
  // precision
  t.push_back(row<B(model, storage)>("precision.compute", DType::bf16, none(),
                                     "compute dtype (fp64: CPU reference only)"));
  t.push_back(row<B(model, fp8)>(
      "precision.fp8", Fp8::none, none(),
      "fp8 GEMMs in the blocks' linear layers: e4m3, or hybrid (e5m2 gradients); needs bf16"));
  KeySpec loss_scale = row<B(precision, loss_scale)>(
      "precision.loss_scale", LossScale{LossScaleMode::dynamic, 0.0}, above(0),
      "loss scaling (used with fp16): dynamic, none or a static scale");
  loss_scale.allowed_doc = "dynamic | none | number > 0";
  t.push_back(loss_scale);
  t.push_back(row<B(precision, initial_loss_scale)>("precision.initial_loss_scale", 65536.0,
                                                    above(0), "first dynamic loss scale"));
  t.push_back(row<B(precision, loss_scale_window)>(
      "precision.loss_scale_window", 1000, at_least(1),
      "grow the dynamic scale x2 after this many finite steps"));
  t.push_back(row<B(precision, min_loss_scale)>("precision.min_loss_scale", 1.0, above(0),
                                                "the dynamic scale never drops below this"));
  t.push_back(row<B(precision, reduce_dtype)>(
      "precision.reduce_dtype", ReduceDtype::fp32, none(),
      "type the block gradients are summed in over data-parallel ranks (zero 2 and 3): bf16 "
      "halves the traffic"));
  // optimizer
  t.push_back(row<B(optimizer, name)>(
      "optimizer.name", OptimizerName::adamw, none(),
      "update rule: adamw, sgd (PyTorch's), lion, muon (orthogonalised momentum for the 2-D "
      "hidden weights, adamw for the rest), or adafactor (factored second moments)"));
  t.push_back(row<B(optimizer, lr)>("optimizer.lr", 1.0e-3, above(0), "peak learning rate"));
  t.push_back(row<B(optimizer, betas)>("optimizer.betas", std::array<double, 2>{0.9, 0.95},
                                       interval(0, 1, false, true),
                                       "adamw (and muon's adamw part) and lion: beta1, beta2"));
  t.push_back(row<B(optimizer, eps)>("optimizer.eps", 1.0e-8, above(0), "AdamW epsilon"));
  t.push_back(row<B(optimizer, weight_decay)>("optimizer.weight_decay", 0.1, at_least(0),
                                              "decoupled weight decay"));
  t.push_back(row<B(optimizer, grad_clip)>("optimizer.grad_clip", 1.0, at_least(0),
                                           "clip the global gradient norm to this; 0 = off"));
  t.push_back(row<B(optimizer, momentum)>("optimizer.momentum", 0.95, interval(0, 1, false, true),
                                          "sgd and muon: momentum; 0 = none (sgd)"));
  t.push_back(row<B(optimizer, nesterov)>("optimizer.nesterov", true, none(),
                                          "sgd and muon: Nesterov momentum"));
  t.push_back(row<B(optimizer, ns_steps)>("optimizer.ns_steps", 5, closed(1, 20),
                                          "muon: Newton-Schulz iterations"));
  t.push_back(row<B(optimizer, beta2_decay)>(
      "optimizer.beta2_decay", -0.8, closed(-1, 0),
      "adafactor: the second-moment decay, 1 - beta2 = step^beta2_decay"));
  t.push_back(
      row<B(optimizer, clip_threshold)>("optimizer.clip_threshold", 1.0, above(0),
                                        "adafactor: the update's RMS is clipped to this (d)"));
  t.push_back(row<B(optimizer, state_dtype)>(
      "optimizer.state_dtype", StateDtype::fp32, none(),
      "type of the optimizer's moments: bf16 halves them, stochastically rounded (seeded by "
      "determinism.seed)"));
  // schedule
  t.push_back(row<B(schedule, warmup_steps)>("schedule.warmup_steps", 20, at_least(0),
                                             "linear warm-up steps from 0 to optimizer.lr"));
  t.push_back(
      row<B(schedule, decay)>("schedule.decay", Decay::cosine, none(),
                              "learning-rate decay after warm-up (wsd = warmup-stable-decay)"));
  t.push_back(row<B(schedule, min_lr)>("schedule.min_lr", 1.0e-4, at_least(0),
                                       "learning rate at the end of the decay; <= optimizer.lr"));
  t.push_back(row<B(schedule, wsd_decay_fraction)>(
      "schedule.wsd_decay_fraction", 0.2, interval(0, 1, true, false),
      "share of post-warm-up steps spent decaying (wsd only)"));
  t.push_back(row<B(schedule, decay_steps)>(
      "schedule.decay_steps", 0, at_least(0),
      "step at which the decay reaches min_lr; 0 = training.steps (set it to extend a run later)"));
  // data
  t.push_back(
      row<B(data, source)>("data.source", DataSource::text, none(),
                           "token source: synthetic, byte-level text, llm.c .bin shards, or a "
                           "Megatron .bin/.idx dataset (trainctl data prepare makes one)"));
  t.push_back(row<B(data, path)>(
      "data.path", "", none(),
      "text file (text), .bin shard / glob of shards (llmc) or dataset prefix (megatron); "
      "required unless synthetic or data.sources"));
  {
    KeySpec sources = row<B(data, sources)>(
        "data.sources", std::vector<data::BlendItem>{}, none(),
        "instead of path: datasets of data.source blended by weight, e.g. [{path: a, weight: 0.7}, "
        "{path: b, weight: 0.3}]");
    sources.allowed_doc = "each weight > 0";
    t.push_back(sources);
  }
  t.push_back(row<B(data, val_path)>(
      "data.val_path", "", none(),
      "separate validation file/shard; empty: hold out val_fraction of path"));
  t.push_back(
      row<B(data, val_fraction)>("data.val_fraction", 0.05, closed(0, 0.5),
                                 "share of path held out for validation when val_path is empty"));
  // training
  t.push_back(row<B(training, steps)>("training.steps", 200, at_least(1), "optimizer steps"));
  t.push_back(row<B(training, global_batch)>("training.global_batch", 16, at_least(1),
                                             "sequences per optimizer step"));
  t.push_back(row<B(training, micro_batch)>("training.micro_batch", 4, at_least(1),
                                            "sequences per forward/backward per rank"));
  // checkpoint
  t.push_back(row<B(checkpoint, every_steps)>("checkpoint.every_steps", 0, at_least(0),
                                              "save every N steps; 0 = off"));
  t.push_back(row<B(checkpoint, every_minutes)>("checkpoint.every_minutes", 0.0, at_least(0),
                                                "save every N minutes; 0 = off"));
  t.push_back(row<B(checkpoint, keep_last)>("checkpoint.keep_last", 3, at_least(1),
                                            "checkpoints kept; older ones are deleted"));
  t.push_back(row<B(checkpoint, async)>("checkpoint.async", true, none(),
                                        "write checkpoints in the background"));
  t.push_back(row<B(checkpoint, resume)>(
      "checkpoint.resume", Resume::never, none(),
      "auto: continue from the newest valid checkpoint in the run directory"));
  t.push_back(row<B(checkpoint, memory_every_steps)>(
      "checkpoint.memory_every_steps", 0, at_least(0),
      "snapshot each rank's state in host memory every N steps (kept for stability.action: "
      "rollback, written to /dev/shm for a restart); 0 = off"));
  t.push_back(row<B(checkpoint, local_dir)>(
      "checkpoint.local_dir", "", none(),
      "node-local folder of the local-disk tier (each rank's state, for a fast restart); "
      "empty = none"));
  t.push_back(row<B(checkpoint, local_every_steps)>(
      "checkpoint.local_every_steps", 0, at_least(0),
      "write the local-disk tier every N steps (needs checkpoint.local_dir); 0 = off"));
  // stability (train/stability.hpp)
  t.push_back(row<B(stability, loss_z)>(
      "stability.loss_z", 0.0, at_least(0),
      "a loss more than this many standard deviations above the window's mean is a spike; 0 = "
      "off"));
  t.push_back(
      row<B(stability, grad_z)>("stability.grad_z", 0.0, at_least(0),
                                "the same test on the gradient norm (before clipping); 0 = off"));
  t.push_back(row<B(stability, window)>("stability.window", 100, closed(2, 100000),
                                        "applied steps the z-scores are taken over"));
  t.push_back(row<B(stability, action)>(
      "stability.action", StabilityAction::skip, none(),
      "on a non-finite loss or gradient, or a spike: skip the batch, or roll back to the newest "
      "in-memory snapshot and skip every batch since"));
  t.push_back(row<B(stability, max_events)>(
      "stability.max_events", 5, at_least(1),
      "stop (exit 1) after this many events in a row without getting past the furthest step"));
  t.push_back(row<B(stability, lr_factor)>(
      "stability.lr_factor", 1.0, interval(0, 1, true, false),
      "after a rollback, multiply the learning rate by this for stability.lr_steps steps"));
  t.push_back(
      row<B(stability, lr_steps)>("stability.lr_steps", 0, at_least(0),
                                  "steps the lowered learning rate lasts after a rollback"));
  // determinism
  t.push_back(row<B(determinism, seed)>("determinism.seed", 1234, at_least(0),
                                        "seed of every random stream"));
  t.push_back(row<B(determinism, deterministic)>("determinism.deterministic", true, none(),
                                                 "fixed reduction orders, no float atomics"));
  // logging
  t.push_back(row<B(logging, every_steps)>("logging.every_steps", 10, at_least(1),
                                           "log metrics every N steps"));
  t.push_back(row<B(logging, eval_every_steps)>("logging.eval_every_steps", 50, at_least(0),
                                                "evaluate every N steps; 0 = only at the end"));
  t.push_back(row<B(logging, eval_batches)>("logging.eval_batches", 4, at_least(1),
                                            "micro-batches per evaluation"));
  t.push_back(row<B(logging, tensorboard)>("logging.tensorboard", true, none(),
                                           "write TensorBoard event files"));
  t.push_back(row<B(logging, progress)>("logging.progress", Progress::automatic, none(),
                                        "auto: a live line on a terminal, plain lines otherwise"));
  t.push_back(row<B(logging, timeline_step)>(
      "logging.timeline_step", 0, at_least(0),
      "time this step's pipeline actions: timeline.svg and .json in the run dir; 0 = off"));
  t.push_back(row<B(logging, straggler_threshold)>("logging.straggler_threshold", 0.2,
                                                   closed(0, 100),
                                                   "name the slowest rank when its compute exceeds "
                                                   "the median rank's by this fraction; 0 = off"));
  // cluster
  t.push_back(row<B(cluster, device)>("cluster.device", Device::automatic, none(),
                                      "auto: cuda if a GPU is present, else cpu"));
  t.push_back(row<B(cluster, file)>("cluster.file", "", none(),
                                    "cluster description file (for trainctl plan)"));
  t.push_back(row<B(cluster, nodes)>("cluster.nodes", 1, at_least(1), "nodes"));
  t.push_back(
      row<B(cluster, gpus_per_node)>("cluster.gpus_per_node", 0, at_least(0), "GPUs per node"));
  t.push_back(row<B(cluster, shared_fs)>(
      "cluster.shared_fs", true, none(),
      "every node sees the run directory; false: TCP rendezvous, no checkpoints"));
  // slurm (trainctl submit and validate check the values: lib/launch/sbatch.hpp)
  t.push_back(row<B(slurm, partition)>("slurm.partition", "", none(),
                                       "partition to submit to; \"\" = the cluster's default"));
  t.push_back(
      row<B(slurm, account)>("slurm.account", "", none(), "account to charge; \"\" = none"));
  t.push_back(row<B(slurm, qos)>("slurm.qos", "", none(), "quality of service; \"\" = default"));
  t.push_back(row<B(slurm, time)>("slurm.time", "", none(),
                                  "time limit (MM, HH:MM:SS, D-HH:MM, ...); \"\" = partition's"));
  t.push_back(row<B(slurm, extra)>("slurm.extra", "", none(),
                                   "more sbatch options, space separated, e.g. \"--exclusive\""));
  t.push_back(row<B(slurm, env)>("slurm.env", "", none(),
                                 "environment for the ranks, space separated NAME=VALUE"));
  t.push_back(row<B(slurm, signal_grace_s)>(
      "slurm.signal_grace_s", 120, closed(1, 65535),
      "USR1 this many seconds before the time limit: save, then requeue"));
  t.push_back(
      row<B(slurm, max_requeues)>("slurm.max_requeues", 3, at_least(0),
                                  "requeues after a save-on-signal before the job gives up"));
  return t;
}
#undef B
#undef MOE

// Llama's MLP width rule is 2/3 * 4 * hidden rounded up to a multiple of 256; we round to 64 so
// that small models stay small (hidden 128 gives 384, not 512).
int llama_ffn_hidden(const ModelConfig& m) {
  int64_t width = 2 * (4 * static_cast<int64_t>(m.hidden)) / 3;
  int64_t rounded = (width + 63) / 64 * 64;
  return static_cast<int>(std::min<int64_t>(rounded, std::numeric_limits<int>::max()));
}
int gpt_ffn_hidden(const ModelConfig& m) {
  return static_cast<int>(
      std::min<int64_t>(4 * static_cast<int64_t>(m.hidden), std::numeric_limits<int>::max()));
}
int same_as_heads(const ModelConfig& m) {
  return m.heads;
}

const ArchPreset kPresets[] = {
    {Arch::gpt, Norm::layernorm, Activation::gelu, Position::learned, true, true, &same_as_heads,
     &gpt_ffn_hidden, "heads", "4*hidden"},
    {Arch::llama, Norm::rmsnorm, Activation::swiglu, Position::rope, false, false, &same_as_heads,
     &llama_ffn_hidden, "heads", "2/3*4*hidden rounded up to a multiple of 64"},
};

}  // namespace

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> table = build_schema();
  return table;
}

const KeySpec* find_key(std::string_view path) {
  for (const auto& k : schema())
    if (k.path == path) return &k;
  return nullptr;
}

const std::vector<std::string_view>& section_names() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> out;
    for (const auto& k : schema())
      if (!k.section().empty() && std::find(out.begin(), out.end(), k.section()) == out.end())
        out.push_back(k.section());
    return out;
  }();
  return names;
}

std::string_view KeySpec::section() const {
  auto dot = path.find('.');
  return dot == std::string_view::npos ? std::string_view{} : path.substr(0, dot);
}
std::string_view KeySpec::leaf() const {
  auto dot = path.find('.');
  return dot == std::string_view::npos ? path : path.substr(dot + 1);
}

const ArchPreset& arch_preset(Arch arch) {
  for (const auto& p : kPresets)
    if (p.arch == arch) return p;
  return kPresets[0];  // unreachable: every Arch has a row
}

void apply_preset(ModelConfig& m, const std::vector<std::string_view>& given) {
  auto unset = [&](std::string_view path) {
    return std::find(given.begin(), given.end(), path) == given.end();
  };
  const ArchPreset& p = arch_preset(m.arch);
  if (unset("model.norm")) m.norm = p.norm;
  if (unset("model.activation")) m.activation = p.activation;
  if (unset("model.position")) m.position = p.position;
  if (unset("model.tied_embeddings")) m.tied_embeddings = p.tied_embeddings;
  if (unset("model.bias")) m.bias = p.bias;
  if (unset("model.kv_heads")) m.kv_heads = p.kv_heads(m);
  if (unset("model.ffn_hidden")) m.ffn_hidden = p.ffn_hidden(m);
}

std::string preset_doc(const KeySpec& key) {
  std::string out;
  for (const auto& p : kPresets) {
    std::string value;
    if (key.path == "model.kv_heads") {
      value = std::string(p.kv_heads_doc);
    } else if (key.path == "model.ffn_hidden") {
      value = std::string(p.ffn_hidden_doc);
    } else {
      Recipe r = default_recipe(p.arch);
      value = format_value(key, key.fetch(r));
    }
    if (!out.empty()) out += "; ";
    out += fmt::format("{}: {}", to_string(p.arch), value);
  }
  return out;
}

}  // namespace trainctl::recipe
