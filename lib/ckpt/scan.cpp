#include "ckpt/scan.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "ckpt/file_io.hpp"
#include "ckpt/reader.hpp"

namespace trainctl::ckpt {

namespace {

// ".tmp-step_00000042.1234" -> 42
std::optional<int64_t> parse_tmp_name(std::string_view name) {
  constexpr std::string_view prefix = ".tmp-";
  if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
  name.remove_prefix(prefix.size());
  const size_t dot = name.rfind('.');
  return parse_step_dir_name(name.substr(0, dot));
}

ScanEntry examine_step_dir(const fs::path& path, int64_t step, Verify verify) {
  ScanEntry entry{path.filename().string(), path, step, Status::valid, ""};
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    entry.status = Status::corrupt;
    entry.reason = "not a directory";
    return entry;
  }
  if (!fs::exists(path / kManifestFile, ec)) {
    entry.status = Status::partial;
    entry.reason = "no manifest.json (a save that never finished)";
    return entry;
  }
  try {
    const CheckpointReader reader = CheckpointReader::open(path);
    if (reader.step() != step)
      throw CheckpointError(fmt::format("{} says step {} but the directory is {}",
                                        (path / kManifestFile).string(), reader.step(),
                                        entry.name));
    if (verify == Verify::full) reader.verify();
  } catch (const std::exception& e) {
    entry.status = Status::corrupt;
    entry.reason = e.what();
  }
  return entry;
}

}  // namespace

std::string_view status_name(Status status) {
  switch (status) {
    case Status::valid:
      return "valid";
    case Status::partial:
      return "partial";
    case Status::corrupt:
      return "corrupt";
  }
  return "unknown";
}

const ScanEntry* ScanReport::newest_valid() const {
  for (const ScanEntry& e : entries)
    if (e.status == Status::valid) return &e;
  return nullptr;
}

ScanReport scan(const fs::path& checkpoints_dir, Verify verify) {
  ScanReport report;
  report.dir = checkpoints_dir;
  std::error_code ec;
  fs::directory_iterator it(checkpoints_dir, ec);
  if (ec) return report;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    if (const auto step = parse_step_dir_name(name)) {
      report.entries.push_back(examine_step_dir(it->path(), *step, verify));
    } else if (const auto tmp_step = parse_tmp_name(name)) {
      report.entries.push_back({name, it->path(), *tmp_step, Status::partial,
                                "temporary directory of a save that has not committed (in "
                                "progress in another process, or interrupted)"});
    }
  }
  std::sort(report.entries.begin(), report.entries.end(),
            [](const ScanEntry& a, const ScanEntry& b) {
              if (a.step != b.step) return a.step > b.step;
              const bool a_tmp = a.name.starts_with(".tmp-"), b_tmp = b.name.starts_with(".tmp-");
              if (a_tmp != b_tmp) return !a_tmp;
              return a.name < b.name;
            });
  try {
    std::string latest =
        io::read_small_file(checkpoints_dir / kLatestFile, kMaxLatestBytes, "checkpoint pointer");
    while (!latest.empty() && (latest.back() == '\n' || latest.back() == '\r'))
      latest.pop_back();
    report.latest = latest;
  } catch (const std::exception&) {
    // no latest pointer, or a damaged one (too large, a FIFO, a directory...): readers never
    // rely on it anyway
  }
  return report;
}

}  // namespace trainctl::ckpt
