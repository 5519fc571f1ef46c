// The built-in GPU table: published dense peaks (the datasheet figure without 2:4 sparsity) and
// memory, so a cluster file can say `gpu: h100-sxm` and detection can fill in what the CUDA
// runtime does not report (peak FLOP/s, HBM bandwidth).
#include <algorithm>
#include <cctype>

#include "topology/topology.hpp"

namespace trainctl::topology {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

struct Alias {
  std::string_view alias;
  std::string_view key;
};

// Short names accepted for `gpu:` besides the keys themselves.
constexpr Alias kAliases[] = {
    {"a100", "A100-SXM-80GB"},      {"a100-sxm", "A100-SXM-80GB"}, {"a100-80gb", "A100-SXM-80GB"},
    {"h100", "H100-SXM-80GB"},      {"h100-sxm", "H100-SXM-80GB"}, {"h200", "H200-SXM-141GB"},
    {"h200-sxm", "H200-SXM-141GB"},
};

}  // namespace

const std::vector<GpuSpec>& builtin_gpus() {
  // name, memory GiB, fp32, tf32, bf16, fp16, fp8, HBM GB/s. Sources: NVIDIA datasheets
  // (A100 80GB SXM, H100 SXM, H200 SXM, L40S, A10); the CUDA runtime reports a little less
  // memory (e.g. 79.2 GiB on an 80 GB A100/H100) and detection uses the measured value.
  static const std::vector<GpuSpec> table = {
      {"A100-SXM-80GB", 80, 19.5, 156, 312, 312, 0, 2039},
      {"H100-SXM-80GB", 80, 67, 494, 989, 989, 1979, 3350},
      {"H200-SXM-141GB", 141, 67, 494, 989, 989, 1979, 4800},
      {"L40S", 48, 91.6, 183, 362, 362, 733, 864},
      {"A10", 24, 31.2, 62.5, 125, 125, 0, 600},
  };
  return table;
}

std::optional<GpuSpec> find_builtin_gpu(std::string_view name) {
  std::string wanted = lower(name);
  for (const auto& a : kAliases)
    if (a.alias == wanted) wanted = lower(a.key);
  for (const auto& gpu : builtin_gpus())
    if (lower(gpu.name) == wanted) return gpu;
  return std::nullopt;
}

std::optional<GpuSpec> match_device_name(std::string_view device_name) {
  // Split into upper-case tokens at spaces and dashes: "NVIDIA A100-SXM4-80GB" -> NVIDIA, A100,
  // SXM4, 80GB. Whole tokens only, so "A100" never matches the A10 entry.
  std::vector<std::string> tokens;
  std::string token;
  for (char c : device_name) {
    if (c == ' ' || c == '-' || c == '_') {
      if (!token.empty()) tokens.push_back(token);
      token.clear();
    } else {
      token += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
  }
  if (!token.empty()) tokens.push_back(token);
  auto has = [&](std::string_view t) {
    return std::find(tokens.begin(), tokens.end(), t) != tokens.end();
  };
  if (has("H200")) return find_builtin_gpu("H200-SXM-141GB");
  if (has("H100")) return find_builtin_gpu("H100-SXM-80GB");
  if (has("A100")) return find_builtin_gpu("A100-SXM-80GB");
  if (has("L40S")) return find_builtin_gpu("L40S");
  if (has("A10")) return find_builtin_gpu("A10");
  return std::nullopt;
}

}  // namespace trainctl::topology
