// Reading a cluster file: walk the YAML against the key table (cluster_schema.hpp), convert each
// value, then check the relations between keys (NVLink domain divides gpus_per_node, the network
// is given one way, ...). Every problem is collected and thrown at once, each at the place the
// user wrote the value, worded like lib/recipe's.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "files/files.hpp"
#include "recipe/suggest.hpp"
#include "topology/cluster_schema.hpp"
#include "topology/topology.hpp"

namespace trainctl::topology {
namespace {

using internal::find_key;
using internal::keys_of;
using internal::KeySpec;
using internal::Kind;
using recipe::closest;

struct Entry {
  YAML::Node value;
  YAML::Mark key_mark;
};

std::string join(const std::vector<std::string_view>& items) {
  std::string out;
  for (auto item : items) {
    out += out.empty() ? "" : ", ";
    out += item;
  }
  return out;
}

std::string describe_node(const YAML::Node& node) {
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  if (node.IsNull()) return "nothing";
  return fmt::format("'{}'", node.Scalar());
}

std::optional<double> parse_number(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || errno == ERANGE || x != x) return std::nullopt;
  return x;
}

std::optional<long long> parse_integer(const std::string& text) {
  long long x = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), x);
  if (ec != std::errc{} || ptr != text.data() + text.size()) return std::nullopt;
  return x;
}

class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  void read(std::string_view text);
  ClusterSpec build();
  std::vector<Problem> problems;

 private:
  void report(const YAML::Mark& mark, std::string message);
  void walk(std::string_view section, const YAML::Node& map);
  bool has(std::string_view path) const { return entries_.count(std::string(path)) > 0; }
  YAML::Mark mark_of(std::string_view path) const;
  std::optional<double> number(std::string_view path);
  void missing(std::string_view path);
  GpuSpec read_gpu();

  std::string file_;
  std::map<std::string, Entry, std::less<>> entries_;  // leaves and sections by path
  // Keys suggested by a did-you-mean: not reported again as missing (one typo, one message).
  std::vector<std::string> suggested_;
};

void Reader::report(const YAML::Mark& mark, std::string message) {
  if (mark.is_null())
    problems.push_back({file_, 0, 0, std::move(message)});
  else
    problems.push_back({file_, mark.line + 1, mark.column + 1, std::move(message)});
}

void Reader::read(std::string_view text) {
  YAML::Node root;
  try {
    std::vector<YAML::Node> documents = YAML::LoadAll(std::string(text));
    if (documents.size() > 1) {
      report(documents[1].Mark(),
             fmt::format("a cluster file is one YAML document, and this one holds {} (separated "
                         "by ---); keep one description per file",
                         documents.size()));
      return;
    }
    if (!documents.empty()) root = documents.front();
  } catch (const YAML::ParserException& e) {
    report(e.mark, fmt::format("YAML syntax error: {}", e.msg));
    return;
  }
  if (root.IsNull()) return;  // empty file: the missing required keys are reported
  if (!root.IsMap()) {
    report(root.Mark(), "a cluster file is a map of keys (gpu:, gpus_per_node:, nvlink:, ...)");
    return;
  }
  walk("", root);
}

void Reader::walk(std::string_view section, const YAML::Node& map) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    std::string leaf = it->first.IsScalar() ? it->first.Scalar() : std::string{};
    std::string path = section.empty() ? leaf : fmt::format("{}.{}", section, leaf);
    const KeySpec* key = find_key(path);
    if (!key) {
      std::string guess = closest(leaf, keys_of(section));
      std::string where = section.empty() ? "the top level" : fmt::format("'{}'", section);
      if (guess.empty())
        report(it->first.Mark(), fmt::format("unknown key '{}'; the keys of {} are: {}", path,
                                             where, join(keys_of(section))));
      else {
        suggested_.push_back(section.empty() ? guess : fmt::format("{}.{}", section, guess));
        report(it->first.Mark(),
               fmt::format("unknown key '{}'; did you mean '{}'?", path, suggested_.back()));
      }
      continue;
    }
    if (auto seen = entries_.find(path); seen != entries_.end()) {
      report(it->first.Mark(), fmt::format("duplicate key '{}' (first at line {}); keep one", path,
                                           seen->second.key_mark.line + 1));
      continue;
    }
    entries_[path] = {it->second, it->first.Mark()};
    bool map_allowed = key->kind == Kind::section || key->kind == Kind::gpu;
    if (map_allowed && it->second.IsMap()) {
      walk(path, it->second);
    } else if (key->kind == Kind::section) {
      report(it->second.Mark(),
             fmt::format("{}: must be a map of keys, e.g. `{}`", path, key->example));
    }
  }
}

