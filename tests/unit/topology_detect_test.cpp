// lib/topology detection: InfiniBand on recorded sysfs trees (tests/fixtures/topology/sysfs-*),
// NVLink through a substitute NVML library (fake_nvml.c, loaded with dlopen like the real one),
// the Slurm environment, assemble() on fabricated reports, and detect() on this machine.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "topology/probes.hpp"
#include "topology/topology.hpp"

using namespace trainctl::topology;

namespace {

const std::string kFixtures = std::string(TRAINCTL_SOURCE_DIR) + "/tests/fixtures/topology/";

// Sets (or with nullopt unsets) an environment variable for one scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value->c_str(), 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

bool contains(const std::vector<std::string>& facts, const std::string& text) {
  for (const auto& f : facts)
    if (f.find(text) != std::string::npos) return true;
  return false;
}

std::function<const char*(const char*)> fake_env(std::map<std::string, std::string> values) {
  return [values = std::move(values)](const char* name) -> const char* {
    auto it = values.find(name);
    return it == values.end() ? nullptr : it->second.c_str();
  };
}

trainctl::backend::DeviceReport eight_h100s() {
  trainctl::backend::DeviceReport cuda;
  cuda.cuda_compiled = true;
  cuda.status = "8 GPUs: NVIDIA H100 80GB HBM3 (fabricated)";
  for (int i = 0; i < 8; ++i)
    cuda.gpus.push_back({i, "NVIDIA H100 80GB HBM3", 85017853952ull, 9, 0, 132});
  return cuda;
}

}  // namespace

TEST_CASE("InfiniBand: a DGX H100 with 8 NDR HCAs") {
  InfinibandReport ib = probe_infiniband(kFixtures + "sysfs-dgx-h100");
  REQUIRE(ib.ports.size() == 8);
  CHECK(ib.reason.empty());
  for (int i = 0; i < 8; ++i) {
    const IbPort& p = ib.ports[i];
    CHECK(p.device == "mlx5_" + std::to_string(i));
    CHECK(p.port == 1);
    CHECK(p.rate_gbits == 400);
    CHECK(p.rate_text == "400 Gb/sec (4X NDR)");
    CHECK(p.active());
    CHECK(p.link_layer == "InfiniBand");
    CHECK(p.numa_node == i / 4);
  }
}

TEST_CASE("InfiniBand: an Ethernet (RoCE) box with a port down, and a machine without HCAs") {
  InfinibandReport roce = probe_infiniband(kFixtures + "sysfs-roce");
  REQUIRE(roce.ports.size() == 3);
  CHECK(roce.ports[0].link_layer == "Ethernet");
  CHECK(roce.ports[1].rate_gbits == 100);
  CHECK(roce.ports[2].state == "DOWN");
  CHECK_FALSE(roce.ports[2].active());

  InfinibandReport none = probe_infiniband(kFixtures + "sysfs-empty");
  CHECK(none.ports.empty());
  CHECK(none.reason == "no InfiniBand/RoCE adapters (" + kFixtures +
                           "sysfs-empty/class/infiniband does not exist)");
}

TEST_CASE("NVML: the substitute library with 8 GPUs on one NVSwitch") {
  ScopedEnv gpus("FAKE_NVML_GPUS", std::nullopt), group("FAKE_NVML_GROUP", std::nullopt);
  for (std::string p2p : {"1", "0"}) {  // 0: through the remote end of each link
    INFO("FAKE_NVML_P2P=" << p2p);
    ScopedEnv use_p2p("FAKE_NVML_P2P", p2p);
    NvmlReport nvml = probe_nvml(TRAINCTL_FAKE_NVML);
    REQUIRE(nvml.available);
    REQUIRE(nvml.gpus.size() == 8);
    CHECK(nvml.gpus[0].name == "NVIDIA H100 80GB HBM3");
    CHECK(nvml.gpus[0].memory_bytes == 80ull << 30);
    CHECK(nvml.gpus[3].pci_bus_id == "00000000:1b:00.0");
    CHECK(nvml.gpus[7].active_links == 18);
    std::string why;
    CHECK(nvlink_domain(nvml, &why) == 8);
    CHECK(why == "NVML: 8 GPUs in 1 NVLink group of 8 (18 active NVLinks on GPU 0)");
  }
}

