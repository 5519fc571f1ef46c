// Communicators over Gloo (CPU ranks, TCP transport) and the trivial one-rank communicator.
// No Gloo header leaks out of lib/comm: the transport device is an opaque handle.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "comm/store.hpp"

namespace trainctl::comm {

// One Gloo TCP transport device (a socket event loop thread). Share one per process across all
// its groups. Create it only after any fork(): the loop thread does not survive a fork.
class GlooDevice;

// The address this process listens on comes from the environment variable TRAINCTL_GLOO_IFACE: an
// interface name ("eth0", "ib0") or a host name/address; unset: 127.0.0.1 (single node).
// Side effect: SIGPIPE is set to ignored when it has its default action, because Gloo writes to
// sockets without MSG_NOSIGNAL and a dead peer would otherwise kill this process silently.
std::shared_ptr<GlooDevice> make_gloo_device();

// The address make_gloo_device() listens on, for messages about this process: the IPv4 address of
// the interface TRAINCTL_GLOO_IFACE names (the interface name itself when it has none), the host
// or address it names, or 127.0.0.1 when unset.
std::string gloo_address();

struct GroupOptions {
  std::string name = "world";  // used in every error message: "dp", "tp", ...
  int rank = 0;                // this process within the group
  int size = 1;
  std::chrono::milliseconds timeout{30000};  // rendezvous and default per-call timeout
  std::shared_ptr<GlooDevice> device{};      // null: a new device (make_gloo_device())
};

// Joins the group: every member calls this with the same name and size and a store in which keys
// are private to this group (a PrefixStore per group; see Mesh). Blocks until all members arrive
// or the timeout passes (CommError naming the ranks that did not arrive). A group of size 1
// returns a local communicator that never touches the store or the network.
std::unique_ptr<Communicator> create_gloo_communicator(Store& store, const GroupOptions& options);

// A group of one rank: reductions and gathers are copies, point to point is an error.
std::unique_ptr<Communicator> create_local_communicator(std::string name,
                                                        std::chrono::milliseconds timeout);

}  // namespace trainctl::comm
