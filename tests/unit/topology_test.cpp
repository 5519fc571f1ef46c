// lib/topology cluster files: the shipped configs/clusters/*.yaml, round trips through
// dump_cluster, --nodes/--gpus-per-node overrides, the built-in GPU table, and the exact message
// (file:line:col) of each kind of bad file.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "topology/topology.hpp"

using namespace trainctl::topology;

namespace {

std::string cluster_path(const std::string& name) {
  return std::string(TRAINCTL_SOURCE_DIR) + "/configs/clusters/" + name + ".yaml";
}

// The text of the ClusterError that parsing `yaml` throws ("" when it does not throw).
std::string error_of(const std::string& yaml, const ClusterOverrides& overrides = {}) {
  try {
    parse_cluster(yaml, "bad.yaml", overrides);
  } catch (const ClusterError& e) {
    return e.what();
  }
  return "";
}

const std::string kGood = "gpu: h100-sxm\ngpus_per_node: 8\nnvlink: {domain: 8, gbps: 450}\n";

}  // namespace

TEST_CASE("shipped cluster files load with the published figures") {
  ClusterSpec a100 = load_cluster(cluster_path("dgx-a100"));
  CHECK(a100.name == "dgx-a100");
  CHECK(a100.source == cluster_path("dgx-a100"));
  CHECK(a100.gpu.name == "A100-SXM-80GB");
  CHECK(a100.gpu.peak_tflops_bf16 == 312);
  CHECK(a100.gpu.peak_tflops_tf32 == 156);
  CHECK(a100.gpu.peak_tflops_fp32 == 19.5);
  CHECK(a100.gpu.memory_gib == 80);
  CHECK(a100.gpus_per_node == 8);
  CHECK(a100.nvlink_domain == 8);
  CHECK(a100.nvlink_gbps == 300);
  CHECK(a100.inter_node_gbps == 25);  // 8 x 200 Gb/s / 8 bits / 8 GPUs
  CHECK(a100.world_size() == 8);

  ClusterSpec h100 = load_cluster(cluster_path("dgx-h100"));
  CHECK(h100.gpu.peak_tflops_bf16 == 989);
  CHECK(h100.gpu.peak_tflops_fp8 == 1979);
  CHECK(h100.gpu.peak_tflops_fp32 == 67);
  CHECK(h100.nvlink_gbps == 450);
  CHECK(h100.inter_node_gbps == 50);

  ClusterSpec h200 = load_cluster(cluster_path("dgx-h200"));
  CHECK(h200.gpu.memory_gib == 141);
  CHECK(h200.gpu.memory_bandwidth_gbps == 4800);
  CHECK(h200.gpu.peak_tflops_bf16 == h100.gpu.peak_tflops_bf16);

  ClusterSpec l40s = load_cluster(cluster_path("pcie-l40s"));
  CHECK(l40s.nvlink_domain == 1);
  CHECK(l40s.nvlink_gbps == 0);
  CHECK(l40s.intra_node_gbps == 25);
  CHECK(l40s.inter_node_gbps == 3.125);  // 2 x 100 Gb/s / 8 bits / 8 GPUs
  CHECK(l40s.inter_node_latency_us == 10);
}

TEST_CASE("every shipped cluster file round-trips through dump_cluster") {
  for (std::string name : {"dgx-a100", "dgx-h100", "dgx-h200", "pcie-l40s"}) {
    INFO(name);
    ClusterSpec spec = load_cluster(cluster_path(name), {.nodes = 4});
    ClusterSpec again = parse_cluster(dump_cluster(spec), "dumped.yaml");
    CHECK(again.source == "dumped.yaml");
    again.source = spec.source;
    CHECK(again == spec);
  }
}

TEST_CASE("a GPU described as a map, with defaults for the optional keys") {
  std::string yaml =
      "name: lab box\n"
      "gpu:\n"
      "  name: \"Some \\\"GPU\\\"\"\n"
      "  memory_gib: 32.5\n"
      "  peak_tflops: {bf16: 100, fp32: 12.25}\n"
      "gpus_per_node: 2\n";
  ClusterSpec spec = parse_cluster(yaml, "lab.yaml");
  CHECK(spec.name == "lab box");
  CHECK(spec.gpu.name == "Some \"GPU\"");
  CHECK(spec.gpu.memory_gib == 32.5);
  CHECK(spec.gpu.peak_tflops_fp16 == 100);  // defaults to bf16's
  CHECK(spec.gpu.peak_tflops_fp8 == 0);
  CHECK(spec.nvlink_domain == 1);
  CHECK(spec.intra_node_gbps == 25);
  CHECK(spec.inter_node_gbps == 0);
  CHECK(spec.nodes == 1);
  ClusterSpec again = parse_cluster(dump_cluster(spec), "lab.yaml");
  CHECK(again == spec);
  // Without name: the file name.
  CHECK(parse_cluster(kGood, "/x/y/my-node.yaml").name == "my-node");
}

