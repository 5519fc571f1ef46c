// The recipe: one YAML file that says what to train and how. This header is the whole public
// contract of lib/recipe: the typed struct tree every other module reads, and the functions that
// build it (load_recipe, parse_recipe), print it (dump_recipe, explain_table) and fingerprint it
// (recipe_hash), plus where each key's value came from (Origins), so that callers can report a
// later problem at the place the user wrote the value.
//
// A Recipe is only ever built by this module, fully resolved (defaults and model.arch presets
// filled in, --set overrides applied) and validated (types, ranges, cross-field rules). Code that
// receives a `const Recipe&` may rely on every rule listed in docs/recipe.md holding. The member
// names are the YAML key names, so `recipe.model.layers` is `model.layers` in the file, except for
// the four keys the model holds (see the struct tree). Enum values named `automatic` are spelled
// `auto` in YAML (auto is a C++ keyword).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "data/config.hpp"
#include "layout/layout.hpp"
#include "layout/pipeline.hpp"
#include "model/config.hpp"
#include "telemetry/progress.hpp"
#include "tensor/dtype.hpp"
#include "train/config.hpp"

namespace trainctl::recipe {

// ---- enums -------------------------------------------------------------------------------------
// Each enum a module acts on is that module's own, named here for its key; the recipe only adds
// the YAML spelling (EnumNames). The rest exist only in the recipe.
using Arch = model::Arch;                        // model.arch
using Norm = model::NormKind;                    // model.norm
using Activation = model::ActivationKind;        // model.activation
using Position = model::PositionKind;            // model.position
using Router = model::MoeRouter;                 // moe.router
using tensor::DType;                             // precision.compute: f32, bf16, f16 or f64 only
using trainctl::PipeSchedule;                    // parallel.pp_schedule (layout/pipeline.hpp)
using trainctl::Recompute;                       // parallel.recompute (layout/layout.hpp)
using Fp8 = model::Fp8Mode;                      // precision.fp8
using LossScaleMode = train::LossScaleKind;      // precision.loss_scale
using Decay = train::DecayKind;                  // schedule.decay
using ReduceDtype = train::ReduceDtype;          // precision.reduce_dtype
using StateDtype = train::StateDtype;            // optimizer.state_dtype
using DataSource = data::SourceKind;             // data.source
using Progress = telemetry::ProgressMode;        // logging.progress
using OptimizerName = train::OptimizerName;      // optimizer.name
using StabilityAction = train::StabilityAction;  // stability.action
enum class Resume { never, automatic };
enum class Device { automatic, cpu, cuda };

// The YAML spelling of each enum value; the schema takes its choices from here.
template <class E>
struct EnumNames;
template <>
struct EnumNames<Arch> {
  static constexpr std::array<std::string_view, 2> names{"gpt", "llama"};
};
template <>
struct EnumNames<Norm> {
  static constexpr std::array<std::string_view, 2> names{"layernorm", "rmsnorm"};
};
template <>
struct EnumNames<Activation> {
  static constexpr std::array<std::string_view, 2> names{"gelu", "swiglu"};
};
template <>
struct EnumNames<Position> {
  static constexpr std::array<std::string_view, 2> names{"learned", "rope"};
};
template <>
struct EnumNames<Router> {
  static constexpr std::array<std::string_view, 2> names{"softmax", "softmax_topk_renorm"};
};
template <>
struct EnumNames<Recompute> {
  static constexpr std::array<std::string_view, 3> names = kRecomputeNames;
};
template <>
struct EnumNames<PipeSchedule> {
  static constexpr auto names = kPipeScheduleNames;
};
template <>
struct EnumNames<DType> {  // a module enum the recipe offers only part of: `values` lists it
  static constexpr std::array<std::string_view, 4> names{"fp32", "bf16", "fp16", "fp64"};
  static constexpr std::array<DType, 4> values{DType::f32, DType::bf16, DType::f16, DType::f64};
};
template <>
struct EnumNames<Fp8> {
  static constexpr std::array<std::string_view, 3> names{"none", "e4m3", "hybrid"};
};
template <>
struct EnumNames<OptimizerName> {
  static constexpr std::array<std::string_view, 5> names{"adamw", "sgd", "lion", "muon",
                                                         "adafactor"};
};
template <>
struct EnumNames<StateDtype> {
  static constexpr std::array<std::string_view, 2> names{"fp32", "bf16"};
};
template <>
struct EnumNames<ReduceDtype> {
  static constexpr std::array<std::string_view, 2> names{"fp32", "bf16"};
};
template <>
struct EnumNames<Decay> {
  static constexpr std::array<std::string_view, 4> names{"cosine", "linear", "constant", "wsd"};
};
template <>
struct EnumNames<DataSource> {
  static constexpr std::array<std::string_view, 4> names{"synthetic", "text", "llmc", "megatron"};
};
template <>
struct EnumNames<StabilityAction> {
  static constexpr std::array<std::string_view, 2> names{"skip", "rollback"};
};
template <>
struct EnumNames<Resume> {
  static constexpr std::array<std::string_view, 2> names{"never", "auto"};
};
template <>
struct EnumNames<Progress> {
  static constexpr std::array<std::string_view, 3> names{"auto", "plain", "none"};
};
template <>
struct EnumNames<Device> {
  static constexpr std::array<std::string_view, 3> names{"auto", "cpu", "cuda"};
};

// The position of `value` in EnumNames<E>::names: the enum's own order, or its place in
// EnumNames<E>::values where that is given; names.size() for a value the recipe does not offer.
template <class E>
requires std::is_enum_v<E>
constexpr std::size_t choice_index(E value) {
  if constexpr (requires { EnumNames<E>::values; }) {
    for (std::size_t i = 0; i < EnumNames<E>::values.size(); ++i)
      if (EnumNames<E>::values[i] == value) return i;
    return EnumNames<E>::names.size();
  } else {
    return static_cast<std::size_t>(value);
  }
}
// The inverse: the value at `index` (< names.size()) of EnumNames<E>::names.
template <class E>
requires std::is_enum_v<E>
constexpr E choice_value(std::size_t index) {
  if constexpr (requires { EnumNames<E>::values; })
    return EnumNames<E>::values[index];
  else
    return static_cast<E>(index);
}

// The YAML spelling of an enum value, e.g. to_string(Arch::llama) == "llama"; "?" for a value the
// recipe does not offer (DType::e4m3).
template <class E>
requires std::is_enum_v<E>
constexpr std::string_view to_string(E value) {
  const std::size_t i = choice_index(value);
  return i < EnumNames<E>::names.size() ? EnumNames<E>::names[i] : std::string_view("?");
}

// ---- the struct tree -------------------------------------------------------------------------
// A section a module reads is that module's own config struct, which the schema fills as it is:
//   model      model::ModelConfig, which also holds moe.* (as model.moe), precision.compute (as
//              model.storage) and precision.fp8 (as model.fp8): the model computes with them
//   data       data::DataConfig
//   training, optimizer, schedule, precision (its loss-scaling keys), stability   train's own
//   (train/config.hpp) parallel   the Layout (layout/layout.hpp) and how the ranks run
// The remaining sections are the recipe's own structs, without member initializers. The module
// structs have initializers for tests that build them by hand, but the defaults that count are
// the schema table's: build a Recipe with load_recipe, parse_recipe or default_recipe.

// parallel.dp, tp, pp, ep, zero and recompute are the layout (layout/layout.hpp) the planner, the
// mesh and the model take as they are; the rest says how the ranks run.
struct ParallelConfig : Layout {
  // Layers of each pipeline stage (pp * pp_virtual entries summing to model.layers, virtual stage
  // c * pp + r being chunk c of rank r); empty: an even split, the earlier stages taking the
  // remainder.
  std::vector<int> pp_layers;
  // The pipeline schedule (layout/pipeline.hpp) and, for interleaved, the model chunks per rank.
  PipeSchedule pp_schedule;
  int pp_virtual;
  // Seconds a collective (and the rendezvous) may wait for a peer before the job fails.
  double timeout_s;
  // Start each gradient bucket's reduction as soon as the last micro-batch's backward has
  // produced it, overlapping communication with the rest of backward; with ZeRO-1 also gather
  // each bucket's updated parameters while the next forward runs (results are identical).
  bool overlap_grad_sync;
  // `parallel: auto` (YAML) or `--set parallel=auto`: the planner (lib/planner) chooses the keys
  // above and training.micro_batch; they hold their defaults until then. No parallel.* key may
  // be given with it.
  bool automatic;
  bool operator==(const ParallelConfig&) const = default;
};

using ModelConfig = model::ModelConfig;  // model.*, moe.*, precision.compute, precision.fp8
using MoeConfig = model::MoeConfig;
using DataConfig = data::DataConfig;
using TrainingConfig = train::TrainingConfig;
using OptimizerConfig = train::OptimizerConfig;
using ScheduleConfig = train::ScheduleConfig;
using LossScale = train::LossScale;
using PrecisionConfig = train::PrecisionConfig;  // precision.* but compute and fp8
using StabilityConfig = train::StabilityConfig;  // stability.*

struct CheckpointConfig {
  int64_t every_steps;   // 0: off
  double every_minutes;  // 0: off
  int keep_last;
  bool async;  // write checkpoints on a background thread
  Resume resume;
  // An in-memory snapshot every N steps (0: none): stability.action rollback returns to it, and
  // it is written to the memory tier (/dev/shm) for a restart (lib/run/local_tier.hpp).
  int64_t memory_every_steps;
  // The local-disk tier: a node-local folder ("" : none) and its cadence (0: none).
  std::string local_dir;
  int64_t local_every_steps;
  bool operator==(const CheckpointConfig&) const = default;
};

struct DeterminismConfig {
  int64_t seed;
  bool deterministic;
  bool operator==(const DeterminismConfig&) const = default;
};

struct LoggingConfig {
  int64_t every_steps;
  int64_t eval_every_steps;  // 0: only at the end
  int eval_batches;
  bool tensorboard;
  Progress progress;
  int64_t timeline_step;  // 0: none
  // Several ranks: name the slowest rank when its compute time exceeds the median rank's by more
  // than this fraction (lib/run/straggler.hpp); 0: never.
  double straggler_threshold;
  bool operator==(const LoggingConfig&) const = default;
};

struct ClusterConfig {
  Device device;
  std::string file;
  int nodes, gpus_per_node;
  // Whether every node sees the run directory (a shared file system). false: the ranks of a Slurm
  // job rendezvous through a TCP store on the first node (lib/launch/store_address.hpp), and no
  // checkpoint is written (rank 0 commits a checkpoint from files every rank writes into the run
  // directory), so the checkpoint.every_* keys must be 0.
  bool shared_fs;
  bool operator==(const ClusterConfig&) const = default;
};

// `trainctl submit` (lib/launch/sbatch.hpp): what the batch script asks Slurm for. Nodes and GPUs
// per node are cluster.nodes and cluster.gpus_per_node; tasks per node follow from the layout.
// The values are checked (names, time format, no shell injection) by `trainctl submit`.
struct SlurmConfig {
  std::string partition, account, qos;
  std::string time;    // Slurm time limit ("" = the partition's): MM, HH:MM:SS, D-HH, ...
  std::string extra;   // more #SBATCH options, space separated: "--constraint=h100 --exclusive"
  std::string env;     // exported to the ranks, space separated NAME=VALUE: "NCCL_DEBUG=WARN"
  int signal_grace_s;  // --signal=B:USR1@N: seconds before the time limit to save and requeue
  int max_requeues;    // "saved, please requeue" exits requeued at most this often
  bool operator==(const SlurmConfig&) const = default;
};

struct Recipe {
  std::string name;
  ModelConfig model;  // model.*, moe.*, precision.compute, precision.fp8
  ParallelConfig parallel;
  PrecisionConfig precision;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  DataConfig data;
  TrainingConfig training;
  CheckpointConfig checkpoint;
  StabilityConfig stability;
  DeterminismConfig determinism;
  LoggingConfig logging;
  ClusterConfig cluster;
  SlurmConfig slurm;

