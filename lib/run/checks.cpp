// The checks before anything is created (session.hpp), and the data.
#include <fmt/core.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include "comm/error.hpp"
#include "files/files.hpp"
#include "launch/store_address.hpp"
#include "run/context.hpp"
#include "run/provenance.hpp"
#include "train/checkpointing.hpp"

namespace fs = std::filesystem;

namespace trainctl::run {

int report_problems(const std::vector<recipe::Problem>& problems, const std::string& label) {
  std::fputs(recipe::format_report(problems, label).c_str(), stderr);
  return kExitBadInput;
}

int bad_input(const std::string& command, const std::string& message) {
  std::fprintf(stderr, "trainctl %s: error: %s\n", command.c_str(), message.c_str());
  return kExitBadInput;
}

std::vector<recipe::Problem> unsupported_in_this_build(const recipe::LoadedRecipe& loaded) {
  const recipe::Recipe& r = loaded.recipe;
  std::vector<recipe::Problem> problems;
  if (r.cluster.device == recipe::Device::cuda) {
    const backend::DeviceReport devices = backend::detect_gpus();
    if (!devices.cuda_compiled)
      problems.push_back(loaded.origins.problem(
          "cluster.device",
          "this build has no CUDA (no nvcc when it was configured); use cluster.device: auto or "
          "cpu, or rebuild where the CUDA toolkit is installed"));
    else if (devices.gpus.empty())
      problems.push_back(loaded.origins.problem(
          "cluster.device",
          "this machine has no usable GPU (`trainctl version` says why); use "
          "cluster.device: auto or cpu"));
  }
  return problems;
}

bool uses_tcp_store(bool shared_fs, const launch::RankInfo& rank) {
  if (rank.source == launch::RankSource::torchrun) return rank.external_tcp_store;
  return !shared_fs;
}

comm::TcpStoreServerOptions store_server_options() {
  comm::TcpStoreServerOptions options;
  options.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  return options;
}

namespace {

// The job's secret from the environment; CommError (usage) naming the variable and the fix.
comm::StoreSecret job_store_secret() {
  const char* text = std::getenv(launch::kEnvStoreSecret);
  const std::string fix = fmt::format(
      "trainctl submit's batch script sets it for each job; in a batch script of your own, "
      "before srun: export {}=\"$(od -An -tx1 -N32 /dev/urandom | tr -d ' \\n')\"",
      launch::kEnvStoreSecret);
  if (text == nullptr || *text == '\0')
    throw comm::CommError(
        comm::CommError::Kind::usage,
        fmt::format("{} is not set: without a shared file system (cluster.shared_fs: false) the "
                    "ranks meet through rank 0's TCP store, which lets in only the ranks that "
                    "hold the job's secret; {}",
                    launch::kEnvStoreSecret, fix),
        "store.secret");
  try {
    return comm::StoreSecret::from_hex(text);
  } catch (const comm::CommError& error) {
    throw comm::CommError(comm::CommError::Kind::usage,
                          fmt::format("{}: {}; {}", launch::kEnvStoreSecret, error.what(), fix),
                          "store.secret");
  }
}

}  // namespace

Exit check_rank_environment(SessionInput& input, const std::string& command) {
  try {
    input.rank = launch::rank_info_from_environment();
  } catch (const launch::RankEnvError& e) {
    return bad_input(command, e.what());
  }
  const recipe::Recipe& r = input.loaded.recipe;
  if (input.rank.world_size > 1 && uses_tcp_store(r.cluster.shared_fs, input.rank)) {
    try {
      input.store_secret = job_store_secret();
      if (input.rank.source == launch::RankSource::torchrun)
        launch::external_store_address([](const char* name) { return std::getenv(name); });
    } catch (const comm::CommError& e) {
      return bad_input(command, e.what());
    } catch (const launch::RankEnvError& e) {
      return bad_input(command, e.what());
    }
  }
  if (input.rank.launched() && input.rank.world_size != r.world_size())
    return bad_input(
        command,
        fmt::format("{} started {} rank{} but the recipe's layout needs {}; start {} ranks, or "
                    "change the parallel degrees (or run without a launcher: trainctl starts the "
                    "ranks itself)",
                    launch::rank_source_name(input.rank.source), input.rank.world_size,
                    input.rank.world_size == 1 ? "" : "s", r.parallel.world_formula(),
                    r.world_size()));
  // NCCL puts each rank of a group on its own GPU ("duplicate GPU" otherwise). The ranks trainctl
  // starts itself all run here; a launcher's ranks are checked by the GPU their local rank gets.
  if (r.cluster.device == recipe::Device::cuda && !input.rank.launched() && r.world_size() > 1) {
    const size_t gpus = backend::detect_gpus().gpus.size();
    if (gpus < static_cast<size_t>(r.world_size()))
      return report_problems(
          {input.loaded.origins.problem(
              "cluster.device",
              fmt::format("cuda with {} ranks ({}) needs one GPU per rank, and this machine has "
                          "{}; lower the parallel degrees, run on more GPUs (Slurm: trainctl "
                          "submit), or use cluster.device: cpu",
                          r.world_size(), r.parallel.degrees(), gpus))},
          input.recipe_label);
  }
  return std::nullopt;
}

namespace {

// The key a data error is about: the validation file when the error names it, data.sources for
// a blend, else data.path.
std::string_view data_error_key(const recipe::Recipe& r, const std::string& message) {
  const std::string& val = r.data.val_path;
  if (!val.empty() && val != r.data.path && message.starts_with(val + ":")) return "data.val_path";
  return r.data.sources.empty() ? "data.path" : "data.sources";
}

// A dataset that names its tokenizer (data prepare's sidecar) and a model too small for it: the
// ids may all fit today, but the data was made for a larger vocabulary.
std::string tokenizer_problem(const data::TokenSource& source, int32_t vocab) {
  const data::TokenizerInfo* tokenizer = source.tokenizer();
  if (tokenizer == nullptr || tokenizer->vocab_size <= vocab) return "";
  return fmt::format(
      "{} was made by a tokenizer of {} ids ({} {}, recorded in its sidecar), more than "
      "model.vocab {}; set model.vocab to at least {} (a multiple of 128 is faster on GPUs)",
      source.describe(), tokenizer->vocab_size, tokenizer->kind, tokenizer->path, vocab,
      tokenizer->vocab_size);
}

// Whether two FILE streams write to the same file (a rank whose stderr the launcher sends to its
// external launcher (srun, torchrun) every rank opens the data itself, so each reads its 1/W part:
// the job reads the data once, not W times (a rank that finds one exits 2, and srun stops the
// others). Our own launcher has read it all before starting its ranks, which read nothing here.
// The same read digests the tokens (`digest`: of this rank's part; nullopt for data without
// files). A rank's part is whole digest chunks, so the parts' digests add up to the whole's.
std::string vocab_problem(const data::TokenSource& source, int32_t vocab, const char* key,
                          const launch::RankInfo& rank, std::optional<uint64_t>& digest) {
  const int64_t size = source.size();
  const int parts = std::max(1, rank.world_size);
  const int part = rank.launched() ? rank.rank : 0;
  const auto boundary = [&](int p) {
    return std::min(size, (size / parts * p) / data::kDigestChunk * data::kDigestChunk);
  };
  const int64_t begin = rank.launched() ? boundary(part) : 0;
  const int64_t end = rank.launched() && part + 1 < parts ? boundary(part + 1) : size;
  const data::VocabScan scan = data::scan_vocab(source, vocab, begin, end);
  if (!source.files().empty()) digest = scan.digest;
  if (scan.first_outside < 0) return "";
  return fmt::format(
      "{}: token id {} is outside model.vocab {} (ids must be in [0, {})), and the largest id in "
      "{} is {}; set model.vocab to at least {}, or point {} at data tokenized for this model",
      source.where(scan.first_outside), scan.first_outside_id, vocab, vocab,
      parts > 1 && rank.launched()
          ? fmt::format("part {} of {} of {} (the part this rank checks)", part + 1, parts, key)
          : std::string(key),
      scan.max_id, scan.max_id + 1, key);
}

std::string format_digest(const std::optional<uint64_t>& digest) {
  return digest ? fmt::format("{:016x}", *digest) : "-";
}

std::optional<uint64_t> parse_digest(const std::string& text) {
  if (text == "-" || text.empty()) return std::nullopt;
  return std::stoull(text, nullptr, 16);
}

// format_data_digests' text back; a missing or malformed one (a rank started by hand with our
// launcher's variables) gives no digests rather than wrong ones.
std::vector<PartDigests> parse_data_digests(const char* text) {
  std::vector<PartDigests> out;
  if (text == nullptr) return out;
  try {
    std::string rest = text;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string item = rest.substr(0, comma);
      rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
      const size_t colon = item.find(':');
      if (colon == std::string::npos) return {};
      out.push_back({parse_digest(item.substr(0, colon)), parse_digest(item.substr(colon + 1))});
    }
  } catch (const std::exception&) {
    return {};
  }
  return out;
}

}  // namespace