TEST_CASE("NVML: groups of GPUs, no NVLink, unequal groups") {
  ScopedEnv gpus("FAKE_NVML_GPUS", "8");
  for (std::string p2p : {"1", "0"}) {
    INFO("FAKE_NVML_P2P=" << p2p);
    ScopedEnv use_p2p("FAKE_NVML_P2P", p2p);
    {
      ScopedEnv group("FAKE_NVML_GROUP", "4");
      CHECK(nvlink_domain(probe_nvml(TRAINCTL_FAKE_NVML)) == 4);
    }
    {
      ScopedEnv group("FAKE_NVML_GROUP", "2");
      CHECK(nvlink_domain(probe_nvml(TRAINCTL_FAKE_NVML)) == 2);
    }
    {
      ScopedEnv group("FAKE_NVML_GROUP", "1");
      std::string why;
      CHECK(nvlink_domain(probe_nvml(TRAINCTL_FAKE_NVML), &why) == 1);
      CHECK(why == "NVML: 8 GPUs, no NVLink between them");
    }
  }
  // Groups of 4 and 2 (6 GPUs): the planner may only rely on the gcd.
  NvmlReport report;
  report.available = true;
  report.gpus.resize(6);
  report.nvlink.assign(6, std::vector<bool>(6, false));
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 6; ++j)
      report.nvlink[i][j] = (i < 4) == (j < 4);
  std::string why;
  CHECK(nvlink_domain(report, &why) == 2);
  CHECK(why.find("unequal groups") != std::string::npos);
}

TEST_CASE("NVML missing or failing is a normal answer: domain 1 with the reason") {
  NvmlReport missing = probe_nvml("/nonexistent/libnvidia-ml.so.1");
  CHECK_FALSE(missing.available);
  CHECK(missing.reason.find("cannot open shared object file") != std::string::npos);
  std::string why;
  CHECK(nvlink_domain(missing, &why) == 1);
  CHECK(why.rfind("no NVML (/nonexistent/libnvidia-ml.so.1: cannot open", 0) == 0);

  ScopedEnv fail("FAKE_NVML_INIT_ERROR", "9");
  NvmlReport failing = probe_nvml(TRAINCTL_FAKE_NVML);
  CHECK_FALSE(failing.available);
  CHECK(failing.reason == "nvmlInit_v2: error 9 (Driver Not Loaded)");
  CHECK(nvlink_domain(failing) == 1);
}

TEST_CASE("Slurm environment") {
  CHECK_FALSE(probe_slurm(fake_env({})).in_job);
  SlurmReport job = probe_slurm(fake_env({{"SLURM_JOB_ID", "42"},
                                          {"SLURM_JOB_NUM_NODES", "4"},
                                          {"SLURM_GPUS_PER_NODE", "h100:8"},
                                          {"SLURM_NTASKS_PER_NODE", "8(x4)"}}));
  CHECK(job.in_job);
  CHECK(job.nodes == 4);
  CHECK(job.gpus_per_node == 8);
  CHECK(job.tasks_per_node == 8);
  CHECK(job.problems.empty());
  // SLURM_GPUS_ON_NODE wins over SLURM_GPUS_PER_NODE; bad values are named and ignored.
  SlurmReport odd = probe_slurm(fake_env({{"SLURM_JOB_NUM_NODES", "two"},
                                          {"SLURM_GPUS_ON_NODE", "4"},
                                          {"SLURM_GPUS_PER_NODE", "gpu:h100:8"}}));
  CHECK(odd.in_job);
  CHECK(odd.nodes == 0);
  CHECK(odd.gpus_per_node == 4);
  REQUIRE(odd.problems.size() == 1);
  CHECK(odd.problems[0] == "SLURM_JOB_NUM_NODES='two' is not a count (ignored)");
  CHECK(probe_slurm(fake_env({{"SLURM_JOB_ID", "1"}, {"SLURM_GPUS_PER_NODE", "gpu:a100:2"}}))
            .gpus_per_node == 2);
}

TEST_CASE("assemble: 8 H100 on NVSwitch with 8 NDR HCAs, two Slurm nodes") {
  ScopedEnv gpus("FAKE_NVML_GPUS", "8"), group("FAKE_NVML_GROUP", std::nullopt);
  Detection d = assemble(eight_h100s(), probe_nvml(TRAINCTL_FAKE_NVML),
                         probe_infiniband(kFixtures + "sysfs-dgx-h100"), HostReport{},
                         probe_slurm(fake_env({{"SLURM_JOB_NUM_NODES", "2"},
                                               {"SLURM_GPUS_ON_NODE", "8"},
                                               {"SLURM_NTASKS_PER_NODE", "8"}})));
  const ClusterSpec& c = d.cluster;
  CHECK(d.in_slurm_job);
  CHECK(c.source == "detected");
  CHECK(c.nodes == 2);
  CHECK(c.gpus_per_node == 8);
  CHECK(c.world_size() == 16);
  CHECK(c.gpu.name == "NVIDIA H100 80GB HBM3");
  CHECK(c.gpu.peak_tflops_bf16 == 989);
  CHECK(c.gpu.memory_gib == Approx(79.18).epsilon(0.001));
  CHECK(c.nvlink_domain == 8);
  CHECK(c.nvlink_gbps == 450);  // 18 links x 25 GB/s
  CHECK(c.inter_node_gbps == 50);
  CHECK(c.intra_node_gbps == 25);
  CHECK(contains(d.facts, "network: 8 active ports, 3200 Gb/s per node = 50 GB/s per GPU"));
  CHECK(contains(d.facts, "no hwloc topology"));
  // What was detected is a valid cluster file.
  ClusterSpec again = parse_cluster(dump_cluster(c), "detected.yaml");
  again.source = c.source;
  CHECK(again == c);
}

