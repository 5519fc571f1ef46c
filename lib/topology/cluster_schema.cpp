// The cluster file keys (see cluster_schema.hpp) and the did-you-mean helper.
#include "topology/cluster_schema.hpp"

#include <algorithm>
#include <cctype>

namespace trainctl::topology::internal {

const std::vector<KeySpec>& cluster_keys() {
  static const std::vector<KeySpec> keys = {
      {"name", Kind::text, 0, false, false, "name: dgx-h100",
       "label shown in plans (default: the file name without .yaml)"},
      {"gpu", Kind::gpu, 0, false, true, "gpu: h100-sxm",
       "a built-in GPU (A100-SXM-80GB, H100-SXM-80GB, H200-SXM-141GB, L40S, A10) or a map"},
      {"gpu.name", Kind::text, 0, false, true, "name: my-gpu", "GPU model, free text"},
      {"gpu.memory_gib", Kind::number, 0, true, true, "memory_gib: 80",
       "device memory per GPU, GiB"},
      {"gpu.peak_tflops", Kind::section, 0, false, true, "peak_tflops: {bf16: 989}",
       "dense peak TFLOP/s per precision"},
      {"gpu.peak_tflops.fp32", Kind::number, 0, false, false, "fp32: 67", "FP32 (no TF32)"},
      {"gpu.peak_tflops.tf32", Kind::number, 0, false, false, "tf32: 494", "TF32 tensor cores"},
      {"gpu.peak_tflops.bf16", Kind::number, 0, true, true, "bf16: 989", "BF16 tensor cores"},
      {"gpu.peak_tflops.fp16", Kind::number, 0, false, false, "fp16: 989",
       "FP16 tensor cores (default: bf16's)"},
      {"gpu.peak_tflops.fp8", Kind::number, 0, false, false, "fp8: 1979", "FP8; 0 = none"},
      {"gpu.memory_bandwidth_gbps", Kind::number, 0, false, false, "memory_bandwidth_gbps: 3350",
       "device memory bandwidth, GB/s (0 = unknown)"},
      {"nodes", Kind::integer, 1, false, false, "nodes: 1", "number of nodes (default 1)"},
      {"gpus_per_node", Kind::integer, 1, false, true, "gpus_per_node: 8", "GPUs in one node"},
      {"nvlink", Kind::section, 0, false, false, "nvlink: {domain: 8, gbps: 450}",
       "NVLink/NVSwitch inside a node (absent: no NVLink)"},
      {"nvlink.domain", Kind::integer, 1, false, true, "domain: 8",
       "GPUs that reach each other over NVLink; divides gpus_per_node"},
      {"nvlink.gbps", Kind::number, 0, true, false, "gbps: 450",
       "NVLink GB/s per GPU per direction (required when domain > 1)"},
      {"nvlink.latency_us", Kind::number, 0, false, false, "latency_us: 1",
       "NVLink latency, microseconds (default 1)"},
      {"intra_node_gbps", Kind::number, 0, true, false, "intra_node_gbps: 25",
       "GB/s per GPU between GPUs of a node outside an NVLink domain (PCIe; default 25)"},
      {"network", Kind::section, 0, false, false, "network: {nics: 8, nic_gbits: 400}",
       "the network between nodes (required when nodes > 1)"},
      {"network.gbps", Kind::number, 0, true, false, "gbps: 50",
       "GB/s per GPU to other nodes (or give nics and nic_gbits)"},
      {"network.nics", Kind::integer, 1, false, false, "nics: 8", "NICs per node"},
      {"network.nic_gbits", Kind::number, 0, true, false, "nic_gbits: 400",
       "rate of one NIC, Gb/s (bits)"},
      {"network.latency_us", Kind::number, 0, false, false, "latency_us: 5",
       "network latency, microseconds (default 5)"},
  };
  return keys;
}

const KeySpec* find_key(std::string_view path) {
  for (const auto& key : cluster_keys())
    if (key.path == path) return &key;
  return nullptr;
}

std::vector<std::string_view> keys_of(std::string_view section) {
  std::vector<std::string_view> out;
  for (const auto& key : cluster_keys()) {
    std::string_view path = key.path;
    if (section.empty()) {
      if (path.find('.') == std::string_view::npos) out.push_back(path);
    } else if (path.size() > section.size() + 1 && path.substr(0, section.size()) == section &&
               path[section.size()] == '.') {
      std::string_view leaf = path.substr(section.size() + 1);
      if (leaf.find('.') == std::string_view::npos) out.push_back(leaf);
    }
  }
  return out;
}

}  // namespace trainctl::topology::internal
