#include "run/provenance.hpp"

#include <cblas.h>
#include <fmt/core.h>
#include <gnu/libc-version.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "backend/cuda/device.hpp"
#include "comm/nccl_communicator.hpp"
#include "files/files.hpp"
#include "run/build_info.hpp"
#include "run/summary.hpp"

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

namespace trainctl::run {

namespace {

// /proc/cpuinfo's first "model name" (x86) or "Model"/"CPU part" elsewhere; "unknown" if none.
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("model name") && !line.starts_with("Model")) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    if (start != std::string::npos) return line.substr(start);
  }
  return "unknown";
}

ordered_json host_json() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  utsname os{};
  ::uname(&os);
  return {{"hostname", name},
          {"os", fmt::format("{} {}", os.sysname, os.release)},
          {"cpu", cpu_model()},
          {"cpu_threads", std::thread::hardware_concurrency()}};
}

ordered_json binary_json() {
  const BuildInfo& b = build_info();
  return {{"version", b.version},
          {"commit", b.commit},
          {"tree", b.tree},
          {"build_type", b.build_type},
          {"compiler", fmt::format("gcc {}.{}.{}", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__)}};
}

// The libraries whose results the run's numbers depend on: OpenBLAS (GEMMs; its build and core
// type choose the kernels), glibc (libm: exp, log, tanh), libstdc++; on GPUs CUDA, cuBLASLt, NCCL.
ordered_json libraries_json(bool cuda) {
  ordered_json j = {{"openblas", openblas_get_config()},
                    {"glibc", gnu_get_libc_version()},
                    {"libstdc++", std::to_string(__GLIBCXX__)}};
  if (cuda) {
    for (const auto& [name, version] : backend::cuda_library_versions())
      j[name] = version;
    j["nccl"] = comm::nccl_version();
  }
  return j;
}

ordered_json backend_json(RunContext& run) {
  ordered_json j = {{"device", run.on_cuda() ? "cuda" : "cpu"},
                    {"blas_threads", openblas_get_num_threads()}};
  if (run.on_cuda()) j["gpus"] = backend::detect_gpus().status;
  return j;
}

ordered_json environment_json() {
  ordered_json j = ordered_json::object();
  for (const char* name : kResultEnvironment)
    if (const char* value = std::getenv(name)) j[name] = value;
  return j;
}

ordered_json digest_json(const std::optional<uint64_t>& digest) {
  return digest ? ordered_json(fmt::format("{:016x}", *digest)) : ordered_json(nullptr);
}

std::string absolute(const std::string& path) {
  return fs::absolute(path).lexically_normal().string();
}

// Each dataset part: what it is, its files, its tokens and their digests, its tokenizer.
ordered_json data_json(const SessionData& data) {
  ordered_json parts = ordered_json::array();
  for (size_t i = 0; i < data.dataset.parts.size(); ++i) {
    const data::DatasetPart& part = data.dataset.parts[i];
    ordered_json files = ordered_json::array();
    for (const data::SourceFile& f : part.train->files())
      files.push_back({{"path", absolute(f.path)}, {"bytes", f.bytes}});
    if (part.val)  // a validation file of its own (a holdout split reads the training files)
      for (const data::SourceFile& f : part.val->files())
        if (std::none_of(files.begin(), files.end(), [&](const ordered_json& seen) {
              return seen["path"] == absolute(f.path);
            }))
          files.push_back({{"path", absolute(f.path)}, {"bytes", f.bytes}});
    const PartDigests digests = i < data.digests.size() ? data.digests[i] : PartDigests{};
    ordered_json j = {{"source", part.train->describe()},
                      {"weight", part.weight},
                      {"files", std::move(files)},
                      {"train_tokens", part.train->size()},
                      {"train_digest", digest_json(digests.train)},
                      {"val_tokens", part.val ? part.val->size() : 0},
                      {"val_digest", digest_json(digests.val)}};
    if (const data::TokenizerInfo* t = part.train->tokenizer()) j["tokenizer_sha256"] = t->sha256;
    parts.push_back(std::move(j));
  }
  return parts;
}

}  // namespace