TEST_CASE("overrides of nodes and gpus per node") {
  ClusterSpec h100 = load_cluster(cluster_path("dgx-h100"), {.nodes = 16});
  CHECK(h100.nodes == 16);
  CHECK(h100.world_size() == 128);

  // Half a node: the NVSwitch still joins the 4 GPUs, and the node's 8 NICs serve 4 GPUs.
  ClusterSpec half = apply_overrides(h100, {.gpus_per_node = 4});
  CHECK(half.gpus_per_node == 4);
  CHECK(half.nvlink_domain == 4);
  CHECK(half.inter_node_gbps == 100);
  CHECK(apply_overrides(h100, {.gpus_per_node = 6}).nvlink_domain == 2);

  CHECK(error_of(kGood, {.nodes = 2}) ==
        "error: --nodes 2: cluster 'bad' has no inter-node bandwidth; use a cluster file with a "
        "network section (--cluster FILE)");
  CHECK(error_of(kGood, {.nodes = -1}) == "error: --nodes must be >= 1, got -1");
  CHECK(error_of(kGood, {.gpus_per_node = -8}) == "error: --gpus-per-node must be >= 1, got -8");
  CHECK(error_of(kGood, {.nodes = 1}).empty());
  // 2^31 GPUs would overflow an int: refused, in the file and from the command line.
  CHECK_THROWS_WITH(apply_overrides(h100, {.nodes = 268435456}),
                    Catch::Contains("268435456 node(s) x 8 GPU(s) = 2147483648 GPUs is more than "
                                    "trainctl plans for (at most 16777216)"));
  CHECK(apply_overrides(h100, {.nodes = 2097152}).world_size() == 16777216);
  CHECK_THAT(error_of("gpu: h100-sxm\ngpus_per_node: 1000\nnodes: 900000\nnetwork: {gbps: 50}\n"),
             Catch::Contains("nodes x gpus_per_node = 900000 x 1000 = 900000000 GPUs is more than "
                             "trainctl plans for"));
}

TEST_CASE("built-in GPU table and device names") {
  CHECK(builtin_gpus().size() == 5);
  CHECK(find_builtin_gpu("H100-SXM") == find_builtin_gpu("H100-SXM-80GB"));
  CHECK(find_builtin_gpu("a100")->peak_tflops_bf16 == 312);
  CHECK(find_builtin_gpu("h200-sxm-141gb")->memory_gib == 141);
  CHECK_FALSE(find_builtin_gpu("h300"));
  CHECK(match_device_name("NVIDIA A100-SXM4-80GB")->name == "A100-SXM-80GB");
  CHECK(match_device_name("NVIDIA A100 80GB PCIe")->name == "A100-SXM-80GB");
  CHECK(match_device_name("NVIDIA H100 80GB HBM3")->name == "H100-SXM-80GB");
  CHECK(match_device_name("NVIDIA H200")->name == "H200-SXM-141GB");
  CHECK(match_device_name("NVIDIA L40S")->name == "L40S");
  CHECK(match_device_name("NVIDIA A10")->name == "A10");
  CHECK_FALSE(match_device_name("NVIDIA GeForce RTX 4090"));
  CHECK_FALSE(match_device_name(""));
}

TEST_CASE("a missing cluster file names the path and where the shipped ones are") {
  try {
    load_cluster("/nonexistent/c.yaml");
    FAIL("no error");
  } catch (const ClusterError& e) {
    CHECK(std::string(e.what()) ==
          "/nonexistent/c.yaml: error: cannot read the cluster file (No such file or directory); "
          "the shipped ones are in configs/clusters/");
    CHECK(e.problems().size() == 1);
  }
}