  bool operator==(const Recipe&) const = default;

  // tp * ep * dp * pp. Rank order: tp fastest, then ep, then dp, then pp.
  int world_size() const;
  // dp * ep: non-expert weights are replicated over dp*ep ranks, so the batch is split over them.
  int data_parallel_size() const;
  // global_batch / (micro_batch * dp * ep); exact (validation guarantees divisibility).
  int grad_accum_steps() const;
  // global_batch * seq_len.
  int64_t tokens_per_step() const;
};

// ---- problems ---------------------------------------------------------------------------------
// One thing wrong with a recipe. line/col are 1-based; 0 when the problem has no position (file
// missing, required key absent). Problems from --set have an empty `file` and their message starts
// with "--set KEY=VALUE: ".
struct Problem {
  std::string file;
  int line = 0;
  int col = 0;
  std::string message;
  bool operator==(const Problem&) const = default;
};

// "FILE:LINE:COL: error: MESSAGE", "FILE: error: MESSAGE" or "error: MESSAGE" (from --set).
std::string format_problem(const Problem& problem);

// Every problem, one per line, then the summary line "N problem(s) in RECIPE_PATH": what trainctl
// prints on stderr for bad input, whoever found the problems (lib/recipe or a later check).
std::string format_report(const std::vector<Problem>& problems, std::string_view recipe_path);

// Thrown by load_recipe/parse_recipe with EVERY problem found, sorted by position (file problems
// by line and column, then --set problems in the order found). what() lists them all.
class RecipeError : public std::runtime_error {
 public:
  explicit RecipeError(std::vector<Problem> problems);
  const std::vector<Problem>& problems() const { return problems_; }

