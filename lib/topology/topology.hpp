// The hardware a plan is made for: one kind of GPU, nodes of gpus_per_node GPUs, NVLink domains
// inside a node, and a network between nodes. Either detected on this machine (CUDA runtime, NVML
// loaded with dlopen, /sys/class/infiniband, hwloc, the Slurm environment) or read from a cluster
// description file (configs/clusters/*.yaml, documented key by key in docs/topology.md). Units:
// bytes, GB/s = 1e9 bytes per second (one direction, per GPU), TFLOP/s = 1e12 dense FLOP per
// second.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace trainctl::topology {

struct GpuSpec {
  std::string name;             // "NVIDIA H100 80GB HBM3"
  double memory_gib = 0;        // usable device memory per GPU
  double peak_tflops_fp32 = 0;  // dense, no TF32
  double peak_tflops_tf32 = 0;
  double peak_tflops_bf16 = 0;
  double peak_tflops_fp16 = 0;
  double peak_tflops_fp8 = 0;        // 0: not supported
  double memory_bandwidth_gbps = 0;  // HBM, GB/s
  bool operator==(const GpuSpec&) const = default;
};

struct ClusterSpec {
  std::string name;    // "dgx-h100", "detected: vm"
  std::string source;  // the file it came from, or "detected"
  GpuSpec gpu;
  int nodes = 1;
  int gpus_per_node = 0;  // 0: a CPU-only machine
  // GPUs that reach each other over NVLink/NVSwitch (a divisor of gpus_per_node; 1 = no NVLink).
  int nvlink_domain = 1;
  double nvlink_gbps = 0;      // per GPU, one direction, inside a domain
  double intra_node_gbps = 0;  // per GPU between GPUs of a node outside a domain (PCIe)
  double inter_node_gbps = 0;  // per GPU to other nodes (NICs x rate / GPUs per node)
  double nvlink_latency_us = 0;
  double inter_node_latency_us = 0;
  // CPU ranks as the devices (a multi-rank CPU run's `parallel: auto`): gpus_per_node then
  // counts ranks per node, and none is a GPU (no CUDA context; Gloo's staging buffers).
  bool cpu_ranks = false;
  bool cpu_only() const { return gpus_per_node == 0 || cpu_ranks; }

  // At most kMaxWorldSize: load_cluster and apply_overrides refuse more, so this cannot
  // overflow.
  int world_size() const { return nodes * gpus_per_node; }
  bool operator==(const ClusterSpec&) const = default;  // added: round-trip tests
};

// The most GPUs a cluster may have (nodes x gpus_per_node): 2^24, far beyond any machine built,
// and far below where int products of degrees would overflow.
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 24;

// What detection found, for `trainctl plan --show-topology` (one line per fact, with why a part
// is missing: "no NVML (libnvidia-ml.so.1: cannot open shared object file)").
struct Detection {
  ClusterSpec cluster;
  std::vector<std::string> facts;
  // Added: the host (hwloc; 0 when hwloc could not load the topology).
  int cpu_cores = 0;
  int numa_nodes = 0;
  bool in_slurm_job = false;  // added: SLURM_JOB_ID (or SLURM_JOB_NUM_NODES) was set
};

// ---- built-in GPU table -----------------------------------------------------------------------
// Published dense peaks (no sparsity) of the GPUs the cluster files may name with `gpu: KEY`:
// A100-SXM-80GB, H100-SXM-80GB, H200-SXM-141GB, L40S, A10. GpuSpec::name is the table key.
const std::vector<GpuSpec>& builtin_gpus();
// The entry `name` refers to: a table key or a short alias ("h100-sxm", "h100", "a100"), case
// ignored. nullopt when none.
std::optional<GpuSpec> find_builtin_gpu(std::string_view name);
// The table entry for a GPU as the CUDA runtime or NVML names it ("NVIDIA H100 80GB HBM3" ->
// H100-SXM-80GB, "NVIDIA A100-SXM4-80GB" -> A100-SXM-80GB); nullopt for a model not in the table.
std::optional<GpuSpec> match_device_name(std::string_view device_name);

// ---- cluster description files ----------------------------------------------------------------
// One thing wrong with a cluster file. line/col are 1-based; 0 when the problem has no position
// (file missing, required key absent, a bad override).
struct Problem {
  std::string file;
  int line = 0;
  int col = 0;
  std::string message;
  bool operator==(const Problem&) const = default;
};
// "FILE:LINE:COL: error: MESSAGE", "FILE: error: MESSAGE" or "error: MESSAGE" (no file).
std::string format_problem(const Problem& problem);

// Thrown by load_cluster/parse_cluster/apply_overrides with every problem found, in file order.
// what() is one format_problem line per problem. Callers exit with code 2 (bad input).
class ClusterError : public std::runtime_error {
 public:
  explicit ClusterError(std::vector<Problem> problems);
  const std::vector<Problem>& problems() const { return problems_; }

 private:
  std::vector<Problem> problems_;
};

// `--nodes` / `--gpus-per-node` on top of a file or a detection; 0 keeps the value.
struct ClusterOverrides {
  int nodes = 0;
  int gpus_per_node = 0;
};

// The largest cluster file read (1 MiB; the shipped ones are under 1 KiB): a larger one is refused
// before it is parsed.
inline constexpr uint64_t kMaxClusterFileBytes = uint64_t{1} << 20;

// Reads a cluster file (see docs/topology.md), then applies `overrides`. A file that is not a
// regular file, is larger than kMaxClusterFileBytes or holds several YAML documents is refused.
// `source` is set to `path`, `name` to the file's `name:` (else the file name without .yaml).
ClusterSpec load_cluster(const std::string& path, const ClusterOverrides& overrides = {});
// The same from YAML text; `file_label` is what problems name as their file.
ClusterSpec parse_cluster(std::string_view yaml_text, const std::string& file_label,
                          const ClusterOverrides& overrides = {});
// Checks and applies overrides to any spec. A gpus_per_node override shrinks nvlink_domain to
// gcd(domain, gpus_per_node) (part of an NVSwitch node is still fully connected). Going to more
// than one node needs an inter-node bandwidth. Throws ClusterError (no file position).
ClusterSpec apply_overrides(ClusterSpec spec, const ClusterOverrides& overrides);
// The spec as a cluster file (every key, the GPU written out in full); parse_cluster reads it back
// to an equal ClusterSpec (except `source`, which is the file's label).
std::string dump_cluster(const ClusterSpec& spec);

// ---- detection ----------------------------------------------------------------------------------
// Describes this machine: GPUs through the CUDA runtime (backend::detect_gpus; NVML's list when
// the runtime sees none), NVLink domains through NVML (dlopen of $TRAINCTL_NVML_LIBRARY, default
// libnvidia-ml.so.1), InfiniBand/RoCE ports under $TRAINCTL_SYSFS_ROOT (default /sys)
// /class/infiniband, cores/NUMA/PCIe placement through hwloc, nodes and GPUs per node from the
// Slurm environment. Never throws for missing parts: each becomes a fact saying why. A CPU-only
// machine gets gpus_per_node 0 and a fact starting "no GPU".
Detection detect();

// The detection as text, one fact per line after a summary (trainctl plan --show-topology).
std::string describe(const Detection& detection);
// A cluster spec as text (the same layout as describe's summary), for --cluster --show-topology.
std::string describe(const ClusterSpec& spec);

}  // namespace trainctl::topology
