// trainctl: parse the command line (the only file that includes CLI11), then hand a plain options
// struct to the subcommand's own file. Phases: build the CLI, parse, dispatch.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <limits>
#include <string>

#include "ckpt/ckpt.hpp"
#include "commands.hpp"
#include "files/files.hpp"

namespace app = trainctl::app;

namespace {

// Diagnostic fault injection for tests of signals and crashes during a save (docs/reliability.md).
void add_debug_save_delay(CLI::App* command, int& milliseconds) {
  command
      ->add_option("--debug-save-delay-ms", milliseconds,
                   "Diagnostic: sleep MS after each tensor a checkpoint save writes (slows every "
                   "save; for testing signals and crashes during a save)")
      ->type_name("MS")
      ->check(CLI::Range(0, 60000))
      ->group("Diagnostics");
}

// Diagnostic fault injection for the straggler tests (lib/run/straggler.hpp).
void add_debug_slow_rank(CLI::App* command, std::pair<int, int>& slow) {
  command
      ->add_option("--debug-slow-rank", slow,
                   "Diagnostic: rank RANK sleeps MS milliseconds in every step's compute (a "
                   "straggler; for testing the straggler report)")
      ->type_name("RANK MS")
      ->check(CLI::Range(0, 60000))
      ->group("Diagnostics");
}

// Diagnostic fault injection for the stability guard's tests (lib/train/stability.hpp).
void add_debug_batches(CLI::App* command, app::BatchFaultOptions& faults) {
  const auto add = [&](const char* name, std::vector<int64_t>& batches, const char* what) {
    command->add_option(name, batches, what)
        ->type_name("BATCH[,BATCH...]")
        ->delimiter(',')
        ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()))
        ->group("Diagnostics");
  };
  add("--debug-nan-batch", faults.nan,
      "Diagnostic: data rank 0's gradients of these global batches (1-based, in data order) "
      "become NaN (for testing the stability guard)");
  add("--debug-spike-batch", faults.spike,
      "Diagnostic: the loss and gradients of these global batches are multiplied by 100 (a loss "
      "spike, for testing the stability guard)");
  add("--debug-drop-batch", faults.drop,
      "Diagnostic: these global batches are passed over as if the data did not hold them (the "
      "run the stability guard's skips must equal)");
}

// --tokenizer and --eod, as data encode and data prepare both take them (lib/tokenize's
// load_tokenizer reads them).
void add_tokenizer_options(CLI::App* command, std::string& tokenizer, std::string& eod) {
  command
      ->add_option("--tokenizer", tokenizer,
                   "A Hugging Face tokenizer.json (byte-level BPE), a SentencePiece .model, or a "
                   "folder holding one")
      ->required()
      ->type_name("PATH");
  command
      ->add_option("--eod", eod,
                   "End-of-document token (default: tokenizer_config.json's eos_token, else "
                   "<|endoftext|>, <|end_of_text|> or </s>; SentencePiece: its eos piece)")
      ->type_name("TOKEN");
}

