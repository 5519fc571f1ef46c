// Internal to lib/topology: the keys of a cluster file, each declared once (type, range, whether
// required, default, one line of help). cluster_file.cpp reads files against it; docs/topology.md
// lists the same keys. Not a public header.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace trainctl::topology::internal {

enum class Kind { text, integer, number, gpu, section };

struct KeySpec {
  std::string_view path;  // "nvlink.gbps"
  Kind kind;
  double min = 0;              // numbers: lowest accepted value
  bool min_exclusive = false;  // true: must be > min
  bool required = false;       // required when its section is present (top level: always)
  std::string_view example;    // for "add e.g. `...`" in messages
  std::string_view help;
};

const std::vector<KeySpec>& cluster_keys();
const KeySpec* find_key(std::string_view path);
// The keys (leaf and section names) directly inside `section` ("" = the top level).
std::vector<std::string_view> keys_of(std::string_view section);

// Defaults of the optional keys (documented in docs/topology.md).
inline constexpr double kDefaultIntraNodeGbps = 25;  // PCIe Gen4 x16, one direction, achievable
inline constexpr double kDefaultNvlinkLatencyUs = 1;
inline constexpr double kDefaultNetworkLatencyUs = 5;

}  // namespace trainctl::topology::internal
