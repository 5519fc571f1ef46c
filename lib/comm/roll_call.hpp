// Which rank is lost, when the ranks run on several hosts.
//
// Gloo reports a silent peer only as a timeout, and a survivor whose peer gave up first sees only
// "connection closed" from that peer, although neither is the culprit. On one host the process
// table settles it (peers.hpp); across hosts nothing does: a rank whose link is cut is alive, it
// just cannot be reached. So after a failed collective every rank that catches it takes a roll
// call through the job's store: it posts its own key, then waits a short window for the others'.
// The ranks that fail together (the survivors of a cut all time out on the same silence, or see
// the first one's connections close) answer within milliseconds of each other; a rank that does
// not answer within the window cannot reach the store (its link or host is down) or is stuck
// outside any collective. With the TCP store (on rank 0's host) this is a statement about the
// network; with a file store it is one about the shared file system.
//
// The members' hosts, pids and Gloo addresses are gathered once at the start (gather_members),
// while the network works, so the message can say where the silent rank is.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/store.hpp"

namespace trainctl::comm {

struct Member {
  std::string host;  // gethostname()
  int pid = 0;
  std::string address;  // where its Gloo device listens (gloo_address())
};

// Every member of `world`, in rank order (a collective: every rank calls it).
std::vector<Member> gather_members(Communicator& world);

// Whether the members' Gloo traffic crosses a network: not every member listens on one address
// (trainctl's launcher and emulated nodes share 127.0.0.1, where the process table names peers).
bool spans_network(const std::vector<Member>& members);

struct RollCall {
  std::vector<int> answered;  // ranks that posted their key within the window, this one included
  std::vector<int> silent;    // the others
  std::string store_error;    // this rank could not post its key (the store's host unreachable?)
  // The store failed after the post (its host's rank left); the ranks not seen by then count as
  // silent.
  std::string store_lost;
};

// Posts "trainctl/roll_call/<rank>" (this rank's pid) in `store` and polls the other members'
// keys until all have answered or `window` has passed. A key counts only when it holds that
// member's pid, so keys left in a file store by an earlier attempt are not taken as answers.
// Then it posts "trainctl/roll_call_done/<rank>" and waits (at most another window) until every
// rank that answered has posted its own: rank 0 serves the TCP store, and leaving at the end of
// its window would take the store away from a rank that failed a little later and still polls.
// Never throws for the store: its failures are reported in store_error and store_lost.
RollCall roll_call(Store& store, int rank, const std::vector<Member>& members,
                   std::chrono::milliseconds window);

// "roll call through tcp store 10.77.0.1:29500: rank 2 (pid 4242 on vm, address 10.77.0.3) did
// not answer within 2000 ms, ranks 0, 1 did: rank 2 is cut off (its link or host is down) or
// stuck"; or that every rank answered, or that the store did not.
std::string describe_roll_call(const RollCall& call, const std::vector<Member>& members,
                               const std::string& store, std::chrono::milliseconds window);

}  // namespace trainctl::comm