 private:
  std::vector<Problem> problems_;
};

// ---- origins: where each key's value came from -------------------------------------------------
// Problems found after loading (the parallel layout this build cannot run, a data file the data
// module rejects) belong at the place the user wrote the value, like the loader's own problems.
struct KeyOrigin {
  enum class Source { file, set, preset, default_value };
  Source source = Source::default_value;
  int line = 0, col = 0;  // Source::file: 1-based position of the value (of the key when empty)
  std::string set_arg;    // Source::set: the --set argument as given, e.g. "model.hidden=256"
  int set_index = -1;     // Source::set: 0-based position among the --set arguments
  bool user_set() const { return source == Source::file || source == Source::set; }
  bool operator==(const KeyOrigin&) const = default;
};

// The origins of every key of one loaded recipe. A key the user did not set has Source::preset
// (model.arch fills it) or Source::default_value. Key paths must be schema keys ("model.hidden");
// any other path is a programming error and throws std::invalid_argument.
class Origins {
 public:
  Origins() = default;  // nothing set by the user; problems are located at no file
  // `file`: the recipe's label in problems; `set_keys`: the keys the file or a --set gave.
  Origins(std::string file, std::map<std::string, KeyOrigin, std::less<>> set_keys);

  const std::string& file() const { return file_; }
  KeyOrigin of(std::string_view key_path) const;
  // "r.yaml:3:17", "--set model.hidden=256", "preset" or "default".
  std::string describe(std::string_view key_path) const;

