// Cross-field rules: relations between keys that no single key's range can express. Each message
// shows the formula with the recipe's numbers, so the fix is evident without reading code.
#include <fmt/format.h>

#include "recipe/internal.hpp"

namespace trainctl::recipe::internal {
namespace {

class RuleChecker {
 public:
  RuleChecker(const std::function<bool(std::string_view)>& usable) : usable_(usable) {}

  // Whether every key a rule reads holds a real value.
  bool usable(std::initializer_list<std::string_view> keys) const {
    for (auto k : keys)
      if (!usable_(k)) return false;
    return true;
  }
  void fail(std::vector<std::string_view> keys, std::string message) {
    violations.push_back({std::move(keys), std::move(message)});
  }
  // `a % b == 0`, reported as "A % B == 0 fails: 130 % 4 = 2".
  void divisible(std::string_view a_key, int64_t a, std::string_view b_key, int64_t b,
                 std::vector<std::string_view> keys, std::string_view why = {}) {
    if (!usable({a_key, b_key}) || b == 0 || a % b == 0) return;
    std::string message =
        fmt::format("{} % {} == 0 fails: {} % {} = {}", a_key, b_key, a, b, a % b);
    if (!why.empty()) message += fmt::format(" ({})", why);
    fail(std::move(keys), message);
  }

  std::vector<RuleViolation> violations;

