// Detection: run each probe, then assemble() the reports into a ClusterSpec plus one fact per
// finding, so `plan --show-topology` can say both what was found and why a part is missing.
#include <unistd.h>

#include <cstdlib>
#include <numeric>

#include <fmt/format.h>

#include "topology/cluster_schema.hpp"
#include "topology/probes.hpp"

namespace trainctl::topology {
namespace {

constexpr double kGib = 1024.0 * 1024.0 * 1024.0;
// NVLink 3 and 4 carry 25 GB/s per link per direction (A100: 12 links = 300, H100: 18 = 450).
constexpr double kNvlinkGbpsPerLink = 25;

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : std::string(fallback);
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || !name[0]) return "this machine";
  return name;
}

// GPU count, model and memory: the CUDA runtime's list, else NVML's.
void add_gpus(const backend::DeviceReport& cuda, const NvmlReport& nvml, ClusterSpec& spec,
              std::vector<std::string>& facts) {
  std::string model;
  size_t memory_bytes = 0;
  int count = 0;
  if (!cuda.gpus.empty()) {
    facts.push_back(cuda.status);
    count = static_cast<int>(cuda.gpus.size());
    model = cuda.gpus[0].name;
    memory_bytes = cuda.gpus[0].memory_bytes;
    for (const auto& g : cuda.gpus)
      if (g.name != model)
        facts.push_back(fmt::format("GPUs of different models ({} and {}): planning for GPU 0's",
                                    model, g.name));
  } else if (nvml.available && !nvml.gpus.empty()) {
    facts.push_back(fmt::format("CUDA runtime: {}; NVML lists {} GPU{}: planning with NVML's list",
                                cuda.status, nvml.gpus.size(), nvml.gpus.size() == 1 ? "" : "s"));
    count = static_cast<int>(nvml.gpus.size());
    model = nvml.gpus[0].name;
    memory_bytes = nvml.gpus[0].memory_bytes;
  } else {
    bool says = cuda.status.rfind("no GPU", 0) == 0;
    facts.push_back(says ? cuda.status : fmt::format("no GPU ({})", cuda.status));
    facts.push_back("CPU-only machine: gpus_per_node 0");
    return;
  }
  spec.gpus_per_node = count;
  if (auto known = match_device_name(model)) {
    spec.gpu = *known;
    facts.push_back(
        fmt::format("GPU model '{}': peak FLOP/s and memory bandwidth from the "
                    "built-in entry {}",
                    model, known->name));
  } else {
    facts.push_back(
        fmt::format("GPU model '{}' is not in the built-in table: peak FLOP/s "
                    "unknown; describe it in a cluster file (--cluster FILE)",
                    model));
  }
  spec.gpu.name = model.empty() ? spec.gpu.name : model;
  if (memory_bytes > 0) spec.gpu.memory_gib = static_cast<double>(memory_bytes) / kGib;
}

void add_network(const InfinibandReport& ib, ClusterSpec& spec, std::vector<std::string>& facts) {
  if (ib.ports.empty()) {
    facts.push_back(ib.reason);
    return;
  }
  double total_gbits = 0;
  int active = 0;
  for (const auto& p : ib.ports) {
    facts.push_back(fmt::format("{} port {}: {}, {}, {}{}", p.device, p.port, p.rate_text,
                                p.state.empty() ? "state unknown" : p.state,
                                p.link_layer == "Ethernet" ? "Ethernet (RoCE)" : p.link_layer,
                                p.numa_node >= 0 ? fmt::format(", NUMA {}", p.numa_node) : ""));
    if (p.active()) {
      total_gbits += p.rate_gbits;
      ++active;
    }
  }
  if (active == 0) {
    facts.push_back("no active InfiniBand/RoCE port: no inter-node bandwidth");
    return;
  }
  if (spec.gpus_per_node > 0) spec.inter_node_gbps = total_gbits / 8 / spec.gpus_per_node;
  facts.push_back(fmt::format(
      "network: {} active port{}, {} Gb/s per node{}", active, active == 1 ? "" : "s", total_gbits,
      spec.gpus_per_node > 0 ? fmt::format(" = {} GB/s per GPU", spec.inter_node_gbps)
                             : std::string{}));
}

}  // namespace

