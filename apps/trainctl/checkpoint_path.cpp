#include "checkpoint_path.hpp"

#include <fmt/core.h>

#include "ckpt/ckpt.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace trainctl::app {

namespace {

bool is_checkpoint_name(const std::string& name) {
  return ckpt::parse_step_dir_name(name).has_value() || name.starts_with(".tmp-step_");
}

}  // namespace

CheckpointTarget resolve_checkpoint_path(const std::string& path) {
  std::error_code ec;
  fs::path p(path);
  if (path.empty() || !fs::exists(p, ec))
    throw BadInput(fmt::format("{}: no such file or directory; {}", path, kCheckpointPathHelp));
  if (p.filename() == ckpt::kManifestFile) p = p.parent_path();
  if (!fs::is_directory(p, ec))
    throw BadInput(fmt::format("{}: not a directory; {}", path, kCheckpointPathHelp));
  if (fs::exists(p / ckpt::kManifestFile, ec) || is_checkpoint_name(p.filename().string()))
    return {true, p};
  if (fs::is_directory(p / "checkpoints", ec)) p = p / "checkpoints";
  for (const auto& entry : fs::directory_iterator(p, ec))
    if (is_checkpoint_name(entry.path().filename().string())) return {false, p};
  throw BadInput(
      fmt::format("{}: holds no checkpoint (no manifest.json, step_* directory or "
                  "checkpoints/ folder); {}",
                  path, kCheckpointPathHelp));
}

fs::path select_step(const CheckpointTarget& target, json* why) {
  if (target.single_step) return target.dir;
  const ckpt::ScanReport report = ckpt::scan(target.dir);
  const ckpt::ScanEntry* chosen = report.newest_valid();
  json skipped = json::array();
  for (const ckpt::ScanEntry& e : report.entries) {
    if (&e == chosen) break;
    fmt::print(stderr, "skipped {}: {}: {}\n", e.name, ckpt::status_name(e.status), e.reason);
    skipped.push_back({{"name", e.name},
                       {"status", std::string(ckpt::status_name(e.status))},
                       {"reason", e.reason}});
  }
  if (!chosen)
    throw ckpt::CheckpointError(fmt::format(
        "{}: no valid checkpoint among its {} entries (see the skipped lines above); run "
        "`trainctl ckpt verify {}` for details",
        target.dir.string(), report.entries.size(), target.dir.string()));
  fmt::print(stderr, "using {}: the newest valid checkpoint in {}\n", chosen->name,
             target.dir.string());
  if (why) *why = {{"selected", chosen->name}, {"skipped", skipped}};
  return chosen->path;
}

}  // namespace trainctl::app
