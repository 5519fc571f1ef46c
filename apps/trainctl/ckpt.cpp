// `trainctl ckpt inspect | verify | export PATH`. PATH is a step directory (has manifest.json), a
// checkpoints directory (has step_* or .tmp-* entries) or a run directory (has checkpoints/).
// inspect and export use the given step, or the newest valid checkpoint (saying which and why any
// newer one was skipped); verify checks the given step or every entry of the directory.
// Exit codes: 0 ok, 1 a checkpoint is bad (the message names the file and tensor), 2 bad input
// (no such path, no checkpoint there, bad --out).
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint_path.hpp"
#include "ckpt/ckpt.hpp"
#include "ckpt/export.hpp"
#include "ckpt/hf.hpp"
#include "commands.hpp"
#include "files/files.hpp"
#include "tokenize/tokenize.hpp"

namespace trainctl::app {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4)
    v /= 1024, ++u;
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

std::string kind_of(const std::string& name) {
  const size_t slash = name.find('/');
  return slash == std::string::npos ? "other" : name.substr(0, slash);
}

// "a=1 b=x" for a flat JSON object (strings without quotes).
std::string key_values(const json& object) {
  std::string out;
  for (const auto& [key, value] : object.items())
    out += fmt::format("{}{}={}", out.empty() ? "" : " ", key,
                       value.is_string() ? value.get<std::string>() : value.dump());
  return out.empty() ? "-" : out;
}

std::string state_line(const json& s) {
  auto get = [&](const json::json_pointer& ptr) {
    return s.contains(ptr) ? s.at(ptr).dump() : std::string("?");
  };
  return fmt::format(
      "step {}, tokens {}, loss scale {}, sampler position {} (epoch {}), optimizer updates {}",
      get("/step"_json_pointer), get("/tokens"_json_pointer),
      get("/loss_scaler/scale"_json_pointer), get("/sampler/position"_json_pointer),
      get("/sampler/epoch"_json_pointer), get("/optimizer_updates"_json_pointer));
}

json summarize(const ckpt::CheckpointReader& reader) {
  const ckpt::Manifest& m = reader.manifest();
  json tensors = json::array(), kinds = json::object(), files = json::object();
  uint64_t total_bytes = 0, file_bytes = 0;
  for (const ckpt::TensorEntry& t : m.tensors) {
    uint64_t bytes = tensor::dtype_size(t.dtype);
    for (int64_t d : t.shape)
      bytes *= static_cast<uint64_t>(d);
    const std::string kind = kind_of(t.name);
    tensors.push_back({{"name", t.name},
                       {"kind", kind},
                       {"dtype", std::string(tensor::dtype_name(t.dtype))},
                       {"shape", t.shape},
                       {"bytes", bytes},
                       {"slices", t.slices.size()}});
    if (!kinds.contains(kind)) kinds[kind] = {{"tensors", 0}, {"bytes", 0}};
    json& k = kinds[kind];
    k["tensors"] = k["tensors"].get<int64_t>() + 1;
    k["bytes"] = k["bytes"].get<uint64_t>() + bytes;
    total_bytes += bytes;
  }
  for (const auto& [name, f] : m.files) {
    files[name] = {{"bytes", f.bytes}, {"crc32c", fmt::format("{:08x}", f.crc32c)}};
    file_bytes += f.bytes;
  }
  return {{"checkpoint", fs::absolute(reader.dir()).lexically_normal().string()},
          {"step", m.header.step},
          {"created", m.created},
          {"recipe_hash", m.header.recipe_hash},
          {"layout", m.header.layout},
          {"model", m.header.model},
          {"state", m.header.state},
          {"provenance", m.header.provenance},  // null: a checkpoint older than provenance.json
          {"files", files},
          {"tensors", tensors},
          {"kinds", kinds},
          {"total",
           {{"tensors", m.tensors.size()}, {"bytes", total_bytes}, {"file_bytes", file_bytes}}}};
}

