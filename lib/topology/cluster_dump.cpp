// Writing a ClusterSpec back out: as a cluster file (dump_cluster, read back equal by
// parse_cluster) and as text for people (describe).
#include <fmt/format.h>

#include "topology/topology.hpp"

namespace trainctl::topology {
namespace {

// A YAML double-quoted scalar.
std::string quoted(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::string dump_cluster(const ClusterSpec& spec) {
  const GpuSpec& g = spec.gpu;
  std::string out = "# trainctl cluster description; every key is explained in docs/topology.md\n";
  out += fmt::format("name: {}\n", quoted(spec.name));
  out += "gpu:\n";
  out += fmt::format("  name: {}\n", quoted(g.name));
  out += fmt::format("  memory_gib: {}\n", g.memory_gib);
  out += fmt::format("  peak_tflops: {{fp32: {}, tf32: {}, bf16: {}, fp16: {}, fp8: {}}}\n",
                     g.peak_tflops_fp32, g.peak_tflops_tf32, g.peak_tflops_bf16, g.peak_tflops_fp16,
                     g.peak_tflops_fp8);
  out += fmt::format("  memory_bandwidth_gbps: {}\n", g.memory_bandwidth_gbps);
  out += fmt::format("nodes: {}\n", spec.nodes);
  out += fmt::format("gpus_per_node: {}\n", spec.gpus_per_node);
  out += "nvlink:\n";
  out += fmt::format("  domain: {}\n", spec.nvlink_domain);
  if (spec.nvlink_gbps > 0) out += fmt::format("  gbps: {}\n", spec.nvlink_gbps);
  out += fmt::format("  latency_us: {}\n", spec.nvlink_latency_us);
  out += fmt::format("intra_node_gbps: {}\n", spec.intra_node_gbps);
  if (spec.inter_node_gbps > 0) {
    out += "network:\n";
    out += fmt::format("  gbps: {}\n", spec.inter_node_gbps);
    out += fmt::format("  latency_us: {}\n", spec.inter_node_latency_us);
  }
  return out;
}

std::string describe(const ClusterSpec& spec) {
  std::string out = fmt::format("cluster {} (from {})\n", spec.name, spec.source);
  if (spec.gpus_per_node == 0) {
    out += fmt::format("  {} node{} without GPUs (CPU only)\n", spec.nodes,
                       spec.nodes == 1 ? "" : "s");
    return out;
  }
  const GpuSpec& g = spec.gpu;
  out += fmt::format("  {} node{} x {} GPU{} = {} GPUs: {}, {:.1f} GiB", spec.nodes,
                     spec.nodes == 1 ? "" : "s", spec.gpus_per_node,
                     spec.gpus_per_node == 1 ? "" : "s", spec.world_size(),
                     g.name.empty() ? "unknown model" : g.name, g.memory_gib);
  if (g.peak_tflops_bf16 > 0)
    out += fmt::format(", peak bf16 {} / fp32 {} TFLOP/s", g.peak_tflops_bf16, g.peak_tflops_fp32);
  else
    out += ", peak FLOP/s unknown";
  if (g.memory_bandwidth_gbps > 0) out += fmt::format(", {} GB/s memory", g.memory_bandwidth_gbps);
  out += "\n";
  if (spec.nvlink_domain > 1)
    out += fmt::format("  NVLink domain {} GPUs, {} GB/s per GPU per direction, {} us\n",
                       spec.nvlink_domain, spec.nvlink_gbps, spec.nvlink_latency_us);
  else
    out += "  no NVLink (domain 1)\n";
  out +=
      fmt::format("  PCIe between GPUs outside a domain: {} GB/s per GPU\n", spec.intra_node_gbps);
  if (spec.inter_node_gbps > 0)
    out += fmt::format("  network: {} GB/s per GPU to other nodes, {} us\n", spec.inter_node_gbps,
                       spec.inter_node_latency_us);
  else
    out += "  network: none known (one node only)\n";
  return out;
}

}  // namespace trainctl::topology