YAML::Mark Reader::mark_of(std::string_view path) const {
  auto it = entries_.find(path);
  if (it == entries_.end()) return YAML::Mark::null_mark();
  YAML::Mark value = it->second.value.Mark();
  return value.is_null() ? it->second.key_mark : value;
}

void Reader::missing(std::string_view path) {
  if (std::find(suggested_.begin(), suggested_.end(), path) != suggested_.end()) return;
  const KeySpec* key = find_key(path);
  std::string_view parent =
      path.substr(0, path.rfind('.') == std::string_view::npos ? 0 : path.rfind('.'));
  // Inside a section: point at the section's key, which is where the key belongs.
  YAML::Mark at =
      parent.empty() ? YAML::Mark::null_mark() : entries_.at(std::string(parent)).key_mark;
  report(at, fmt::format("missing required key '{}' ({}); add e.g. `{}`", path, key->help,
                         key->example));
}

// The value of a number or integer key, checked against its range; nullopt when absent or bad
// (bad values are reported here).
std::optional<double> Reader::number(std::string_view path) {
  auto it = entries_.find(path);
  if (it == entries_.end()) return std::nullopt;
  const KeySpec& key = *find_key(path);
  const YAML::Node& node = it->second.value;
  std::optional<double> x;
  if (node.IsScalar()) {
    if (key.kind == Kind::integer) {
      if (auto i = parse_integer(node.Scalar())) x = static_cast<double>(*i);
    } else {
      x = parse_number(node.Scalar());
    }
  }
  if (!x) {
    report(mark_of(path),
           fmt::format("{}: expected {}, got {}", path,
                       key.kind == Kind::integer ? "an integer" : "a number", describe_node(node)));
    return std::nullopt;
  }
  bool ok = key.min_exclusive ? *x > key.min : *x >= key.min;
  if (key.kind == Kind::integer && *x > 1e6) ok = false;
  if (!ok) {
    std::string range = key.kind == Kind::integer && *x > 1e6
                            ? std::string("must be at most 1000000")
                            : fmt::format("must be {} {}", key.min_exclusive ? ">" : ">=", key.min);
    report(mark_of(path), fmt::format("{}: {}, got {}", path, range, node.Scalar()));
    return std::nullopt;
  }
  return x;
}

GpuSpec Reader::read_gpu() {
  GpuSpec gpu;
  auto it = entries_.find("gpu");
  if (it == entries_.end()) {
    missing("gpu");
    return gpu;
  }
  const YAML::Node& node = it->second.value;
  if (node.IsScalar()) {
    if (auto known = find_builtin_gpu(node.Scalar())) return *known;
    std::vector<std::string_view> names = {"a100",     "h100",     "h200",
                                           "h100-sxm", "a100-sxm", "h200-sxm"};
    std::vector<std::string_view> keys;
    for (const auto& g : builtin_gpus())
      keys.push_back(g.name);
    names.insert(names.end(), keys.begin(), keys.end());
    std::string guess = closest(node.Scalar(), names);
    report(
        mark_of("gpu"),
        fmt::format("gpu: unknown GPU '{}'{}; the built-in GPUs are {}, or describe it as a "
                    "map (name, memory_gib, peak_tflops, memory_bandwidth_gbps)",
                    node.Scalar(), guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess),
                    join(keys)));
    return gpu;
  }
  if (!node.IsMap()) {
    report(mark_of("gpu"),
           fmt::format("gpu: expected a built-in GPU name or a map, got {}", describe_node(node)));
    return gpu;
  }
  if (auto name = entries_.find("gpu.name"); name != entries_.end()) {
    if (name->second.value.IsScalar() && !name->second.value.Scalar().empty())
      gpu.name = name->second.value.Scalar();
    else
      report(mark_of("gpu.name"),
             fmt::format("gpu.name: expected a text, got {}", describe_node(name->second.value)));
  }
  for (std::string_view required : {"gpu.name", "gpu.memory_gib", "gpu.peak_tflops"})
    if (!has(required)) missing(required);
  if (has("gpu.peak_tflops") && entries_.at("gpu.peak_tflops").value.IsMap() &&
      !has("gpu.peak_tflops.bf16"))
    missing("gpu.peak_tflops.bf16");
  gpu.memory_gib = number("gpu.memory_gib").value_or(0);
  gpu.peak_tflops_fp32 = number("gpu.peak_tflops.fp32").value_or(0);
  gpu.peak_tflops_tf32 = number("gpu.peak_tflops.tf32").value_or(0);
  gpu.peak_tflops_bf16 = number("gpu.peak_tflops.bf16").value_or(0);
  gpu.peak_tflops_fp16 = number("gpu.peak_tflops.fp16").value_or(gpu.peak_tflops_bf16);
  gpu.peak_tflops_fp8 = number("gpu.peak_tflops.fp8").value_or(0);
  gpu.memory_bandwidth_gbps = number("gpu.memory_bandwidth_gbps").value_or(0);
  return gpu;
}