void complete_data_digests(SessionData& data, comm::Communicator& world) {
  if (!data.partial_digests) return;
  // Every rank holds the same parts; a digest absent on one (data without files) is on none.
  std::vector<uint64_t> mine;
  for (const PartDigests& d : data.digests)
    for (const std::optional<uint64_t>& value : {d.train, d.val})
      mine.push_back(value.value_or(0));
  std::vector<uint64_t> all(mine.size() * static_cast<size_t>(world.size()));
  if (!mine.empty()) world.all_gather(mine.data(), all.data(), mine.size() * sizeof(uint64_t));
  for (size_t i = 0; i < mine.size(); ++i) {
    uint64_t sum = 0;
    for (int r = 0; r < world.size(); ++r)
      sum += all[static_cast<size_t>(r) * mine.size() + i];
    PartDigests& d = data.digests[i / 2];
    std::optional<uint64_t>& value = i % 2 == 0 ? d.train : d.val;
    if (value) value = sum;
  }
  data.partial_digests = false;
}

ordered_json provenance_segment(const SessionInput& input, RunContext& run,
                                const std::string& command) {
  const recipe::Recipe& r = input.loaded.recipe;
  ordered_json segment = {{"command", command},
                          {"started", files::utc_timestamp()},
                          {"first_step", run.start_step() + 1},
                          {"last_step", nullptr},
                          {"outcome", nullptr},
                          {"trainctl", binary_json()},
                          {"libraries", libraries_json(run.on_cuda())},
                          {"host", host_json()},
                          {"backend", backend_json(run)},
                          {"environment", environment_json()},
                          {"recipe_hash", run.recipe_hash()},
                          {"seed", r.determinism.seed},
                          {"layout", layout_json(r)}};
  if (input.data && !input.data->partial_digests) segment["data"] = data_json(*input.data);
  return segment;
}

Provenance::Provenance(const SessionInput& input, RunContext& run, const std::string& command)
    : path_(input.run_dir / kProvenanceFile) {
  if (!run.leader()) return;
  ordered_json segments = ordered_json::array();
  std::string earlier;  // what became of the earlier attempts' record
  if (input.resuming) {
    try {
      std::ifstream in(path_);
      if (!in) throw std::runtime_error("there is none: an older trainctl made them");
      const ordered_json old = ordered_json::parse(in);
      if (old.value("version", 0) != kProvenanceVersion || !old.at("segments").is_array())
        throw std::runtime_error("another version");
      segments = old.at("segments");
      // An attempt without an end was killed: its steps up to the checkpoint this attempt starts
      // from are the run's. Steps after that checkpoint are made again by this attempt, so no
      // earlier attempt keeps them.
      const int64_t start = run.start_step();
      for (ordered_json& s : segments) {
        if (s["last_step"].is_null()) {
          s["last_step"] = start;
          s["outcome"] = "killed";
        }
        const int64_t first = s.at("first_step").get<int64_t>();
        s["last_step"] = std::max(first - 1, std::min(s["last_step"].get<int64_t>(), start));
      }
    } catch (const std::exception& e) {  // a missing, foreign or damaged record: start over
      segments = ordered_json::array();
      earlier = fmt::format("the earlier attempts are not recorded ({})", e.what());
    }
  }
  ordered_json segment = provenance_segment(input, run, command);
  if (!earlier.empty()) segment["note"] = earlier;
  segments.push_back(std::move(segment));
  json_ = {{"format", "trainctl-provenance"},
           {"version", kProvenanceVersion},
           {"segments", std::move(segments)}};
  write();
}

std::string Provenance::finish(int64_t last_step, std::string_view outcome) {
  if (json_.is_null()) return "";
  ordered_json& segment = json_["segments"].back();
  // An attempt that made no step ends where it started.
  segment["last_step"] = std::max(last_step, segment["first_step"].get<int64_t>() - 1);
  segment["outcome"] = outcome;
  try {
    write();
  } catch (const files::FileError& e) {
    return fmt::format("provenance.json: not updated with this attempt's end ({})", e.what());
  }
  return "";
}

void Provenance::write() const {
  files::write_file_atomically(path_, json_.dump(2) + "\n");
}

}  // namespace trainctl::run