std::string format_data_digests(const std::vector<PartDigests>& digests) {
  std::string text;
  for (const PartDigests& d : digests) {
    if (!text.empty()) text += ',';
    text += fmt::format("{}:{}", format_digest(d.train), format_digest(d.val));
  }
  return text;
}

Exit open_session_data(const SessionInput& input, SessionData& out) {
  const recipe::Recipe& r = input.loaded.recipe;
  try {
    out.dataset = data::open_dataset(
        r.data, {.seed = static_cast<uint64_t>(r.determinism.seed), .vocab_size = r.model.vocab});
    // Every id is checked once here, not at the step that happens to read it.
    const char* train_key = r.data.sources.empty() ? "data.path" : "data.sources";
    const char* val_key = r.data.val_path.empty() ? train_key : "data.val_path";
    // The ranks our own launcher starts read nothing: it has read it all, and passes them its
    // digests.
    const bool launcher_read = input.rank.source == launch::RankSource::trainctl;
    if (launcher_read) out.digests = parse_data_digests(std::getenv(kEnvDataDigests));
    out.partial_digests = !launcher_read && input.rank.launched() && input.rank.world_size > 1;
    for (size_t i = 0; i < out.dataset.parts.size() && !launcher_read; ++i) {
      const data::DatasetPart& part = out.dataset.parts[i];
      PartDigests& digests = out.digests.emplace_back();
      std::string p = tokenizer_problem(*part.train, r.model.vocab);
      if (p.empty())
        p = vocab_problem(*part.train, r.model.vocab, train_key, input.rank, digests.train);
      if (p.empty() && part.val)
        p = vocab_problem(*part.val, r.model.vocab, val_key, input.rank, digests.val);
      if (!p.empty())
        return report_problems({input.loaded.origins.problem("model.vocab", p)},
                               input.recipe_label);
    }
    out.sampler.emplace(out.dataset.train_parts(), r.model.seq_len,
                        static_cast<uint64_t>(r.determinism.seed), true, r.model.vocab);
    // Validation needs a window in every part of a blend.
    std::vector<data::SamplerPart> val_parts = out.dataset.val_parts();
    const bool val_fits =
        !val_parts.empty() &&
        std::all_of(val_parts.begin(), val_parts.end(), [&](const data::SamplerPart& part) {
          return part.source->size() > r.model.seq_len;
        });
    if (val_fits) {
      out.val.emplace(std::move(val_parts), r.model.seq_len, r.model.vocab);
      if (out.val->num_batches(r.training.micro_batch) < 1) out.val.reset();
    }
  } catch (const data::DataError& e) {
    return report_problems({input.loaded.origins.problem(data_error_key(r, e.what()), e.what())},
                           input.recipe_label);
  }
  return std::nullopt;
}