Detection assemble(const backend::DeviceReport& cuda, const NvmlReport& nvml,
                   const InfinibandReport& infiniband, const HostReport& host,
                   const SlurmReport& slurm) {
  Detection d;
  ClusterSpec& spec = d.cluster;
  spec.name = "detected";
  spec.source = "detected";
  spec.nvlink_latency_us = internal::kDefaultNvlinkLatencyUs;
  spec.inter_node_latency_us = internal::kDefaultNetworkLatencyUs;
  add_gpus(cuda, nvml, spec, d.facts);

  d.in_slurm_job = slurm.in_job;
  if (slurm.in_job) {
    spec.nodes = slurm.nodes > 0 ? slurm.nodes : 1;
    d.facts.push_back(fmt::format("Slurm job: {} node{}, {} GPUs per node, {} tasks per node",
                                  spec.nodes, spec.nodes == 1 ? "" : "s", slurm.gpus_per_node,
                                  slurm.tasks_per_node));
    if (slurm.gpus_per_node > 0 && slurm.gpus_per_node != spec.gpus_per_node) {
      d.facts.push_back(
          fmt::format("this process sees {} GPU{}; the job has {} per node: "
                      "planning with the job's",
                      spec.gpus_per_node, spec.gpus_per_node == 1 ? "" : "s", slurm.gpus_per_node));
      spec.gpus_per_node = slurm.gpus_per_node;
    }
    for (const auto& p : slurm.problems)
      d.facts.push_back(p);
  } else {
    d.facts.push_back("not inside a Slurm job: 1 node");
  }

  std::string why;
  int domain = nvlink_domain(nvml, &why);
  d.facts.push_back(why);
  if (spec.gpus_per_node > 0) {
    spec.nvlink_domain = std::gcd(domain, spec.gpus_per_node);
    if (spec.nvlink_domain != domain)
      d.facts.push_back(fmt::format("NVLink groups of {} do not divide {} GPUs per node: using {}",
                                    domain, spec.gpus_per_node, spec.nvlink_domain));
    if (spec.nvlink_domain > 1) {
      int links = nvml.gpus.empty() ? 0 : nvml.gpus[0].active_links;
      spec.nvlink_gbps = links * kNvlinkGbpsPerLink;
      d.facts.push_back(
          fmt::format("NVLink bandwidth: {} links x {} GB/s = {} GB/s per GPU per "
                      "direction",
                      links, kNvlinkGbpsPerLink, spec.nvlink_gbps));
    }
  }

  d.cpu_cores = host.cores;
  d.numa_nodes = host.numa_nodes;
  if (host.available) {
    d.facts.push_back(fmt::format("host: {} cores ({} hardware threads), {} NUMA node{}",
                                  host.cores, host.threads, host.numa_nodes,
                                  host.numa_nodes == 1 ? "" : "s"));
    for (const auto& line : host.placement)
      d.facts.push_back(line);
  } else {
    d.facts.push_back(fmt::format("no hwloc topology ({})", host.reason));
  }
  if (host.gpu_pcie_gbps > 0) {
    spec.intra_node_gbps = host.gpu_pcie_gbps;
    d.facts.push_back(fmt::format("PCIe: {} GB/s per GPU (hwloc link speed)", host.gpu_pcie_gbps));
  } else {
    spec.intra_node_gbps = internal::kDefaultIntraNodeGbps;
    if (spec.gpus_per_node > 0)
      d.facts.push_back(fmt::format("PCIe link speed unknown: assuming {} GB/s per GPU (Gen4 x16)",
                                    internal::kDefaultIntraNodeGbps));
  }
  add_network(infiniband, spec, d.facts);
  return d;
}

Detection detect() {
  std::string nvml_library = env_or("TRAINCTL_NVML_LIBRARY", "libnvidia-ml.so.1");
  std::string sysfs_root = env_or("TRAINCTL_SYSFS_ROOT", "/sys");
  Detection d =
      assemble(backend::detect_gpus(), probe_nvml(nvml_library), probe_infiniband(sysfs_root),
               probe_host(), probe_slurm([](const char* name) { return std::getenv(name); }));
  d.cluster.name = fmt::format("detected: {}", host_name());
  return d;
}

std::string describe(const Detection& detection) {
  std::string out = describe(detection.cluster);
  out += "facts:\n";
  for (const auto& fact : detection.facts)
    out += fmt::format("  - {}\n", fact);
  return out;
}

}  // namespace trainctl::topology