ClusterSpec Reader::build() {
  ClusterSpec spec;
  if (!problems.empty() && entries_.empty()) return spec;  // unreadable: nothing more to say
  if (auto it = entries_.find("name"); it != entries_.end()) {
    if (it->second.value.IsScalar() && !it->second.value.Scalar().empty())
      spec.name = it->second.value.Scalar();
    else
      report(mark_of("name"),
             fmt::format("name: expected a text, got {}", describe_node(it->second.value)));
  }
  spec.gpu = read_gpu();
  if (!has("gpus_per_node")) missing("gpus_per_node");
  auto gpus_per_node = number("gpus_per_node");
  auto nodes = number("nodes");
  spec.gpus_per_node = static_cast<int>(gpus_per_node.value_or(0));
  spec.nodes = static_cast<int>(nodes.value_or(1));

  // NVLink: absent = no NVLink (domain 1).
  if (has("nvlink") && entries_.at("nvlink").value.IsMap()) {
    if (!has("nvlink.domain")) missing("nvlink.domain");
    auto domain = number("nvlink.domain");
    auto gbps = number("nvlink.gbps");
    spec.nvlink_domain = static_cast<int>(domain.value_or(1));
    spec.nvlink_gbps = gbps.value_or(0);
    spec.nvlink_latency_us =
        number("nvlink.latency_us").value_or(internal::kDefaultNvlinkLatencyUs);
    if (domain && gpus_per_node && spec.gpus_per_node % spec.nvlink_domain != 0) {
      std::string divisors;
      for (int d = 1; d <= spec.gpus_per_node; ++d)
        if (spec.gpus_per_node % d == 0)
          divisors += fmt::format("{}{}", divisors.empty() ? "" : ", ", d);
      report(mark_of("nvlink.domain"),
             fmt::format("nvlink.domain {} does not divide gpus_per_node {}; use one of {}",
                         spec.nvlink_domain, spec.gpus_per_node, divisors));
    }
    if (domain && *domain > 1 && !has("nvlink.gbps"))
      report(mark_of("nvlink.domain"),
             fmt::format("nvlink.domain is {} but nvlink.gbps is missing; add the NVLink GB/s per "
                         "GPU per direction, e.g. `gbps: 450`",
                         spec.nvlink_domain));
  } else {
    spec.nvlink_latency_us = internal::kDefaultNvlinkLatencyUs;
  }
  spec.intra_node_gbps = number("intra_node_gbps").value_or(internal::kDefaultIntraNodeGbps);

  // Network: gbps per GPU, or nics x nic_gbits shared by the node's GPUs.
  spec.inter_node_latency_us = internal::kDefaultNetworkLatencyUs;
  if (has("network") && entries_.at("network").value.IsMap()) {
    auto gbps = number("network.gbps");
    auto nics = number("network.nics");
    auto nic_gbits = number("network.nic_gbits");
    spec.inter_node_latency_us =
        number("network.latency_us").value_or(internal::kDefaultNetworkLatencyUs);
    bool per_nic = has("network.nics") || has("network.nic_gbits");
    if (has("network.gbps") && per_nic) {
      report(mark_of("network.gbps"),
             "network: give either gbps (GB/s per GPU) or nics and nic_gbits, not both");
    } else if (has("network.gbps")) {
      spec.inter_node_gbps = gbps.value_or(0);
    } else if (has("network.nics") != has("network.nic_gbits")) {
      report(mark_of(has("network.nics") ? "network.nics" : "network.nic_gbits"),
             "network: nics and nic_gbits go together (NICs per node, Gb/s of one NIC)");
    } else if (!per_nic) {
      report(entries_.at("network").key_mark,
             "network: give gbps (GB/s per GPU), or nics and nic_gbits; e.g. `network: {nics: 8, "
             "nic_gbits: 400}`");
    } else if (nics && nic_gbits && spec.gpus_per_node > 0) {
      spec.inter_node_gbps = *nics * *nic_gbits / 8 / spec.gpus_per_node;
    }
  }
  if (nodes && spec.nodes > 1 && !has("network"))
    report(mark_of("nodes"),
           fmt::format("nodes is {} but there is no network section; add e.g. `network: {{nics: "
                       "8, nic_gbits: 400}}`",
                       spec.nodes));
  if (nodes && gpus_per_node && *nodes * *gpus_per_node > static_cast<double>(kMaxWorldSize))
    report(mark_of("nodes"),
           fmt::format("nodes x gpus_per_node = {} x {} = {} GPUs is more than "
                       "trainctl plans for (at most {})",
                       spec.nodes, spec.gpus_per_node,
                       static_cast<int64_t>(*nodes * *gpus_per_node), kMaxWorldSize));
  return spec;
}

}  // namespace

