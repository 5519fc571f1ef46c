// `trainctl run RECIPE`: validate everything that can be wrong with the input before anything
// touches the disk, then build the backend, model and data, create the run directory, train, and
// report. Phases: input -> build -> run directory -> train -> summary.
#include <fmt/core.h>
#include <fmt/os.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cuda/device.hpp"
#include "commands.hpp"
#include "convert.hpp"
#include "data/data.hpp"
#include "data/sampler.hpp"
#include "model/model.hpp"
#include "recipe/recipe.hpp"
#include "telemetry/telemetry.hpp"
#include "train/trainer.hpp"

namespace fs = std::filesystem;

namespace trainctl::app {

namespace {

// Bad input found after loading, in the same form as the recipe's own problems: exit code 2.
int report_problems(const std::vector<recipe::Problem>& problems, const std::string& file) {
  std::fputs(recipe::format_report(problems, file).c_str(), stderr);
  return kExitBadInput;
}

// What this build cannot run, located at the key the user set: more than one rank (at the first
// parallel degree > 1, in rank order), checkpoints, and the CUDA device.
std::vector<recipe::Problem> unsupported_in_this_build(const recipe::LoadedRecipe& loaded) {
  const recipe::Recipe& r = loaded.recipe;
  std::vector<recipe::Problem> problems;
  if (r.world_size() != 1) {
    const std::pair<const char*, int> degrees[] = {{"parallel.tp", r.parallel.tp},
                                                   {"parallel.ep", r.parallel.ep},
                                                   {"parallel.dp", r.parallel.dp},
                                                   {"parallel.pp", r.parallel.pp}};
    const char* key = "parallel.tp";
    for (auto [name, degree] : degrees) {
      if (degree > 1) {
        key = name;
        break;
      }
    }
    problems.push_back(loaded.origins.problem(
        key,
        fmt::format("world size tp*ep*dp*pp = {}*{}*{}*{} = {} but this build trains on one "
                    "rank; set every parallel degree to 1",
                    r.parallel.tp, r.parallel.ep, r.parallel.dp, r.parallel.pp, r.world_size())));
  }
  // Saving is the checkpoint issue's work: refuse rather than train for hours without the saves
  // the recipe asks for.
  const char* no_checkpoints =
      "checkpointing is not part of this build yet; set checkpoint.every_steps: 0, "
      "checkpoint.every_minutes: 0 and checkpoint.resume: never";
  if (r.checkpoint.every_steps > 0)
    problems.push_back(loaded.origins.problem("checkpoint.every_steps", no_checkpoints));
  if (r.checkpoint.every_minutes > 0)
    problems.push_back(loaded.origins.problem("checkpoint.every_minutes", no_checkpoints));
  if (r.checkpoint.resume != recipe::Resume::never)
    problems.push_back(loaded.origins.problem("checkpoint.resume", no_checkpoints));
  if (r.cluster.device == recipe::Device::cuda)
    problems.push_back(loaded.origins.problem(
        "cluster.device",
        "the CUDA training backend is not part of this build yet; use cluster.device: auto or "
        "cpu"));
  return problems;
}

// The key a data error is about: the validation file when the error names it, else data.path.
std::string_view data_error_key(const recipe::Recipe& r, const std::string& message) {
  const std::string& val = r.data.val_path;
  if (!val.empty() && val != r.data.path && message.starts_with(val + ":")) return "data.val_path";
  return "data.path";
}

int bad_input(const std::string& message) {
  std::fprintf(stderr, "trainctl run: error: %s\n", message.c_str());
  return kExitBadInput;
}

telemetry::ProgressMode progress_mode(recipe::Progress p) {
  switch (p) {
    case recipe::Progress::automatic:
      return telemetry::ProgressMode::automatic;
    case recipe::Progress::plain:
      return telemetry::ProgressMode::plain;
    case recipe::Progress::none:
      return telemetry::ProgressMode::none;
  }
  return telemetry::ProgressMode::plain;
}

// FNV-1a over the bytes of the parameter values: a cheap fingerprint two runs can compare.
std::string weights_fingerprint(backend::Backend& be, const model::ParamStore& params) {
  const tensor::Tensor values = params.values();
  std::vector<unsigned char> host(values.bytes());
  be.copy_to_host(host.data(), values);
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : host)
    h = (h ^ c) * 0x100000001b3ull;
  return fmt::format("{:016x}", h);
}

nlohmann::json metrics_record(const train::StepMetrics& m, bool fp16, bool moe) {
  nlohmann::json j{{"step", m.step},      {"loss", m.loss},
                   {"lr", m.lr},          {"grad_norm", m.grad_norm},
                   {"tokens", m.tokens},  {"tokens_per_s", m.tokens_per_s},
                   {"step_ms", m.step_ms}};
  if (fp16) {
    j["loss_scale"] = m.loss_scale;
    j["skipped"] = m.skipped;
  }
  if (moe) {
    j["aux_loss"] = m.aux_loss;
    j["z_loss"] = m.z_loss;
    j["expert_load"] = m.expert_load;
    j["dropped_tokens"] = m.dropped_tokens;
  }
  if (m.val_loss) j["val_loss"] = *m.val_loss;
  return j;
}

// --overwrite: the files of the earlier run go, so metrics.jsonl and TensorBoard show only the new
// run. Anything else the user keeps in the directory is left alone.
void remove_previous_run(const fs::path& run_dir) {
  if (!fs::is_directory(run_dir)) return;
  for (const char* name : {"recipe.yaml", "metrics.jsonl", "summary.json", "logs"})
    fs::remove_all(run_dir / name);
  for (const fs::directory_entry& entry : fs::directory_iterator(run_dir))
    if (entry.path().filename().string().starts_with("events.out.tfevents."))
      fs::remove(entry.path());
}

}  // namespace

