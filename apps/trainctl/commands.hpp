// The subcommands of trainctl. main.cpp parses the command line with CLI11 into these plain
// structs and calls the matching run_* function; each lives in its own file and never sees CLI11.
// Every run_* returns the process exit code (see "Exit codes" in README.md).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "prepare/prepare.hpp"
#include "run/session.hpp"

namespace trainctl::app {

// Exit codes shared by all subcommands (documented in README.md; run/session.hpp).
inline constexpr int kExitOk = run::kExitOk;
inline constexpr int kExitFailure = run::kExitFailure;
inline constexpr int kExitBadInput = run::kExitBadInput;
inline constexpr int kExitSavedOnSignal = run::kExitSavedOnSignal;
// The front ends print problems as the run library does.
using run::bad_input;
using run::Exit;
using run::report_problems;

struct ValidateOptions {
  std::string recipe_path;
  std::vector<std::string> overrides;  // "a.b=c" from --set
  bool explain = false;                // print the schema table instead of validating
};
int run_validate(const ValidateOptions& options);

// Fault injection for the stability guard (run::SessionInput::BatchFaults): global batch indices.
struct BatchFaultOptions {
  std::vector<int64_t> nan, spike, drop;
};

struct RunOptions {
  std::string recipe_path;
  std::vector<std::string> overrides;
  std::string run_dir;     // empty: runs/<recipe name>
  bool overwrite = false;  // reuse a run directory that already holds a run
  int ranks = 0;  // parallel: auto plans for this many CPU or GPU ranks here (0: see auto_world)
  int debug_save_delay_ms = 0;  // fault injection: run::SessionInput::debug_save_delay
  std::pair<int, int> debug_slow_rank{-1, 0};  // RANK MS: run::SessionInput::debug_slow_rank
  BatchFaultOptions debug_batches;
};
int run_run(const RunOptions& options);

// `trainctl resume TARGET`: TARGET is a run directory (its recipe.yaml is the resolved recipe
// of the run) or a recipe file (the run directory is then runs/<name> or --run-dir).
struct ResumeOptions {
  std::string target;
  std::vector<std::string> overrides;  // e.g. training.steps to extend a run
  std::string run_dir;
  int debug_save_delay_ms = 0;  // fault injection: run::SessionInput::debug_save_delay
  std::pair<int, int> debug_slow_rank{-1, 0};  // RANK MS: run::SessionInput::debug_slow_rank
  BatchFaultOptions debug_batches;
};
int run_resume(const ResumeOptions& options);

// `trainctl submit RECIPE`: run a recipe as a Slurm batch job (docs/slurm.md).
struct SubmitOptions {
  std::string recipe_path;
  std::vector<std::string> overrides;  // "a.b=c" from --set
  std::string run_dir;                 // empty: runs/<recipe name>
  bool dry_run = false;                // print the batch script; create nothing, submit nothing
  int ranks = 0;  // parallel: auto on CPU nodes: the job's ranks (a multiple of cluster.nodes)
};
// Loads and checks the recipe, writes <run_dir>/submit_recipe.yaml (the resolved recipe) and
// <run_dir>/submit.sbatch, and submits the script with `sbatch --parsable`. Exit codes: 0
// submitted (or printed), 1 sbatch refused the job, 2 bad input or no sbatch (nothing created).
int run_submit(const SubmitOptions& options);

// `trainctl ckpt inspect|verify|export PATH`: PATH is a step directory, a checkpoints directory
// or a run directory (then the newest valid checkpoint for inspect/export, every one for verify).
struct CkptOptions {
  std::string action;  // inspect | verify | export
  std::string path;
  std::string format = "safetensors";  // export
  std::string out;                     // export: output file (hf: folder)
  std::string max_shard_size = "5GB";  // export --format hf
  bool json = false;                   // inspect: machine-readable output
};
int run_ckpt(const CkptOptions& options);

// `trainctl plan RECIPE`: the parallel layouts that fit a cluster, ranked by predicted step time.
struct PlanOptions {
  std::string recipe_path;
  std::vector<std::string> overrides;
  std::string cluster_file;  // empty: detect this machine (or the recipe's cluster.file)
  int nodes = 0;             // 0: from the cluster
  int gpus_per_node = 0;     // 0: from the cluster
  int ranks = 0;             // a CPU-only machine: plan for this many CPU ranks (0: one)
  int top = 5;               // rows of the table
  bool json = false;
  bool show_topology = false;  // print what was detected / read, then exit
  // "tp=8,pp=16,zero=1,...": preview this layout instead of the recipe's own; keys not given
  // take the recipe's values, dp the rest of the cluster's GPUs.
  std::string layout;
  // The pipeline schedule of the previewed layout (else the best), drawn on the planner's stage
  // times: as text after the plan (in the JSON document with --json), and as an SVG page.
  bool timeline = false;
  std::string timeline_svg;
};
int run_plan(const PlanOptions& options);

// `trainctl report RUN_DIR`: RUN_DIR/report.html (or `out`), the run's curves and memory.
struct ReportOptions {
  std::string run_dir;
  std::string out;  // empty: RUN_DIR/report.html
};
int run_report(const ReportOptions& options);

// `trainctl diff RUN_A RUN_B [--json]`: why two runs' numbers differ, most likely cause first,
// and where their losses part. Exit 0 when their losses agree at every common step, 1 when they
// differ (as diff(1)), 2 for bad input.
struct DiffOptions {
  std::string run_a;
  std::string run_b;
  bool json = false;
};
int run_diff(const DiffOptions& options);

// `trainctl data encode --tokenizer PATH [FILE]`: the ids of FILE's text (stdin without FILE) on
// one line, space-separated, no end-of-document token appended; with --json a document that also
// names the tokenizer. For checking a tokenizer by hand and against its own library.
struct DataEncodeOptions {
  std::string tokenizer;  // tokenizer.json, .model, or a folder holding one (tokenize.hpp)
  std::string eod;        // end-of-document token; empty: the tokenizer's default
  std::string file;       // empty: stdin
  bool json = false;
};
int run_data_encode(const DataEncodeOptions& options);

// `trainctl data prepare INPUT... --tokenizer PATH --out PREFIX`: text and JSON Lines files (or
// folders of them; .gz and .zst too) tokenized into a Megatron indexed dataset PREFIX.bin/.idx
// and its sidecar PREFIX.json (lib/prepare). Exit codes: 0 written, 1 a write failed, 2 bad input
// (nothing at PREFIX changed).
struct DataPrepareOptions {
  prepare::PrepareOptions prepare;  // what to read, with which tokenizer, where to write
  std::string progress = "auto";    // auto | plain | none, as logging.progress
};
int run_data_prepare(const DataPrepareOptions& options);

// `trainctl lineage CKPT --seed N | --against CKPT2`: a SeedPrints-style test of whether CKPT's
// model descends from the initialisation of seed N, or shares one with CKPT2's (lib/lineage,
// docs/lineage.md). Exit codes: 0 the test ran (whatever the verdict), 1 a checkpoint is damaged,
// 2 bad input (no checkpoint there, a bad --seed, checkpoints of different models).
struct LineageOptions {
  std::string path;     // step, checkpoints or run directory
  std::string seed;     // as typed (checked by run_lineage, whose message says what to give)
  std::string against;  // another checkpoint (step, checkpoints or run directory)
  bool json = false;
};
int run_lineage(const LineageOptions& options);

struct VersionOptions {};
int run_version(const VersionOptions& options);

}  // namespace trainctl::app
