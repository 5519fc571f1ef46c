// The parts of detect(), each a plain function returning a plain report, and assemble(), which
// turns the reports into a Detection. Public so that tests (and a GPU-machine check script) can run
// one probe at a time against recorded inputs: a sysfs tree, a substitute NVML library, a fake
// environment. Every probe returns its failure as text instead of throwing: "no NVML" is normal.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/device.hpp"
#include "topology/topology.hpp"

namespace trainctl::topology {

// ---- NVML (dlopen) ------------------------------------------------------------------------------
struct NvmlGpu {
  std::string name;         // nvmlDeviceGetName ("" when the library lacks it)
  size_t memory_bytes = 0;  // nvmlDeviceGetMemoryInfo total (0 when unknown)
  std::string pci_bus_id;   // nvmlDeviceGetPciInfo_v3 busId ("" when unknown)
  int active_links = 0;     // NVLinks in state enabled (nvmlDeviceGetNvLinkState over 18 links)
};

struct NvmlReport {
  bool available = false;
  std::string reason;  // when !available: "libnvidia-ml.so.1: cannot open shared object file ..."
  std::vector<NvmlGpu> gpus;
  // nvlink[i][j]: GPU i reaches GPU j over NVLink, directly or through NVSwitch (symmetric, with
  // nvlink[i][i] true). From nvmlDeviceGetP2PStatus(NVLINK) where the library has it, else from
  // the remote end of each active link (nvmlDeviceGetNvLinkRemotePciInfo_v2: a GPU's bus id, or a
  // switch that joins every GPU linked to a switch).
  std::vector<std::vector<bool>> nvlink;
};

// Loads `library_path` with dlopen, reads the GPUs and their NVLinks, unloads it.
NvmlReport probe_nvml(const std::string& library_path);

// The NVLink domain size the planner may rely on: the size of the connected groups of the NVLink
// graph when they are all equal, else the gcd of their sizes; 1 without NVLink. `why` (optional)
// receives one line of explanation.
int nvlink_domain(const NvmlReport& report, std::string* why = nullptr);

// ---- InfiniBand / RoCE (sysfs) ------------------------------------------------------------------
struct IbPort {
  std::string device;  // "mlx5_0"
  int port = 0;
  double rate_gbits = 0;   // "400 Gb/sec (4X NDR)" -> 400
  std::string rate_text;   // the file's text, trimmed
  std::string state;       // "ACTIVE", "DOWN", ... (the name after "4: ")
  std::string link_layer;  // "InfiniBand" or "Ethernet" (RoCE)
  int numa_node = -1;      // <device>/device/numa_node; -1 unknown
  bool active() const { return state == "ACTIVE"; }
};

struct InfinibandReport {
  std::vector<IbPort> ports;  // sorted by device, then port
  std::string reason;         // when no ports: why ("no /sys/class/infiniband")
};

// Reads SYSFS_ROOT/class/infiniband/*/ports/*/{rate,state,link_layer}.
InfinibandReport probe_infiniband(const std::string& sysfs_root);

// ---- host (hwloc) -------------------------------------------------------------------------------
struct HostReport {
  bool available = false;
  std::string reason;  // when !available
  int cores = 0;       // physical cores
  int threads = 0;     // hardware threads (PUs)
  int numa_nodes = 0;
  // One line per NUMA node: "NUMA 0: 64 cores, GPUs 0000:18:00.0 0000:2a:00.0, NICs mlx5_0".
  std::vector<std::string> placement;
  double gpu_pcie_gbps = 0;  // PCIe link speed of the first NVIDIA GPU hwloc sees (0: unknown)
};

HostReport probe_host();

// ---- Slurm environment --------------------------------------------------------------------------
struct SlurmReport {
  bool in_job = false;     // SLURM_JOB_ID or SLURM_JOB_NUM_NODES set
  int nodes = 0;           // SLURM_JOB_NUM_NODES (0: not set)
  int gpus_per_node = 0;   // SLURM_GPUS_ON_NODE, else SLURM_GPUS_PER_NODE ("8", "h100:8")
  int tasks_per_node = 0;  // SLURM_NTASKS_PER_NODE
  std::vector<std::string> problems;  // "SLURM_JOB_NUM_NODES='x' is not a number (ignored)"
};

// `getenv` is a parameter so tests need not touch the process environment.
SlurmReport probe_slurm(const std::function<const char*(const char*)>& getenv);

// ---- assembling ---------------------------------------------------------------------------------
// The Detection detect() returns, from the reports. GPU count and model from `cuda` (NVML's list
// when CUDA sees none), GPUs per node from Slurm when inside a job, NVLink domain from NVML,
// inter-node bandwidth from the active ports (rate / 8 x ports / GPUs per node), peaks from the
// built-in table when the model is known.
Detection assemble(const backend::DeviceReport& cuda, const NvmlReport& nvml,
                   const InfinibandReport& infiniband, const HostReport& host,
                   const SlurmReport& slurm);

}  // namespace trainctl::topology