int run_run(const RunOptions& options) {
  // ---- 1. input: every check that can fail on bad input happens before the disk is touched ----
  recipe::LoadedRecipe loaded;
  try {
    loaded = recipe::load_recipe_with_origins(options.recipe_path, options.overrides);
  } catch (const recipe::RecipeError& e) {
    return report_problems(e.problems(), options.recipe_path);
  }
  const recipe::Recipe& r = loaded.recipe;
  if (auto problems = unsupported_in_this_build(loaded); !problems.empty())
    return report_problems(problems, options.recipe_path);
  const backend::DeviceReport devices = backend::detect_gpus();
  const std::string device_line =
      devices.gpus.empty()
          ? fmt::format("device: {}, using CPU", devices.status)
          : fmt::format("device: {}; the CUDA training backend is not available yet, using CPU",
                        devices.status);

  data::Dataset dataset;
  std::optional<data::Sampler> sampler;
  std::optional<data::ValidationSet> val;
  try {
    dataset = data::open_dataset(to_data_config(r));
    sampler.emplace(*dataset.train, r.model.seq_len, static_cast<uint64_t>(r.determinism.seed),
                    true, r.model.vocab);
    if (dataset.val && dataset.val->size() > r.model.seq_len) {
      val.emplace(*dataset.val, r.model.seq_len, r.model.vocab);
      if (val->num_batches(r.training.micro_batch) < 1) val.reset();
    }
  } catch (const data::DataError& e) {
    return report_problems({loaded.origins.problem(data_error_key(r, e.what()), e.what())},
                           options.recipe_path);
  }

  const fs::path run_dir =
      options.run_dir.empty() ? fs::path("runs") / r.name : fs::path(options.run_dir);
  if (fs::exists(run_dir / "metrics.jsonl") && !options.overwrite)
    return bad_input(fmt::format(
        "run directory {} already holds a run (metrics.jsonl); choose another with --run-dir or "
        "pass --overwrite to replace it",
        run_dir.string()));

  // ---- 2. build ----
  std::unique_ptr<backend::Backend> be = backend::make_cpu_backend();
  const model::ModelConfig model_config = to_model_config(r);
  model::Transformer model(model_config, *be, r.training.micro_batch);
  model.params().initialize(static_cast<uint64_t>(r.determinism.seed));
  const train::TrainConfig train_config = to_train_config(r);
  train::Trainer trainer(train_config, model, *be, *sampler, val ? &*val : nullptr);

  // ---- 3. run directory ----
  if (options.overwrite) remove_previous_run(run_dir);
  fs::create_directories(run_dir / "logs");
  {
    std::ofstream out(run_dir / "recipe.yaml");
    out << "# resolved recipe (hash " << recipe::recipe_hash(r) << ")\n" << recipe::dump_recipe(r);
  }
  telemetry::MetricsWriter metrics(run_dir / "metrics.jsonl");
  std::optional<telemetry::TensorBoardWriter> tensorboard;
  if (r.logging.tensorboard) tensorboard.emplace(run_dir);
  std::FILE* log_file = std::fopen((run_dir / "logs" / "rank_0.log").c_str(), "w");
  if (!log_file) throw std::runtime_error("cannot write " + (run_dir / "logs/rank_0.log").string());
  telemetry::Progress progress(r.training.steps, progress_mode(r.logging.progress), stderr,
                               r.logging.every_steps);
  telemetry::Progress log(r.training.steps, telemetry::ProgressMode::plain, log_file,
                          r.logging.every_steps, false);
  auto say = [&](const std::string& line) {
    progress.message(line);
    log.message(line);
  };
  say(device_line);
  say(fmt::format("model: {} ({} parameters, {})", model::describe(model_config),
                  telemetry::format_count(static_cast<uint64_t>(model.params().table().numel())),
                  tensor::dtype_name(model_config.storage)));
  say(fmt::format(
      "data: {} train tokens ({}), {} validation tokens",
      telemetry::format_count(static_cast<uint64_t>(dataset.train->size())),
      dataset.train->describe(),
      telemetry::format_count(static_cast<uint64_t>(dataset.val ? dataset.val->size() : 0))));
  say(fmt::format("run directory: {}", run_dir.string()));

  // ---- 4. train ----
  const bool fp16 = model_config.storage == tensor::DType::f16;
  const bool moe = model_config.moe.experts > 0;
  const auto start = std::chrono::steady_clock::now();
  std::optional<double> last_val;
  train::StepMetrics last;
  int64_t skipped = 0;
  trainer.run([&](const train::StepMetrics& m) {
    metrics.write(metrics_record(m, fp16, moe));
    telemetry::StepInfo info{m.step,         m.loss,    m.lr,
                             m.tokens_per_s, m.step_ms, {{"grad_norm", m.grad_norm}}};
    if (fp16) info.extras.push_back({"scale", m.loss_scale});
    if (m.val_loss) info.extras.push_back({"val_loss", *m.val_loss});
    progress.update(info);
    log.update(info);
    if (tensorboard) {
      std::vector<std::pair<std::string, double>> scalars{{"train/loss", m.loss},
                                                          {"train/lr", m.lr},
                                                          {"train/grad_norm", m.grad_norm},
                                                          {"perf/tokens_per_s", m.tokens_per_s}};
      if (fp16) scalars.push_back({"train/loss_scale", m.loss_scale});
      if (moe) {
        scalars.push_back({"moe/aux_loss", m.aux_loss});
        scalars.push_back({"moe/z_loss", m.z_loss});
      }
      if (m.val_loss) scalars.push_back({"val/loss", *m.val_loss});
      tensorboard->add_scalars(m.step, scalars);
    }
    if (m.skipped) {
      ++skipped;
      say(fmt::format("step {}: non-finite gradients, step skipped, loss scale now {}", m.step,
                      trainer.loss_scaler().scale()));
    }
    if (m.val_loss) last_val = m.val_loss;
    last = m;
    return true;
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  progress.finish();
  if (tensorboard) tensorboard->flush();

  // ---- 5. summary ----
  const model::ParamStore::Bytes pb = model.params().bytes();
  telemetry::MemoryReport memory;
  memory.params = pb.params;
  memory.grads = pb.grads;
  memory.optimizer = pb.optimizer;
  memory.activations = model.activation_bytes().total();
  const double tokens_per_s = static_cast<double>(last.tokens) / seconds;
  const std::string fingerprint = weights_fingerprint(*be, model.params());
  nlohmann::json summary{{"steps", last.step},
                         {"final_loss", last.loss},
                         {"tokens", last.tokens},
                         {"seconds", seconds},
                         {"tokens_per_s", tokens_per_s},
                         {"skipped_steps", skipped},
                         {"weights_fnv1a64", fingerprint},
                         {"memory_bytes", memory.to_json()},
                         {"forward_flops_per_token", model.forward_flops_per_token()}};
  if (last_val) summary["final_val_loss"] = *last_val;
  std::ofstream(run_dir / "summary.json") << summary.dump(2) << "\n";

  say(fmt::format("done: {} steps in {} | loss {:.4f}{} | {} tokens/s | weights {}", last.step,
                  telemetry::format_duration(seconds), last.loss,
                  last_val ? fmt::format(" | val_loss {:.4f}", *last_val) : std::string(),
                  telemetry::format_count(static_cast<uint64_t>(tokens_per_s)), fingerprint));
  say("peak memory by category:\n" + memory.to_string());
  std::fclose(log_file);
  return kExitOk;
}

}  // namespace trainctl::app
