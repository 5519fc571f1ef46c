// Malformed recipes: each one written to a file, loaded, and every problem compared word for word
// (position included). The preamble makes a recipe valid, so each case shows only its own mistake.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "recipe/recipe.hpp"

namespace {

using trainctl::recipe::Problem;
using trainctl::recipe::RecipeError;

const std::string kOk = "name: t\ndata: {source: synthetic}\n";  // lines 1-2

// A folder for this process's recipe files, removed when the tests end.
const std::filesystem::path& temp_dir() {
  struct Dir {
    std::filesystem::path path = std::filesystem::temp_directory_path() /
                                 ("trainctl_recipe_test_" + std::to_string(::getpid()));
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

std::string write_temp(const std::string& text) {
  auto path = temp_dir() / "recipe.yaml";
  std::ofstream(path) << text;
  return path.string();
}

// "LINE:COL: message" for file problems with a position, the bare message otherwise.
std::string describe(const Problem& p) {
  if (p.line == 0) return p.message;
  return std::to_string(p.line) + ":" + std::to_string(p.col) + ": " + p.message;
}

std::vector<std::string> problems_of(const std::string& yaml,
                                     const std::vector<std::string>& overrides) {
  std::string path = write_temp(yaml);
  try {
    trainctl::recipe::load_recipe(path, overrides);
  } catch (const RecipeError& e) {
    std::vector<std::string> out;
    for (const auto& p : e.problems()) {
      if (!p.file.empty()) CHECK(p.file == path);
      out.push_back(describe(p));
    }
    return out;
  }
  return {"(loaded without problems)"};
}

// Relative data paths are taken from here; problems about them say so.
const std::string kCwd = std::filesystem::current_path().string();
// An existing file to name as data: the recipe file each case writes.
const std::string kRecipeFile = (temp_dir() / "recipe.yaml").string();

struct BadCase {
  std::string what;
  std::string yaml;
  std::vector<std::string> overrides;
  std::vector<std::string> expected;
};

const std::vector<BadCase> kBadCases = {
    {"YAML syntax error",
     kOk + "model: [1, 2\nmoe: 3\n",
     {},
     {"4:4: YAML syntax error: end of sequence flow not found"}},
    {"top level is a list",
     "- name\n- model\n",
     {},
     {"1:1: a recipe is a map of sections (name:, model:, training:, ...)"}},
    {"empty file: required key and data.path",
     "",
     {},
     {"missing required key 'name' (run name; used as the run directory name); add e.g. `name: "
      "my-run`",
      "data.path (or data.sources) is required when data.source is text (or use data.source: "
      "synthetic)"}},
    {"unknown section, did you mean",
     kOk + "modle:\n  layers: 2\n",
     {},
     {"3:1: unknown section 'modle'; did you mean 'model'?"}},
    {"unknown section, no near name",
     kOk + "zzzzzz: 1\n",
     {},
     {"3:1: unknown section 'zzzzzz'; the sections are: model, moe, parallel, precision, "
      "optimizer, schedule, data, training, checkpoint, stability, determinism, logging, cluster, "
      "slurm ('name' is the only top-level key)"}},
    {"unknown top-level key, did you mean 'name'",
     "nmae: t\ndata: {source: synthetic}\n",
     {},
     {"missing required key 'name' (run name; used as the run directory name); add e.g. `name: "
      "my-run`",
      "1:1: unknown top-level key 'nmae'; did you mean 'name'?"}},
    {"duplicate top-level key 'name' is a key, not a section",
     kOk + "name: u\n",
     {},
     {"3:1: duplicate key 'name' (first at line 1); keep one"}},
    {"duplicate section",
     kOk + "model: {layers: 2}\nmodel: {heads: 2}\n",
     {},
     {"4:1: duplicate section 'model' (first at line 3); merge them"}},
    {"tab indenting the first line",
     "\tname: t\n",
     {},
     {"1:1: tabs are not allowed for YAML indentation; indent with spaces"}},
    {"tab indenting a key inside a section",
     kOk + "model:\n  layers: 2\n\theads: 2\n",
     {},
     {"5:1: tabs are not allowed for YAML indentation; indent with spaces"}},
    {"tab after spaces in the indentation",
     kOk + "model:\n  \tlayers: 2\n",
     {},
     {"4:3: tabs are not allowed for YAML indentation; indent with spaces"}},
    {"a tab inside a flow map is only a separator",
     kOk + "model: {layers: 2,\n\theads: 2}\n",
     {},
     {"(loaded without problems)"}},
    {"unknown key, did you mean",
     kOk + "model:\n  hiden: 64\n",
     {},
     {"4:3: unknown key 'model.hiden'; did you mean 'model.hidden'?"}},
    {"key in the wrong section",
     kOk + "training:\n  seed: 7\n",
     {},
     {"4:3: unknown key 'training.seed'; did you mean 'determinism.seed'?"}},
    {"unknown key, no near name",
     kOk + "cluster:\n  qqqqqqqq: 1\n",
     {},
     {"4:3: unknown key 'cluster.qqqqqqqq'; the keys of 'cluster' are: device, file, nodes, "
      "gpus_per_node, shared_fs"}},
    {"integer expected",
     kOk + "model:\n  hidden: abc\n",
     {},
     {"4:11: model.hidden: expected an integer, got 'abc'"}},
    {"integer expected, got a float",
     kOk + "training:\n  steps: 2.5\n",
     {},
     {"4:10: training.steps: expected an integer, got '2.5'"}},
    {"number expected",
     kOk + "optimizer: {lr: fast}\n",
     {},
     {"3:17: optimizer.lr: expected a number, got 'fast'"}},
    {"bool expected",
     kOk + "checkpoint:\n  async: maybe\n",
     {},
     {"4:10: checkpoint.async: expected true or false, got 'maybe'"}},
    {"scalar expected, got a map",
     kOk + "model:\n  layers: {a: 1}\n",
     {},
     {"4:11: model.layers: expected an integer, got a map"}},
    {"integer below its range",
     kOk + "model:\n  layers: 0\n",
     {},
     {"4:11: model.layers: must be >= 1, got 0"}},
    {"integer too large for its member",
     kOk + "model:\n  layers: 99999999999\n",
     {},
     {"4:11: model.layers: must be <= 2147483647, got 99999999999"}},
    {"float must be positive",
     kOk + "optimizer:\n  lr: 0\n",
     {},
     {"4:7: optimizer.lr: must be > 0, got 0"}},
    {"float above a closed interval",
     "name: t\ndata: {source: synthetic, val_fraction: 0.7}\n",
     {},
     {"2:41: data.val_fraction: must be in [0, 0.5], got 0.7"}},
    {"float in a half-open interval",
     kOk + "schedule:\n  wsd_decay_fraction: 0\n",
     {},
     {"4:23: schedule.wsd_decay_fraction: must be in (0, 1], got 0"}},
    {"bad choice, did you mean",
     kOk + "model:\n  arch: lama\n",
     {},
     {"4:9: model.arch: expected one of gpt | llama, got 'lama'; did you mean 'llama'?"}},
    {"bad choice, no near name",
     kOk + "precision:\n  compute: int8\n",
     {},
     {"4:12: precision.compute: expected one of fp32 | bf16 | fp16 | fp64, got 'int8'"}},
    {"betas: wrong length",
     kOk + "optimizer:\n  betas: [0.9]\n",
     {},
     {"4:10: optimizer.betas: expected a list of 2 numbers like [0.9, 0.95], got 1 item"}},
    {"betas: out of range",
     kOk + "optimizer:\n  betas: [0.9, 1.0]\n",
     {},
     {"4:10: optimizer.betas: each value must be in [0, 1), got 1"}},
    {"loss scale: not a mode or number",
     kOk + "precision:\n  loss_scale: big\n",
     {},
     {"4:15: precision.loss_scale: expected dynamic, none or a number > 0, got 'big'"}},
    {"name: bad characters",
     "name: my run\ndata: {source: synthetic}\n",
     {},
     {"1:7: name: 'my run' may only use letters, digits, '.', '_' and '-' (it names the run "
      "directory)"}},
    {"duplicate key",
     kOk + "model:\n  layers: 2\n  layers: 3\n",
     {},
     {"5:3: duplicate key 'model.layers' (first at line 4); keep one"}},
    {"section is not a map",
     kOk + "model: 4\n",
     {},
     {"3:8: section 'model' must be a map of keys, e.g. `model: {key: value}`"}},
    {"hidden % heads",
     kOk + "model:\n  hidden: 130\n  heads: 4\n",
     {},
     {"5:10: model.hidden % model.heads == 0 fails: 130 % 4 = 2 (head_dim = hidden / heads must "
      "be whole)"}},
    {"kv_heads > heads",
     kOk + "model:\n  heads: 4\n  kv_heads: 8\n",
     {},
     {"5:13: model.kv_heads <= model.heads fails: 8 > 4"}},
    {"heads % kv_heads",
     kOk + "model:\n  hidden: 96\n  heads: 6\n  kv_heads: 4\n",
     {},
     {"6:13: model.heads % model.kv_heads == 0 fails: 6 % 4 = 2 (each key/value head serves a "
      "whole group of query heads)"}},
    {"global_batch % (micro_batch * dp * ep)",
     kOk + "training:\n  global_batch: 10\n",
     {},
     {"4:17: training.global_batch % (training.micro_batch * parallel.dp * parallel.ep) == 0 "
      "fails: 10 % (4 * 1 * 1) = 10 % 4 = 2"}},
    {"tensor parallel divisibility, all four at once",
     kOk + "model: {heads: 4, vocab: 250}\nparallel: {tp: 3}\n",
     {},
     {"3:16: model.heads % parallel.tp == 0 fails: 4 % 3 = 1",
      "3:26: model.vocab % parallel.tp == 0 fails: 250 % 3 = 1",
      "4:16: model.kv_heads % parallel.tp == 0 fails: 4 % 3 = 1",
      "4:16: model.ffn_hidden % parallel.tp == 0 fails: 512 % 3 = 2"}},
    {"pp > layers",
     kOk + "model: {layers: 2}\nparallel: {pp: 3}\n",
     {},
     {"4:16: parallel.pp <= model.layers fails: 3 > 2 (each pipeline stage needs at least one "
      "layer)"}},
    {"pp_layers: one entry per stage",
     kOk + "model: {layers: 5}\nparallel: {pp: 2, pp_layers: [5]}\n",
     {},
     {"4:30: parallel.pp_layers needs one entry per stage (parallel.pp = 2), got 1: [5]"}},
    {"pp_layers: sum is the layers",
     kOk + "model: {layers: 5}\nparallel: {pp: 2, pp_layers: [3, 3]}\n",
     {},
     {"4:30: sum(parallel.pp_layers) == model.layers fails: 3 + 3 = 6 != 5"}},
    {"pp_virtual needs the interleaved schedule",
     kOk + "parallel: {pp: 2, pp_virtual: 2}\n",
     {},
     {"3:31: parallel.pp_virtual = 2 needs parallel.pp_schedule: interleaved (1f1b runs one model "
      "chunk per stage); set parallel.pp_virtual: 1 or parallel.pp_schedule: interleaved"}},
    {"interleaved needs pp and pp_virtual of 2 or more",
     kOk + "parallel: {pp_schedule: interleaved}\n",
     {},
     {"3:25: parallel.pp_schedule: interleaved needs parallel.pp >= 2 and parallel.pp_virtual >= 2 "
      "model chunks per stage (got pp 1, pp_virtual 1); or use parallel.pp_schedule: 1f1b"}},
    {"zb-h1 needs pp of 2 or more",
     kOk + "parallel: {pp_schedule: zb-h1}\n",
     {},
     {"3:25: parallel.pp_schedule: zb-h1 needs parallel.pp >= 2 (got 1); or use "
      "parallel.pp_schedule: 1f1b"}},
    {"zb-h1 runs one chunk per stage",
     kOk + "parallel: {pp: 2, pp_schedule: zb-h1, pp_virtual: 2}\n",
     {},
     {"3:51: parallel.pp_virtual = 2 needs parallel.pp_schedule: interleaved (zb-h1 runs one "
      "model chunk per stage); set parallel.pp_virtual: 1 or parallel.pp_schedule: interleaved"}},
    {"zb-h1 keeps activations: no recompute",
     kOk + "parallel: {pp: 2, pp_schedule: zb-h1, recompute: selective}\n",
     {},
     {"3:32: parallel.pp_schedule: zb-h1 keeps each micro-batch's activations for its "
      "weight-gradient pass, which parallel.recompute: selective would run the forward again "
      "for; set parallel.recompute: none or parallel.pp_schedule: 1f1b"}},
    {"zb-h1 splits the backward: zero <= 1",
     kOk + "parallel: {pp: 2, dp: 2, pp_schedule: zb-h1, zero: 2}\n",
     {},
     {"3:39: parallel.pp_schedule: zb-h1 needs parallel.zero <= 1 (got 2): ZeRO-2 and 3 bind a "
      "block's gradients or values for one backward pass, and zb-h1 splits it in two; set "
      "parallel.zero: 1 or parallel.pp_schedule: 1f1b"}},
    {"interleaved: micro-batches in groups of pp",
     kOk + "training: {global_batch: 12}\nparallel: {pp: 2, pp_schedule: interleaved, "
           "pp_virtual: 2}\n",
     {},
     {"4:32: parallel.pp_schedule: interleaved runs micro-batches in groups of parallel.pp: "
      "training.global_batch / (training.micro_batch * parallel.dp * parallel.ep) = 12 / (4 * 1 "
      "* 1) = 3 micro-batches per step, and 3 % 2 = 1 must be 0"}},
    {"interleaved: a layer per chunk",
     kOk + "model: {layers: 3}\nparallel: {pp: 2, pp_schedule: interleaved, pp_virtual: 2}\n",
     {},
     {"4:16: parallel.pp * parallel.pp_virtual <= model.layers fails: 2 * 2 = 4 > 3 (each model "
      "chunk needs at least one layer)"}},
    {"interleaved: pp_layers per virtual stage",
     kOk + "model: {layers: 8}\nparallel: {pp: 2, pp_schedule: interleaved, pp_virtual: 2, "
           "pp_layers: [4, 4]}\n",
     {},
     {"4:71: parallel.pp_layers needs one entry per virtual stage (parallel.pp * "
      "parallel.pp_virtual = 2 * 2 = 4, chunk c of rank r at c * pp + r), got 2: [4, 4]"}},
    {"pp_schedule: a known schedule",
     kOk + "parallel: {pp: 2, pp_schedule: zb}\n",
     {},
     {"3:32: parallel.pp_schedule: expected one of 1f1b | interleaved | zb-h1, got 'zb'"}},
    {"pp_layers: positive",
     kOk + "model: {layers: 5}\nparallel: {pp: 2, pp_layers: [5, 0]}\n",
     {},
     {"4:30: parallel.pp_layers: item 2: must be >= 1, got 0"}},
    {"expert_ffn_hidden % tp",
     kOk + "moe: {experts: 4, expert_ffn_hidden: 101}\nparallel: {tp: 2}\n",
     {},
     {"3:38: moe.expert_ffn_hidden % parallel.tp == 0 fails: 101 % 2 = 1 (each expert MLP is split "
      "over the tensor-parallel ranks)"}},
    {"experts % ep",
     kOk + "moe: {experts: 6}\nparallel: {ep: 4, dp: 1}\ntraining: {global_batch: 16}\n",
     {},
     {"3:16: moe.experts % parallel.ep == 0 fails: 6 % 4 = 2 (each expert-parallel rank holds "
      "whole experts)"}},
    {"fp8 needs bf16",
     kOk + "precision: {compute: fp32, fp8: hybrid}\n",
     {},
     {"3:33: precision.fp8: hybrid needs precision.compute: bf16 (got fp32); set "
      "precision.compute: bf16 or precision.fp8: none"}},
    {"a bf16 gradient reduction needs zero 2 or 3",
     kOk + "precision: {reduce_dtype: bf16}\nparallel: {zero: 1}\n",
     {},
     {"3:27: precision.reduce_dtype: bf16 applies to the block reduce-scatters of parallel.zero 2 "
      "and 3, but parallel.zero is 1; set parallel.zero: 2 or 3, or precision.reduce_dtype: "
      "fp32"}},
    {"sequence parallel needs tp",
     kOk + "parallel: {sequence_parallel: true}\n",
     {},
     {"3:31: parallel.sequence_parallel: true needs parallel.tp >= 2 (it splits the tokens "
      "between the tensor-parallel GEMMs over the tp ranks), but parallel.tp is 1; raise "
      "parallel.tp or set parallel.sequence_parallel: false"}},
    {"sequence parallel splits each sequence over tp",
     kOk + "model: {seq_len: 102}\nparallel: {tp: 4, sequence_parallel: true}\n",
     {},
     {"3:18: model.seq_len % parallel.tp == 0 fails: 102 % 4 = 2 (sequence parallelism splits "
      "each sequence over the tensor-parallel ranks)"}},
    {"context parallel cuts each sequence into 2 * cp chunks",
     kOk + "model: {seq_len: 100}\nparallel: {cp: 3}\n",
     {},
     {"3:18: model.seq_len % (2 * parallel.cp) == 0 fails: 100 % 6 = 4 (each rank holds two of "
      "the 2 * cp chunks of a sequence, chunk i and 2cp-1-i, so every rank does the same causal "
      "attention work)"}},
    {"top_k > experts",
     kOk + "moe:\n  experts: 2\n  top_k: 3\n",
     {},
     {"5:10: moe.top_k <= moe.experts fails: 3 > 2"}},
    {"ep > 1 on a dense model",
     kOk + "parallel:\n  ep: 2\n",
     {},
     {"4:7: parallel.ep = 2 needs an MoE model (moe.experts > 0), but moe.experts = 0"}},
    {"rope needs an even head_dim",
     kOk + "model:\n  arch: llama\n  hidden: 12\n  heads: 4\n",
     {},
     {"5:11: head_dim = model.hidden / model.heads = 12 / 4 = 3 must be even with "
      "model.position: rope"}},
    {"min_lr > lr",
     kOk + "optimizer:\n  lr: 1e-5\n",
     {},
     {"4:7: schedule.min_lr <= optimizer.lr fails: 0.0001 > 1e-05"}},
    {"warmup_steps > steps",
     kOk + "training:\n  steps: 10\n",
     {},
     {"4:10: schedule.warmup_steps <= training.steps fails: 20 > 10"}},
    {"warmup_steps > decay_steps",
     kOk + "schedule:\n  decay_steps: 10\n",
     {},
     {"4:16: schedule.warmup_steps <= schedule.decay_steps fails: 20 > 10"}},
    {"data.path required for text",
     "name: t\ndata:\n  source: llmc\n",
     {},
     {"3:11: data.path (or data.sources) is required when data.source is llmc (or use data.source: "
      "synthetic)"}},
    {"text data file missing, relative path",
     "name: t\ndata: {source: text, path: no_such_corpus.txt}\n",
     {},
     {"2:28: data.path: 'no_such_corpus.txt' does not exist (relative to " + kCwd + ")"}},
    {"text data file missing, absolute path",
     "name: t\ndata:\n  source: text\n  path: /no/such/corpus.txt\n",
     {},
     {"4:9: data.path: '/no/such/corpus.txt' does not exist"}},
    {"text data path is a directory",
     "name: t\ndata:\n  source: text\n  path: " + temp_dir().string() + "\n",
     {},
     {"4:9: data.path: '" + temp_dir().string() + "' is a directory; give one text file"}},
    {"validation file missing",
     "name: t\ndata:\n  source: text\n  path: " + kRecipeFile + "\n  val_path: val.txt\n",
     {},
     {"5:13: data.val_path: 'val.txt' does not exist (relative to " + kCwd + ")"}},
    {"llmc glob matching nothing",
     "name: t\ndata: {source: llmc, path: \"shards/train_*.bin\"}\n",
     {},
     {"2:28: data.path: 'shards/train_*.bin' matches no file (relative to " + kCwd + ")"}},
    {"llmc single shard missing",
     "name: t\ndata: {source: llmc, path: train.bin}\n",
     {},
     {"2:28: data.path: 'train.bin' does not exist (relative to " + kCwd + ")"}},
    {"data file missing, set by --set",
     "name: t\ndata: {source: text, path: " + kRecipeFile + "}\n",
     {"data.path=gone.txt"},
     {"--set data.path=gone.txt: 'gone.txt' does not exist (relative to " + kCwd + ")"}},
    {"synthetic data takes no val_path",
     kOk,
     {"data.val_path=v.txt"},
     {"--set data.val_path=v.txt: data.val_path must be empty when data.source is synthetic (its "
      "validation tokens are held out from the synthetic stream); remove data.val_path"}},
    {"no shared file system with periodic checkpoints",
     kOk + "cluster:\n  shared_fs: false\ncheckpoint: {every_steps: 10}\n",
     {},
     {"4:14: cluster.shared_fs: false turns checkpoints off, but checkpoint.every_steps = 10 and "
      "checkpoint.every_minutes = 0 ask for them (every rank writes its shard into the run "
      "directory and rank 0 commits them, so checkpoints need a file system all nodes share); "
      "set both to 0, or put the run directory on a shared file system and set "
      "cluster.shared_fs: true"}},
    {"no shared file system, checkpoints by time set by --set",
     kOk + "cluster: {shared_fs: false}\n",
     {"checkpoint.every_minutes=2.5"},
     {"--set checkpoint.every_minutes=2.5: cluster.shared_fs: false turns checkpoints off, but "
      "checkpoint.every_steps = 0 and checkpoint.every_minutes = 2.5 ask for them (every rank "
      "writes its shard into the run directory and rank 0 commits them, so checkpoints need a "
      "file system all nodes share); set both to 0, or put the run directory on a shared file "
      "system and set cluster.shared_fs: true"}},
    {"bad arch does not cascade into preset rules",
     kOk + "model: {arch: bert, heads: 4}\n",
     {},
     {"3:15: model.arch: expected one of gpt | llama, got 'bert'"}},
    {"many problems at once, sorted by position",
     "model:\n  layers: 0\n  hiden: 3\nname: ok\noptimizer: {lr: -1}\ndata: {source: synthetic}\n"
     "modle: {}\n",
     {"training.steps=x"},
     {"2:11: model.layers: must be >= 1, got 0",
      "3:3: unknown key 'model.hiden'; did you mean 'model.hidden'?",
      "5:17: optimizer.lr: must be > 0, got -1",
      "7:1: unknown section 'modle'; did you mean 'model'?",
      "--set training.steps=x: expected an integer, got 'x'"}},
    {"--set: wrong type",
     kOk,
     {"model.hidden=abc"},
     {"--set model.hidden=abc: expected an integer, got 'abc'"}},
    {"--set: unknown key",
     kOk,
     {"model.hiden=256"},
     {"--set model.hiden=256: unknown key 'model.hiden'; did you mean 'model.hidden'?"}},
    {"--set: no '='",
     kOk,
     {"model.hidden"},
     {"--set model.hidden: expected KEY=VALUE, e.g. --set model.layers=8"}},
    {"--set: a whole section",
     kOk,
     {"model={layers: 2}"},
     {"--set model={layers: 2}: 'model' is a section; set one key, e.g. --set model.KEY=VALUE"}},
    {"--set: cross-field problem points at the override",
     kOk,
     {"parallel.tp=3"},
     {"--set parallel.tp=3: model.heads % parallel.tp == 0 fails: 4 % 3 = 1",
      "--set parallel.tp=3: model.kv_heads % parallel.tp == 0 fails: 4 % 3 = 1",
      "--set parallel.tp=3: model.ffn_hidden % parallel.tp == 0 fails: 512 % 3 = 2",
      "--set parallel.tp=3: model.vocab % parallel.tp == 0 fails: 256 % 3 = 1"}},
    {"--set: cross-field problem at the --set, not at the file's other key",
     kOk + "training: {global_batch: 16, micro_batch: 4}\n",
     {"training.micro_batch=3"},
     {"--set training.micro_batch=3: training.global_batch % (training.micro_batch * "
      "parallel.dp * parallel.ep) == 0 fails: 16 % (3 * 1 * 1) = 16 % 3 = 1"}},
    {"--set: cross-field problem at the --set, not at the file's more specific key",
     kOk + "model: {heads: 4, kv_heads: 4}\n",
     {"model.heads=3"},
     {"--set model.heads=3: model.hidden % model.heads == 0 fails: 128 % 3 = 2 (head_dim = "
      "hidden / heads must be whole)",
      "--set model.heads=3: model.kv_heads <= model.heads fails: 4 > 3"}},
    {"--set: the latest --set of the keys involved wins",
     kOk,
     {"model.heads=3", "parallel.tp=2"},
     {"--set model.heads=3: model.hidden % model.heads == 0 fails: 128 % 3 = 2 (head_dim = "
      "hidden / heads must be whole)",
      "--set parallel.tp=2: model.heads % parallel.tp == 0 fails: 3 % 2 = 1",
      "--set parallel.tp=2: model.kv_heads % parallel.tp == 0 fails: 3 % 2 = 1"}},
    {"--set: choice with did-you-mean",
     kOk,
     {"schedule.decay=cosin"},
     {"--set schedule.decay=cosin: expected one of cosine | linear | constant | wsd, got 'cosin'; "
      "did you mean 'cosine'?"}},
};

}  // namespace

TEST_CASE("malformed recipes report every problem with its exact position and text") {
  REQUIRE(kBadCases.size() >= 24);
  for (const auto& c : kBadCases) {
    INFO("case: " << c.what << "\n--- yaml ---\n" << c.yaml);
    CHECK(problems_of(c.yaml, c.overrides) == c.expected);
  }
}

TEST_CASE("a missing recipe file is one problem naming the file") {
  std::string path =
      (std::filesystem::temp_directory_path() / "trainctl_no_such_recipe.yaml").string();
  std::filesystem::remove(path);
  try {
    trainctl::recipe::load_recipe(path);
    FAIL("loaded a file that does not exist");
  } catch (const RecipeError& e) {
    REQUIRE(e.problems().size() == 1);
    CHECK(trainctl::recipe::format_problem(e.problems()[0]) ==
          path + ": error: no such file; check the recipe path");
  }
}

TEST_CASE("a directory is not a recipe") {
  auto dir = std::filesystem::temp_directory_path().string();
  try {
    trainctl::recipe::load_recipe(dir);
    FAIL("loaded a directory");
  } catch (const RecipeError& e) {
    REQUIRE(e.problems().size() == 1);
    CHECK(e.problems()[0].message == "is a directory; give the path of a recipe .yaml file");
  }
}

TEST_CASE("problems format as FILE:LINE:COL: error: MESSAGE and what() lists them all") {
  std::string path = write_temp("name: t\ndata: {source: synthetic}\nmodel: {layers: 0}\n");
  try {
    trainctl::recipe::load_recipe(path, {"model.hidden=x"});
    FAIL("no problem reported");
  } catch (const RecipeError& e) {
    CHECK(std::string(e.what()) == path + ":3:17: error: model.layers: must be >= 1, got 0\n" +
                                       "error: --set model.hidden=x: expected an integer, got 'x'");
  }
}

TEST_CASE("a recipe of two YAML documents is refused at the --- that starts the second") {
  CHECK(problems_of(kOk + "---\nname: other\n", {}) ==
        std::vector<std::string>{"3:1: a recipe is one YAML document, and this file holds 2 "
                                 "(separated by ---); keep one recipe per file and remove the "
                                 "others"});
  CHECK(problems_of("---\n" + kOk + "---\n", {}).front().starts_with("4:1: a recipe is one YAML"));
}

TEST_CASE("a FIFO in the recipe's place is refused without waiting for a writer") {
  const auto path = temp_dir() / "fifo.yaml";
  REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  ::alarm(10);  // a regression blocks in open(): fail instead of hanging the suite
  try {
    trainctl::recipe::load_recipe(path.string());
    FAIL("loaded a FIFO");
  } catch (const RecipeError& e) {
    REQUIRE(e.problems().size() == 1);
    CHECK(e.problems()[0].message ==
          "the recipe is a FIFO (named pipe), not a regular file; give a regular file there");
  }
  ::alarm(0);
}

TEST_CASE("a recipe larger than kMaxRecipeBytes is refused before it is parsed") {
  // Valid YAML up to the limit loads; one byte more is refused without parsing (a comment
  // would parse fine, so only the size can be the reason).
  const std::string at_limit =
      kOk + "#" + std::string(trainctl::recipe::kMaxRecipeBytes - kOk.size() - 2, 'x') + "\n";
  CHECK(problems_of(at_limit, {}) == std::vector<std::string>{"(loaded without problems)"});
  CHECK(problems_of(at_limit + "\n", {}) ==
        std::vector<std::string>{"the recipe has 1048577 bytes, more than the 1048576 a recipe "
                                 "may have"});
}

TEST_CASE("YAML nested past the parser's depth is a problem, not a crash") {
  const std::string deep =
      "name: t\nmodel: " + std::string(100000, '[') + std::string(100000, ']') + "\n";
  const std::vector<std::string> problems = problems_of(deep, {});
  REQUIRE(problems.size() == 1);
  CHECK_THAT(problems[0], Catch::Contains("levels deep, more than a parser may follow"));
}

TEST_CASE("data.sources mistakes name the item, the field and the fix") {
  const std::string ok = "name: t\ndata:\n  source: megatron\n";
  CHECK(problems_of(ok + "  sources: [{path: x, wieght: 2}]\n", {}) ==
        std::vector<std::string>{"4:12: data.sources: item 1: unknown field 'wieght' (a dataset "
                                 "has path and weight); did you mean 'weight'?"});
  CHECK(problems_of(ok + "  sources: [{weight: 2}]\n", {}) ==
        std::vector<std::string>{"4:12: data.sources: item 1: a dataset needs a path, like "
                                 "{path: data/a, weight: 0.5}"});
  CHECK(problems_of(ok + "  sources: [{path: x, weight: 0}]\n", {}) ==
        std::vector<std::string>{"4:12: data.sources: item 1: weight must be > 0, got 0"});
  CHECK(problems_of(ok + "  sources: x\n", {}) ==
        std::vector<std::string>{
            "4:12: data.sources: expected a list of datasets like [{path: data/a, weight: 0.7}, "
            "{path: data/b, weight: 0.3}], got 'x'"});
  CHECK(problems_of(ok + "  sources: [/no/such/set]\n", {}) ==
        std::vector<std::string>{
            "4:12: data.sources: '/no/such/set.bin' does not exist (data.source megatron reads "
            "/no/such/set.bin and /no/such/set.idx)"});
  CHECK(problems_of("name: t\ndata:\n  source: synthetic\n  sources: [a]\n", {}) ==
        std::vector<std::string>{
            "4:12: data.sources blends datasets of data.source, and synthetic data has no files; "
            "set data.source (text, llmc, megatron) or remove data.sources"});
}
