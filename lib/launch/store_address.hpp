// Where the ranks of a Slurm job rendezvous when the nodes share no file system
// (cluster.shared_fs: false): a comm::TcpStoreServer that rank 0 runs on the first node of the
// job step, on a port derived from the job id. Pure functions of the rank environment (and of
// name resolution, injectable for tests); lib/comm does the networking.
//
// Port: kStorePortBase + SLURM_JOB_ID % kStorePortCount, i.e. 20000..29999: below Linux's
// ephemeral range (32768..60999) so no outgoing connection holds it, and distinct for 10,000
// consecutive jobs sharing a node. A requeued job keeps its id and so its port (the previous
// attempt's server has exited). Overrides: TRAINCTL_STORE_PORT (a port) and TRAINCTL_STORE_HOST
// (a host name or address every node can reach), e.g. through slurm.env.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "launch/rank_env.hpp"

namespace trainctl::launch {

inline constexpr int kStorePortBase = 20000;
inline constexpr int kStorePortCount = 10000;
inline constexpr const char* kEnvStoreHost = "TRAINCTL_STORE_HOST";
inline constexpr const char* kEnvStorePort = "TRAINCTL_STORE_PORT";
// The job's secret (64 hexadecimal digits, comm::StoreSecret): every rank proves it holds it to
// the TCP store, which refuses everyone else. trainctl submit's batch script makes a fresh one per
// attempt from /dev/urandom and srun hands it to the ranks in their environment: never in argv
// (which `ps` shows), a file or a log.
inline constexpr const char* kEnvStoreSecret = "TRAINCTL_STORE_SECRET";

// Slurm's compressed host list to host names, in order: "node[1-3,7],gpu-a" -> node1 node2 node3
// node7 gpu-a; ranges keep their zero padding ("n[08-10]" -> n08 n09 n10); several bracket groups
// in one name multiply out ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2). Throws RankEnvError naming
// the text and the position of a malformed list (unbalanced brackets, a descending range, ...).
std::vector<std::string> expand_slurm_nodelist(std::string_view list);

// The store port of Slurm job `job_id` (decimal digits; a job array's "123_4" is not an id here:
// Slurm sets SLURM_JOB_ID to the array task's own id). Throws RankEnvError when not a number.
int store_port_for_job(std::string_view job_id);

struct StoreAddress {
  std::string host;  // where every rank connects
  int port = 0;      // rank 0 listens on it (every interface)
  std::string how;   // for the log: "first node node1 of node[1-2], port 20042 from job 42"
};

// Whether a host name resolves to an address here (getaddrinfo); injectable for tests.
using Resolves = std::function<bool(const std::string& host)>;
bool host_resolves(const std::string& host);

// The TCP store of this Slurm job step. Host: TRAINCTL_STORE_HOST, else the first node of
// info.node_list; when that name does not resolve (emulated nodes, or a cluster whose node names
// are not in DNS) and SLURM_LAUNCH_NODE_IPADDR is set, that address: srun was started by the batch
// script, which Slurm runs on the first node of the allocation. Port: TRAINCTL_STORE_PORT, else
// store_port_for_job(SLURM_JOB_ID).
// Rank 0 must run on that first node (Slurm's default block distribution puts it there): when
// the host is not overridden and rank 0 finds itself on another node (info.node), this throws
// RankEnvError saying so, rather than letting every rank time out connecting.
StoreAddress tcp_store_address(const RankInfo& info, const Getenv& getenv,
                               const Resolves& resolves = host_resolves);

// The TCP store that trainctl's own launcher serves for its ranks (cluster.shared_fs: false on
// one machine): TRAINCTL_STORE_HOST and TRAINCTL_STORE_PORT, both set by the launcher. Throws
// RankEnvError when either is missing or the port is not a port.
StoreAddress launcher_store_address(const Getenv& getenv);

// The TCP store of an external launcher's ranks (RankInfo::external_tcp_store): rank 0 serves it
// on TRAINCTL_STORE_PORT (every interface), and every rank connects to TRAINCTL_STORE_HOST, else
// MASTER_ADDR (torchrun and most launchers set it to rank 0's node). MASTER_PORT is not taken:
// torchrun's own store listens there. Throws RankEnvError when the port is not a port or no host
// is named.
StoreAddress external_store_address(const Getenv& getenv);

}  // namespace trainctl::launch
