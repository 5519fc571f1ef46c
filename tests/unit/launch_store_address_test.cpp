// lib/launch: Slurm node lists, the TCP store port of a job, and where rank 0's TCP store is when
// the nodes share no file system. Fake getenv and name resolution: nothing here touches the
// network or the test's own environment.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "launch/rank_env.hpp"
#include "launch/store_address.hpp"

using namespace trainctl::launch;
using Catch::Matchers::Contains;
using Names = std::vector<std::string>;

namespace {

struct FakeEnv {
  std::map<std::string, std::string> vars;
  Getenv getenv() const {
    return [this](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

RankInfo slurm_rank(int rank, const std::string& node, const std::string& node_list) {
  RankInfo info;
  info.rank = rank;
  info.world_size = 4;
  info.source = RankSource::slurm;
  info.node = node;
  info.node_list = node_list;
  return info;
}

const Resolves kEverything = [](const std::string&) { return true; };
const Resolves kNothing = [](const std::string&) { return false; };

}  // namespace

TEST_CASE("nodelist: plain names and ranges expand in order", "[launch]") {
  CHECK(expand_slurm_nodelist("node1") == Names{"node1"});
  CHECK(expand_slurm_nodelist("node[1-2]") == Names{"node1", "node2"});
  CHECK(expand_slurm_nodelist("node[1-3,7],gpu-a") ==
        Names{"node1", "node2", "node3", "node7", "gpu-a"});
  CHECK(expand_slurm_nodelist("a1,b[2-3]") == Names{"a1", "b2", "b3"});
  CHECK(expand_slurm_nodelist("dgx[5]") == Names{"dgx5"});
}

TEST_CASE("nodelist: zero padding and several bracket groups", "[launch]") {
  CHECK(expand_slurm_nodelist("n[08-10]") == Names{"n08", "n09", "n10"});
  CHECK(expand_slurm_nodelist("r[1-2]n[1-2]") == Names{"r1n1", "r1n2", "r2n1", "r2n2"});
  CHECK(expand_slurm_nodelist("gpu[001-002]-ib") == Names{"gpu001-ib", "gpu002-ib"});
}

TEST_CASE("nodelist: malformed lists name the text and the place", "[launch]") {
  CHECK_THROWS_WITH(expand_slurm_nodelist("node[1-2"),
                    Contains("'node[1-2'") && Contains("character 5") && Contains("without ']'"));
  CHECK_THROWS_WITH(expand_slurm_nodelist("node[3-1]"), Contains("descends"));
  CHECK_THROWS_WITH(expand_slurm_nodelist("node[a-b]"), Contains("not a number"));
  CHECK_THROWS_WITH(expand_slurm_nodelist("node1]"), Contains("']' without '['"));
  CHECK_THROWS_WITH(expand_slurm_nodelist("node[]"), Contains("not a number"));
  CHECK_THROWS_WITH(expand_slurm_nodelist("a,,b"), Contains("empty host name"));
  CHECK_THROWS_WITH(expand_slurm_nodelist("a,"), Contains("trailing ','"));
  CHECK_THROWS_WITH(expand_slurm_nodelist(""), Contains("empty"));
  CHECK_THROWS_AS(expand_slurm_nodelist("n[1-2[3]]"), RankEnvError);
}

TEST_CASE("store port: derived from the job id within its range", "[launch]") {
  CHECK(store_port_for_job("42") == 20042);
  CHECK(store_port_for_job("123456") == kStorePortBase + 3456);
  CHECK(store_port_for_job("0") == kStorePortBase);
  CHECK(store_port_for_job("9999") == kStorePortBase + kStorePortCount - 1);
  CHECK_THROWS_WITH(store_port_for_job(""), Contains("TRAINCTL_STORE_PORT"));
  CHECK_THROWS_WITH(store_port_for_job("12_3"), Contains("'12_3' is not a job number"));
}

TEST_CASE("store address: rank 0's node first in the list, port from the job", "[launch]") {
  const FakeEnv env{{{"SLURM_JOB_ID", "77"}}};
  for (int rank : {0, 3}) {
    const StoreAddress a = tcp_store_address(
        slurm_rank(rank, rank == 0 ? "gpu01" : "gpu02", "gpu[01-02]"), env.getenv(), kEverything);
    CHECK(a.host == "gpu01");
    CHECK(a.port == 20077);
    CHECK_THAT(a.how, Contains("first node gpu01 of gpu[01-02]") && Contains("job 77"));
  }
}

TEST_CASE("store address: the environment overrides host and port", "[launch]") {
  const FakeEnv env{{{"SLURM_JOB_ID", "77"},
                     {"TRAINCTL_STORE_HOST", "10.0.0.5"},
                     {"TRAINCTL_STORE_PORT", "31000"}}};
  // With the host given, rank 0 may run anywhere: the user said where the store is.
  const StoreAddress a = tcp_store_address(slurm_rank(0, "b", "a,b"), env.getenv(), kNothing);
  CHECK(a.host == "10.0.0.5");
  CHECK(a.port == 31000);
  const FakeEnv bad{{{"SLURM_JOB_ID", "77"}, {"TRAINCTL_STORE_PORT", "70000"}}};
  CHECK_THROWS_WITH(tcp_store_address(slurm_rank(1, "b", "a,b"), bad.getenv(), kEverything),
                    Contains("TRAINCTL_STORE_PORT='70000' is not a TCP port"));
}

TEST_CASE("store address: trainctl's launcher hands its ranks the host and port of its store",
          "[launch]") {
  const FakeEnv env{{{"TRAINCTL_STORE_HOST", "127.0.0.1"}, {"TRAINCTL_STORE_PORT", "41234"}}};
  const StoreAddress a = launcher_store_address(env.getenv());
  CHECK(a.host == "127.0.0.1");
  CHECK(a.port == 41234);
  CHECK(a.how == "served by trainctl's launcher");
  const FakeEnv missing{{{"TRAINCTL_STORE_PORT", "41234"}}};
  CHECK_THROWS_WITH(launcher_store_address(missing.getenv()),
                    Contains("needs TRAINCTL_STORE_HOST and TRAINCTL_STORE_PORT"));
  const FakeEnv bad{{{"TRAINCTL_STORE_HOST", "127.0.0.1"}, {"TRAINCTL_STORE_PORT", "0"}}};
  CHECK_THROWS_WITH(launcher_store_address(bad.getenv()),
                    Contains("TRAINCTL_STORE_PORT='0' is not a TCP port"));
}

TEST_CASE("store address: an external launcher's ranks meet at rank 0's host on the named port",
          "[launch]") {
  const FakeEnv env{{{"TRAINCTL_STORE_HOST", "10.77.0.1"},
                     {"TRAINCTL_STORE_PORT", "29500"},
                     {"MASTER_ADDR", "10.0.0.9"},
                     {"MASTER_PORT", "29400"}}};
  const StoreAddress a = external_store_address(env.getenv());
  CHECK(a.host == "10.77.0.1");
  CHECK(a.port == 29500);
  CHECK(a.how ==
        "rank 0 serves it, host from TRAINCTL_STORE_HOST, port 29500 from "
        "TRAINCTL_STORE_PORT");
  // torchrun's MASTER_ADDR is rank 0's node; its MASTER_PORT is torchrun's own store, never ours.
  const FakeEnv torchrun{
      {{"TRAINCTL_STORE_PORT", "29500"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29400"}}};
  const StoreAddress t = external_store_address(torchrun.getenv());
  CHECK(t.host == "node0");
  CHECK(t.port == 29500);
  CHECK_THAT(t.how, Contains("host from MASTER_ADDR"));
  const FakeEnv no_host{{{"TRAINCTL_STORE_PORT", "29500"}}};
  CHECK_THROWS_WITH(external_store_address(no_host.getenv()),
                    Contains("neither TRAINCTL_STORE_HOST nor MASTER_ADDR"));
  const FakeEnv bad{{{"TRAINCTL_STORE_HOST", "h"}, {"TRAINCTL_STORE_PORT", "x"}}};
  CHECK_THROWS_WITH(external_store_address(bad.getenv()),
                    Contains("TRAINCTL_STORE_PORT='x' is not a TCP port"));
}

TEST_CASE("store address: rank 0 away from the first node is an error", "[launch]") {
  const FakeEnv env{{{"SLURM_JOB_ID", "77"}}};
  CHECK_THROWS_WITH(
      tcp_store_address(slurm_rank(0, "node2", "node[1-2]"), env.getenv(), kEverything),
      Contains("rank 0 runs on node2, not on node1") && Contains("TRAINCTL_STORE_HOST"));
}

TEST_CASE("store address: an unresolvable first node falls back to srun's launch node",
          "[launch]") {
  const FakeEnv env{{{"SLURM_JOB_ID", "5"}, {"SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1"}}};
  const StoreAddress a =
      tcp_store_address(slurm_rank(2, "node2", "node[1-2]"), env.getenv(), kNothing);
  CHECK(a.host == "127.0.0.1");
  CHECK_THAT(a.how, Contains("node1") && Contains("does not resolve"));
  const FakeEnv without{{{"SLURM_JOB_ID", "5"}}};
  CHECK_THROWS_WITH(
      tcp_store_address(slurm_rank(2, "node2", "node[1-2]"), without.getenv(), kNothing),
      Contains("node1") && Contains("set TRAINCTL_STORE_HOST"));
}

TEST_CASE("rank env: slurm node name, step node list and device index", "[launch]") {
  const FakeEnv env{{{"SLURM_PROCID", "3"},
                     {"SLURM_NTASKS", "4"},
                     {"SLURM_LOCALID", "1"},
                     {"SLURM_NODEID", "1"},
                     {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                     {"SLURM_STEP_ID", "0"},
                     {"SLURM_JOB_ID", "9"},
                     {"SLURMD_NODENAME", "node2"},
                     {"SLURM_NODELIST", "node[1-3]"},
                     {"SLURM_STEP_NODELIST", "node[1-2]"}}};
  const RankInfo info = rank_info_from_environment(env.getenv());
  CHECK(info.node == "node2");
  CHECK(info.node_list == "node[1-2]");
  CHECK(info.device_index == 1);
  CHECK(describe_rank(info) == "rank 3 of 4 (local rank 1 of 2) on node2, via slurm");
}

TEST_CASE("rank env: the GPU of a rank follows its local rank", "[launch]") {
  RankInfo info;
  info.local_rank = info.device_index = 3;
  info.local_world_size = 4;
  CHECK(device_for_rank(info, 0) == -1);  // no GPU: CPU
  CHECK(device_for_rank(info, 8) == 3);
  CHECK(device_for_rank(info, 1) == 0);   // one GPU bound to this task by the launcher
  CHECK(device_for_rank(info, 2) == -1);  // fewer GPUs than ranks: never share silently
}

TEST_CASE("rank env: our launcher names the host and says trainctl", "[launch]") {
  const FakeEnv env{{{"TRAINCTL_RANK", "1"},
                     {"TRAINCTL_WORLD_SIZE", "2"},
                     {"TRAINCTL_LAUNCHER_PID", "4242"},
                     {"TRAINCTL_LOCAL_RANK", "1"},
                     {"TRAINCTL_LOCAL_WORLD_SIZE", "2"}}};
  const RankInfo info = rank_info_from_environment(env.getenv());
  CHECK(info.node == info.hostname);
  CHECK(info.device_index == 1);
  CHECK(describe_rank(info) ==
        "rank 1 of 2 (local rank 1 of 2) on " + info.hostname + ", via trainctl");
}