Exit check_session_input(SessionInput& input, const std::string& command) {
  const fs::path& dir = input.run_dir;
  if (std::string why = files::why_not_writable_directory(dir); !why.empty())
    return bad_input(command, fmt::format("the run directory {} cannot hold the run's files: {}; "
                                          "choose another with --run-dir",
                                          dir.string(), why));
  const recipe::CheckpointConfig& tiers = input.loaded.recipe.checkpoint;
  if (!tiers.local_dir.empty())
    if (std::string why = files::why_not_writable_directory(tiers.local_dir); !why.empty())
      return report_problems(
          {input.loaded.origins.problem(
              "checkpoint.local_dir",
              fmt::format("checkpoint.local_dir {} cannot hold the local-disk tier: {}; choose a "
                          "writable node-local folder",
                          tiers.local_dir, why))},
          input.recipe_label);
  if (tiers.memory_every_steps > 0)
    if (std::string why = files::why_not_writable_directory("/dev/shm"); !why.empty())
      return report_problems(
          {input.loaded.origins.problem(
              "checkpoint.memory_every_steps",
              fmt::format("checkpoint.memory_every_steps writes the memory tier to /dev/shm, "
                          "which cannot hold it here: {}; set checkpoint.memory_every_steps: 0",
                          why))},
          input.recipe_label);
  // The run's own files, where an earlier run left them, must be what trainctl writes there: a
  // FIFO in metrics.jsonl's place would block the first write forever.
  for (const char* name : {"logs", "checkpoints"}) {
    struct stat st {};
    if (::lstat((dir / name).c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
      return bad_input(command,
                       fmt::format("{} is {}, not a directory; remove it or choose "
                                   "another run directory",
                                   (dir / name).string(), files::file_type_name(st.st_mode)));
  }
  std::vector<fs::path> own_files;
  for (const char* name : {"recipe.yaml", "data.json", kProvenanceFile, "metrics.jsonl",
                           "summary.json", files::kRunLockFile})
    own_files.push_back(dir / name);
  std::error_code ec;
  if (fs::is_directory(dir / "logs", ec))
    for (const fs::directory_entry& entry : fs::directory_iterator(dir / "logs", ec))
      own_files.push_back(entry.path());  // rank logs are appended to
  for (const fs::path& path : own_files) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      return bad_input(command, fmt::format("{} is {}, not a regular file; remove it or choose "
                                            "another run directory",
                                            path.string(), files::file_type_name(st.st_mode)));
  }
  // model.init_from: every tensor of the model there with its shape, before anything is made
  // (the recipe already took the source's model keys; resuming reads the checkpoint instead).
  const model::ModelConfig& model = input.loaded.recipe.model;
  if (!input.resuming && !model.init_from.empty()) {
    try {
      ckpt::WeightSource::open(model.init_from)->bind(train::weights_wanted(model));
    } catch (const ckpt::CheckpointError& e) {
      return report_problems({input.loaded.origins.problem("model.init_from", e.what())},
                             input.recipe_label);
    }
  }
  auto data = std::make_shared<SessionData>();
  if (Exit end = open_session_data(input, *data)) return end;
  input.data = std::move(data);
  return std::nullopt;
}

void remove_previous_run(const fs::path& run_dir) {
  if (!fs::is_directory(run_dir)) return;
  for (const char* name : {"recipe.yaml", "data.json", kProvenanceFile, "metrics.jsonl",
                           "summary.json", "logs", "checkpoints"})
    fs::remove_all(run_dir / name);
  for (const fs::directory_entry& entry : fs::directory_iterator(run_dir))
    if (entry.path().filename().string().starts_with("events.out.tfevents."))
      fs::remove(entry.path());
}

bool owns_run_dir(const launch::RankInfo& rank) {
  return !rank.launched() || (rank.source != launch::RankSource::trainctl && rank.rank == 0);
}

Exit lock_run_dir(SessionInput& input, const std::string& command, files::RunDirLock& lock) {
  const launch::RankInfo& rank = input.rank;
  if (!owns_run_dir(rank)) return std::nullopt;
  try {
    lock = files::RunDirLock::acquire(input.run_dir);
  } catch (const files::RunDirBusy& e) {
    return bad_input(command, e.what());
  } catch (const files::FileError& e) {
    return bad_input(command,
                     fmt::format("{}; choose another run directory with --run-dir", e.what()));
  }
  if (lock.takeover_note()) {
    // The ranks our launcher starts print the notes they find themselves; this one only the
    // launcher knows.
    if (!rank.launched() && input.loaded.recipe.world_size() > 1)
      std::fprintf(stderr, "trainctl %s: %s\n", command.c_str(), lock.takeover_note()->c_str());
    else
      input.notes.push_back(*lock.takeover_note());
  }
  return std::nullopt;
}

}  // namespace trainctl::run
