// Scanning a checkpoints directory: what is there and what can be trusted. Resume uses
// newest_valid() and reports every newer entry it skips with its reason. scan() never throws for
// a bad checkpoint: a bad checkpoint is a finding, not an error.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ckpt/format.hpp"

namespace trainctl::ckpt {

enum class Verify {
  manifest,  // parse the manifest strictly and check every file exists with its size (fast)
  full,      // also re-read every byte and check every checksum (CheckpointReader::verify)
};

enum class Status {
  valid,
  partial,  // a save that never finished: a .tmp-* directory or a step_* without manifest.json
  corrupt,  // bad JSON, wrong format/version, missing file, size or checksum mismatch...
};
std::string_view status_name(Status status);

struct ScanEntry {
  std::string name;  // "step_00000042" or ".tmp-step_00000043.1234"
  fs::path path;
  int64_t step = -1;
  Status status = Status::corrupt;
  std::string reason;  // empty when valid
};

struct ScanReport {
  fs::path dir;
  std::vector<ScanEntry> entries;  // newest step first (a step_ dir before a tmp dir of that step)
  std::string latest;              // the content of checkpoints/latest, "" when absent
  // The newest valid checkpoint, nullptr when none is.
  const ScanEntry* newest_valid() const;
};

// A missing directory gives an empty report.
ScanReport scan(const fs::path& checkpoints_dir, Verify verify = Verify::manifest);

}  // namespace trainctl::ckpt