 private:
  const std::function<bool(std::string_view)>& usable_;
};

void check_model(const Recipe& r, RuleChecker& c) {
  const ModelConfig& m = r.model;
  c.divisible("model.hidden", m.hidden, "model.heads", m.heads, {"model.heads", "model.hidden"},
              "head_dim = hidden / heads must be whole");
  if (c.usable({"model.kv_heads", "model.heads"})) {
    if (m.kv_heads > m.heads) {
      c.fail({"model.kv_heads", "model.heads"},
             fmt::format("model.kv_heads <= model.heads fails: {} > {}", m.kv_heads, m.heads));
    } else {
      c.divisible("model.heads", m.heads, "model.kv_heads", m.kv_heads,
                  {"model.kv_heads", "model.heads"},
                  "each key/value head serves a whole group of query heads");
    }
  }
  if (c.usable({"model.hidden", "model.heads", "model.position"}) && m.hidden % m.heads == 0 &&
      m.position == Position::rope && (m.hidden / m.heads) % 2 != 0) {
    c.fail({"model.hidden", "model.heads", "model.position", "model.arch"},
           fmt::format("head_dim = model.hidden / model.heads = {} / {} = {} must be even with "
                       "model.position: rope",
                       m.hidden, m.heads, m.hidden / m.heads));
  }
}

// Stages hold whole layers: pp * pp_virtual <= layers; parallel.pp_layers, when given, has one
// positive entry per (virtual) stage and sums to model.layers. An even split needs no
// divisibility (the earlier stages take the remainder). The schedule's own needs
// (PipelineShape::problem): interleaved takes pp >= 2, pp_virtual >= 2 and micro-batches in
// groups of pp; 1f1b and zb-h1 one chunk per rank, zb-h1 pp >= 2 and (the model's split backward)
// recompute none and zero <= 1.
void check_pipeline(const Recipe& r, RuleChecker& c) {
  const ParallelConfig& p = r.parallel;
  if (c.usable({"parallel.pp_schedule", "parallel.pp_virtual", "parallel.pp"})) {
    if (p.pp_schedule != PipeSchedule::interleaved && p.pp_virtual != 1) {
      c.fail({"parallel.pp_virtual", "parallel.pp_schedule"},
             fmt::format("parallel.pp_virtual = {} needs parallel.pp_schedule: interleaved ({} "
                         "runs one model chunk per stage); set parallel.pp_virtual: 1 or "
                         "parallel.pp_schedule: interleaved",
                         p.pp_virtual, schedule_name(p.pp_schedule)));
      return;
    }
    if (p.pp_schedule == PipeSchedule::zb_h1 && p.pp < 2) {
      c.fail({"parallel.pp_schedule", "parallel.pp"},
             fmt::format("parallel.pp_schedule: zb-h1 needs parallel.pp >= 2 (got {}); or use "
                         "parallel.pp_schedule: 1f1b",
                         p.pp));
      return;
    }
    if (p.pp_schedule == PipeSchedule::zb_h1 && c.usable({"parallel.recompute"}) &&
        p.recompute != Recompute::none)
      c.fail({"parallel.pp_schedule", "parallel.recompute"},
             fmt::format("parallel.pp_schedule: zb-h1 keeps each micro-batch's activations for "
                         "its weight-gradient pass, which parallel.recompute: {} would run the "
                         "forward again for; set parallel.recompute: none or "
                         "parallel.pp_schedule: 1f1b",
                         kRecomputeNames[static_cast<size_t>(p.recompute)]));
    if (p.pp_schedule == PipeSchedule::zb_h1 && c.usable({"parallel.zero"}) && p.zero >= 2)
      c.fail({"parallel.pp_schedule", "parallel.zero"},
             fmt::format("parallel.pp_schedule: zb-h1 needs parallel.zero <= 1 (got {}): ZeRO-2 "
                         "and 3 bind a block's gradients or values for one backward pass, and "
                         "zb-h1 splits it in two; set parallel.zero: 1 or parallel.pp_schedule: "
                         "1f1b",
                         p.zero));
    if (p.pp_schedule == PipeSchedule::interleaved && (p.pp < 2 || p.pp_virtual < 2)) {
      c.fail({"parallel.pp_schedule", "parallel.pp", "parallel.pp_virtual"},
             fmt::format("parallel.pp_schedule: interleaved needs parallel.pp >= 2 and "
                         "parallel.pp_virtual >= 2 model chunks per stage (got pp {}, "
                         "pp_virtual {}); or use parallel.pp_schedule: 1f1b",
                         p.pp, p.pp_virtual));
      return;
    }
    if (p.pp_schedule == PipeSchedule::interleaved &&
        c.usable({"training.global_batch", "training.micro_batch", "parallel.dp", "parallel.ep"})) {
      const int64_t per_pass = static_cast<int64_t>(r.training.micro_batch) * p.dp * p.ep;
      const int64_t micro_batches = per_pass > 0 ? r.training.global_batch / per_pass : 0;
      if (micro_batches % p.pp != 0)
        c.fail({"parallel.pp_schedule", "parallel.pp", "training.global_batch",
                "training.micro_batch", "parallel.dp", "parallel.ep"},
               fmt::format("parallel.pp_schedule: interleaved runs micro-batches in groups of "
                           "parallel.pp: training.global_batch / (training.micro_batch * "
                           "parallel.dp * parallel.ep) = {} / ({} * {} * {}) = {} micro-batches "
                           "per step, and {} % {} = {} must be 0",
                           r.training.global_batch, r.training.micro_batch, p.dp, p.ep,
                           micro_batches, micro_batches, p.pp, micro_batches % p.pp));
    }
  }
  if (!c.usable({"model.layers", "parallel.pp", "parallel.pp_virtual"})) return;
  const int stages = p.pp * p.pp_virtual;
  if (stages > r.model.layers) {
    if (p.pp_virtual == 1)
      c.fail({"parallel.pp", "model.layers"},
             fmt::format("parallel.pp <= model.layers fails: {} > {} (each pipeline stage needs "
                         "at least one layer)",
                         p.pp, r.model.layers));
    else
      c.fail({"parallel.pp", "parallel.pp_virtual", "model.layers"},
             fmt::format("parallel.pp * parallel.pp_virtual <= model.layers fails: {} * {} = {} > "
                         "{} (each model chunk needs at least one layer)",
                         p.pp, p.pp_virtual, stages, r.model.layers));
    return;
  }
  if (!c.usable({"parallel.pp_layers"}) || p.pp_layers.empty()) return;
  if (static_cast<int>(p.pp_layers.size()) != stages) {
    if (p.pp_virtual == 1)
      c.fail({"parallel.pp_layers", "parallel.pp"},
             fmt::format("parallel.pp_layers needs one entry per stage (parallel.pp = {}), got "
                         "{}: [{}]",
                         p.pp, p.pp_layers.size(), fmt::join(p.pp_layers, ", ")));
    else
      c.fail({"parallel.pp_layers", "parallel.pp", "parallel.pp_virtual"},
             fmt::format("parallel.pp_layers needs one entry per virtual stage (parallel.pp * "
                         "parallel.pp_virtual = {} * {} = {}, chunk c of rank r at c * pp + r), "
                         "got {}: [{}]",
                         p.pp, p.pp_virtual, stages, p.pp_layers.size(),
                         fmt::join(p.pp_layers, ", ")));
    return;
  }
  int64_t sum = 0;
  for (int n : p.pp_layers)
    sum += n;
  if (sum != r.model.layers)
    c.fail({"parallel.pp_layers", "model.layers"},
           fmt::format("sum(parallel.pp_layers) == model.layers fails: {} = {} != {}",
                       fmt::join(p.pp_layers, " + "), sum, r.model.layers));
}

void check_parallel(const Recipe& r, RuleChecker& c) {
  const ModelConfig& m = r.model;
  const ParallelConfig& p = r.parallel;
  for (auto [key, value] : {std::pair<std::string_view, int>{"model.heads", m.heads},
                            {"model.kv_heads", m.kv_heads},
                            {"model.ffn_hidden", m.ffn_hidden},
                            {"model.vocab", m.vocab}}) {
    c.divisible(key, value, "parallel.tp", p.tp, {key, "parallel.tp"});
  }
  check_pipeline(r, c);
  if (c.usable({"parallel.sequence_parallel", "parallel.tp"}) && p.sequence_parallel) {
    if (p.tp < 2)
      c.fail({"parallel.sequence_parallel", "parallel.tp"},
             fmt::format("parallel.sequence_parallel: true needs parallel.tp >= 2 (it splits the "
                         "tokens between the tensor-parallel GEMMs over the tp ranks), but "
                         "parallel.tp is {}; raise parallel.tp or set "
                         "parallel.sequence_parallel: false",
                         p.tp));
    else
      c.divisible("model.seq_len", m.seq_len, "parallel.tp", p.tp,
                  {"model.seq_len", "parallel.tp", "parallel.sequence_parallel"},
                  "sequence parallelism splits each sequence over the tensor-parallel ranks");
  }
  if (c.usable({"parallel.cp", "model.seq_len"}) && p.cp > 1 && m.seq_len % (2 * p.cp) != 0)
    c.fail({"model.seq_len", "parallel.cp"},
           fmt::format("model.seq_len % (2 * parallel.cp) == 0 fails: {} % {} = {} (each rank "
                       "holds two of the 2 * cp chunks of a sequence, chunk i and 2cp-1-i, so "
                       "every rank does the same causal attention work)",
                       m.seq_len, 2 * p.cp, m.seq_len % (2 * p.cp)));
  if (c.usable({"moe.experts", "moe.expert_ffn_hidden"}) && r.model.moe.experts > 0 &&
      r.model.moe.expert_ffn_hidden > 0)
    c.divisible("moe.expert_ffn_hidden", r.model.moe.expert_ffn_hidden, "parallel.tp", p.tp,
                {"moe.expert_ffn_hidden", "parallel.tp"},
                "each expert MLP is split over the tensor-parallel ranks");
  if (c.usable({"training.global_batch", "training.micro_batch", "parallel.dp", "parallel.ep"})) {
    int64_t per_pass = static_cast<int64_t>(r.training.micro_batch) * p.dp * p.ep;
    if (r.training.global_batch % per_pass != 0) {
      c.fail({"training.global_batch", "training.micro_batch", "parallel.dp", "parallel.ep"},
             fmt::format("training.global_batch % (training.micro_batch * parallel.dp * "
                         "parallel.ep) == 0 fails: {} % ({} * {} * {}) = {} % {} = {}",
                         r.training.global_batch, r.training.micro_batch, p.dp, p.ep,
                         r.training.global_batch, per_pass, r.training.global_batch % per_pass));
    }
  }
}

void check_moe(const Recipe& r, RuleChecker& c) {
  const MoeConfig& e = r.model.moe;
  if (c.usable({"moe.experts"}) && e.experts > 0) {
    c.divisible("moe.experts", e.experts, "parallel.ep", r.parallel.ep,
                {"moe.experts", "parallel.ep"}, "each expert-parallel rank holds whole experts");
    if (c.usable({"moe.top_k"}) && e.top_k > e.experts)
      c.fail({"moe.top_k", "moe.experts"},
             fmt::format("moe.top_k <= moe.experts fails: {} > {}", e.top_k, e.experts));
  }
  if (c.usable({"moe.experts", "parallel.ep"}) && e.experts == 0 && r.parallel.ep > 1)
    c.fail({"parallel.ep", "moe.experts"},
           fmt::format("parallel.ep = {} needs an MoE model (moe.experts > 0), but moe.experts = 0",
                       r.parallel.ep));
}

void check_optimizer(const Recipe& r, RuleChecker& c) {
  const OptimizerConfig& o = r.optimizer;
  // PyTorch's SGD refuses it too: Nesterov's look-ahead is along a momentum there is none of.
  if (c.usable({"optimizer.name", "optimizer.nesterov", "optimizer.momentum"}) &&
      o.name == OptimizerName::sgd && o.nesterov && o.momentum == 0)
    c.fail({"optimizer.nesterov", "optimizer.momentum"},
           "optimizer.nesterov: true needs optimizer.momentum > 0 (sgd): set a momentum, or "
           "nesterov: false for plain SGD");
  // bf16 moments need per-element moments to halve, and f32 arithmetic beside them.
  if (c.usable({"optimizer.state_dtype", "optimizer.name", "optimizer.momentum"}) &&
      o.state_dtype == StateDtype::bf16 && train::optimizer_moments(o) == 0)
    c.fail({"optimizer.state_dtype", "optimizer.name"},
           fmt::format("optimizer.state_dtype: bf16 needs an optimizer with per-element moments, "
                       "but {} keeps none{}: remove state_dtype (or use fp32)",
                       o.name == OptimizerName::adafactor ? "adafactor" : "sgd without momentum",
                       o.name == OptimizerName::adafactor
                           ? " (its factored statistics are a row and a column per matrix)"
                           : ""));
  if (c.usable({"optimizer.state_dtype", "precision.compute"}) &&
      o.state_dtype == StateDtype::bf16 && r.model.storage == DType::f64)
    c.fail({"optimizer.state_dtype", "precision.compute"},
           "optimizer.state_dtype: bf16 does not go with precision.compute: fp64 (the float64 "
           "reference keeps float64 moments): use state_dtype fp32, or compute bf16 or fp32");
}

void check_schedule_and_data(const Recipe& r, RuleChecker& c) {
  if (c.usable({"schedule.min_lr", "optimizer.lr"}) && r.schedule.min_lr > r.optimizer.lr)
    c.fail({"schedule.min_lr", "optimizer.lr"},
           fmt::format("schedule.min_lr <= optimizer.lr fails: {} > {}",
                       format_number(r.schedule.min_lr), format_number(r.optimizer.lr)));
  if (c.usable({"schedule.warmup_steps", "schedule.decay_steps"}) && r.schedule.decay_steps > 0 &&
      r.schedule.warmup_steps > r.schedule.decay_steps)
    c.fail({"schedule.warmup_steps", "schedule.decay_steps"},
           fmt::format("schedule.warmup_steps <= schedule.decay_steps fails: {} > {}",
                       r.schedule.warmup_steps, r.schedule.decay_steps));
  if (c.usable({"logging.timeline_step", "training.steps"}) &&
      r.logging.timeline_step > r.training.steps)
    c.fail({"logging.timeline_step", "training.steps"},
           fmt::format("logging.timeline_step <= training.steps fails: {} > {} (the step whose "
                       "pipeline timeline is recorded must run; 0 records none)",
                       r.logging.timeline_step, r.training.steps));
  if (c.usable({"schedule.warmup_steps", "training.steps"}) &&
      r.schedule.warmup_steps > r.training.steps)
    c.fail({"schedule.warmup_steps", "training.steps"},
           fmt::format("schedule.warmup_steps <= training.steps fails: {} > {}",
                       r.schedule.warmup_steps, r.training.steps));
  if (c.usable({"data.source", "data.path", "data.sources"}) &&
      r.data.source != DataSource::synthetic && r.data.path.empty() && r.data.sources.empty())
    c.fail({"data.path", "data.source"},
           fmt::format("data.path (or data.sources) is required when data.source is {} (or use "
                       "data.source: synthetic)",
                       to_string(r.data.source)));
  if (c.usable({"data.source", "data.sources"}) && r.data.source == DataSource::synthetic &&
      !r.data.sources.empty())
    c.fail({"data.sources", "data.source"},
           "data.sources blends datasets of data.source, and synthetic data has no files; set "
           "data.source (text, llmc, megatron) or remove data.sources");
  if (c.usable({"data.path", "data.sources"}) && !r.data.path.empty() && !r.data.sources.empty())
    c.fail({"data.sources", "data.path"},
           "set data.path (one dataset) or data.sources (a blend), not both; add the path to "
           "data.sources with its weight");
  if (c.usable({"data.val_path", "data.sources"}) && !r.data.val_path.empty() &&
      !r.data.sources.empty())
    c.fail({"data.val_path", "data.sources"},
           "a blend (data.sources) holds out data.val_fraction of each dataset for validation and "
           "takes no data.val_path; remove data.val_path");
  if (c.usable({"data.source", "data.val_path"}) && r.data.source == DataSource::synthetic &&
      !r.data.val_path.empty())
    c.fail({"data.val_path", "data.source"},
           "data.val_path must be empty when data.source is synthetic (its validation tokens are "
           "held out from the synthetic stream); remove data.val_path");
}

// Checkpoints are committed by rank 0 from files every rank writes into the run directory: without
// a shared file system rank 0 would wait for shards it can never see.
// fp8 GEMMs take bf16 operands and write bf16 (Transformer Engine's arrangement).
void check_precision(const Recipe& r, RuleChecker& c) {
  // The gradient sync sums in bf16 only where it reduce-scatters block by block.
  if (c.usable({"precision.reduce_dtype", "parallel.zero"}) &&
      r.precision.reduce_dtype == ReduceDtype::bf16 && r.parallel.zero < 2)
    c.fail({"precision.reduce_dtype", "parallel.zero"},
           fmt::format("precision.reduce_dtype: bf16 applies to the block reduce-scatters of "
                       "parallel.zero 2 and 3, but parallel.zero is {}; set parallel.zero: 2 "
                       "or 3, or precision.reduce_dtype: fp32",
                       r.parallel.zero));
  if (!c.usable({"precision.fp8", "precision.compute"}) || r.model.fp8 == Fp8::none) return;
  if (r.model.storage != DType::bf16)
    c.fail({"precision.fp8", "precision.compute"},
           fmt::format("precision.fp8: {} needs precision.compute: bf16 (got {}); set "
                       "precision.compute: bf16 or precision.fp8: none",
                       to_string(r.model.fp8), to_string(r.model.storage)));
}

void check_cluster(const Recipe& r, RuleChecker& c) {
  if (!c.usable({"cluster.shared_fs", "checkpoint.every_steps", "checkpoint.every_minutes"}) ||
      r.cluster.shared_fs)
    return;
  if (r.checkpoint.every_steps > 0 || r.checkpoint.every_minutes > 0)
    c.fail({"cluster.shared_fs", "checkpoint.every_steps", "checkpoint.every_minutes"},
           fmt::format("cluster.shared_fs: false turns checkpoints off, but checkpoint.every_steps "
                       "= {} and checkpoint.every_minutes = {} ask for them (every rank writes "
                       "its shard into the run directory and rank 0 commits them, so checkpoints "
                       "need a file system all nodes share); set both to 0, or put the run "
                       "directory on a shared file system and set cluster.shared_fs: true",
                       r.checkpoint.every_steps, format_number(r.checkpoint.every_minutes)));
}

// The rollback needs the in-memory snapshot.
void check_stability(const Recipe& r, RuleChecker& c) {
  if (!c.usable({"stability.action", "checkpoint.memory_every_steps"})) return;
  const bool rollback = r.stability.action == StabilityAction::rollback;
  if (rollback && r.checkpoint.memory_every_steps == 0)
    c.fail({"stability.action", "checkpoint.memory_every_steps"},
           "stability.action: rollback returns to the newest in-memory snapshot, but "
           "checkpoint.memory_every_steps = 0 takes none; set it (e.g. "
           "checkpoint.memory_every_steps: 50: each snapshot holds the parameters and optimizer "
           "state in host memory), or stability.action: skip");
}

// The local-disk tier needs both its folder and its cadence.
void check_tiers(const Recipe& r, RuleChecker& c) {
  if (!c.usable({"checkpoint.local_dir", "checkpoint.local_every_steps"})) return;
  const bool dir = !r.checkpoint.local_dir.empty();
  if (dir != (r.checkpoint.local_every_steps > 0))
    c.fail({"checkpoint.local_dir", "checkpoint.local_every_steps"},
           dir ? fmt::format("checkpoint.local_dir: {} names the local-disk tier's folder, but "
                             "checkpoint.local_every_steps = 0 never writes it; set "
                             "checkpoint.local_every_steps (e.g. 100), or remove local_dir",
                             r.checkpoint.local_dir)
               : fmt::format("checkpoint.local_every_steps = {} writes the local-disk tier, but "
                             "checkpoint.local_dir names no folder for it; set a node-local "
                             "folder (e.g. checkpoint.local_dir: /local/scratch/ckpt)",
                             r.checkpoint.local_every_steps));
}

}  // namespace

std::vector<RuleViolation> check_rules(const Recipe& recipe,
                                       const std::function<bool(std::string_view)>& usable) {
  RuleChecker checker(usable);
  check_model(recipe, checker);
  check_parallel(recipe, checker);
  check_moe(recipe, checker);
  check_optimizer(recipe, checker);
  check_schedule_and_data(recipe, checker);
  check_precision(recipe, checker);
  check_cluster(recipe, checker);
  check_stability(recipe, checker);
  check_tiers(recipe, checker);
  return std::move(checker.violations);
}

}  // namespace trainctl::recipe::internal