std::string format_problem(const Problem& p) {
  if (p.file.empty()) return fmt::format("error: {}", p.message);
  if (p.line == 0) return fmt::format("{}: error: {}", p.file, p.message);
  return fmt::format("{}:{}:{}: error: {}", p.file, p.line, p.col, p.message);
}

namespace {
std::string join_problems(const std::vector<Problem>& problems) {
  std::string out;
  for (const auto& p : problems) {
    out += out.empty() ? "" : "\n";
    out += format_problem(p);
  }
  return out;
}
}  // namespace

ClusterError::ClusterError(std::vector<Problem> problems)
    : std::runtime_error(join_problems(problems)), problems_(std::move(problems)) {}

ClusterSpec parse_cluster(std::string_view yaml_text, const std::string& file_label,
                          const ClusterOverrides& overrides) {
  Reader reader(file_label);
  reader.read(yaml_text);
  ClusterSpec spec = reader.build();
  if (!reader.problems.empty()) {
    std::stable_sort(reader.problems.begin(), reader.problems.end(),
                     [](const Problem& a, const Problem& b) {
                       return std::pair(a.line, a.col) < std::pair(b.line, b.col);
                     });
    throw ClusterError(std::move(reader.problems));
  }
  spec.source = file_label;
  if (spec.name.empty()) spec.name = std::filesystem::path(file_label).stem().string();
  return apply_overrides(std::move(spec), overrides);
}

ClusterSpec load_cluster(const std::string& path, const ClusterOverrides& overrides) {
  // Without blocking (a FIFO in the file's place), and refused above the limit before parsing.
  std::string text;
  try {
    text = files::read_regular_file(path, kMaxClusterFileBytes, "cluster file");
  } catch (const files::FileError& e) {
    const std::string message =
        e.os_error() != 0
            ? fmt::format("cannot read the cluster file ({})", std::strerror(e.os_error()))
            : e.reason();  // the problem names the file already
    throw ClusterError(
        {{path, 0, 0, fmt::format("{}; the shipped ones are in configs/clusters/", message)}});
  }
  return parse_cluster(text, path, overrides);
}

ClusterSpec apply_overrides(ClusterSpec spec, const ClusterOverrides& overrides) {
  std::vector<Problem> problems;
  if (overrides.nodes < 0)
    problems.push_back({"", 0, 0, fmt::format("--nodes must be >= 1, got {}", overrides.nodes)});
  if (overrides.gpus_per_node < 0)
    problems.push_back(
        {"", 0, 0, fmt::format("--gpus-per-node must be >= 1, got {}", overrides.gpus_per_node)});
  if (!problems.empty()) throw ClusterError(std::move(problems));
  if (overrides.gpus_per_node > 0) {
    // The node's NICs now serve fewer (or more) GPUs: keep the per-node network rate.
    if (spec.gpus_per_node > 0)
      spec.inter_node_gbps = spec.inter_node_gbps * spec.gpus_per_node / overrides.gpus_per_node;
    spec.gpus_per_node = overrides.gpus_per_node;
    spec.nvlink_domain = std::gcd(std::max(spec.nvlink_domain, 1), spec.gpus_per_node);
  }
  if (overrides.nodes > 0) {
    if (overrides.nodes > 1 && spec.inter_node_gbps <= 0)
      throw ClusterError({{"", 0, 0,
                           fmt::format("--nodes {}: cluster '{}' has no inter-node bandwidth; use "
                                       "a cluster file with a network section (--cluster FILE)",
                                       overrides.nodes, spec.name)}});
    spec.nodes = overrides.nodes;
  }
  const int64_t world = int64_t{spec.nodes} * spec.gpus_per_node;
  if (world > kMaxWorldSize)
    throw ClusterError({{"", 0, 0,
                         fmt::format("{} node(s) x {} GPU(s) = {} GPUs is more than trainctl plans "
                                     "for (at most {}); lower --nodes or --gpus-per-node",
                                     spec.nodes, spec.gpus_per_node, world, kMaxWorldSize)}});
  return spec;
}

}  // namespace trainctl::topology
