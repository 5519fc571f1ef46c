// MemoryReport: bytes per category of one rank's memory, measured (peak) or planned, so the
// planner's memory model can be checked against what a run actually used.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

namespace trainctl::telemetry {

struct MemoryReport {
  std::uint64_t params = 0;       // parameter buffers (all dtypes)
  std::uint64_t grads = 0;        // gradient buffers
  std::uint64_t optimizer = 0;    // optimizer state (fp32 master weights, Adam moments)
  std::uint64_t activations = 0;  // peak of the per-step activation arena
  std::uint64_t comm = 0;         // communication buckets and staging buffers
  std::uint64_t other = 0;        // anything else (workspaces, RNG state, ...)

  // Sum of all categories; throws std::overflow_error if it does not fit in 64 bits.
  std::uint64_t total() const;

  // (name, bytes) per category in the order above; names are the JSON keys.
  std::array<std::pair<std::string_view, std::uint64_t>, 6> categories() const;

  // An aligned table, one line per category plus a total line, each ending in '\n':
  //   params          12.3 MiB   41.0%
  //   ...
  //   total           30.0 MiB  100.0%
  std::string to_string() const;
  // The same table with two more columns: `planned` (the planner's figure for this rank) and
  // used / planned ("-" where nothing was planned), under a header line.
  std::string to_string(const MemoryReport& planned) const;

  // {"params": <bytes>, "grads": ..., "optimizer": ..., "activations": ..., "comm": ...,
  //  "other": ..., "total": ...}, all exact byte counts.
  nlohmann::json to_json() const;
};

}  // namespace trainctl::telemetry