void print_inspect(const json& s) {
  fmt::print("checkpoint   {}\n", s["checkpoint"].get<std::string>());
  fmt::print("step         {}\n", s["step"].get<int64_t>());
  fmt::print("created      {}\n", s["created"].get<std::string>());
  fmt::print("recipe hash  {}\n", s["recipe_hash"].get<std::string>());
  fmt::print("layout       {}\n", key_values(s["layout"]));
  fmt::print("model        {}\n", key_values(s["model"]));
  fmt::print("state        {}\n", state_line(s["state"]));
  // Which attempt and binary made which steps (docs/provenance.md); the attempt that saved this
  // checkpoint was still running, so its steps end here.
  if (s["provenance"].is_object()) {
    bool first_attempt = true;
    for (const json& a : s["provenance"]["segments"]) {
      const json& last = a["last_step"];
      const json& binary = a["trainctl"];
      fmt::print("{:<12} {} steps {}-{}: trainctl {} {} ({} tree), {}, {} BLAS threads\n",
                 first_attempt ? "made by" : "", a["command"].get<std::string>(),
                 a["first_step"].get<int64_t>(),
                 last.is_number() ? last.get<int64_t>() : s["step"].get<int64_t>(),
                 binary["version"].get<std::string>(),
                 binary["commit"].get<std::string>().substr(0, 12),
                 binary["tree"].get<std::string>(), a["host"]["hostname"].get<std::string>(),
                 a["backend"]["blas_threads"].get<int64_t>());
      first_attempt = false;
    }
  }
  bool first = true;
  for (const auto& [name, f] : s["files"].items()) {
    fmt::print("{:<12} {}  {} bytes ({})  crc32c {}\n", first ? "files" : "", name,
               f["bytes"].get<uint64_t>(), human_bytes(f["bytes"].get<uint64_t>()),
               f["crc32c"].get<std::string>());
    first = false;
  }
  size_t width = 4;
  for (const json& t : s["tensors"])
    width = std::max(width, t["name"].get<std::string>().size());
  std::vector<std::string> order = {"model", "master", "adam_m", "adam_v"};
  for (const auto& [kind, totals] : s["kinds"].items())
    if (std::find(order.begin(), order.end(), kind) == order.end()) order.push_back(kind);
  for (const std::string& kind : order) {
    if (!s["kinds"].contains(kind)) continue;
    const json& k = s["kinds"][kind];
    fmt::print("\n{}: {} tensors, {} bytes ({})\n", kind, k["tensors"].get<int64_t>(),
               k["bytes"].get<uint64_t>(), human_bytes(k["bytes"].get<uint64_t>()));
    fmt::print("  {:<{}}  {:<5} {:<18} {:>12} {:>6}\n", "name", width, "dtype", "shape", "bytes",
               "slices");
    for (const json& t : s["tensors"]) {
      if (t["kind"] != kind) continue;
      fmt::print("  {:<{}}  {:<5} {:<18} {:>12} {:>6}\n", t["name"].get<std::string>(), width,
                 t["dtype"].get<std::string>(),
                 fmt::format("[{}]", fmt::join(t["shape"].get<std::vector<int64_t>>(), ", ")),
                 t["bytes"].get<uint64_t>(), t["slices"].get<size_t>());
    }
  }
  const json& total = s["total"];
  fmt::print("\ntotal: {} tensors, {} bytes ({}) in {} file(s) of {} bytes\n",
             total["tensors"].get<size_t>(), total["bytes"].get<uint64_t>(),
             human_bytes(total["bytes"].get<uint64_t>()), s["files"].size(),
             total["file_bytes"].get<uint64_t>());
}

int inspect(const CkptOptions& options) {
  json why;
  const fs::path step = select_step(resolve_checkpoint_path(options.path), &why);
  const ckpt::CheckpointReader reader = ckpt::CheckpointReader::open(step);
  json summary = summarize(reader);
  if (options.json) {
    if (!why.is_null()) summary["selection"] = why;
    fmt::print("{}\n", summary.dump(2));
  } else {
    print_inspect(summary);
  }
  return kExitOk;
}

// Verifies one step directory; prints one line; true when valid.
bool verify_step(const fs::path& dir) {
  const std::string name = dir.filename().string();
  std::error_code ec;
  if (!fs::exists(dir / ckpt::kManifestFile, ec)) {
    fmt::print("PARTIAL {}: partial (an interrupted save; never loaded): no manifest.json\n", name);
    return false;
  }
  try {
    const ckpt::CheckpointReader reader = ckpt::CheckpointReader::open(dir);
    const auto named = ckpt::parse_step_dir_name(name);
    if (named && *named != reader.step())
      throw ckpt::CheckpointError(fmt::format("{} says step {} but the directory is {}",
                                              (dir / ckpt::kManifestFile).string(), reader.step(),
                                              name));
    reader.verify();
    uint64_t bytes = 0;
    for (const auto& [file, entry] : reader.manifest().files)
      bytes += entry.bytes;
    fmt::print("OK {}: {} tensors, {} bytes verified\n", name, reader.manifest().tensors.size(),
               bytes);
    return true;
  } catch (const ckpt::CheckpointError& e) {
    fmt::print("CORRUPT {}: {}\n", name, e.what());
    return false;
  }
}

