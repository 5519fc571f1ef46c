#include "comm/peers.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <sstream>
#include <string>

namespace trainctl::comm::detail {

PeerInfo this_process() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return PeerInfo{host, static_cast<int>(::getpid())};
}

std::string encode(const PeerInfo& peer) {
  return std::to_string(peer.pid) + " " + peer.host;
}

PeerInfo decode_peer(const std::string& text) {
  std::istringstream in(text);
  PeerInfo peer;
  if (!(in >> peer.pid >> peer.host)) return {};
  return peer;
}

PeerState probe(const PeerInfo& peer) {
  if (peer.pid <= 0 || peer.host != this_process().host) return PeerState::unknown;
  if (::kill(peer.pid, 0) != 0) return errno == ESRCH ? PeerState::gone : PeerState::unknown;
  // /proc/<pid>/stat: "pid (comm) S ..."; comm may hold spaces, so the state follows the last ')'.
  // Plain read(2): the peer may exit between kill() and here, and reading a vanished process's
  // stat fails with ESRCH, which a std::ifstream turns into an exception out of its buffer.
  const std::string path = "/proc/" + std::to_string(peer.pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ESRCH ? PeerState::gone : PeerState::unknown;
  char buffer[4096];
  const ssize_t got = ::read(fd, buffer, sizeof buffer);
  const int read_errno = errno;
  ::close(fd);
  if (got < 0) return read_errno == ESRCH ? PeerState::gone : PeerState::unknown;
  const std::string stat(buffer, static_cast<size_t>(got));
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return PeerState::unknown;
  switch (stat[paren + 2]) {
    case 'Z':
    case 'X':
      return PeerState::gone;
    case 'T':
    case 't':
      return PeerState::stopped;
    default:
      return PeerState::alive;
  }
}

const char* state_text(PeerState state) {
  switch (state) {
    case PeerState::gone:
      return "gone (process exited)";
    case PeerState::stopped:
      return "stopped (process suspended, not answering)";
    case PeerState::alive:
      return "alive";
    case PeerState::unknown:
      break;
  }
  return "unknown";
}

}  // namespace trainctl::comm::detail