  // A problem with the value of one key, located where the user set it and worded like the
  // loader's own: "FILE:L:C: error: KEY: MESSAGE", "error: --set KEY=V: MESSAGE", or
  // "FILE: error: KEY: MESSAGE" when the key kept its default or preset.
  Problem problem(std::string_view key_path, std::string message) const;

  // The key a problem involving all of `keys` (most specific first) is reported at: the one the
  // user set most recently (the last --set beats earlier ones, any --set beats the file), else
  // the first of `keys` the file sets; "" when the user set none of them.
  std::string_view locate(const std::vector<std::string_view>& keys) const;
  // A problem about a relation between keys, at locate(keys). The message is not prefixed with a
  // key name (it names the keys itself, e.g. a formula): "FILE:L:C: error: MESSAGE",
  // "error: --set KEY=V: MESSAGE" or "FILE: error: MESSAGE".
  Problem rule_problem(const std::vector<std::string_view>& keys, std::string message) const;

 private:
  Problem located(const KeyOrigin& origin, std::string message) const;

  std::string file_;
  std::map<std::string, KeyOrigin, std::less<>> set_keys_;
};

// A recipe with the origins of its keys (for callers that check more after loading).
struct LoadedRecipe {
  Recipe recipe;
  Origins origins;
};

// ---- building, printing, fingerprinting --------------------------------------------------------
// The largest recipe file read (1 MiB; the biggest shipped recipe is a few KiB): a larger one is
// refused before it is parsed, since YAML costs about a hundred times its text in memory.
inline constexpr uint64_t kMaxRecipeBytes = uint64_t{1} << 20;

// Reads the YAML recipe at `path`, applies `overrides` ("a.b=c", the value parsed as YAML, as from
// --set) on top of the file, fills defaults and model.arch presets, and validates everything.
// Throws RecipeError listing all problems at once. A file that is not a regular file (a FIFO), is
// larger than kMaxRecipeBytes or holds more than one YAML document is refused.
// Data files are checked too (data.path and a non-empty data.val_path must name an existing,
// readable file, or for llmc a glob matching at least one file; relative paths are taken from the
// current working directory), so a Recipe never names a data file that was missing at load time.
Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides = {});
// The same, keeping where each key's value came from.
LoadedRecipe load_recipe_with_origins(const std::string& path,
                                      const std::vector<std::string>& overrides = {});

// The same from YAML text in memory; `file_label` is what problems name as their file.
Recipe parse_recipe(std::string_view yaml_text, const std::string& file_label,
                    const std::vector<std::string>& overrides = {});
LoadedRecipe parse_recipe_with_origins(std::string_view yaml_text, const std::string& file_label,
                                       const std::vector<std::string>& overrides = {});

// Every key at its default (presets of `arch`), name "default", data.source synthetic. Valid.
// For tests and tools that need a Recipe without a file.
Recipe default_recipe(Arch arch = Arch::gpt);

// The resolved recipe as YAML: every key, block style, in schema order. parse_recipe/load_recipe
// read it back to an identical Recipe (floats are printed in shortest round-trip form).
std::string dump_recipe(const Recipe& recipe);

// FNV-1a 64 of dump_recipe(recipe), as 16 lower-case hex digits. Equal recipes hash equally
// whatever the key order, comments or defaults-vs-explicit style of their source files.
std::string recipe_hash(const Recipe& recipe);

// The schema as a text table: key, type, default, allowed values, help (trainctl validate
// --explain).
std::string explain_table();

}  // namespace trainctl::recipe