int verify(const CkptOptions& options) {
  const CheckpointTarget target = resolve_checkpoint_path(options.path);
  if (target.single_step) return verify_step(target.dir) ? kExitOk : kExitFailure;
  const ckpt::ScanReport report = ckpt::scan(target.dir);
  std::map<ckpt::Status, int> counts;
  for (const ckpt::ScanEntry& e : report.entries) {
    ckpt::Status status = e.status;
    if (status == ckpt::Status::partial)
      fmt::print("PARTIAL {}: partial (an interrupted save; never loaded)\n", e.name);
    else if (status == ckpt::Status::corrupt)
      fmt::print("CORRUPT {}: {}\n", e.name, e.reason);
    else if (!verify_step(e.path))
      status = ckpt::Status::corrupt;
    ++counts[status];
  }
  const int bad = counts[ckpt::Status::corrupt] + counts[ckpt::Status::partial];
  fmt::print("{}: {} entries: {} valid, {} corrupt, {} partial\n", target.dir.string(),
             report.entries.size(), counts[ckpt::Status::valid], counts[ckpt::Status::corrupt],
             counts[ckpt::Status::partial]);
  return bad ? kExitFailure : kExitOk;
}

// "5GB", "500MB", "64KiB", "1000": bytes (KB/MB/GB decimal as Hugging Face's max_shard_size,
// KiB/MiB/GiB binary).
uint64_t parse_shard_size(const std::string& text) {
  static const std::map<std::string, uint64_t> units = {{"", 1},
                                                        {"B", 1},
                                                        {"KB", 1000},
                                                        {"MB", 1000'000},
                                                        {"GB", 1000'000'000},
                                                        {"KiB", 1ULL << 10},
                                                        {"MiB", 1ULL << 20},
                                                        {"GiB", 1ULL << 30}};
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits])))
    ++digits;
  const auto unit = units.find(text.substr(digits));
  if (digits == 0 || digits > 12 || unit == units.end() ||
      std::stoull(text.substr(0, digits)) == 0 ||
      std::stoull(text.substr(0, digits)) > std::numeric_limits<uint64_t>::max() / unit->second)
    throw BadInput(fmt::format(
        "--max-shard-size {}: not a size; write a positive number with an optional unit (B, KB, "
        "MB, GB, KiB, MiB, GiB), e.g. 5GB",
        text));
  return std::stoull(text.substr(0, digits)) * unit->second;
}

// The tokenizer the run's data was made with, when data.json (in the run directory above the
// step) records one and the file is still there with the recorded SHA-256; otherwise why not.
std::optional<ckpt::HfTokenizer> recorded_tokenizer(const fs::path& step, std::string& why);

std::optional<ckpt::HfTokenizer> run_tokenizer(const fs::path& step, std::string& why) {
  try {
    return recorded_tokenizer(step, why);
  } catch (const nlohmann::json::exception& e) {
    why = fmt::format("no tokenizer written: {}/data.json is not what trainctl writes: {}",
                      step.parent_path().parent_path().string(), e.what());
    return std::nullopt;
  }
}

std::optional<ckpt::HfTokenizer> recorded_tokenizer(const fs::path& step, std::string& why) {
  const fs::path run_dir = step.parent_path().parent_path();
  const fs::path record = run_dir / "data.json";
  std::error_code ec;
  if (step.parent_path().filename() != "checkpoints" || !fs::exists(record, ec)) {
    why = fmt::format("no tokenizer written: {} is not there to say which made the data",
                      record.string());
    return std::nullopt;
  }
  json data;
  try {
    data = json::parse(files::read_regular_file(record, 64ULL << 20, "data record"));
  } catch (const std::exception& e) {
    why = fmt::format("no tokenizer written: {}: {}", record.string(), e.what());
    return std::nullopt;
  }
  std::optional<json> found;
  for (const json& part : data.value("datasets", json::array())) {
    if (!part.contains("tokenizer")) {
      why = fmt::format(
          "no tokenizer written: {} records none for {} (byte-level or pre-made "
          "data)",
          record.string(), part.value("source", "a dataset"));
      return std::nullopt;
    }
    if (found && (*found)["sha256"] != part["tokenizer"]["sha256"]) {
      why = fmt::format(
          "no tokenizer written: the datasets of {} were made by different "
          "tokenizers",
          record.string());
      return std::nullopt;
    }
    found = part["tokenizer"];
  }
  if (!found) {
    why = fmt::format("no tokenizer written: {} lists no dataset", record.string());
    return std::nullopt;
  }
  const std::string path = found->value("path", "");
  if (!fs::is_regular_file(path, ec) || tokenize::sha256_file(path) != found->value("sha256", "")) {
    why = fmt::format(
        "no tokenizer written: {} (recorded in {}) is {}; copy the tokenizer into the folder "
        "by hand",
        path, record.string(),
        fs::is_regular_file(path, ec) ? "no longer the file the data was made with (its SHA-256 "
                                        "differs)"
                                      : "not there any more");
    return std::nullopt;
  }
  why.clear();
  return ckpt::HfTokenizer{path, found->value("kind", ""), found->value("eod_id", -1),
                           found->value("eod_token", "")};
}

