// CommError: every failure of lib/comm (store timeouts, rendezvous, collectives, a dead or silent
// peer, misuse such as a wrong buffer size) is reported as one exception type whose message names
// what failed, on which group, and what to do. The fields let a caller (the launcher, the trainer)
// act on the failure without parsing the text.
#pragma once

#include <stdexcept>
#include <string>

namespace trainctl::comm {

class CommError : public std::runtime_error {
 public:
  enum class Kind {
    timeout,    // a store key or a collective did not complete within its timeout
    peer_gone,  // a peer closed its connection (exited, crashed, was killed)
    usage,      // a call that can never succeed (bad sizes, bad peer, bad layout)
    io,         // any other transport or file-system failure
  };

  CommError(Kind kind, std::string message, std::string op = {}, int peer = -1)
      : std::runtime_error(std::move(message)), kind_(kind), op_(std::move(op)), peer_(peer) {}

  Kind kind() const { return kind_; }
  // The operation that failed ("all_reduce", "store.get", "rendezvous"), empty when none.
  const std::string& op() const { return op_; }
  // The rank (within the group) that failed or went silent, -1 when unknown.
  int peer() const { return peer_; }

 private:
  Kind kind_;
  std::string op_;
  int peer_;
};

}  // namespace trainctl::comm