TEST_CASE("assemble: Slurm's GPUs per node win over what this process sees") {
  trainctl::backend::DeviceReport one = eight_h100s();
  one.gpus.resize(1);  // srun --gpus-per-task=1: one visible GPU
  Detection d = assemble(
      one, probe_nvml("/nonexistent/libnvidia-ml.so.1"), probe_infiniband(kFixtures + "sysfs-roce"),
      HostReport{}, probe_slurm(fake_env({{"SLURM_JOB_ID", "7"}, {"SLURM_GPUS_ON_NODE", "4"}})));
  CHECK(d.cluster.gpus_per_node == 4);
  CHECK(d.cluster.nodes == 1);
  CHECK(d.cluster.nvlink_domain == 1);
  CHECK(d.cluster.inter_node_gbps == 6.25);  // 2 active x 100 Gb/s / 8 / 4 GPUs
  CHECK(contains(d.facts, "this process sees 1 GPU; the job has 4 per node"));
  CHECK(contains(d.facts, "no NVML (/nonexistent/libnvidia-ml.so.1"));
  CHECK(contains(d.facts, "mlx5_2 port 1: 10 Gb/sec (1X QDR), DOWN, Ethernet (RoCE)"));
}

TEST_CASE("detect() with the substitute NVML and a recorded DGX sysfs tree") {
  ScopedEnv nvml("TRAINCTL_NVML_LIBRARY", TRAINCTL_FAKE_NVML);
  ScopedEnv sysfs("TRAINCTL_SYSFS_ROOT", kFixtures + "sysfs-dgx-h100");
  ScopedEnv gpus("FAKE_NVML_GPUS", "8"), group("FAKE_NVML_GROUP", std::nullopt);
  ScopedEnv job("SLURM_JOB_ID", "99"), nodes("SLURM_JOB_NUM_NODES", "3");
  ScopedEnv on_node("SLURM_GPUS_ON_NODE", std::nullopt), per("SLURM_GPUS_PER_NODE", std::nullopt);
  Detection d = detect();
  CHECK(d.in_slurm_job);
  CHECK(d.cluster.nodes == 3);
  CHECK(d.cluster.name.rfind("detected: ", 0) == 0);
  if (trainctl::backend::detect_gpus().gpus.empty()) {
    // No GPU for the CUDA runtime here: the GPUs come from (substitute) NVML.
    CHECK(d.cluster.gpus_per_node == 8);
    CHECK(d.cluster.nvlink_domain == 8);
    CHECK(d.cluster.inter_node_gbps == 50);
    CHECK(contains(d.facts, "NVML lists 8 GPUs: planning with NVML's list"));
  }
  CHECK(d.cpu_cores > 0);  // hwloc
  CHECK(describe(d).find("facts:\n") != std::string::npos);
}

TEST_CASE("detect() on this machine: no crash, a CPU-only machine says so") {
  ScopedEnv nvml("TRAINCTL_NVML_LIBRARY", std::nullopt), sysfs("TRAINCTL_SYSFS_ROOT", std::nullopt);
  ScopedEnv job("SLURM_JOB_ID", std::nullopt), nodes("SLURM_JOB_NUM_NODES", std::nullopt);
  Detection d = detect();
  CHECK(d.cpu_cores > 0);
  CHECK(d.numa_nodes > 0);
  CHECK_FALSE(d.in_slurm_job);
  CHECK(d.cluster.nodes == 1);
  CHECK(contains(d.facts, "not inside a Slurm job"));
  std::string text = describe(d);
  INFO(text);
  if (trainctl::backend::detect_gpus().gpus.empty()) {
    CHECK(d.cluster.gpus_per_node == 0);
    CHECK(contains(d.facts, "no GPU"));
    CHECK(text.find("without GPUs (CPU only)") != std::string::npos);
  } else {
    CHECK(d.cluster.gpus_per_node > 0);
    CHECK(d.cluster.gpu.memory_gib > 0);
  }
}
