// Internal to lib/comm: who the members of a group are (host, pid), so that after a failure a
// communicator can say which peer exited or stopped answering. Gloo reports a dead peer by address
// or not at all (a silent peer only shows as a timeout); on one host the process table knows more.
#pragma once

#include <string>
#include <vector>

namespace trainctl::comm::detail {

struct PeerInfo {
  std::string host;  // gethostname()
  int pid = 0;
};

PeerInfo this_process();
std::string encode(const PeerInfo& peer);
PeerInfo decode_peer(const std::string& text);  // {"", 0} when malformed

enum class PeerState { unknown, alive, stopped, gone };

// Looks at the process table; only meaningful for peers on this host (else unknown).
PeerState probe(const PeerInfo& peer);
const char* state_text(PeerState state);  // "gone (process exited)", "stopped (not answering)"

}  // namespace trainctl::comm::detail
