// The roll call after a failed collective across hosts; see roll_call.hpp for the contract.
#include "comm/roll_call.hpp"

#include <fmt/core.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>

#include "comm/error.hpp"
#include "comm/gloo_communicator.hpp"

namespace trainctl::comm {

namespace {

using Clock = std::chrono::steady_clock;

// One member as the all-gather carries it: fixed-size, NUL-padded fields.
struct MemberRecord {
  std::array<char, 64> host{};
  std::array<char, 64> address{};
  int64_t pid = 0;
};

void copy_into(std::array<char, 64>& field, const std::string& text) {
  std::memcpy(field.data(), text.data(), std::min(text.size(), field.size() - 1));
}

std::string text_of(const std::array<char, 64>& field) {
  return std::string(field.data(), strnlen(field.data(), field.size()));
}

std::string key_of(int rank) {
  return "trainctl/roll_call/" + std::to_string(rank);
}

std::string done_key_of(int rank) {
  return "trainctl/roll_call_done/" + std::to_string(rank);
}

std::string ranks_text(const std::vector<int>& ranks) {
  return fmt::format("rank{} {}", ranks.size() == 1 ? "" : "s", fmt::join(ranks, ", "));
}

}  // namespace

std::vector<Member> gather_members(Communicator& world) {
  MemberRecord own;
  std::array<char, 64> host{};
  ::gethostname(host.data(), host.size() - 1);
  own.host = host;
  copy_into(own.address, gloo_address());
  own.pid = static_cast<int64_t>(::getpid());
  std::vector<MemberRecord> all(static_cast<size_t>(world.size()));
  world.all_gather(&own, all.data(), sizeof own);
  std::vector<Member> members;
  for (const MemberRecord& record : all)
    members.push_back(
        {text_of(record.host), static_cast<int>(record.pid), text_of(record.address)});
  return members;
}

bool spans_network(const std::vector<Member>& members) {
  return std::any_of(members.begin(), members.end(), [&](const Member& member) {
    return member.address != members.front().address;
  });
}

namespace {

// Polls until every member not yet `seen` holds its pid under key(rank), or the deadline passes.
// Throws what the store throws.
void poll_keys(Store& store, const std::vector<Member>& members, std::vector<bool>& seen,
               const std::function<std::string(int)>& key, Clock::time_point deadline) {
  for (;;) {
    bool all = true;
    for (size_t r = 0; r < members.size(); ++r) {
      if (seen[r]) continue;
      const std::optional<std::string> value = store.try_get(key(static_cast<int>(r)));
      seen[r] = value && *value == std::to_string(members[r].pid);
      all = all && seen[r];
    }
    if (all || Clock::now() >= deadline) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

RollCall roll_call(Store& store, int rank, const std::vector<Member>& members,
                   std::chrono::milliseconds window) {
  const std::string pid = std::to_string(members[static_cast<size_t>(rank)].pid);
  std::vector<bool> seen(members.size(), false);
  seen[static_cast<size_t>(rank)] = true;
  RollCall call;
  try {
    store.set(key_of(rank), pid);
  } catch (const std::exception& error) {  // CommError from the store, or its transport
    call.store_error = error.what();
  }
  if (call.store_error.empty()) {
    try {
      poll_keys(store, members, seen, key_of, Clock::now() + window);
      // Stay until every rank that answered has posted that it is done (at most another window).
      std::vector<bool> done(seen.size());
      for (size_t r = 0; r < seen.size(); ++r)
        done[r] = !seen[r] || static_cast<int>(r) == rank;
      store.set(done_key_of(rank), pid);
      poll_keys(store, members, done, done_key_of, Clock::now() + window);
    } catch (const std::exception& error) {
      call.store_lost = error.what();
    }
  }
  for (int r = 0; r < static_cast<int>(members.size()); ++r)
    (seen[static_cast<size_t>(r)] ? call.answered : call.silent).push_back(r);
  return call;
}

std::string describe_roll_call(const RollCall& call, const std::vector<Member>& members,
                               const std::string& store, std::chrono::milliseconds window) {
  std::string text = "roll call through " + store + ": ";
  if (!call.store_error.empty())
    return text + "the store did not answer (" + call.store_error +
           "): this rank is cut off from the store's host, or that host (rank 0's) is down";
  const std::string lost = call.store_lost.empty()
                               ? std::string()
                               : " (then the store went away: " + call.store_lost + ")";
  if (call.silent.empty())
    return text + "every rank answered within " + std::to_string(window.count()) +
           " ms: all are alive and reach the store, so the failure lies between them (the network "
           "Gloo uses, TRAINCTL_GLOO_IFACE)" +
           lost;
  std::vector<std::string> who;
  for (int r : call.silent) {
    const Member& m = members[static_cast<size_t>(r)];
    who.push_back(fmt::format("rank {} (pid {} on {}, address {})", r, m.pid, m.host, m.address));
  }
  return text + fmt::format(
                    "{} did not answer within {} ms, {} did: {} {} cut off (link or host "
                    "down) or stuck{}",
                    fmt::join(who, ", "), window.count(), ranks_text(call.answered),
                    ranks_text(call.silent), call.silent.size() == 1 ? "is" : "are", lost);
}

}  // namespace trainctl::comm