// The end of a subcommand's --help: two or three examples, then the pages to read.
void add_examples(CLI::App* command, std::initializer_list<const char*> examples,
                  const char* read) {
  std::string footer = "\nExamples:\n";
  for (const char* example : examples)
    footer += std::string("  ") + example + "\n";
  footer += std::string("\nRead: ") + read;
  command->footer(footer);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"trainctl: train GPT/Llama-style transformers (dense and MoE) from one YAML recipe",
               "trainctl"};
  cli.require_subcommand(0, 1);
  bool show_version = false;
  cli.add_flag("--version", show_version, "Print the version and build facts, then exit");

  app::RunOptions run;
  CLI::App* run_cmd = cli.add_subcommand("run", "Train the model a recipe describes");
  run_cmd->add_option("recipe", run.recipe_path, "Recipe YAML file")->required();
  run_cmd->add_option("--set", run.overrides, "Override a recipe key: --set model.layers=2")
      ->type_name("KEY=VALUE");
  run_cmd->add_option("--run-dir", run.run_dir, "Run directory (default: runs/<recipe name>)");
  run_cmd->add_flag("--overwrite", run.overwrite,
                    "Reuse a run directory that already holds a run (its files are replaced)");
  run_cmd
      ->add_option("--ranks", run.ranks,
                   "parallel: auto plans for this many ranks on this machine (CPU ranks, or one "
                   "per GPU), which trainctl then starts")
      ->check(CLI::Range(1, 4096));
  add_debug_save_delay(run_cmd, run.debug_save_delay_ms);
  add_debug_slow_rank(run_cmd, run.debug_slow_rank);
  add_debug_batches(run_cmd, run.debug_batches);
  add_examples(run_cmd,
               {"trainctl run recipes/tiny.yaml",
                "trainctl run recipes/tiny.yaml --set training.steps=50 --run-dir runs/quick",
                "trainctl run recipes/tiny.yaml --set parallel=auto --ranks 2"},
               "docs/recipe.md (every key), README.md (the run directory, exit codes)");

  app::ValidateOptions validate;
  CLI::App* validate_cmd =
      cli.add_subcommand("validate", "Check a recipe and print it resolved, or every problem");
  validate_cmd->add_option("recipe", validate.recipe_path, "Recipe YAML file");
  validate_cmd->add_option("--set", validate.overrides, "Override a recipe key")
      ->type_name("KEY=VALUE");
  validate_cmd->add_flag("--explain", validate.explain,
                         "Print every recipe key with its type, default, range and help");
  add_examples(validate_cmd,
               {"trainctl validate recipes/tiny.yaml",
                "trainctl validate recipes/llama3-8b.yaml --set training.micro_batch=2",
                "trainctl validate --explain"},
               "docs/recipe.md (every key and rule)");

  app::ResumeOptions resume;
  CLI::App* resume_cmd =
      cli.add_subcommand("resume", "Continue a run from its newest valid checkpoint (bit for bit)");
  resume_cmd->add_option("target", resume.target, "Run directory, or the recipe file of the run")
      ->required();
  resume_cmd
      ->add_option("--set", resume.overrides,
                   "Override a recipe key, e.g. --set training.steps=400 to extend the run")
      ->type_name("KEY=VALUE");
  resume_cmd->add_option("--run-dir", resume.run_dir,
                         "Run directory when TARGET is a recipe (default: runs/<recipe name>)");
  add_debug_save_delay(resume_cmd, resume.debug_save_delay_ms);
  add_debug_slow_rank(resume_cmd, resume.debug_slow_rank);
  add_debug_batches(resume_cmd, resume.debug_batches);
  add_examples(resume_cmd,
               {"trainctl resume runs/tiny", "trainctl resume runs/tiny --set training.steps=400",
                "trainctl resume recipes/tiny.yaml --run-dir runs/tiny"},
               "docs/checkpoints.md (what a checkpoint holds, resuming on another layout)");

  app::CkptOptions ckpt;
  CLI::App* ckpt_cmd = cli.add_subcommand("ckpt", "Inspect, verify or export checkpoints");
  ckpt_cmd->require_subcommand(1);
  CLI::App* inspect_cmd = ckpt_cmd->add_subcommand(
      "inspect", "Print a checkpoint's step, layout, tensors, sizes and training state");
  inspect_cmd->add_option("path", ckpt.path, "Step, checkpoints or run directory")->required();
  inspect_cmd->add_flag("--json", ckpt.json, "Print the manifest summary as JSON");
  CLI::App* verify_cmd = ckpt_cmd->add_subcommand(
      "verify", "Re-read every byte and check every checksum; non-zero exit names what is bad");
  verify_cmd->add_option("path", ckpt.path, "Step, checkpoints or run directory")->required();
  CLI::App* export_cmd = ckpt_cmd->add_subcommand(
      "export", "Write the model weights with Hugging Face's names and layout");
  export_cmd->add_option("path", ckpt.path, "Step, checkpoints or run directory")->required();
  export_cmd
      ->add_option("--format", ckpt.format,
                   "safetensors: one file; hf: a folder transformers' from_pretrained loads "
                   "(config.json, weights, tokenizer)")
      ->check(CLI::IsMember({"safetensors", "hf"}));
  export_cmd->add_option("--out", ckpt.out, "Output file (hf: a new folder)")->required();
  export_cmd->add_option("--max-shard-size", ckpt.max_shard_size,
                         "hf: split the weights into files of at most this size (5GB, 500MB, "
                         "64KiB) with model.safetensors.index.json");
  add_examples(ckpt_cmd,
               {"trainctl ckpt inspect runs/tiny",
                "trainctl ckpt verify runs/tiny/checkpoints/step_00000200",
                "trainctl ckpt export runs/tiny --out tiny.safetensors"},
               "docs/checkpoints.md");
  add_examples(inspect_cmd,
               {"trainctl ckpt inspect runs/tiny",
                "trainctl ckpt inspect runs/tiny/checkpoints/step_00000200 --json"},
               "docs/checkpoints.md (the manifest)");
  add_examples(verify_cmd,
               {"trainctl ckpt verify runs/tiny", "trainctl ckpt verify runs/tiny/checkpoints"},
               "docs/checkpoints.md (checksums)");
  add_examples(
      export_cmd,
      {"trainctl ckpt export runs/tiny --out tiny.safetensors",
       "trainctl ckpt export runs/tiny --format hf --out tiny-hf",
       "trainctl ckpt export runs/tiny/checkpoints/step_00000200 --out step200.safetensors"},
      "docs/checkpoints.md (the Hugging Face names)");

  app::LineageOptions lineage;
  CLI::App* lineage_cmd = cli.add_subcommand(
      "lineage", "Test whether a model descends from seed N's initialisation, with a p-value");
  lineage_cmd->add_option("checkpoint", lineage.path, "Step, checkpoints or run directory")
      ->required();
  CLI::Option* lineage_seed =
      lineage_cmd
          ->add_option("--seed", lineage.seed,
                       "The determinism.seed whose initialisation to test the model against")
          ->type_name("N");
  lineage_cmd
      ->add_option("--against", lineage.against,
                   "Instead: test whether two checkpoints share an initialisation")
      ->type_name("CKPT")
      ->excludes(lineage_seed);
  lineage_cmd->add_flag("--json", lineage.json, "Print the result as a JSON document");
  add_examples(lineage_cmd,
               {"trainctl lineage runs/tiny --seed 1234",
                "trainctl lineage runs/finetuned --against runs/tiny --json"},
               "docs/lineage.md (the statistic, and how well it separates)");

  app::PlanOptions plan;
  CLI::App* plan_cmd = cli.add_subcommand(
      "plan", "Rank the parallel layouts that fit a cluster, with memory, speed and why");
  plan_cmd->add_option("recipe", plan.recipe_path, "Recipe YAML file");
  plan_cmd->add_option("--set", plan.overrides, "Override a recipe key")->type_name("KEY=VALUE");
  plan_cmd->add_option("--cluster", plan.cluster_file,
                       "Cluster description file (default: the recipe's cluster.file, else "
                       "this machine)");
  plan_cmd->add_option("--nodes", plan.nodes, "Override the number of nodes")
      ->check(CLI::PositiveNumber);
  plan_cmd->add_option("--gpus-per-node", plan.gpus_per_node, "Override GPUs per node")
      ->check(CLI::PositiveNumber);
  plan_cmd
      ->add_option("--ranks", plan.ranks,
                   "No GPU here: plan for this many CPU ranks of this machine (run --ranks)")
      ->check(CLI::Range(1, 4096));
  plan_cmd->add_option("--top", plan.top, "How many layouts to show")->check(CLI::PositiveNumber);
  plan_cmd->add_flag("--json", plan.json, "Print the plan as a stable JSON document");
  plan_cmd
      ->add_option("--layout", plan.layout,
                   "Score this layout first instead of the recipe's own (keys tp, pp, dp, ep, "
                   "cp, zero, sp, mb, recompute, v (interleaved chunks per rank) and schedule "
                   "(1f1b, interleaved or zb-h1); the others from the recipe, dp the remaining "
                   "GPUs)")
      ->type_name("tp=8,pp=2,...");
  plan_cmd->add_flag("--timeline", plan.timeline,
                     "Draw the pipeline schedule of the previewed layout (else the best) on the "
                     "planner's stage times, with its bubble");
  plan_cmd
      ->add_option("--timeline-svg", plan.timeline_svg,
                   "Write that schedule as an SVG page for a browser")
      ->type_name("FILE");
  plan_cmd->add_flag("--show-topology", plan.show_topology,
                     "Print the detected (or described) topology and exit");
  add_examples(plan_cmd,
               {"trainctl plan recipes/llama3-70b.yaml",
                "trainctl plan recipes/tiny.yaml --cluster configs/clusters/dgx-h100.yaml "
                "--nodes 4 --top 5",
                "trainctl plan recipes/llama3-70b.yaml --layout tp=8,pp=4,zero=1,mb=1 --json"},
               "docs/planner.md (the models), docs/topology.md (cluster files)");

  app::SubmitOptions submit;
  CLI::App* submit_cmd = cli.add_subcommand(
      "submit", "Submit a recipe as a Slurm batch job that saves, requeues and resumes itself");
  submit_cmd->add_option("recipe", submit.recipe_path, "Recipe YAML file")->required();
  submit_cmd->add_option("--set", submit.overrides, "Override a recipe key")
      ->type_name("KEY=VALUE");
  submit_cmd->add_option("--run-dir", submit.run_dir,
                         "Run directory (default: runs/<recipe name>)");
  submit_cmd->add_flag("--dry-run", submit.dry_run,
                       "Print the batch script; create and submit nothing");
  submit_cmd
      ->add_option("--ranks", submit.ranks,
                   "parallel: auto on CPU nodes: plan for this many ranks over cluster.nodes "
                   "(GPU nodes: cluster.nodes x cluster.gpus_per_node)")
      ->check(CLI::Range(1, 1 << 24));
  add_examples(submit_cmd,
               {"trainctl submit recipes/llama3-8b.yaml --dry-run",
                "trainctl submit recipes/gpt2-124m.yaml --set slurm.partition=gpu "
                "--set slurm.time=24:00:00"},
               "docs/slurm.md");

  app::DiffOptions diff;
  CLI::App* diff_cmd = cli.add_subcommand(
      "diff",
      "Say why two runs' losses differ (recipe, seed, data, layout, threads, binary, "
      "hardware) and where they part, or that they should be identical and whether they are");
  diff_cmd->add_option("run_a", diff.run_a, "A run directory")->required();
  diff_cmd->add_option("run_b", diff.run_b, "Another run directory")->required();
  diff_cmd->add_flag("--json", diff.json, "Print the comparison as JSON");
  add_examples(diff_cmd,
               {"trainctl diff runs/tiny runs/tiny-dp2", "trainctl diff runs/a runs/b --json"},
               "docs/provenance.md");

  app::ReportOptions report;
  CLI::App* report_cmd = cli.add_subcommand(
      "report", "Draw a run's loss, learning rate, throughput and memory as one HTML page");
  report_cmd->add_option("run_dir", report.run_dir, "Run directory")->required();
  report_cmd->add_option("--out", report.out, "Output file (default: RUN_DIR/report.html)");
  add_examples(report_cmd,
               {"trainctl report runs/tiny", "trainctl report runs/tiny --out /tmp/tiny.html"},
               "README.md (the run directory)");

  // `data`: a group of data commands (encode, prepare).
  CLI::App* data_cmd = cli.add_subcommand("data", "Tokenize text and prepare training data");
  data_cmd->require_subcommand(1);
  app::DataEncodeOptions data_encode;
  CLI::App* data_encode_cmd = data_cmd->add_subcommand(
      "encode", "Print a tokenizer's ids for a text file (stdin without FILE), one line");
  add_tokenizer_options(data_encode_cmd, data_encode.tokenizer, data_encode.eod);
  data_encode_cmd->add_option("file", data_encode.file, "Text file (default: stdin)");
  data_encode_cmd->add_flag("--json", data_encode.json,
                            "Print a JSON document with the tokenizer's facts and the ids");
  add_examples(data_encode_cmd,
               {"trainctl data encode --tokenizer models/llama3/tokenizer.json data/kjv.txt",
                "trainctl data encode --tokenizer models/mistral/tokenizer.model --json notes.txt",
                "trainctl data encode --tokenizer models/qwen2 --eod '<|im_end|>' notes.txt"},
               "docs/data.md (tokenizers: what is supported)");
  app::DataPrepareOptions data_prepare;
  CLI::App* data_prepare_cmd = data_cmd->add_subcommand(
      "prepare", "Tokenize text or JSON Lines into a Megatron .bin/.idx dataset, in parallel");
  data_prepare_cmd
      ->add_option("inputs", data_prepare.prepare.inputs,
                   "Files or folders: .txt (a document per file), .jsonl/.json (a document per "
                   "line), each optionally .gz or .zst")
      ->required();
  add_tokenizer_options(data_prepare_cmd, data_prepare.prepare.tokenizer, data_prepare.prepare.eod);
  data_prepare_cmd
      ->add_option("--out", data_prepare.prepare.out,
                   "Dataset prefix: writes PREFIX.bin, PREFIX.idx and PREFIX.json")
      ->required()
      ->type_name("PREFIX");
  data_prepare_cmd->add_option("--jsonl-key", data_prepare.prepare.jsonl_key,
                               "The JSON field holding each line's text (default: text)");
  data_prepare_cmd
      ->add_option("--workers", data_prepare.prepare.workers,
                   "Tokenizing threads (default 0: one per hardware thread)")
      ->check(CLI::NonNegativeNumber);
  data_prepare_cmd->add_flag("--overwrite", data_prepare.prepare.overwrite,
                             "Replace a dataset already at PREFIX");
  data_prepare_cmd
      ->add_option("--progress", data_prepare.progress,
                   "auto (a live line on a terminal), plain (a line every 10 s) or none")
      ->check(CLI::IsMember({"auto", "plain", "none"}));
  add_examples(data_prepare_cmd,
               {"trainctl data prepare corpus/ --tokenizer models/gpt2 --out data/corpus",
                "trainctl data prepare web.jsonl.zst --tokenizer llama3/tokenizer.json --out "
                "data/web --jsonl-key content --workers 16"},
               "docs/data.md (formats, the sidecar, training on the dataset)");
  add_examples(data_cmd,
               {"trainctl data prepare corpus/ --tokenizer models/gpt2 --out data/corpus",
                "trainctl data encode --tokenizer models/gpt2 data/kjv.txt",
                "trainctl data encode --tokenizer tokenizer.model --json notes.txt"},
               "docs/data.md");

  app::VersionOptions version;
  CLI::App* version_cmd =
      cli.add_subcommand("version", "Print the version, build type, backends and libraries");
  add_examples(version_cmd, {"trainctl version", "trainctl --version"},
               "README.md, docs/cuda.md (the CUDA backend)");

  // A checkpoint write past RLIMIT_FSIZE must fail with EFBIG (reported, earlier checkpoints
  // intact), not kill the process with SIGXFSZ.
  trainctl::ckpt::ignore_file_size_signal();
  // One descriptor per data shard stays open (lib/data reads with pread): use the hard limit.
  trainctl::files::raise_open_file_limit();
  try {
    cli.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return cli.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return cli.exit(e);
  } catch (const CLI::ParseError& e) {
    // The subcommand that was being parsed names the error, as every other trainctl error does.
    std::string where = "trainctl";
    for (const CLI::App* sub : cli.get_subcommands())
      where += " " + sub->get_name();
    std::fprintf(stderr, "%s: error: %s\nRun '%s --help' for usage.\n", where.c_str(), e.what(),
                 where.c_str());
    return app::kExitBadInput;
  }

  try {
    if (show_version || version_cmd->parsed()) return app::run_version(version);
    if (submit_cmd->parsed()) return app::run_submit(submit);
    if (run_cmd->parsed()) return app::run_run(run);
    if (resume_cmd->parsed()) return app::run_resume(resume);
    if (plan_cmd->parsed()) return app::run_plan(plan);
    if (report_cmd->parsed()) return app::run_report(report);
    if (diff_cmd->parsed()) return app::run_diff(diff);
    if (lineage_cmd->parsed()) return app::run_lineage(lineage);
    if (data_encode_cmd->parsed()) return app::run_data_encode(data_encode);
    if (data_prepare_cmd->parsed()) return app::run_data_prepare(data_prepare);
    if (ckpt_cmd->parsed()) {
      ckpt.action = inspect_cmd->parsed() ? "inspect" : verify_cmd->parsed() ? "verify" : "export";
      return app::run_ckpt(ckpt);
    }
    if (validate_cmd->parsed()) {
      if (!validate.explain && validate.recipe_path.empty()) {
        std::fprintf(stderr, "trainctl validate: a recipe file is required (or --explain)\n");
        return app::kExitBadInput;
      }
      return app::run_validate(validate);
    }
    std::fputs(cli.help().c_str(), stdout);
    return app::kExitOk;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainctl: error: %s\n", e.what());
    return app::kExitFailure;
  }
}