TEST_CASE("bad cluster files: one exact message each, at file:line:col") {
  struct Case {
    std::string yaml;
    std::string message;
  };
  const std::vector<Case> cases = {
      // unknown keys, with and without a plausible correction
      {"gpu: h100\ngpus_per_node: 8\nnvlink:\n  domian: 8\n  gbps: 450\n",
       "bad.yaml:4:3: error: unknown key 'nvlink.domian'; did you mean 'nvlink.domain'?"},
      {"gpu: h100\ngpus_per_nodes: 8\n",
       "bad.yaml:2:1: error: unknown key 'gpus_per_nodes'; did you mean 'gpus_per_node'?"},
      {"gpu: h100\ngpus_per_node: 8\ncolour: red\n",
       "bad.yaml:3:1: error: unknown key 'colour'; the keys of the top level are: name, gpu, "
       "nodes, gpus_per_node, nvlink, intra_node_gbps, network"},
      // wrong types
      {"gpu: h100\ngpus_per_node: eight\n",
       "bad.yaml:2:16: error: gpus_per_node: expected an integer, got 'eight'"},
      {"gpu: h100\ngpus_per_node: 8.5\n",
       "bad.yaml:2:16: error: gpus_per_node: expected an integer, got '8.5'"},
      {"gpu: h100\ngpus_per_node: 8\nnvlink: 8\n",
       "bad.yaml:3:9: error: nvlink: must be a map of keys, e.g. `nvlink: {domain: 8, gbps: 450}`"},
      {"gpu: [h100]\ngpus_per_node: 8\n",
       "bad.yaml:1:6: error: gpu: expected a built-in GPU name or a map, got a list"},
      // out of range
      {"gpu: h100\ngpus_per_node: 8\nnvlink: {domain: 8, gbps: -450}\n",
       "bad.yaml:3:27: error: nvlink.gbps: must be > 0, got -450"},
      {"gpu: h100\ngpus_per_node: 8\nnodes: 0\n",
       "bad.yaml:3:8: error: nodes: must be >= 1, got 0"},
      // relations between keys
      {"gpu: h100\ngpus_per_node: 8\nnvlink: {domain: 3, gbps: 450}\n",
       "bad.yaml:3:18: error: nvlink.domain 3 does not divide gpus_per_node 8; use one of 1, 2, "
       "4, 8"},
      {"gpu: h100\ngpus_per_node: 8\nnvlink: {domain: 8}\n",
       "bad.yaml:3:18: error: nvlink.domain is 8 but nvlink.gbps is missing; add the NVLink GB/s "
       "per GPU per direction, e.g. `gbps: 450`"},
      {"gpu: h100\ngpus_per_node: 8\nnodes: 4\n",
       "bad.yaml:3:8: error: nodes is 4 but there is no network section; add e.g. `network: "
       "{nics: 8, nic_gbits: 400}`"},
      {"gpu: h100\ngpus_per_node: 8\nnetwork: {gbps: 50, nics: 8, nic_gbits: 400}\n",
       "bad.yaml:3:17: error: network: give either gbps (GB/s per GPU) or nics and nic_gbits, not "
       "both"},
      {"gpu: h100\ngpus_per_node: 8\nnetwork: {nics: 8}\n",
       "bad.yaml:3:17: error: network: nics and nic_gbits go together (NICs per node, Gb/s of one "
       "NIC)"},
      // unknown GPU
      {"gpu: h2000\ngpus_per_node: 8\n",
       "bad.yaml:1:6: error: gpu: unknown GPU 'h2000' (did you mean 'h200'?); the built-in GPUs "
       "are A100-SXM-80GB, H100-SXM-80GB, H200-SXM-141GB, L40S, A10, or describe it as a map "
       "(name, memory_gib, peak_tflops, memory_bandwidth_gbps)"},
      // missing required keys
      {"gpu: h100\n",
       "bad.yaml: error: missing required key 'gpus_per_node' (GPUs in one node); add e.g. "
       "`gpus_per_node: 8`"},
      {"gpus_per_node: 8\n",
       "bad.yaml: error: missing required key 'gpu' (a built-in GPU (A100-SXM-80GB, "
       "H100-SXM-80GB, H200-SXM-141GB, L40S, A10) or a map); add e.g. `gpu: h100-sxm`"},
      {"gpu:\n  name: x\n  peak_tflops: {bf16: 100}\ngpus_per_node: 8\n",
       "bad.yaml:1:1: error: missing required key 'gpu.memory_gib' (device memory per GPU, GiB); "
       "add e.g. `memory_gib: 80`"},
      // YAML itself
      {"gpu: h100\ngpus_per_node: 8\ngpus_per_node: 4\n",
       "bad.yaml:3:1: error: duplicate key 'gpus_per_node' (first at line 2); keep one"},
      {"gpu: [h100\n", "bad.yaml:2:1: error: YAML syntax error: end of sequence flow not found"},
      {"- gpu: h100\n",
       "bad.yaml:1:1: error: a cluster file is a map of keys (gpu:, gpus_per_node:, nvlink:, ...)"},
  };
  for (const auto& c : cases) {
    INFO(c.yaml);
    CHECK(error_of(c.yaml) == c.message);
  }
  // Problems are all reported at once, in file order.
  CHECK(error_of("gpus_per_node: x\nnodes: -1\n") ==
        "bad.yaml: error: missing required key 'gpu' (a built-in GPU (A100-SXM-80GB, "
        "H100-SXM-80GB, H200-SXM-141GB, L40S, A10) or a map); add e.g. `gpu: h100-sxm`\n"
        "bad.yaml:1:16: error: gpus_per_node: expected an integer, got 'x'\n"
        "bad.yaml:2:8: error: nodes: must be >= 1, got -1");
}