int export_hf(const CkptOptions& options, const fs::path& out) {
  std::error_code ec;
  if (fs::exists(out, ec) && !(fs::is_directory(out, ec) && fs::is_empty(out, ec)))
    throw BadInput(fmt::format(
        "--out {}: exists; a Hugging Face export writes a new folder (name one that does not "
        "exist, or remove it first)",
        options.out));
  ckpt::HfExportOptions hf;
  hf.max_shard_bytes = parse_shard_size(options.max_shard_size);
  const fs::path step = select_step(resolve_checkpoint_path(options.path), nullptr);
  std::string why;
  hf.tokenizer = run_tokenizer(step, why);
  const ckpt::CheckpointReader reader = ckpt::CheckpointReader::open(step);
  ckpt::HfExportResult result;
  try {
    result = ckpt::export_hf(reader, out, hf);
  } catch (const ckpt::HfRefused& e) {
    throw BadInput(e.what());
  }
  fmt::print("exported {} (step {}) to {} for transformers.{}\n", step.filename().string(),
             reader.step(), result.dir.string(), result.architecture);
  fmt::print("naming {}: {} tensors, {} bytes ({}) of weights; files: {}\n",
             ckpt::naming_name(result.plan.naming), result.plan.tensors.size(), result.bytes,
             human_bytes(result.bytes), fmt::join(result.files, ", "));
  if (!why.empty()) fmt::print("note: {}\n", why);
  return kExitOk;
}

int export_weights(const CkptOptions& options) {
  if (options.format != "safetensors" && options.format != "hf")
    throw BadInput(fmt::format(
        "--format {}: unknown; use safetensors (one file) or hf (a Hugging Face model folder)",
        options.format));
  if (options.out.empty()) throw BadInput("--out: name the file or folder to write");
  const fs::path out(options.out);
  std::error_code ec;
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec))
    throw BadInput(fmt::format("--out {}: the folder {} does not exist; create it first",
                               options.out, parent.string()));
  if (options.format == "hf") return export_hf(options, out);
  if (fs::is_directory(out, ec))
    throw BadInput(fmt::format("--out {}: is a directory; name the file to write", options.out));
  const fs::path step = select_step(resolve_checkpoint_path(options.path), nullptr);
  const ckpt::CheckpointReader reader = ckpt::CheckpointReader::open(step);
  const ckpt::ExportResult result = ckpt::export_safetensors(reader, out);
  fmt::print("exported {} (step {}) to {}\n", step.filename().string(), reader.step(),
             result.file.string());
  fmt::print("naming {}: {} tensors, {} bytes ({}) of weights, file {} bytes\n",
             ckpt::naming_name(result.plan.naming), result.plan.tensors.size(), result.bytes,
             human_bytes(result.bytes), fs::file_size(out, ec));
  for (const std::string& note : result.plan.notes)
    fmt::print("note: {}\n", note);
  return kExitOk;
}

}  // namespace

int run_ckpt(const CkptOptions& options) {
  const std::string where = "trainctl ckpt " + options.action;
  try {
    if (options.action == "inspect") return inspect(options);
    if (options.action == "verify") return verify(options);
    if (options.action == "export") return export_weights(options);
    throw BadInput("unknown action '" + options.action + "': use inspect, verify or export");
  } catch (const BadInput& e) {
    fmt::print(stderr, "{}: error: {}\n", where, e.what());
    return kExitBadInput;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: error: {}\n", where, e.what());
    return kExitFailure;
  }
}

}  // namespace trainctl::app
